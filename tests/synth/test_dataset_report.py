"""benchmarks/dataset_report.py on a real small CPU build done in two "calls" with small rounds, as
benchmarks/dataset_gpu.sh runs it on the GPU: its numbers are the build's own."""

from __future__ import annotations

import importlib.util
import json
import tarfile
from pathlib import Path

import duckdb
import pytest

from cudagym.synth.build import BuildConfig, build_dataset
from cudagym.synth.publish import read_build_rows

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("dataset_report", REPO / "benchmarks" / "dataset_report.py")
dataset_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dataset_report)

pytestmark = pytest.mark.slow


def _config(out, target):
    return BuildConfig(out=str(out), target=target, seed=7, transformers=False, parallel=2, round_size=3, max_rounds=20)


def test_report_of_a_two_call_build_with_small_rounds(tmp_path, kernelbench_path):
    out = tmp_path / "build"
    build_dataset(_config(out, 3))
    assert dataset_report.main([str(out), "--wall-s", "60", "--out", str(tmp_path / "r1")]) == 0
    funnel = build_dataset(_config(out, 5))  # the next call: a larger target resumes the same folder
    with tarfile.open(tmp_path / "state.tar.gz", "w:gz") as tar:
        tar.add(out / "build.duckdb", "build.duckdb")
    assert dataset_report.main([str(out), "--wall-s", "30", "--setup", "one pass; lock writers-first",
                                "--out", str(tmp_path / "r2")]) == 0
    assert dataset_report.main([str(out), "--packed", str(tmp_path / "state.tar.gz"), "--out", str(tmp_path / "r2")]) == 0

    db = duckdb.connect(str(out / "build.duckdb"), read_only=True)
    composed = db.execute("SELECT count(*) FROM candidates").fetchone()[0]
    filtered, kept = db.execute("SELECT count(*), count(*) FILTER (WHERE keep) FROM filtered").fetchone()
    round_sizes = [n for (n,) in db.execute("SELECT count(*) FROM candidates GROUP BY round").fetchall()]
    db.close()
    assert max(round_sizes) <= 3  # --round-size bounds what a round composes

    report = json.loads((tmp_path / "r2" / "report.json").read_text())
    rows = read_build_rows(out / "dataset")
    assert len(rows) == 5 and funnel["status"] == "complete"
    first, second = report["calls"]
    assert first["published"] == 3 and second["published"] == 2  # per call: deltas of the totals
    assert first["filtered"] + second["filtered"] == filtered and first["kept"] + second["kept"] == kept
    assert first["kept_per_gpu_min"] == round(first["kept"] / 1.0, 1)  # 60 s on one GPU is one GPU-minute
    overall = report["overall"]
    assert (overall["composed"], overall["filtered"], overall["kept"], overall["published"]) == (composed, filtered, kept, 5)
    assert overall["yield"] == round(kept / filtered, 4) and overall["gpu_min"] == 1.5
    assert report["stages"] == funnel["stages"] and report["k_distribution"] == funnel["k_distribution"]
    assert sum(v["here"] for v in report["sources"].values()) == 5
    assert sum(v["paper"] for v in report["sources"].values()) == 6000
    assert report["sources"]["torch#2"]["paper_share"] == "83.77%"
    # a CPU build: every row ran eager and compiled, but not on a GPU
    assert report["re_executed_on_gpu"] == {"rows": 5, "eager_and_compiled_on_gpu": 0, "devices": {"cpu": 5}}
    assert all(r["eager_ms"] > 0 and r["compile_ms"] > 0 for r in rows)
    assert report["by_scale"]["1"]["filtered"] == filtered
    assert report["state"]["packed_bytes"] == (tmp_path / "state.tar.gz").stat().st_size
    seconds = report["judge_seconds"]
    assert seconds["scale_search"] == {"candidates": 0, "probes": 0, "reasons": {}}  # no --scale search here
    assert seconds["filter"]["checks_s"]["n"] == filtered  # every decision; ms each on the CPU (its sum may round to 0.0)
    md = (tmp_path / "r2" / "report.md").read_text()
    # every phase a judge records, in the filter's own order (start first: judge start-up is a phase)
    from cudagym.synth.filter import PHASES
    line = next(l for l in md.splitlines() if l.startswith("Filter judge seconds (sum / median over decisions): "))
    named = [part.split()[0] for part in line.split(": ", 1)[1].rstrip(".").split(", ")]
    assert named == [p.removesuffix("_s") for p in PHASES]
    assert first["setup"] == "" and second["setup"] == "one pass; lock writers-first"  # what each call of an A/B ran
    assert "| 2 | one pass; lock writers-first | 30.0 |" in md and "| 1 | – | 60.0 |" in md
    assert f"| all | | 90.0 |" in md and "| torch#2 |" in md and "0 of 5 published rows" in md
    # the rounds in time: every decision of the last rounds counted, no sizing without --scale search
    assert [t["round"] for t in report["rounds"]] == sorted(set(range(len(round_sizes))))[-len(report["rounds"]):]
    assert sum(t["filtered"] for t in report["rounds"]) <= filtered and all(t["size_s"] is None for t in report["rounds"])
    assert all(t["filter_s"] is not None and t["filter_s"] >= 0 for t in report["rounds"] if t["filtered"])
    assert "## Last rounds (the store's timestamps)" in md
    assert (tmp_path / "r2" / "progress.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the calls drawn


def test_report_of_a_call_that_published_nothing(tmp_path):
    """A call stopped before its first round ended (the H200's first scale-search build): the report
    still says so, with the packed state's size and no per-row figure."""
    from cudagym.synth.build import INTERRUPTED, BuildStore, publish_stage

    out = tmp_path / "build"
    BuildStore(out / "build.duckdb").close()
    publish_stage(_config(out, 6000), [], [], stopped=("interrupted", f"{INTERRUPTED}; round 0 unfinished"))
    with tarfile.open(tmp_path / "state.tar.gz", "w:gz") as tar:
        tar.add(out / "build.duckdb", "build.duckdb")
    assert dataset_report.main([str(out), "--wall-s", "470", "--out", str(tmp_path / "r")]) == 0
    assert dataset_report.main([str(out), "--packed", str(tmp_path / "state.tar.gz"), "--out", str(tmp_path / "r")]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["overall"]["published"] == 0 and report["state"]["packed_per_1000_rows"] is None
    assert "packed" in (tmp_path / "r" / "report.md").read_text()


def test_gpu_memory_per_decision_is_reported_apart_from_the_judge_seconds(tmp_path):
    """Decisions from a GPU (since session 28) carry what each task reserved of the memory budget and what
    its judge held: the report gives their medians and maxima, never as judge seconds."""
    from cudagym.synth.build import BuildStore
    from cudagym.synth.filter import FilterResult

    out = tmp_path / "build"
    with BuildStore(out / "build.duckdb") as store:
        for i, (share, peak) in enumerate([(11.6, 1.5), (4.2, 0.4), (30.0, 2.0)]):
            store.add_filtered(f"sha{i}", FilterResult(True, "", t_eager_ms=2.0, wait_s=3.0, admit_s=2.5,
                                                       share_gib=share, peak_gib=peak))
    seconds = dataset_report.judge_seconds(out)
    assert set(seconds["filter"]) == {"wait_s", "admit_s"} and seconds["filter"]["admit_s"]["sum"] == 7.5
    assert seconds["memory_gib"] == {"share_gib": {"n": 3, "median": 11.6, "max": 30.0},
                                     "peak_gib": {"n": 3, "median": 1.5, "max": 2.0}}


def test_filter_footprints_charges_a_check_its_forward_and_counts_the_judges_that_fit(tmp_path, capsys):
    """benchmarks/filter_footprints.py on a store of two filtered candidates (one round each), on meta tensors:
    a 1 GiB tanh charged its sets, its forward and the fixed costs, 1.25x, plus its context (an evaluation's
    factors: 14x);
    the peaks the GPU measured against those shares; a missing store is one line and exit 1."""
    from cudagym.synth.build import BuildStore
    from cudagym.synth.filter import FilterResult
    from cudagym.tasks import Task

    spec = importlib.util.spec_from_file_location("filter_footprints", REPO / "benchmarks" / "filter_footprints.py")
    footprints = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(footprints)

    def task(n: int) -> Task:  # n float32 elements in, as many out
        code = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                f"        return torch.tanh(x)\n\ndef get_inputs():\n    return [torch.randn({n})]\n\n"
                "def get_init_inputs():\n    return []\n")
        return Task(id=f"t{n}", name=f"t{n}", code=code, source="test")

    big, small = task(2**28), task(2**20)  # 1 GiB and 4 MiB of input
    with BuildStore(tmp_path / "build.duckdb") as store:
        for round_, (t, peak) in enumerate(((big, 7.0), (small, 0.5))):
            store.add_candidates([t], round_)
            store.add_filtered(t.sha256, FilterResult(True, "", share_gib=1.0, peak_gib=peak))
    assert footprints.main([str(tmp_path / "build.duckdb"), "--gpu-mib", "81559"]) == 0
    out = capsys.readouterr().out
    assert "2 filtered candidates, rounds 0-1; budget 68 GiB" in out
    # the big one: 1.25 x (3 input sets + 4 output sets + its forward's 1 GiB + 0.25 GiB fixed) + 1 GiB of context;
    # at an evaluation's factors 14 x 1 GiB + 2 GiB; the small one 1.25 x (8 x 4 MiB + 0.25 GiB) + 1 GiB
    assert "check share GiB: median 1.4" in out and "max 11.3" in out
    assert "factors (before session 29): median 2.1" in out and "max 16.0" in out
    # its 10.3 GiB less the context over a 7 GiB peak; the small one's 0.35 GiB under its 0.5 GiB
    assert "measured on the GPU, 2 tasks" in out and "max 1.5" in out and "peak above it: 1" in out
    assert "keeps (2 input sets, 4 output sets, weights) GiB: median 0.0" in out and "max 6.0" in out
    assert "round 0: 1 tasks, check shares sum 11 GiB" in out  # 11.3
    assert footprints.main([str(tmp_path / "nope.duckdb")]) == 1
    assert "no such build store" in capsys.readouterr().err


def _timed_rounds(path, rounds: dict) -> None:
    """A build store whose rounds were written at the given seconds: {round: (sized chains at, candidates
    stored at, decisions at (the first kept, the rest degenerate))}."""
    from datetime import datetime, timedelta

    from cudagym.synth.build import BuildStore
    from cudagym.synth.filter import FilterResult
    from cudagym.tasks import Task

    t0 = datetime(2026, 12, 6, 21, 0, 0)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    with BuildStore(path / "build.duckdb") as store:
        for round_, (sized_at, stored_at, decided_at) in rounds.items():
            for i, s in enumerate(sized_at):
                store.db.execute("INSERT INTO sized (sha256, reason, created) VALUES (?, 'in_window', ?)",
                                 [f"chain{round_}-{i}", at(s)])
            tasks = [Task(id=f"r{round_}t{i}", name="t", code=f"# round {round_} task {i}\n", source="test")
                     for i in range(len(decided_at))]
            store.add_candidates(tasks, round_)
            for i, (task, s) in enumerate(zip(tasks, decided_at)):
                store.add_filtered(task.sha256, FilterResult(i == 0, "" if i == 0 else "degenerate_constant"))
                store.db.execute("UPDATE filtered SET created = ? WHERE sha256 = ?", [at(s), task.sha256])
            store.db.execute("UPDATE candidates SET created = ? WHERE round = ?", [at(stored_at), round_])


def test_round_timeline_from_the_stores_timestamps(tmp_path):
    """Each round's sizing (its first sized chain to its candidates stored), filtering (to its last decision)
    and the gap before it, from the times the store wrote them; a round filtered in two calls has no filter
    time, and a gap across calls is none."""
    _timed_rounds(tmp_path, {
        0: ([0, 10], 40, [50, 100]),
        1: ([120, 130], 150, [160, 900]),  # its second decision 740 s after its first: another call's
        2: ([2000], 2030, [2040]),  # 1,100 s after round 1's last decision: another call
    })
    timeline = dataset_report.round_timeline(tmp_path)
    assert timeline == [
        {"round": 0, "candidates": 2, "filtered": 2, "kept": 1, "size_s": 40.0, "filter_s": 60.0, "filtering_s": 50.0,
         "overlap_s": None, "gap_s": None},
        {"round": 1, "candidates": 2, "filtered": 2, "kept": 1, "size_s": 30.0, "filter_s": None, "filtering_s": None,
         "overlap_s": 0.0, "gap_s": 20.0},
        {"round": 2, "candidates": 1, "filtered": 1, "kept": 1, "size_s": 30.0, "filter_s": 10.0, "filtering_s": 0.0,
         "overlap_s": None, "gap_s": None},
    ]
    assert dataset_report.round_timeline(tmp_path, last=1) == timeline[-1:]


def test_round_timeline_of_overlapped_rounds(tmp_path):
    """Overlapped rounds: a round sized while the round before was filtered shows how long it ran beside
    that filter, and its own filter's span apart from the wait for the round before's."""
    _timed_rounds(tmp_path, {  # round 1 sized during round 0's filter
        0: ([0, 10], 40, [60, 120]),
        1: ([50, 70], 100, [130, 170]),
    })
    timeline = dataset_report.round_timeline(tmp_path)
    # round 1 sized from 50 to 100 s, round 0 filtered from 60 to 120 s: 40 s side by side
    assert [(t["round"], t["size_s"], t["overlap_s"], t["filter_s"], t["filtering_s"]) for t in timeline] == [
        (0, 40.0, None, 80.0, 60.0), (1, 50.0, 40.0, 70.0, 40.0)]
    assert timeline[1]["gap_s"] is None  # sized before the round before's last decision: no gap


def test_round_timeline_of_rounds_a_device_call_ended(tmp_path):
    """A round that one call's end stopped and the next call finished: its sizing or its filter began in
    one call and ended in the next, so that span is none (on the H100, session 31, they read 27,349 and
    13,874 s), while what lies within one call is still told."""
    _timed_rounds(tmp_path, {
        0: ([0, 10], 40, [50, 100]),
        1: ([110, 120], 5000, [5010, 5060]),  # sized in call 1 until stopped; the rest sized, filtered in call 2
        2: ([5070], 5100, [7000, 7040]),  # stored at call 2's end; filtered by call 3
    })
    timeline = dataset_report.round_timeline(tmp_path)
    assert [(t["round"], t["size_s"], t["filter_s"], t["filtering_s"], t["gap_s"], t["overlap_s"]) for t in timeline] == [
        (0, 40.0, 60.0, 50.0, None, None),
        (1, None, 60.0, 50.0, 10.0, None),  # its sizing spans the pause; the gap before it does not
        (2, 30.0, None, 40.0, 10.0, 0.0)]  # sized after round 1 in call 2; filtered wholly in call 3
    assert dataset_report.call_breaks([]) == []
