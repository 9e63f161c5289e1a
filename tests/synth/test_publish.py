"""The Publish stage: hub folder, data card, dry-run and push paths (cudagym/synth/publish.py).

CPU-only and offline: HF_HUB_OFFLINE=1 (conftest) and a socket guard make any network call fail;
the push path is checked up to the Hub client, which a test replaces.
"""

from __future__ import annotations

import json
import socket

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from huggingface_hub import constants as hub_constants

from cudagym.synth import publish as pub
from cudagym.synth.publish import (
    FEATURES,
    PARQUET_PATH,
    HubClient,
    PublishError,
    check_repo_id,
    publish,
    render_card,
    rows_to_dataset,
    size_category,
    write_hub_folder,
)
from cudagym.tasks import TaskError, read_rows

REPO = "someone/cudagym-ops"


class NetworkUsed(BaseException):
    """Raised by the socket guard; a BaseException so no `except Exception` can swallow it."""


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise NetworkUsed(f"network call: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def make_row(i: int, k: int, **over) -> dict:
    row = {
        "id": f"synth/{i:012x}", "name": f"Conv2d_ReLU_{i}", "level": 1 if k == 1 else 2, "problem_id": i,
        "code": f"import torch\nclass Model(torch.nn.Module):\n    pass  # {i}\n",
        "ops": ["torch.nn.Conv2d", "torch.relu"][:k], "data_source": f"torch#{k}", "k": k,
        "seed_ids": [f"torch/seed{j}" for j in range(k)], "seed_ops": ["Conv2d", "relu"][:k],
        "composer": "programmatic", "model": "", "eager_ms": 0.5 + i, "compile_ms": 0.25 + i,
        "filter_device": "cpu", "parity_max": 0.31, "parity_match": "L2/17_Conv2d_InstanceNorm_Divide",
        "strong_max": 0.42, "strong_match": "L1/19_ReLU", "sha256": f"{i:064x}",
    }
    row.update(over)
    return row


@pytest.fixture
def rows() -> list[dict]:
    return [make_row(1, 1, ops=[], seed_ids=[], seed_ops=[]), make_row(2, 2), make_row(3, 2), make_row(4, 3)]


@pytest.fixture
def funnel() -> dict:
    return {
        "stages": [
            {"stage": "crawl", "in": 412, "kept": 287, "dropped": {"no_meta_kernel": 71, "needs_args": 54}},
            {"stage": "compose", "in": 37, "kept": 29, "dropped": {"shape_mismatch": 8}},
            {"stage": "filter", "in": 29, "kept": 11, "dropped": {"nondeterministic": 13, "timeout": 5}},
            {"stage": "dedup", "in": 11, "kept": 7, "dropped": {"exact_duplicate": 3, "near_duplicate": 1}},
            {"stage": "decontaminate", "in": 7, "kept": 4, "dropped": {"parity": 2, "strong": 1}},
            {"stage": "label", "in": 4, "kept": 4, "dropped": {}},
            {"stage": "publish", "in": 4, "kept": 4, "dropped": {}},
        ],
        "k_distribution": {"1": 1, "2": 2, "3": 1},
        "contamination": {
            "parity": {"max": 0.8125, "p50": 0.31, "p90": 0.7, "n_over_0.9": 0},
            "strong": {"max": 0.66, "p50": 0.42, "p90": 0.6, "n_over_0.9": 0},
            "references": "KernelBench v0.1 L1-3 (250 problems)",
        },
        "config": {"out": "out/ops6k", "composer": "programmatic", "target": 6000, "seed": 7, "llm_model": None},
        "versions": {"cudagym": "0.1.0", "torch": "2.13.0", "datasets": "5.2.0"},
        "created": "2026-05-01T12:00:00+00:00",
    }


@pytest.fixture
def build_dir(tmp_path, rows, funnel):
    build = tmp_path / "build"
    write_hub_folder(rows, funnel, build / "dataset")
    (build / "funnel.json").write_text(json.dumps(funnel))
    return build


def files_of(folder) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("\n---\n", 1)[0].removeprefix("---\n"))


# --------------------------------------------------------------------------------------------
# The hub folder
# --------------------------------------------------------------------------------------------

def test_hub_folder_holds_exactly_the_card_and_one_parquet(tmp_path, rows, funnel):
    folder = write_hub_folder(rows, funnel, tmp_path / "hub", REPO)
    assert folder == tmp_path / "hub"
    assert files_of(folder) == ["README.md", PARQUET_PATH] == ["README.md", "data/train-00000-of-00001.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub"]  # no temporary folder left beside it


def test_hub_folder_loads_with_load_dataset_offline(tmp_path, rows, funnel):
    folder = write_hub_folder(rows, funnel, tmp_path / "hub", REPO)
    loaded = datasets.load_dataset(str(folder), cache_dir=str(tmp_path / "cache"))
    assert list(loaded) == ["train"]
    assert loaded["train"].features == FEATURES
    assert loaded["train"].to_list() == rows
    assert read_rows(folder / PARQUET_PATH) == rows  # the parquet alone is a cudagym task set too
    assert files_of(folder) == ["README.md", PARQUET_PATH]  # loading wrote nothing into the folder


def test_types_are_declared_not_inferred(tmp_path, funnel):
    only = [make_row(1, 1, ops=[], seed_ids=[], seed_ops=[], eager_ms=1, compile_ms=2)]  # ints in float columns
    funnel["k_distribution"] = {"1": 1}
    folder = write_hub_folder(only, funnel, tmp_path / "hub")
    schema = pq.read_schema(folder / PARQUET_PATH)
    assert pa.types.is_list(schema.field("ops").type) and schema.field("ops").type.value_type == pa.string()
    assert schema.field("eager_ms").type == pa.float64()
    assert rows_to_dataset(only).features == FEATURES


def test_card_yaml_declares_license_size_configs_and_features(tmp_path, rows, funnel):
    folder = write_hub_folder(rows, funnel, tmp_path / "hub", REPO)
    meta = front_matter((folder / "README.md").read_text())
    assert meta["license"] == "apache-2.0"
    assert meta["task_categories"] == ["text-generation"]
    assert meta["tags"] == ["cuda", "kernels", "pytorch", "code"]
    assert meta["size_categories"] == ["n<1K"]
    assert meta["configs"] == [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}]
    info = meta["dataset_info"]
    assert [f["name"] for f in info["features"]] == list(FEATURES)
    assert info["splits"] == [{"name": "train", "num_bytes": info["dataset_size"], "num_examples": 4}]
    assert info["download_size"] == (folder / PARQUET_PATH).stat().st_size


@pytest.mark.parametrize("n, category", [(0, "n<1K"), (999, "n<1K"), (1000, "1K<n<10K"), (6000, "1K<n<10K"),
                                         (10_000, "10K<n<100K"), (2_000_000, "1M<n<10M")])
def test_size_category(n, category):
    assert size_category(n) == category
    assert front_matter(render_card(_funnel_for(n), n, None))["size_categories"] == [category]


def _funnel_for(n: int) -> dict:
    return {"stages": [], "k_distribution": {"2": n}, "contamination": {}, "config": {}, "versions": {},
            "created": "2026-05-01"}


def test_card_shows_funnel_k_distribution_contamination_and_regeneration(rows, funnel):
    card = render_card(funnel, len(rows), REPO)
    assert "| crawl | 412 | 287 | 125 | `no_meta_kernel` 71, `needs_args` 54 |" in card
    assert "| filter | 29 | 11 | 18 | `nondeterministic` 13, `timeout` 5 |" in card
    assert "| decontaminate | 7 | 4 | 3 | `parity` 2, `strong` 1 |" in card
    assert "| label | 4 | 4 | 0 | – |" in card
    assert "| 2 | 2 | 50.00% |" in card and "| 3 | 1 | 25.00% |" in card
    assert "| 2 | 2 | 50.00% | 5026 | 84.77% |" in card and "| 5 | 0 | 0.00% | 74 | 1.25% |" in card
    assert "| parity | 0.812 | 0.31 | 0.7 | 0 |" in card
    assert "KernelBench v0.1 L1-3 (250 problems)" in card
    assert "cudagym dataset build --out out/ops6k --composer programmatic --target 6000 --seed 7\n" in card
    assert f"cudagym dataset publish out/ops6k --repo {REPO}" in card
    assert f'load_dataset("{REPO}", split="train")' in card
    assert "| `ops` | list<string> |" in card
    assert "$" not in card  # every placeholder filled
    assert set(pub.COLUMN_DOCS) == set(FEATURES)


def test_build_command_from_config():
    config = {"out": "my dir", "target": 60, "resume": True, "dry": False, "llm": None, "levels": [1, 2],
              "k_distribution": {"2": 0.8, "3": 0.2}}
    assert pub.build_command(config) == ("cudagym dataset build --out 'my dir' --target 60 --resume --levels 1,2 "
                                         "--k-distribution '{\"2\":0.8,\"3\":0.2}'")


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

def test_rows_that_do_not_fit_the_features_are_task_errors(rows, funnel, tmp_path):
    with pytest.raises(TaskError, match=r"row 1 .*missing columns \['sha256'\]"):
        rows_to_dataset([rows[0], {k: v for k, v in rows[1].items() if k != "sha256"}])
    with pytest.raises(TaskError, match=r"unexpected columns \['extra'\]"):
        rows_to_dataset([{**rows[0], "extra": 1}])
    with pytest.raises(TaskError, match="do not match the dataset features"):
        rows_to_dataset([{**rows[0], "k": "two"}])
    funnel["k_distribution"] = {"2": 4}
    with pytest.raises(TaskError, match="k_distribution .* does not match the rows"):
        write_hub_folder(rows, funnel, tmp_path / "hub")
    assert not (tmp_path / "hub").exists()


def test_funnel_without_required_keys_is_a_task_error(rows, funnel):
    del funnel["contamination"]
    with pytest.raises(TaskError, match=r"funnel lacks keys \['contamination'\]"):
        render_card(funnel, len(rows), None)


@pytest.mark.parametrize("repo_id", ["noslash", "a/b/c", "/name", "owner/", "owner/na me", "-owner/name",
                                     "owner/name.", "owner/na--me", "owner/na..me", "", "x" * 97 + "/y"])
def test_bad_repo_id_is_a_value_error(repo_id, build_dir):
    with pytest.raises(ValueError, match="expected OWNER/NAME"):
        check_repo_id(repo_id)
    with pytest.raises(ValueError, match="expected OWNER/NAME"):
        publish(build_dir, repo_id, dry_run=True)


@pytest.mark.parametrize("repo_id", ["someone/cudagym-ops", "Org_1/ops.6k", "a/b"])
def test_good_repo_id(repo_id):
    assert check_repo_id(repo_id) == repo_id


def test_missing_build_funnel_or_dataset_is_a_one_line_task_error(tmp_path, build_dir):
    with pytest.raises(TaskError, match="no build directory") as e:
        publish(tmp_path / "nope", REPO)
    assert "\n" not in str(e.value)
    (build_dir / "funnel.json").unlink()
    with pytest.raises(TaskError, match="no funnel.json in"):
        publish(build_dir, REPO)
    (build_dir / "funnel.json").write_text("{not json")
    with pytest.raises(TaskError, match="not JSON"):
        publish(build_dir, REPO)
    (build_dir / "funnel.json").write_text("{}")
    with pytest.raises(TaskError, match="funnel lacks keys"):
        publish(build_dir, REPO)


def test_missing_dataset_folder_is_a_task_error(build_dir):
    for f in (build_dir / "dataset" / "data").iterdir():
        f.unlink()
    with pytest.raises(TaskError, match="no train parquet under"):
        publish(build_dir, REPO)


# --------------------------------------------------------------------------------------------
# Atomic replacement
# --------------------------------------------------------------------------------------------

def test_rewrite_replaces_a_previous_hub_folder(tmp_path, rows, funnel):
    folder = write_hub_folder(rows, funnel, tmp_path / "hub")
    (folder / "data" / "train-00000-of-00002.parquet").write_bytes(b"stale shard")
    write_hub_folder(rows[:2], {**funnel, "k_distribution": {"1": 1, "2": 1}}, folder, REPO)
    assert files_of(folder) == ["README.md", PARQUET_PATH]
    assert read_rows(folder / PARQUET_PATH) == rows[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub"]


def test_a_failed_write_keeps_the_old_folder_and_leaves_no_temp(tmp_path, rows, funnel, monkeypatch):
    folder = write_hub_folder(rows, funnel, tmp_path / "hub")
    before = (folder / "README.md").read_text()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pub, "render_card", killed)
    with pytest.raises(KeyboardInterrupt):
        write_hub_folder(rows, funnel, folder, REPO)
    assert (folder / "README.md").read_text() == before
    assert files_of(folder) == ["README.md", PARQUET_PATH]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub"]


def test_refuses_to_replace_a_folder_with_other_files(tmp_path, rows, funnel):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(TaskError, match="refusing to replace"):
        write_hub_folder(rows, funnel, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# --------------------------------------------------------------------------------------------
# publish
# --------------------------------------------------------------------------------------------

def test_dry_run_writes_the_upload_folder_and_nothing_else(tmp_path, build_dir, rows, funnel):
    out = publish(build_dir, REPO, dry_run=True)
    assert out == build_dir / "hub"
    assert files_of(out) == ["README.md", PARQUET_PATH]
    assert read_rows(out / PARQUET_PATH) == rows
    expected = write_hub_folder(rows, funnel, tmp_path / "expected", REPO)
    assert (out / "README.md").read_text() == (expected / "README.md").read_text()
    assert f'load_dataset("{REPO}"' in (out / "README.md").read_text()
    assert 'load_dataset("path/to/this/folder"' in (build_dir / "dataset" / "README.md").read_text()
    assert publish(build_dir, REPO, out=tmp_path / "elsewhere") == tmp_path / "elsewhere"


def test_push_when_offline_is_a_one_line_publish_error(build_dir):
    assert hub_constants.is_offline_mode()  # conftest / Makefile set HF_HUB_OFFLINE=1
    with pytest.raises(PublishError, match="HF_HUB_OFFLINE is set") as e:
        publish(build_dir, REPO, dry_run=False, token="hf_test")
    assert isinstance(e.value, TaskError) and "\n" not in str(e.value)  # the CLI prints TaskError as one line


def test_push_without_a_token_is_a_one_line_publish_error(build_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(PublishError, match="no Hugging Face token") as e:
        publish(build_dir, REPO, dry_run=False)
    assert "\n" not in str(e.value)


class FakeHub:
    def __init__(self):
        self.calls = []

    def push(self, dataset, card, repo_id, token):
        self.calls.append({"rows": dataset.to_list(), "features": dataset.features, "card": card.read_text(),
                           "repo_id": repo_id, "token": token})
        return f"https://huggingface.co/datasets/{repo_id}"


def test_push_sends_the_dry_run_folder_contents(build_dir, rows, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    hub = FakeHub()
    url = publish(build_dir, REPO, dry_run=False, token="hf_test", hub=hub)
    assert url == f"https://huggingface.co/datasets/{REPO}"
    [call] = hub.calls
    assert call["rows"] == rows and call["features"] == FEATURES
    assert call["repo_id"] == REPO and call["token"] == "hf_test"
    assert not (build_dir / "hub").exists()  # the push staged its folder in a temporary directory
    dry = publish(build_dir, REPO, dry_run=True)
    assert call["card"] == (dry / "README.md").read_text()


def test_real_hub_client_fails_fast_and_cleanly_offline(tmp_path, rows, funnel):
    folder = write_hub_folder(rows, funnel, tmp_path / "hub", REPO)
    with pytest.raises(PublishError, match=f"push to {REPO} failed: OfflineModeIsEnabled") as e:
        HubClient().push(rows_to_dataset(rows), folder / "README.md", REPO, "hf_test")
    assert "\n" not in str(e.value)


def test_template_is_found():
    assert pub.template_path().name == "cudagym_ops.md"
    assert pub.template_path().parent.name == "data_cards"
