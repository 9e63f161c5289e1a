"""The DuckDB store, on a real file in tmp_path."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cudagym.eval.store import AuditKey, BaselineKey, Store, StoreError

REPO = Path(__file__).resolve().parents[2]


def verdict(level: int, problem_id: int, status: str = "pass", kb_version: str | None = "v0.1", **extra) -> dict:
    return {"level": level, "problem_id": problem_id, "name": f"{problem_id}_p", "kb_version": kb_version,
            "status": status, "correct": status == "pass", "reason": None, "flags": [],
            "t_candidate_ms": 1.0, "t_eager_ms": 2.0, "t_compile_ms": 1.5, "speedup_vs_eager": 2.0,
            "speedup_vs_compile": 1.5, "reward": 3, "timing_mode": "strict", "precision": "strict",
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


def test_a_submission_holds_several_timing_modes_and_precisions(db):
    """`eval run SUB --name mine` and `... --timing-mode paper` (or `--precision kernelbench`) are runs of
    one submission: each keeps its own verdict per problem, and readers can tell them apart."""
    with Store(db) as store:
        store.add_submission("mine", "/subs/a", "strict", levels=[1])
        store.add_verdict("mine", verdict(1, 1, "pass"))
        store.add_submission("mine", "/subs/a", "paper", levels=[1])  # no longer refused
        store.add_verdict("mine", verdict(1, 1, "incorrect", timing_mode="paper"))
        store.add_submission("mine", "/subs/a", "strict", levels=[1], precision="kernelbench")
        store.add_verdict("mine", verdict(1, 1, "timeout", precision="kernelbench"))
        store.add_verdict("mine", verdict(1, 2, "pass", precision="kernelbench"))
        store.add_verdict("mine", verdict(1, 1, "pass", timing_mode="paper"))  # replaces paper's, only
        every = store.verdicts("mine")
        assert [(v["timing_mode"], v["precision"], v["problem_id"], v["status"]) for v in every] == [
            ("strict", "strict", 1, "pass"), ("strict", "kernelbench", 1, "timeout"),
            ("strict", "kernelbench", 2, "pass"), ("paper", "strict", 1, "pass")]
        assert [v["status"] for v in store.verdicts("mine", timing_mode="paper")] == ["pass"]
        assert len(store.verdicts("mine", precision="kernelbench")) == 2
        assert store.verdicts("mine", timing_mode="paper", precision="kernelbench") == []
        assert store.done_keys("mine", "strict", "strict") == {("v0.1", 1, 1)}
        assert store.done_keys("mine") == {("v0.1", 1, 1), ("v0.1", 1, 2)}
        [s] = store.submissions()
        assert (s["timing_mode"], s["precision"]) == ("strict", "kernelbench")  # its latest run
        assert s["runs"] == [{"timing_mode": "strict", "precision": "strict", "n": 1},
                             {"timing_mode": "strict", "precision": "kernelbench", "n": 2},
                             {"timing_mode": "paper", "precision": "strict", "n": 1}]


# The schema of the first stores (before timing modes and precisions shared a submission), verbatim.
OLD_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS submissions (
        name VARCHAR PRIMARY KEY, path VARCHAR, timing_mode VARCHAR, levels INTEGER[], kb_version VARCHAR,
        created TIMESTAMP)""",
    """CREATE TABLE IF NOT EXISTS verdicts (
        submission VARCHAR, kb_version VARCHAR, level INTEGER, problem_id INTEGER, name VARCHAR,
        status VARCHAR, correct BOOLEAN, t_candidate_ms DOUBLE, t_eager_ms DOUBLE, t_compile_ms DOUBLE,
        speedup_vs_eager DOUBLE, speedup_vs_compile DOUBLE, reward INTEGER, timing_mode VARCHAR,
        verdict VARCHAR, created TIMESTAMP,
        PRIMARY KEY (submission, kb_version, level, problem_id))""",
    """CREATE TABLE IF NOT EXISTS baselines (
        problem_sha256 VARCHAR, gpu VARCHAR, torch VARCHAR, cuda VARCHAR, dtype VARCHAR, timing_mode VARCHAR,
        t_eager_ms DOUBLE, t_compile_ms DOUBLE, record VARCHAR, created TIMESTAMP,
        PRIMARY KEY (problem_sha256, gpu, torch, cuda, dtype, timing_mode))""",
)


def _old_store(path: Path) -> list[dict]:
    """A file as the first Store wrote it: two submissions (one in paper mode), three verdicts, a baseline."""
    import json

    import duckdb

    old = [verdict(1, 1), verdict(1, 2, "incorrect"), verdict(2, 5, timing_mode="paper", kb_version=None)]
    for v in old:
        del v["precision"]  # the first verdicts had none
    con = duckdb.connect(str(path))
    for statement in OLD_SCHEMA:
        con.execute(statement)
    con.execute("INSERT INTO submissions VALUES ('a', '/subs/a', 'strict', [1], 'v0.1', current_timestamp),"
                " ('b', '/subs/b', 'paper', [2], NULL, current_timestamp)")
    for submission, v in zip("aab", old):
        con.execute("INSERT INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, current_timestamp)",
                    [submission, v["kb_version"] or "", v["level"], v["problem_id"], v["name"], v["status"], v["correct"],
                     v["t_candidate_ms"], v["t_eager_ms"], v["t_compile_ms"], v["speedup_vs_eager"],
                     v["speedup_vs_compile"], v["reward"], v["timing_mode"], json.dumps(v)])
    con.execute("INSERT INTO baselines VALUES ('ab', 'cpu', '2.13.0', '', 'float32-notf32', 'strict', 1.0, 2.0,"
                " '{\"t_eager_ms\": 1.0}', current_timestamp)")
    con.close()
    return old


def test_a_file_of_the_first_schema_is_migrated_in_place_without_losing_rows(db):
    old = _old_store(db)
    with Store(db) as store:
        assert store.verdicts("a") == [dict(v, precision="strict") for v in old[:2]]
        assert store.verdicts("b") == [dict(old[2], precision="strict")]
        assert store.sql("SELECT submission, timing_mode, precision, problem_id FROM verdicts ORDER BY ALL") == [
            ("a", "strict", "strict", 1), ("a", "strict", "strict", 2), ("b", "paper", "strict", 5)]
        assert {s["name"]: (s["timing_mode"], s["precision"], s["levels"]) for s in store.submissions()} == {
            "a": ("strict", "strict", [1]), "b": ("paper", "strict", [2])}
        assert store.get_baseline(BaselineKey("ab", "cpu", "2.13.0", "", "float32-notf32", "strict")) == {"t_eager_ms": 1.0}
        # new writes: another timing mode and precision of the same problem are rows of their own
        store.add_submission("a", "/subs/a", "paper", levels=[1])
        store.add_verdict("a", verdict(1, 1, "timeout", timing_mode="paper"))
        store.add_verdict("a", verdict(1, 1, "pass", precision="kernelbench"))
        store.add_verdict("a", verdict(1, 2, "pass"))  # replaces the migrated one
        store.put_audit(AuditKey("ab", 1e-2, 1e-2, "cpu", "strict"), {"accepts": []})
    with Store(db) as store:  # reopened: migrated once, nothing lost
        assert [(v["timing_mode"], v["precision"], v["problem_id"], v["status"]) for v in store.verdicts("a")] == [
            ("strict", "strict", 1, "pass"), ("strict", "strict", 2, "pass"), ("strict", "kernelbench", 1, "pass"),
            ("paper", "strict", 1, "timeout")]
        assert len(store.verdicts()) == 5
        assert store.get_audit(AuditKey("ab", 1e-2, 1e-2, "cpu", "strict")) == {"accepts": []}


def test_audits_round_trip_by_code_tolerance_device_and_precision(db):
    key = AuditKey("cd" * 32, 1e-2, 1e-2, "cpu", "strict")
    row = {"level": 1, "problem_id": 2, "name": "2_p", "accepts": ["zeros"], "stochastic": [], "near": ["zeros"],
           "input_sensitivity": 0.5, "cost": {"flops": None, "bytes": 1024}, "degenerate": "its check accepts zeros"}
    with Store(db) as store:
        assert store.get_audit(key) is None
        store.put_audit(key, row)
        assert store.get_audit(key) == row
        for other in (AuditKey("cd" * 32, 1e-4, 1e-4, "cpu", "strict"), AuditKey("cd" * 32, 1e-2, 1e-2, "NVIDIA H200", "strict"),
                      AuditKey("cd" * 32, 1e-2, 1e-2, "cpu", "kernelbench"), AuditKey("ef" * 32, 1e-2, 1e-2, "cpu", "strict")):
            assert store.get_audit(other) is None, other
        store.put_audit(key, {**row, "accepts": []})
    with Store(db) as store:
        assert store.get_audit(key)["accepts"] == []
        assert store.sql("SELECT level, problem_id, name FROM audits") == [(1, 2, "2_p")]


def test_a_store_another_process_holds_gives_one_line_naming_the_lock(db, capsys):
    from cudagym.cli import main
    from cudagym.tasks.db import DatabaseLocked

    holder = subprocess.Popen([sys.executable, "-c", f"from cudagym.eval.store import Store; s = Store({str(db)!r});"
                               " print('open', flush=True); import time; time.sleep(60)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(DatabaseLocked) as info:
            Store(db)
        assert str(info.value) == (f"another process (PID {holder.pid}) holds {db} open (DuckDB allows one writer);"
                                   " close it or use another --db")
        assert isinstance(info.value, StoreError) and isinstance(info.value, ValueError)
        argv = ["audit", "kernelbench", "--problems", str(REPO / "examples" / "problems"), "--device", "cpu",
                "--db", str(db)]
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert err == f"cudagym: error: {info.value}"
    finally:
        holder.kill()
        holder.wait()


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
