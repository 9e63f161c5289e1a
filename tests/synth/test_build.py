"""A whole dataset build on the CPU: resumable, a funnel that adds up, rows that hold what they claim."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import datasets
import duckdb
import pytest

from cudagym.cli import main
from cudagym.dedup.near import fingerprint
from cudagym.kernelbench import load_problems
from cudagym.synth.build import BuildConfig, BuildStore, build_dataset, decontaminate_stage, dedup_stage
from cudagym.synth.compose import data_source_of, ops_from_code
from cudagym.synth.filter import FilterConfig, FilterResult, filter_tasks
from cudagym.synth.publish import read_build_rows
from cudagym.synth.scale import REASONS
from cudagym.tasks import Task, TaskError

pytestmark = pytest.mark.slow
TARGET = 6


def _config(out, **kw) -> BuildConfig:
    return BuildConfig(out=str(out), target=kw.pop("target", TARGET), seed=3, transformers=False, parallel=2, **kw)


def _counts(path) -> dict:
    db = duckdb.connect(str(path), read_only=True)
    try:
        return {t: db.execute(f"SELECT count(*), max(created) FROM {t}").fetchone() for t in ("candidates", "filtered")}
    finally:
        db.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory, kernelbench_path):
    out = tmp_path_factory.mktemp("build")
    funnel = build_dataset(_config(out))
    return out, funnel


def test_build_writes_dataset_card_and_funnel(built):
    out, funnel = built
    assert sorted(p.name for p in (out / "dataset").iterdir()) == ["README.md", "data"]
    assert json.loads((out / "funnel.json").read_text()) == funnel
    loaded = datasets.load_dataset(str(out / "dataset"), split="train")
    assert loaded.num_rows == TARGET
    card = (out / "dataset" / "README.md").read_text()
    assert "cudagym dataset build" in card and "| filter |" in card.replace("`", "")
    # what the composed code and shapes depend on, in the card and the funnel
    import platform

    import torch
    import transformers

    assert funnel["versions"] == {"cudagym": funnel["versions"]["cudagym"], "torch": torch.__version__,
                                  "transformers": transformers.__version__, "python": platform.python_version()}
    assert f"torch {torch.__version__}, transformers {transformers.__version__}, python" in card
    assert funnel["status"] == "complete" and "note" not in funnel


def test_funnel_adds_up_stage_by_stage(built):
    _, funnel = built
    stages = funnel["stages"]
    assert [s["stage"] for s in stages] == ["crawl", "compose", "dedup", "decontaminate", "filter", "label", "publish"]
    for stage in stages:
        assert stage["in"] == stage["kept"] + sum(stage["dropped"].values()), stage
    for before, after in zip(stages[1:], stages[2:]):  # from dedup on, each stage takes what the last kept
        assert after["in"] == before["kept"], (before, after)
    assert stages[-1]["kept"] == TARGET
    assert sum(int(n) for n in funnel["k_distribution"].values()) == TARGET


def test_rows_are_labelled_from_their_code_unique_and_uncontaminated(built):
    out, _ = built
    rows = read_build_rows(out / "dataset")
    for row in rows:
        assert row["ops"] == ops_from_code(row["code"]) and row["ops"]
        assert row["data_source"] == data_source_of(row["code"]) == f"torch#{row['k']}"
        assert row["parity_max"] <= 0.9 and row["strong_max"] < 0.9
        assert row["eager_ms"] > 0 and row["filter_device"] == "cpu"
    assert len({fingerprint(r["code"])[0] for r in rows}) == len(rows)  # no two share a normalised AST
    assert [r["problem_id"] for r in rows] == list(range(1, len(rows) + 1))


def test_published_rows_re_execute_in_eager_and_compiled_mode(built):
    out, _ = built
    tasks = [Task(id=r["id"], name=r["name"], code=r["code"]) for r in read_build_rows(out / "dataset")]
    kept, rejects, _ = filter_tasks(tasks, FilterConfig(device="cpu", parallel=2))
    assert not rejects, [(t.id, r.reason, r.detail) for t, r in rejects]
    assert len(kept) == TARGET


def test_rerun_resumes_without_redoing_work(built):
    out, funnel = built
    before = _counts(out / "build.duckdb")
    again = build_dataset(_config(out))
    assert _counts(out / "build.duckdb") == before  # nothing composed or filtered again
    assert again["stages"] == funnel["stages"]


def test_a_larger_target_only_adds_what_is_missing(built):
    out, _ = built
    before = _counts(out / "build.duckdb")
    funnel = build_dataset(_config(out, target=2 * TARGET))
    after = _counts(out / "build.duckdb")
    assert funnel["stages"][-1]["kept"] == 2 * TARGET
    assert after["filtered"][0] > before["filtered"][0]
    assert after["candidates"][0] > before["candidates"][0]
    rows = read_build_rows(out / "dataset")
    assert len(rows) == 2 * TARGET
    build_dataset(_config(out))  # back to the original target for the other tests


def test_the_store_keeps_a_first_pass_check_until_its_task_is_filtered(tmp_path):
    """A GPU build stopped between the filter's passes: what pass 1 measured outlives the process
    (the re-run hands it to run_filter as `checked`), and is dropped once the task has a decision."""
    measured = {"stage": "checked", "compile_s": 1.25, "aten_ops": ["addmm"], "wait_s": 0.5}
    with BuildStore(tmp_path / "build.duckdb") as store:
        store.add_checked("a" * 64, measured)
        store.add_checked("b" * 64, {**measured, "compile_s": 2.0})
    with BuildStore(tmp_path / "build.duckdb") as store:  # a new process
        assert store.checked() == {"a" * 64: measured, "b" * 64: {**measured, "compile_s": 2.0}}
        store.add_filtered("a" * 64, FilterResult(True, "", "", 5.0, 4.0, "NVIDIA H200", 1.25, 0.1, 0.5))
        assert list(store.checked()) == ["b" * 64]
        assert store.filtered()["a" * 64].keep


def test_a_build_resumed_with_two_filter_passes_checks_then_times_what_it_adds(built, tmp_path, capsys):
    """--filter-passes 2 (a GPU's default) on the CPU: the added candidates are checked and compiled in
    one pass of judges, then the survivors timed in another; the rows already published stay first."""
    out, _ = built
    shutil.copytree(out, tmp_path / "copy")
    before = [r["code"] for r in read_build_rows(out / "dataset")]
    with BuildStore(out / "build.duckdb") as store:
        target = sum(r.keep for r in store.filtered().values()) + 2  # more than the first build filtered
    capsys.readouterr()
    build_dataset(_config(tmp_path / "copy", target=target, filter_passes=2, filter_stream=False))
    passes = [line.split(":")[0] for line in capsys.readouterr().err.splitlines() if line.startswith("filter ")]
    assert passes and set(passes) == {"filter check pass", "filter timing pass"}, passes
    rows = read_build_rows(tmp_path / "copy" / "dataset")
    assert len(rows) == target and [r["code"] for r in rows[:TARGET]] == before
    with pytest.raises(ValueError, match="filter_passes"):
        _config(tmp_path, filter_passes=3)


def test_other_settings_refuse_the_same_folder(built):
    out, _ = built
    with pytest.raises(TaskError, match="other settings"):
        build_dataset(BuildConfig(out=str(out), target=TARGET, seed=4, transformers=False))


def test_the_scale_searchs_probe_cap_may_change_between_runs_of_a_build_its_bracket_may_not(tmp_path):
    """The cap only ends searches sooner or later: every stored result stays right, so a build made
    with another cap (or before the cap left the identity: it was there until session 16) resumes."""
    config = _config(tmp_path, scale_search=True)
    legacy = config.identity()
    legacy["scale_search"] = {**legacy["scale_search"], "probes": 6}
    with BuildStore(tmp_path / "build.duckdb") as store:
        store.check_identity(legacy)
    with BuildStore(tmp_path / "build.duckdb") as store:
        store.check_identity(dataclasses.replace(config, scale_probes=2).identity())
        with pytest.raises(TaskError, match=r"other settings \(scale_search\)"):
            store.check_identity(dataclasses.replace(config, max_scale=64).identity())


def test_kernelbench_problems_and_disguised_copies_are_dropped_by_decontamination(tmp_path, kernelbench_path):
    problem = load_problems("v0.1", [2])[16]
    disguised = re.sub(r"\bModel\b", "Model", problem.code)
    disguised = re.sub(r"\bx\b", "inp", disguised).replace("    ", "  ")  # renamed and reformatted
    disguised = re.sub(r"batch_size = (\d+)", lambda m: f"batch_size = {2 * int(m.group(1))}", disguised)  # resized
    disguised = '"""A fused operator."""\n' + disguised
    with BuildStore(tmp_path / "build.duckdb") as store:
        tasks = [Task(id="kb", name="kb", code=problem.code), Task(id="copy", name="copy", code=disguised)]
        store.add_candidates(tasks, 0)
        seqs, dedup = dedup_stage(store)
        assert dedup["dropped"] == {"exact_duplicate": 1}  # resized and renamed: the same normalised AST
        kept, entry = decontaminate_stage(store, _config(tmp_path), {1, 2})
        assert kept == set() and sum(entry["dropped"].values()) == 2


def test_build_and_publish_from_the_cli(built, tmp_path, capsys):
    out, _ = built
    assert main(["dataset", "build", "--out", str(out), "--target", str(TARGET), "--seed", "3", "--no-transformers",
                 "--device", "cpu", "--parallel", "2", "--no-filter-stream"]) == 0
    printed = capsys.readouterr().out
    assert "dataset funnel" in printed and "decontaminate" in printed
    # the card's command regenerates the build with the flags given, the streamed filter's default turned off among them
    assert "--no-filter-stream" in (out / "dataset" / "README.md").read_text()
    assert main(["dataset", "publish", str(out), "--repo", "someone/cudagym-ops", "--dry-run",
                 "--out", str(tmp_path / "hub")]) == 0
    assert sorted(p.name for p in (tmp_path / "hub").iterdir()) == ["README.md", "data"]
    assert "someone/cudagym-ops" in (tmp_path / "hub" / "README.md").read_text()


@pytest.mark.parametrize("probes", ["streamed", "waves"])
def test_scale_search_sizes_candidates_into_the_window(tmp_path, kernelbench_path, capsys, probes):
    """--scale search on the CPU (one round), with a window narrow enough that scale 1 is mostly too
    fast: each candidate's probes and choice are stored, the sized code goes through the filter, and
    the funnel's scale stage counts a reason per candidate it did not size. Probes streamed to one set
    of judges (one line for them all) or in waves (a line per wave), with the same outcome."""
    window = (1.0, 3.0)
    config = _config(tmp_path, target=2, max_rounds=1, scale_search=True, max_scale=6, scale_start=1, scale_probes=3,
                     min_eager_ms=window[0], max_eager_ms=window[1], probes=probes)
    funnel = build_dataset(config)
    stages = {s["stage"]: s for s in funnel["stages"]}
    scale = stages["scale"]
    prefix = "scale search probes, streamed: " if probes == "streamed" else "scale search probes: "
    waves = [line for line in capsys.readouterr().err.splitlines() if line.startswith(prefix)]
    if probes == "streamed":  # one line, over every probe of the round
        assert len(waves) == 1 and waves[0].startswith(f"{prefix}{scale['probes']} in ")
    else:
        assert 2 <= len(waves) <= 3  # a line per wave of probes
    assert all("; judge seconds " in line for line in waves)
    assert all(re.search(r"\bcall \d+ \(median [\d.]+\)", line) for line in waves)  # their untimed first calls
    # the judges' starts, models built on the CPU, moves to the device and inputs, and when the results came in
    assert all(re.search(r"\bstart \d+ \(median [\d.]+\), construct \d+ \(median [\d.]+\), inputs \d+", line)
               for line in waves)
    assert all(re.search(r"; half done at \d+ s, the last at \d+ s$", line) for line in waves)
    assert [s["stage"] for s in funnel["stages"]][1:4] == ["compose", "scale", "dedup"]
    assert scale["in"] == stages["compose"]["kept"] and scale["in"] == scale["kept"] + sum(scale["dropped"].values())
    assert stages["dedup"]["in"] == scale["kept"] and set(scale["dropped"]) <= set(REASONS) | {"duplicate"}
    with BuildStore(tmp_path / "build.duckdb") as store:
        sized, candidates = store.sized(), dict(store.candidates())
        filtered = store.filtered()
    assert len(sized) == scale["in"] and scale["probes"] == sum(len(s["probes"]) for s in sized.values()) > 0
    assert any(len(found["probes"]) > 1 for found in sized.values())  # scale 1 too fast: it searched
    for found in sized.values():
        assert 1 <= len(found["probes"]) <= 3 and all(1 <= k <= 6 for k in found["probes"])
        if found["reason"] == "in_window":  # the chosen scale's eager time is inside the window
            assert window[0] <= found["eager_ms"] <= window[1] and found["probes"][found["scale"]] == found["eager_ms"]
            assert found["task"].provenance["scale"] == found["scale"]
        else:
            assert found["task"] is None and found["reason"] in REASONS
    # the candidates are the sized tasks, and the filter measured those
    assert {t.code for t in candidates.values()} <= {f["task"].code for f in sized.values() if f["task"]}
    assert all(t.provenance["scale_probes"] for t in candidates.values())
    assert {t.sha256 for t in candidates.values()} >= set(filtered)
    assert funnel["config"]["scale"] == "search"
    with pytest.raises(TaskError, match="scale_search"):  # a resumed build cannot silently change it
        build_dataset(_config(tmp_path, target=2, max_rounds=1, min_eager_ms=window[0], max_eager_ms=window[1]))


@pytest.mark.parametrize("argv, message", [
    (["dataset", "build", "--scale", "0"], "scale must be"),
    (["dataset", "build", "--scale", "search", "--composer", "llm", "--device", "cpu", "--model", "m",
      "--base-url", "http://127.0.0.1:9/v1"], "--scale search"),
    (["dataset", "publish", "/nonexistent/build", "--repo", "a/b", "--dry-run"], "no build directory"),
    (["dataset", "build", "--k-distribution", "1:x"], "K distribution"),
    (["dataset", "build", "--target", "0", "--device", "cpu"], "target"),
    (["dataset", "build", "--composer", "llm", "--device", "cpu", "--base-url", "http://127.0.0.1:9/v1"], "model"),
])
def test_bad_input_is_one_line_and_exit_1(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("CUDAGYM_LLM_MODEL", raising=False)
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("cudagym: error:") and message in err and "\n" not in err


def test_prefect_flow_runs_the_same_stages(built, prefect_harness):
    from cudagym.flows.build_dataset import build_dataset as build_flow

    out, _ = built
    expected = build_dataset(_config(out))
    before = _counts(out / "build.duckdb")
    result = build_flow(_config(out))
    assert result["stages"] == expected["stages"]
    assert _counts(out / "build.duckdb") == before


def test_task_set_of_a_build_loads_for_eval(built):
    """A build's parquet is a task set `cudagym eval run --problems` accepts."""
    from cudagym.tasks import load_task_set

    out, _ = built
    tasks = load_task_set(next((out / "dataset" / "data").glob("*.parquet")))
    assert len(tasks) == TARGET and all(dataclasses.asdict(t)["level"] in (1, 2) for t in tasks)


def test_a_rerun_under_other_versions_says_so(tmp_path):
    """Composing depends on torch (meta-kernel shapes, the crawl's seeds): the store keeps the first
    run's versions, and a run under others gets one line naming them."""
    from cudagym.synth.build import versions

    current = versions()
    with BuildStore(tmp_path / "build.duckdb") as store:
        assert store.check_versions(current) is None
        assert store.check_versions(current) is None  # same versions: nothing to say
    with BuildStore(tmp_path / "build.duckdb") as store:
        line = store.check_versions({**current, "torch": "2.11.0+cu130", "cudagym": "9.9"})
    assert line.startswith("this build was started with other versions (torch ") and "-> 2.11.0+cu130" in line
    assert "cudagym" not in line  # our own version changes with every commit; it is recorded, not compared


def test_labels_are_read_once_per_candidate_and_stay_what_the_code_says(tmp_path):
    from cudagym.synth.build import label_stage

    good = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x).sum(1)\n"
    none = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    with BuildStore(tmp_path / "build.duckdb") as store:
        tasks = [Task(id=f"t{i}", name=f"t{i}", code=code) for i, code in enumerate([good, none, "def broken(:\n"])]
        store.add_candidates(tasks, 0)
        seqs = {seq for seq, _ in store.candidates()}
        first = label_stage(store, seqs)
        assert [t.provenance["ops"] for _, t in first[0]] == [["relu", "sum"]]
        assert first[1]["dropped"] == {"no_ops": 1, "unparsable": 1}
        assert len(store.labels) == 3  # each candidate read once, whatever it gave
        first[0][0][1].provenance["ops"].append("changed by a caller")  # a caller's list is its own
        second = label_stage(store, seqs)
        assert [t.provenance for _, t in second[0]] == [{"ops": ["relu", "sum"], "data_source": "torch#2"}]
        assert second[1] == first[1]
