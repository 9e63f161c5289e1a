"""Last stage of a build: the Hub dataset (parquet, split train) and its data card.

A build directory holds `dataset/` (written by `write_hub_folder`, no repo id yet) and
`funnel.json`. `publish` re-renders the card for a repo id and either writes the exact folder that
would be uploaded (`dry_run`, default `BUILD/hub`) or pushes it: the rows with
`Dataset.push_to_hub`, then the card as README.md. A hub folder is exactly two files:

    README.md                                 card from data_cards/cudagym_ops.md (YAML front matter)
    data/train-00000-of-00001.parquet         the rows, typed by `FEATURES`

It loads with `datasets.load_dataset(folder)`. The card is a `string.Template`; every table in it is
built here (no logic in the template). Hub calls sit behind `HubClient` so tests can replace it;
every failure there is a `PublishError`, one line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import string
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Protocol

import datasets
import yaml

from cudagym.synth.labels import OPS_6K_SOURCES
from cudagym.tasks import TaskError, read_rows

log = logging.getLogger(__name__)

SPLIT = "train"
PARQUET_PATH = f"data/{SPLIT}-00000-of-00001.parquet"  # the name push_to_hub gives a single shard
CARD_TEMPLATE = "cudagym_ops.md"
PRETTY_NAME = "cudagym Ops, fused-operator CUDA kernel tasks"

# The row schema, declared once: types never depend on inference (an all-empty list column stays list<string>).
FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "name": datasets.Value("string"),
    "level": datasets.Value("int64"),
    "problem_id": datasets.Value("int64"),
    "code": datasets.Value("string"),
    "ops": datasets.List(datasets.Value("string")),
    "data_source": datasets.Value("string"),
    "k": datasets.Value("int64"),
    "seed_ids": datasets.List(datasets.Value("string")),
    "seed_ops": datasets.List(datasets.Value("string")),
    "composer": datasets.Value("string"),
    "model": datasets.Value("string"),
    "eager_ms": datasets.Value("float64"),
    "compile_ms": datasets.Value("float64"),
    "filter_device": datasets.Value("string"),
    "parity_max": datasets.Value("float64"),
    "parity_match": datasets.Value("string"),
    "strong_max": datasets.Value("float64"),
    "strong_match": datasets.Value("string"),
    "sha256": datasets.Value("string"),
})

COLUMN_DOCS = {
    "id": "stable row id, `synth/<sha12>`",
    "name": "task name, the composed operators joined by `_`",
    "level": "KernelBench-style level: 1 for a single operator (K=1), else 2",
    "problem_id": "1..N in row order (a cudagym task set is keyed by level and problem_id)",
    "code": "the task: `Model`, `get_inputs()`, `get_init_inputs()` (KernelBench format)",
    "ops": "operator names, derived from the code's AST",
    "data_source": "`torch#K` for K composed torch operators, or `transformers`",
    "k": "number of seed operators composed into the task",
    "seed_ids": "ids of the crawled seed operators, in composition order",
    "seed_ops": "operator names of those seeds",
    "composer": "`programmatic` (shape-bound chain, no LLM) or `llm`",
    "model": "the LLM of the `llm` composer; empty for `programmatic`",
    "eager_ms": "median eager forward time on `filter_device`, ms",
    "compile_ms": "median `torch.compile` forward time on `filter_device`, ms",
    "filter_device": "device the execution filter ran and timed on (`cpu` or a GPU name)",
    "parity_max": "highest parity similarity to a KernelBench L1-3 problem",
    "parity_match": "the KernelBench problem with that similarity, e.g. `L2/17_Conv2d_InstanceNorm_Divide`",
    "strong_max": "highest strong similarity to a KernelBench L1-3 problem",
    "strong_match": "the KernelBench problem with that similarity",
    "sha256": "sha256 of `code`",
}

FUNNEL_KEYS = ("stages", "k_distribution", "contamination", "config", "versions", "created")
_SIZE_CATEGORIES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                    (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B"))
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")


class PublishError(TaskError):
    """A push to the Hub failed or cannot start (no token, offline); the message is one line."""


# --------------------------------------------------------------------------------------------
# Rows -> Dataset
# --------------------------------------------------------------------------------------------

def rows_to_dataset(rows: list[dict]) -> datasets.Dataset:
    """The rows as a `datasets.Dataset` typed by `FEATURES`; a row with missing or extra columns,
    or a value of the wrong type, is a `TaskError`."""
    columns = set(FEATURES)
    for n, row in enumerate(rows):
        if row.keys() != columns:
            missing, extra = sorted(columns - row.keys()), sorted(row.keys() - columns)
            raise TaskError(f"row {n} ({row.get('id', '?')}): "
                            + "; ".join(f"{what} columns {cols}" for what, cols in
                                        (("missing", missing), ("unexpected", extra)) if cols))
    try:
        return datasets.Dataset.from_list(rows, features=FEATURES)
    except (TypeError, ValueError, OverflowError) as e:  # pyarrow's ArrowInvalid/ArrowTypeError are these
        raise TaskError(f"rows do not match the dataset features: {_one_line(e)}") from e


def size_category(n_rows: int) -> str:
    """The Hub's `size_categories` bucket for n rows."""
    for limit, name in _SIZE_CATEGORIES:
        if n_rows < limit:
            return name
    return "n>1B"


def check_repo_id(repo_id: str) -> str:
    """`OWNER/NAME` as the Hub accepts it, else ValueError."""
    parts = repo_id.split("/") if isinstance(repo_id, str) else []
    if len(parts) != 2 or not all(_REPO_PART.fullmatch(p) and ".." not in p and "--" not in p for p in parts):
        raise ValueError(f"bad repo id {repo_id!r}: expected OWNER/NAME (letters, digits, '-', '_', '.'; "
                         "no leading/trailing '-' or '.', no '--' or '..')")
    return repo_id


# --------------------------------------------------------------------------------------------
# The card
# --------------------------------------------------------------------------------------------

def template_path(name: str = CARD_TEMPLATE) -> Path:
    """A card template from `data_cards/` at the repository root (the parent of the package)."""
    import importlib.resources

    repo_copy = Path(__file__).resolve().parents[2] / "data_cards" / name
    if repo_copy.is_file():
        return repo_copy
    packaged = importlib.resources.files("cudagym") / "data_cards" / name  # should a wheel ever ship one
    if packaged.is_file():
        return Path(str(packaged))
    raise TaskError(f"dataset card template not found: {repo_copy} (run cudagym from a source checkout "
                    "or an editable install: pip install -e .)")


def render_card(funnel: dict, n_rows: int, repo_id: str | None, *, dataset_info: dict | None = None) -> str:
    """README.md for the Hub: YAML front matter (license, task categories, size, configs, dataset_info)
    and the sections of `data_cards/cudagym_ops.md`, filled from the funnel.

    `dataset_info` (`{"num_bytes", "download_size"}` of the split) adds sizes to the YAML the way
    `push_to_hub` writes them; without it the YAML declares features and row count only."""
    _check_funnel(funnel)
    if repo_id is not None:
        check_repo_id(repo_id)
    config, contamination = funnel["config"], funnel["contamination"]
    values = {
        "size_category": size_category(n_rows),
        "pretty_name": PRETTY_NAME,
        "dataset_info": _dataset_info_yaml(n_rows, dataset_info),
        "n_rows": str(n_rows),
        "cudagym_version": str(funnel["versions"].get("cudagym", "?")),
        "created": str(funnel["created"]),
        "load_target": repo_id or "path/to/this/folder",
        "columns_table": _md_table(["column", "type", "meaning"],
                                   [[f"`{c}`", _dtype(f), COLUMN_DOCS[c]] for c, f in FEATURES.items()]),
        "funnel_table": _funnel_table(funnel["stages"]),
        "k_table": _k_table(funnel["k_distribution"]),
        "k_comparison": _k_comparison(funnel["k_distribution"]),
        "references": str(contamination.get("references", "KernelBench reference problems")),
        "parity_threshold": _fmt(config.get("parity_threshold", _thresholds()[0])),
        "strong_threshold": _fmt(config.get("strong_threshold", _thresholds()[1])),
        "contamination_table": _contamination_table(contamination),
        "build_command": build_command(config),
        "continue_note": continue_note(funnel, n_rows),
        "publish_command": f"cudagym dataset publish {shlex.quote(str(config.get('out', 'OUT')))} "
                           f"--repo {repo_id or 'OWNER/NAME'}",
        "versions": ", ".join(f"{k} {v}" for k, v in funnel["versions"].items()) or "not recorded",
    }
    try:
        card = string.Template(template_path().read_text()).substitute(values)
    except (KeyError, ValueError) as e:
        raise TaskError(f"card template {template_path()}: bad placeholder {e}") from e
    _front_matter(card)  # a template edit that breaks the YAML fails here, not on the Hub
    return card


def build_command(config: dict) -> str:
    """The `cudagym dataset build` command line of a build config: a field `name_x` is the flag
    `--name-x`; True is a bare flag, False and None are left out, lists are joined by commas and
    dicts written as JSON."""
    args = ["cudagym", "dataset", "build"]
    for key, value in config.items():
        if value is None or value is False:
            continue
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            args.append(flag)
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, dict):
            value = json.dumps(value, separators=(",", ":"))
        args += [flag, shlex.quote(str(value))]
    return " ".join(args)


def continue_note(funnel: dict, n_rows: int) -> str:
    """For a build short of its target (stopped, or out of rounds): the size reached and the command
    that continues it, on a Ray cluster for more GPUs; empty for a complete build."""
    target = funnel["config"].get("target")
    if not target or n_rows >= target:
        return ""
    return (f"\nThis build reached {n_rows:,} of its target {target:,} rows (status `{funnel.get('status', '?')}`). "
            "The same command, run again on the same build folder, continues it where it stopped; on more GPUs, "
            "with one filter worker per GPU of a Ray cluster (`--address` joins an existing one):\n\n"
            f"```bash\n{build_command(config_for_ray(funnel['config']))}\n```\n")


def config_for_ray(config: dict) -> dict:
    """The build's flags with `--runner ray` and the device pinned to cuda (the driver may see no GPU)."""
    return {**config, "device": "cuda", "runner": "ray"}


def _check_funnel(funnel: dict) -> None:
    if not isinstance(funnel, dict):
        raise TaskError(f"funnel is a {type(funnel).__name__}, not a JSON object")
    missing = [k for k in FUNNEL_KEYS if k not in funnel]
    if missing:
        raise TaskError(f"funnel lacks keys {missing}")
    for n, stage in enumerate(funnel["stages"]):
        if not isinstance(stage, dict) or not {"stage", "in", "kept"} <= stage.keys():
            raise TaskError(f"funnel stage {n} lacks keys stage/in/kept")


def _front_matter(card: str) -> dict:
    """The card's YAML metadata, parsed (TaskError if it does not parse)."""
    head, sep, _ = card.removeprefix("---\n").partition("\n---\n")
    try:
        meta = yaml.safe_load(head) if card.startswith("---\n") and sep else None
    except yaml.YAMLError as e:
        raise TaskError(f"card YAML does not parse: {_one_line(e)}") from e
    if not isinstance(meta, dict):
        raise TaskError("card has no YAML front matter between '---' lines")
    return meta


def _dataset_info_yaml(n_rows: int, sizes: dict | None) -> str:
    from datasets.info import DatasetInfosDict
    from huggingface_hub import DatasetCardData

    info = datasets.DatasetInfo(features=FEATURES, splits=datasets.SplitDict())
    info.splits.add(datasets.SplitInfo(name=SPLIT, num_examples=n_rows,
                                       num_bytes=(sizes or {}).get("num_bytes", 0)))
    if sizes:
        info.download_size, info.dataset_size = sizes["download_size"], sizes["num_bytes"]
    data = DatasetCardData()
    DatasetInfosDict({"default": info}).to_dataset_card_data(data)
    meta = data.to_dict()["dataset_info"]
    if not sizes:  # sizes unknown: say nothing rather than 0 bytes
        for split in meta["splits"]:
            split.pop("num_bytes", None)
        for key in ("download_size", "dataset_size"):
            meta.pop(key, None)
    return yaml.safe_dump({"dataset_info": meta}, sort_keys=False)


def _thresholds() -> tuple[float, float]:
    from cudagym.dedup import PARITY_THRESHOLD, STRONG_THRESHOLD

    return PARITY_THRESHOLD, STRONG_THRESHOLD


def _dtype(feature) -> str:
    if isinstance(feature, datasets.List):
        return f"list<{feature.feature.dtype}>"
    return feature.dtype


def _fmt(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.3f}".rstrip("0").rstrip(".") if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


def _funnel_table(stages: list[dict]) -> str:
    rows = []
    for s in stages:
        dropped = {str(k): int(v) for k, v in (s.get("dropped") or {}).items() if v}
        reasons = ", ".join(f"`{r}` {n}" for r, n in sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0])))
        rows.append([s["stage"], s["in"], s["kept"], sum(dropped.values()), reasons or "–"])
    return _md_table(["stage", "in", "kept", "dropped", "drop reasons"], rows)


def _k_counts(k_distribution: dict) -> list[tuple[int, int]]:
    return sorted((int(k), int(n)) for k, n in k_distribution.items())


def _k_table(k_distribution: dict) -> str:
    counts = _k_counts(k_distribution)
    total = sum(n for _, n in counts)
    return _md_table(["K", "tasks", "share"],
                     [[k, n, f"{100 * n / total:.2f}%" if total else "–"] for k, n in counts])


def _k_comparison(k_distribution: dict) -> str:
    """Each K's share here beside CUDA-Agent-Ops-6K's (its torch rows, as released)."""
    counts = dict(_k_counts(k_distribution))
    total = sum(counts.values())
    theirs = {int(s.split("#")[1]): n for s, n in OPS_6K_SOURCES.items() if s.startswith("torch#")}
    their_total = sum(theirs.values())
    rows = [[k, counts.get(k, 0), f"{100 * counts.get(k, 0) / total:.2f}%" if total else "–",
             theirs.get(k, 0), f"{100 * theirs.get(k, 0) / their_total:.2f}%"] for k in sorted(set(counts) | set(theirs))]
    return ("Against CUDA-Agent-Ops-6K as released (its torch rows):\n\n"
            + _md_table(["K", "tasks here", "share", "CUDA-Agent-Ops-6K", "its share"], rows))


def _contamination_table(contamination: dict) -> str:
    rows = []
    for check in ("parity", "strong"):
        stats = contamination.get(check) or {}
        rows.append([check, *(_fmt(stats.get(key)) for key in ("max", "p50", "p90", "n_over_0.9"))])
    return _md_table(["check", "max", "p50", "p90", "tasks > 0.9"], rows)


# --------------------------------------------------------------------------------------------
# The hub folder
# --------------------------------------------------------------------------------------------

def write_hub_folder(rows: list[dict], funnel: dict, folder: str | Path, repo_id: str | None = None) -> Path:
    """Write exactly `folder/README.md` and `folder/PARQUET_PATH`, atomically: the files go to a
    sibling temporary folder that then replaces `folder`, so a killed run leaves the old folder or
    the new one, never half of one. An existing `folder` is replaced only if it holds nothing but a
    previous hub folder's files."""
    folder = Path(folder)
    dataset = rows_to_dataset(rows)
    _check_k_distribution(funnel, dataset)
    _check_replaceable(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        parquet = tmp / PARQUET_PATH
        parquet.parent.mkdir(parents=True)
        _quietly(dataset.to_parquet, str(parquet))
        sizes = {"num_bytes": dataset.data.nbytes, "download_size": parquet.stat().st_size}
        (tmp / "README.md").write_text(render_card(funnel, len(dataset), repo_id, dataset_info=sizes))
        tmp.chmod(0o755)
        _replace_dir(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote %s (%d rows)", folder, len(dataset))
    return folder


def _check_k_distribution(funnel: dict, dataset: datasets.Dataset) -> None:
    _check_funnel(funnel)
    stated = {k: n for k, n in _k_counts(funnel["k_distribution"]) if n}
    actual = dict(sorted(Counter(dataset["k"]).items()))
    if stated != actual:
        raise TaskError(f"funnel k_distribution {stated} does not match the rows {actual}")


def _check_replaceable(folder: Path) -> None:
    if not folder.exists():
        return
    if not folder.is_dir():
        raise TaskError(f"{folder} exists and is not a directory")
    def ours(p: Path) -> bool:
        if p.parent == folder:
            return p.name == "README.md" and p.is_file() or p.name == "data" and p.is_dir()
        return p.parent == folder / "data" and p.suffix == ".parquet" and p.is_file()

    foreign = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if not ours(p)]
    if foreign:
        raise TaskError(f"{folder} holds files that are not a hub folder's ({', '.join(sorted(foreign)[:3])}); "
                        "refusing to replace it")


def _replace_dir(new: Path, target: Path) -> None:
    if not target.exists():
        os.rename(new, target)
        return
    old = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.old")
    os.rename(target, old)
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Publish
# --------------------------------------------------------------------------------------------

class Hub(Protocol):
    def push(self, dataset: datasets.Dataset, card: Path, repo_id: str, token: str) -> str:
        """Upload the rows and the card to the dataset repo; return its URL."""


class HubClient:
    """The real Hub: `Dataset.push_to_hub` (creates the repo if needed, replaces old train shards),
    then README.md through `HfApi.upload_file` (overwriting the card push_to_hub generated)."""

    def push(self, dataset: datasets.Dataset, card: Path, repo_id: str, token: str) -> str:
        from huggingface_hub import HfApi, constants

        try:
            dataset.push_to_hub(repo_id, token=token, split=SPLIT, num_shards=1,
                                commit_message=f"cudagym: {len(dataset)} tasks")
            HfApi(token=token).upload_file(path_or_fileobj=str(card), path_in_repo="README.md", repo_id=repo_id,
                                           repo_type="dataset", commit_message="cudagym: dataset card")
        except _hub_errors() as e:
            raise PublishError(f"push to {repo_id} failed: {type(e).__name__}: {_one_line(e)}") from e
        return f"{constants.ENDPOINT}/datasets/{repo_id}"


def publish(build_dir: str | Path, repo_id: str, dry_run: bool = True, token: str | None = None,
            out: str | Path | None = None, *, hub: Hub | None = None) -> Path | str:
    """Publish a build (`BUILD/dataset/` and `BUILD/funnel.json`) as `repo_id`.

    dry_run: write the folder that would be uploaded to `out` (default `BUILD/hub`) and return it;
    nothing touches the network. Otherwise push with `token` (default: the user's Hugging Face
    token) and return the dataset's URL; failures are `PublishError`."""
    check_repo_id(repo_id)
    build_dir = Path(build_dir)
    if not build_dir.is_dir():
        raise TaskError(f"no build directory: {build_dir}")
    funnel = load_funnel(build_dir / "funnel.json")
    rows = read_build_rows(build_dir / "dataset")
    if dry_run:
        return write_hub_folder(rows, funnel, Path(out) if out is not None else build_dir / "hub", repo_id)

    from huggingface_hub import constants, get_token

    if constants.is_offline_mode():
        raise PublishError("cannot push: HF_HUB_OFFLINE is set (unset it, or use --dry-run)")
    token = token or get_token()
    if not token:
        raise PublishError("cannot push: no Hugging Face token (set HF_TOKEN or run `hf auth login`)")
    with tempfile.TemporaryDirectory(prefix="cudagym-publish-") as tmp:
        folder = write_hub_folder(rows, funnel, Path(tmp) / "hub", repo_id)
        dataset = rows_to_dataset(read_rows(folder / PARQUET_PATH))
        return (hub or HubClient()).push(dataset, folder / "README.md", repo_id, token)


def load_funnel(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"no funnel.json in {path.parent} (is it a `cudagym dataset build` output?)")
    try:
        funnel = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TaskError(f"{path}: not JSON ({e.msg})") from None
    _check_funnel(funnel)
    return funnel


def read_build_rows(dataset_dir: str | Path) -> list[dict]:
    """The rows of a hub folder (a build's `dataset/`), from its `data/train-*.parquet` shards."""
    dataset_dir = Path(dataset_dir)
    shards = sorted((dataset_dir / "data").glob(f"{SPLIT}-*.parquet"))
    if not shards:
        raise TaskError(f"no {SPLIT} parquet under {dataset_dir / 'data'} (is it a `cudagym dataset build` output?)")
    return [row for shard in shards for row in read_rows(shard)]


def _hub_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError, ValueError, RuntimeError]  # HfHubHTTPError and offline are OSError
    try:
        import httpx2  # huggingface_hub >= 2: raw transport errors

        errors.append(httpx2.HTTPError)
    except ImportError:
        pass
    return tuple(errors)


def _quietly(fn, *args):
    """fn(*args) without datasets' progress bars (a library call, not a CLI screen)."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        return fn(*args)
    finally:
        if not was_disabled:
            enable_progress_bars()


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
