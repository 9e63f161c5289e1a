"""The DuckDB store, on a real file in tmp_path."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cudagym.eval.store import BaselineKey, Store, StoreError

REPO = Path(__file__).resolve().parents[2]


def verdict(level: int, problem_id: int, status: str = "pass", kb_version: str | None = "v0.1", **extra) -> dict:
    return {"level": level, "problem_id": problem_id, "name": f"{problem_id}_p", "kb_version": kb_version,
            "status": status, "correct": status == "pass", "reason": None, "flags": [],
            "t_candidate_ms": 1.0, "t_eager_ms": 2.0, "t_compile_ms": 1.5, "speedup_vs_eager": 2.0,
            "speedup_vs_compile": 1.5, "reward": 3, "timing_mode": "strict",
            "env": {"gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0"}, **extra}


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "results.duckdb"


def test_upsert_keeps_one_verdict_per_problem(db):
    with Store(db) as store:
        store.add_verdict("sub", verdict(1, 1, "incorrect"))
        store.add_verdict("sub", verdict(1, 1, "incorrect"))
        assert [v["status"] for v in store.verdicts("sub")] == ["incorrect"]
        store.add_verdict("sub", verdict(1, 1, "pass"))
        assert [v["status"] for v in store.verdicts("sub")] == ["pass"]
        # same problem in another version or submission is another row
        store.add_verdict("sub", verdict(1, 1, kb_version="v0"))
        store.add_verdict("other", verdict(1, 1))
        assert len(store.verdicts("sub")) == 2
        assert len(store.verdicts()) == 3


def test_verdicts_round_trip_the_full_json(db):
    v = verdict(2, 17, flags=["zeros"], timing={"iqr_ms": 0.01, "reps": 100})
    with Store(db) as store:
        store.add_verdict("sub", v)
        assert store.verdicts("sub") == [v]


def test_done_keys(db):
    with Store(db) as store:
        assert store.done_keys("sub") == set()
        store.add_verdict("sub", verdict(1, 3))
        store.add_verdict("sub", verdict(2, 5, "timeout"))
        store.add_verdict("sub", verdict(4, 1, kb_version=None))  # a task set, not KernelBench
        store.add_verdict("other", verdict(3, 9))
        assert store.done_keys("sub") == {("v0.1", 1, 3), ("v0.1", 2, 5), (None, 4, 1)}


def test_verdict_without_problem_id_is_refused(db):
    with Store(db) as store, pytest.raises(StoreError):
        store.add_verdict("sub", verdict(1, None))


def test_reopen_after_close_keeps_data(db):
    store = Store(db)
    store.add_submission("sub", "/subs/a", "strict", levels=[1, 2], kb_version="v0.1")
    store.add_verdict("sub", verdict(1, 1))
    store.close()
    with Store(db) as store:
        assert [s["name"] for s in store.submissions()] == ["sub"]
        assert store.done_keys("sub") == {("v0.1", 1, 1)}


def test_killed_process_loses_nothing(db):
    # The writer is SIGKILLed right after add_verdict returns, without close().
    code = (
        "import os, signal\n"
        "from cudagym.eval.store import Store\n"
        f"s = Store({str(db)!r})\n"
        "s.add_verdict('sub', {'level': 1, 'problem_id': 7, 'kb_version': 'v0.1', 'status': 'pass', 'correct': True})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO)
    assert proc.returncode == -9
    with Store(db) as store:
        assert store.done_keys("sub") == {("v0.1", 1, 7)}


def test_threads_share_one_store(db):
    with Store(db) as store:
        threads = [threading.Thread(target=lambda i=i: store.add_verdict("sub", verdict(1, i))) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert {pid for _, _, pid in store.done_keys("sub")} == set(range(16))


def test_add_submission_is_idempotent_and_merges_levels(db):
    with Store(db) as store:
        store.add_submission("sub", "/subs/a", "strict", levels=[2, 1], kb_version="v0.1")
        store.add_submission("sub", "/subs/a", "strict", levels=[1, 2], kb_version="v0.1")
        [s] = store.submissions()
        assert (s["name"], s["path"], s["timing_mode"], s["levels"], s["kb_version"]) == (
            "sub", "/subs/a", "strict", [1, 2], "v0.1")
        store.add_submission("sub", "/subs/b", "strict", levels=[3])
        [s] = store.submissions()
        assert (s["path"], s["levels"], s["kb_version"]) == ("/subs/b", [1, 2, 3], "v0.1")
        # a new KernelBench version replaces the levels run on the old one
        store.add_submission("sub", "/subs/b", "strict", levels=[1], kb_version="latest")
        [s] = store.submissions()
        assert (s["levels"], s["kb_version"]) == ([1], "latest")


def test_submission_keeps_its_timing_mode(db):
    with Store(db) as store:
        store.add_submission("sub", "/subs/a", "strict")
        with pytest.raises(StoreError, match="timing mode"):
            store.add_submission("sub", "/subs/a", "paper")
        assert store.submissions()[0]["timing_mode"] == "strict"


def test_baselines_round_trip(db):
    key = BaselineKey("ab" * 32, "NVIDIA H200", "2.11.0", "13.0", "float32", "strict")
    record = {"t_eager_ms": 2.69, "t_compile_ms": 2.5, "stats": {"eager": {"iqr_ms": 0.01, "reps": 200}}}
    with Store(db) as store:
        assert store.get_baseline(key) is None
        store.put_baseline(key, record)
        assert store.get_baseline(key) == record
        # every key field matters
        assert store.get_baseline(BaselineKey("ab" * 32, "NVIDIA H100", "2.11.0", "13.0", "float32", "strict")) is None
        assert store.get_baseline(BaselineKey("ab" * 32, "NVIDIA H200", "2.11.0", "13.0", "float32", "paper")) is None
        newer = {**record, "t_eager_ms": 2.0}
        store.put_baseline(key, newer)
    with Store(db) as store:
        assert store.get_baseline(key) == newer


@pytest.mark.parametrize("make_path", [
    lambda tmp: tmp / "no" / "such" / "dir" / "results.duckdb",
    lambda tmp: tmp,  # a directory
    lambda tmp: _text_file(tmp / "notes.duckdb"),  # not a DuckDB file
])
def test_bad_path_raises_one_line_store_error(tmp_path, make_path):
    path = make_path(tmp_path)
    with pytest.raises(StoreError) as info:
        Store(path)
    assert isinstance(info.value, ValueError)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def _text_file(path: Path) -> Path:
    path.write_text("this is not a database\n" * 100)
    return path
