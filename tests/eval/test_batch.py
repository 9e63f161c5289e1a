"""Many problems at once: submission layout, several tasks per judge, a judge that dies mid-batch."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cudagym.eval.batch import strided, submission_files
from cudagym.eval.evaluate import EvalConfig, run_reference_jobs
from cudagym.tasks import Task, TaskError

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return {body}

def get_inputs():
    return [torch.{gen}(8, 16)]

def get_init_inputs():
    return []
"""
CRASHING = TASK.format(body="__import__('os').kill(__import__('os').getpid(), 11)", gen="randn")


def task(i: int, body: str = "torch.relu(x)", gen: str = "rand", code: str | None = None) -> Task:
    return Task(id=f"t{i}", name=f"{i}_t", code=code or TASK.format(body=body, gen=gen), level=1, problem_id=i)


def test_submission_files_follow_the_contract_naming(tmp_path):
    (tmp_path / "level1").mkdir()
    (tmp_path / "level2").mkdir()
    (tmp_path / "level1" / "3_Some_name.py").write_text("")
    (tmp_path / "level1" / "12.py").write_text("")
    (tmp_path / "level1" / "notes.py").write_text("")  # no problem id: ignored
    (tmp_path / "level2" / "7_x.py").write_text("")
    assert sorted(submission_files(tmp_path)) == [(1, 3), (1, 12), (2, 7)]
    (tmp_path / "level1" / "3_again.py").write_text("")
    with pytest.raises(TaskError, match="two files for level 1 problem 3"):
        submission_files(tmp_path)
    with pytest.raises(TaskError, match="not found"):
        submission_files(tmp_path / "absent")


def test_several_tasks_in_one_judge_each_get_their_own_result_even_if_one_kills_the_judge():
    tasks = [task(1), task(2, code=CRASHING), task(3, body="torch.tanh(x)", gen="randn")]
    results = run_reference_jobs(tasks, "audit", EvalConfig(device="cpu", n_checks=2, timeout_s=30))
    assert "passthrough" in results[0]["accepts"]  # ReLU of torch.rand is the identity there
    assert "accepts" not in results[1] and "SIGSEGV" in results[1]["reason"]
    assert results[2]["accepts"] == []  # tanh of randn: nothing trivial passes


def test_strided_shares_hold_every_task_once_and_mix_the_levels():
    tasks = [Task(id=f"L{1 + i // 10}/{i}", name=f"p{i}", code="", level=1 + i // 10, problem_id=i) for i in range(30)]
    shares = strided(tasks, 4)
    assert len(shares) == 4 and sorted(t.problem_id for s in shares for t in s) == list(range(30))
    assert all({t.level for t in s} == {1, 2, 3} for s in shares)  # no judge gets only the heavy level
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert strided(tasks[:2], 4) == [[tasks[0]], [tasks[1]]] and strided([], 4) == []


HANGING = TASK.format(body="__import__('time').sleep(300) or x", gen="randn")


def fresh() -> float:
    """A constant new to this test run: the suite's inductor cache keeps what earlier runs compiled,
    and its compile marks with it (judge.compiled_mark)."""
    import random

    return round(random.uniform(1, 100), 6)


def test_compile_judges_walking_one_list_share_it_as_a_queue_each_problem_compiled_once():
    """A baseline run's compile judges all get the same list (real judges, CPU): together they compile
    each problem once, the others leaving it; a second walk finds every problem compiled already."""
    import threading

    config = EvalConfig(device="cpu", n_checks=2, timeout_s=120)
    tasks = [task(20 + i, body=f"torch.relu(x) * {i + 2} - {fresh()}", gen="randn") for i in range(4)]
    walks: list[list[dict]] = [[], []]
    judges = [threading.Thread(target=lambda out=out: out.extend(run_reference_jobs(tasks, "warm", config)))
              for out in walks]
    for judge in judges:
        judge.start()
    for judge in judges:
        judge.join()
    for i in range(len(tasks)):
        compiled = [walk[i] for walk in walks if "compile_s" in walk[i]]
        assert len(compiled) == 1, [walk[i] for walk in walks]
        assert all(walk[i].get("compiled_elsewhere") for walk in walks if walk[i] is not compiled[0])
    again = run_reference_jobs(tasks, "warm", config)
    assert all(r.get("compiled_elsewhere") for r in again)


def test_a_compile_judge_that_dies_hands_the_rest_of_its_list_to_one_new_judge(monkeypatch):
    import cudagym.eval.evaluate as evaluate

    def one_process_each(*args, **kwargs):
        raise AssertionError("a warm judge's rest ran one process per problem")

    monkeypatch.setattr(evaluate, "run_reference_job", one_process_each)
    tasks = [task(30, body=f"torch.relu(x) + {fresh()}", gen="randn"), task(31, code=CRASHING),
             task(32, body=f"torch.relu(x) - {fresh()}", gen="randn"), task(33, body=f"torch.tanh(x) + {fresh()}", gen="randn")]
    seen: dict[int, dict] = {}
    results = run_reference_jobs(tasks, "warm", EvalConfig(device="cpu", n_checks=2, timeout_s=120),
                                 on_result=lambda i, r: seen.setdefault(i, r))
    assert "compile_s" in results[0] and "SIGSEGV" in results[1]["reason"]
    assert "compile_s" in results[2] and "compile_s" in results[3]
    assert sorted(seen) == [0, 1, 2, 3] and "compile_s" in seen[3]


def test_a_compile_judge_leaves_a_problem_another_judge_compiles_and_a_timing_judge_waits_for_it():
    """The claim a baseline run's judges take on a problem while they compile it (real judges, CPU):
    a compile ("warm") judge that finds it held reports the problem as compiling elsewhere at once;
    a timing judge waits for the holder and then compiles and times it."""
    import threading

    from cudagym.eval.gpulock import compile_claim, lock_dir
    from cudagym.eval.judge import compile_claim_key

    config = EvalConfig(device="cpu", n_checks=2, timeout_s=120)
    t = task(7, body=f"torch.relu(x) * 3 + {fresh()}", gen="randn")
    key = compile_claim_key("cpu", config.precision, t.code)
    release = threading.Event()

    def hold(held_at: list) -> None:
        with compile_claim(lock_dir(), key, wait_s=0) as held:
            held_at.append(held)
            release.wait(60)

    held_at: list = []
    holder = threading.Thread(target=hold, args=(held_at,))
    holder.start()
    try:
        while not held_at:
            time.sleep(0.01)
        assert held_at == [True]
        [warm] = run_reference_jobs([t], "warm", config)
        assert warm.get("compiled_elsewhere") is True and "compile_s" not in warm
        threading.Thread(target=release_when_a_judge_waits, args=(release,), daemon=True).start()
        [timed] = run_reference_jobs([t], "baseline", config)
    finally:
        release.set()
        holder.join()
    assert timed["t_eager_ms"] > 0 and timed["compile_s"] > 0
    assert timed["phase_s"]["other compile"] >= 1.0  # it waited for the claim


def release_when_a_judge_waits(release, wait_s: float = 1.0) -> None:
    """Set `release` wait_s after a judge notes that it waits for another judge's compile (its phase file)."""
    import glob
    import tempfile

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not release.is_set():
        for path in glob.glob(os.path.join(tempfile.gettempdir(), "cudagym-judge-*", "phase.json")):
            try:
                if "another judge's compile" in Path(path).read_text():
                    time.sleep(wait_s)
                    release.set()
                    return
            except OSError:
                pass
        time.sleep(0.05)
    release.set()


def test_a_stopped_judge_counts_a_deferred_or_out_of_memory_task_as_unfinished_not_failed(monkeypatch):
    """A GPU-only path (the memory ledger defers nothing on the CPU): the judge's process is stood in
    for by what it had written when the batch was stopped. On the H200 such a stop reported a
    deferred 130 GiB problem as failed."""
    import cudagym.eval.evaluate as evaluate

    timed = {"t_eager_ms": 1.0, "t_compile_ms": 0.9}
    deferred = {"deferred": True, "reason": "130.0 GiB of GPU memory not free after 10 s"}
    oom = {"status": "runtime_error", "reason": "OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB."}

    def stopped(*args, **kwargs):
        raise evaluate.Interrupted([timed, deferred, oom])

    monkeypatch.setattr(evaluate, "run_judge", stopped)
    tasks = [task(40), task(41), task(42), task(43)]
    assert run_reference_jobs(tasks, "baseline", EvalConfig(device="cpu")) == [timed, None, None, None]


def test_a_stopped_batch_keeps_what_its_judges_had_finished_and_starts_nothing_new(tmp_path, monkeypatch):
    """Ctrl-C (or a time limit's SIGINT) in the middle of a chunk: the chunk's finished task is
    recorded, the hanging one and the one after it are not, and no judge outlives the batch."""
    import os
    import signal
    import tempfile
    import threading
    import time

    from cudagym.eval import evaluate
    from cudagym.eval.batch import dispatch_reference

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where judges make their workdirs
    tasks = [task(1), task(2, code=HANGING), task(3, body="torch.tanh(x)", gen="randn")]
    recorded: dict[str, dict] = {}

    def stop_after_first_task() -> None:  # the judge writes a line per finished task
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(p.read_text().count("\n") >= 1 for p in tmp_path.glob("cudagym-judge-*/results.jsonl")):
                os.kill(os.getpid(), signal.SIGINT)  # a real signal: it wakes the waiting main thread
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=stop_after_first_task, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        dispatch_reference(tasks, "audit", lambda t, env, r: recorded.setdefault(t.id, r),
                           EvalConfig(device="cpu", n_checks=2, timeout_s=200), chunk=3)
    assert time.monotonic() - t0 < 150  # did not wait for the hanging task
    assert list(recorded) == ["t1"] and "passthrough" in recorded["t1"]["accepts"]
    assert not evaluate._LIVE_JUDGES and not list(tmp_path.glob("cudagym-judge-*"))
    # The stop ended with its batch: a judge run afterwards in this process runs to its end.
    assert "passthrough" in run_reference_jobs([task(4)], "audit", EvalConfig(device="cpu", n_checks=2))[0]["accepts"]


def test_a_judge_alive_across_a_stop_is_unfinished_even_when_the_stop_was_cleared_before_it_was_reaped():
    """A stop kills every judge of the process, and its clear_stop can come before a thread has reaped
    its killed judge (a drain that gave up, another batch of the same process). That judge was
    stopped: its task is unfinished (None), never a failed result, which a build or a baseline run
    would store for good."""
    import threading

    from cudagym.eval import evaluate

    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(results=run_reference_jobs(
        [task(5, code=HANGING)], "audit", EvalConfig(device="cpu", n_checks=2, timeout_s=200))))
    runner.start()
    deadline = time.monotonic() + 60
    while not evaluate._LIVE_JUDGES and time.monotonic() < deadline:
        time.sleep(0.05)
    assert evaluate._LIVE_JUDGES
    time.sleep(1.0)
    evaluate.stop_live_judges()  # the stop and its clear, before the runner's thread has reaped the judge
    evaluate.clear_stop()
    runner.join(60)
    assert not runner.is_alive() and out["results"] == [None]
    assert not evaluate._LIVE_JUDGES


def test_a_verdict_shows_how_far_the_live_eager_time_strays_from_the_cached_baseline(tmp_path):
    """The compile time comes from the cache; the eager time is timed live. Their ratio to the cached
    eager time tells a user whether speedup_vs_compile was measured with the GPU in the same state."""
    from cudagym.eval.batch import baseline_key, machine_env, run_submission
    from cudagym.eval.store import Store

    relu = task(1, body="torch.relu(x)", gen="randn")
    (tmp_path / "sub" / "level1").mkdir(parents=True)
    (tmp_path / "sub" / "level1" / "1_t.py").write_text(
        "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.clamp_min(x, 0.0)\n")
    config = EvalConfig(device="cpu", policy="permissive", n_checks=2, timeout_s=60, max_timing_s=0.5)
    with Store(tmp_path / "runs.duckdb") as store:
        # as if the baseline had been timed with the machine 1000x slower than now
        store.put_baseline(baseline_key(relu, machine_env("cpu"), "strict"), {"t_eager_ms": 1000.0, "t_compile_ms": 2000.0})
        [verdict] = run_submission(tmp_path / "sub", [relu], store, "mine", config)
    assert verdict.status.value == "pass", verdict.reason
    assert verdict.t_compile_ms == 2000.0  # the cached compile time, not re-timed
    assert verdict.timing["eager_vs_baseline"] == pytest.approx(verdict.t_eager_ms / 1000.0, rel=1e-3)
    assert verdict.timing["eager_vs_baseline"] < 0.01


def test_a_task_that_hangs_in_a_judge_of_several_times_out_after_its_own_budget_not_theirs():
    """A judge of n tasks may run n task budgets in all; a task that hangs is killed after one budget
    without progress, timed out, and not run again, while the finished tasks keep their results and
    the rest run in judges of their own."""
    import time

    tasks = [task(1), task(2, code=HANGING), task(3, body="torch.tanh(x)", gen="randn")]
    config = EvalConfig(device="cpu", n_checks=2, timeout_s=30, task_timeout_s=20)
    t0 = time.monotonic()
    results = run_reference_jobs(tasks, "audit", config)
    assert "passthrough" in results[0]["accepts"]
    assert results[1]["status"] == "timeout" and "finished nothing in 20 s" in results[1]["reason"]
    assert results[2]["accepts"] == []
    # one budget of stall, not the judge's three; the hung task not run again (another 20 s)
    assert time.monotonic() - t0 < 55


# -- audits, precisions and timing modes of one submission ---------------------------------------------
DEGENERATE = TASK.format(body="x * 1e-4", gen="randn")  # outputs so small that all zeros pass the tolerance
CANDIDATE = "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return {body}\n"


def _submission(root, files: dict[int, str]):
    (root / "level1").mkdir(parents=True)
    for problem_id, body in files.items():
        (root / "level1" / f"{problem_id}_t.py").write_text(CANDIDATE.format(body=body))
    return root


def test_an_eval_run_audits_its_problems_first_and_marks_the_verdicts_of_degenerate_ones(tmp_path, monkeypatch):
    """A problem whose check accepts all zeros is marked on its verdicts (the one with no file too),
    from an audit row stored for the problem; a finished run starts nothing. (An honest problem, not
    marked: the CLI test below.)"""
    from cudagym.eval import batch
    from cudagym.eval.store import Store

    tasks = [task(1, code=DEGENERATE), task(3, code=TASK.format(body="x * 2e-4", gen="randn"))]
    sub = _submission(tmp_path / "sub", {1: "x * 1e-4"})
    config = EvalConfig(device="cpu", policy="permissive", n_checks=2, timeout_s=60, time_candidate=False)
    with Store(tmp_path / "runs.duckdb") as store:
        verdicts = {v.problem_id: v for v in batch.run_submission(sub, tasks, store, "mine", config)}
        rows = {pid: json.loads(row) for pid, row in store.sql("SELECT problem_id, row FROM audits")}
        keys = store.sql("SELECT device, precision, atol, rtol FROM audits")
        stored = store.verdicts("mine")
        monkeypatch.setattr(batch, "open_pool", _no_pool)
        again = batch.run_submission(sub, tasks, store, "mine", config)  # finished: nothing runs, not even the audit
    assert sorted(rows) == [1, 3] and set(keys) == {("cpu", "strict", 1e-2, 1e-2)}
    assert "zeros" in rows[1]["accepts"] and "zeros" in rows[3]["accepts"]
    assert verdicts[1].degenerate and "zeros" in verdicts[1].degenerate
    assert verdicts[3].reason == batch.NO_FILE and verdicts[3].degenerate and "zeros" in verdicts[3].degenerate
    assert verdicts[1].status.value == "pass", verdicts[1].reason  # exactly the reference: marked, not failed
    for pid, verdict in verdicts.items():
        assert verdict.degenerate == rows[pid]["degenerate"] and verdict.cost == rows[pid]["cost"]
        assert set(rows[pid]) >= {"level", "problem_id", "name", "accepts", "stochastic", "near", "input_sensitivity",
                                  "cost", "degenerate"}
    assert {v["problem_id"]: v["degenerate"] for v in stored} == {pid: v.degenerate for pid, v in verdicts.items()}
    assert [v.to_dict() for v in again] == [v for v in stored]


def _no_pool(*args, **kwargs):
    raise AssertionError("a pool was opened")


def test_a_run_in_another_precision_keeps_its_own_verdicts_baselines_and_audits(tmp_path, monkeypatch):
    """Judges are stand-ins here (what reaches them is the point): a kernelbench run of a submission
    that has a strict run resumes from nothing of it, times against kernelbench baselines only, audits
    for its own precision; an audit that failed is stored, marks nothing and is run again by the next audit."""
    from dataclasses import replace

    from cudagym.eval import batch
    from cudagym.eval.store import Store
    from cudagym.eval.verdict import Status, Verdict

    tasks = [task(1, code=DEGENERATE), task(2, body="torch.tanh(x)"), task(3, code=CRASHING)]
    sub = _submission(tmp_path / "sub", {1: "x * 1e-4", 3: "x"})  # 2 has no file
    strict = EvalConfig(device="cpu", n_checks=2)
    kernelbench = replace(strict, precision="kernelbench")
    audited, judged = [], []

    def fake_references(pool, shares, mode, on_result, description):
        assert mode == "audit"
        for share in shares:
            for t in share:
                audited.append((pool.worker.config.precision, t.problem_id))
                found = {"status": "runtime_error", "reason": "judge died (SIGSEGV)"} if t.problem_id == 3 else {
                    "accepts": ["zeros"] if t.problem_id == 1 else [], "stochastic_ops": [], "cost": {"flops": 4, "bytes": 8}}
                on_result(t, pool.envs[0], found)

    def fake_eval_job(t, code, baselines, worker, files=None):
        judged.append((worker.config.precision, t.problem_id, sorted(b["t_compile_ms"] for b in baselines.values())))
        return worker.env, Verdict(status=Status.PASS, level=t.level, problem_id=t.problem_id, name=t.name,
                                   timing_mode=worker.config.timing_mode, precision=worker.config.precision).finish()

    monkeypatch.setattr(batch, "run_references", fake_references)
    monkeypatch.setattr(batch, "_eval_job", fake_eval_job)
    env = batch.machine_env("cpu")
    assert batch.baseline_key(tasks[0], env, "strict", "strict").dtype == "float32-notf32"
    assert batch.baseline_key(tasks[0], env, "strict", "kernelbench").dtype == "float32-kernelbench"
    with Store(tmp_path / "runs.duckdb") as store:
        for precision, t_compile in (("strict", 1.0), ("kernelbench", 2.0)):
            store.put_baseline(batch.baseline_key(tasks[0], env, "strict", precision), {"t_compile_ms": t_compile})
        first = batch.run_submission(sub, tasks, store, "mine", strict)
        second = batch.run_submission(sub, tasks, store, "mine", kernelbench)
        third = batch.run_submission(sub, tasks, store, "mine", kernelbench)  # finished: nothing runs
        rows = batch.run_audit(tasks, kernelbench, store=store)  # only the failed audit runs again
        every = store.verdicts("mine")
        audits = store.sql("SELECT precision, problem_id, row FROM audits ORDER BY ALL")
    assert [v.precision for v in first] == ["strict"] * 3 and [v.precision for v in second] == ["kernelbench"] * 3
    assert [v.to_dict() for v in third] == [v.to_dict() for v in second]
    assert len(every) == 6 and {(v["precision"], v["problem_id"]) for v in every} == {
        (p, i) for p in ("strict", "kernelbench") for i in (1, 2, 3)}
    assert judged == [("strict", 1, [1.0]), ("strict", 3, []), ("kernelbench", 1, [2.0]), ("kernelbench", 3, [])]
    assert audited == [("strict", 1), ("strict", 2), ("strict", 3), ("kernelbench", 1), ("kernelbench", 2),
                       ("kernelbench", 3), ("kernelbench", 3)]
    assert [(p, i) for p, i, _ in audits] == [("kernelbench", 1), ("kernelbench", 2), ("kernelbench", 3),
                                              ("strict", 1), ("strict", 2), ("strict", 3)]
    assert "SIGSEGV" in json.loads(audits[2][2])["error"] and "SIGSEGV" in rows[2]["error"]
    assert [r["problem_id"] for r in rows] == [1, 2, 3] and rows[2]["degenerate"] is None
    for run in (first, second):
        by_id = {v.problem_id: v for v in run}
        assert "zeros" in by_id[1].degenerate and by_id[1].cost == {"flops": 4, "bytes": 8}
        assert by_id[2].reason == batch.NO_FILE and by_id[2].degenerate is None and by_id[2].cost == {"flops": 4, "bytes": 8}
        assert by_id[3].degenerate is None and by_id[3].cost is None  # its audit failed: no mark


def test_a_stored_audit_is_reused_for_the_same_code_under_another_name(tmp_path, monkeypatch):
    """`run_audit` with a store: rows come back in task order with the task's own names; a second
    audit of the same code (another task set) runs no judge."""
    from cudagym.eval import batch
    from cudagym.eval.store import Store

    config = EvalConfig(device="cpu", n_checks=2, timeout_s=30)
    with Store(tmp_path / "runs.duckdb") as store:
        [row] = batch.run_audit([task(4, code=DEGENERATE)], config, store=store)
        monkeypatch.setattr(batch, "run_references", _no_pool)
        [again] = batch.run_audit([Task(id="x", name="9_same_code", code=DEGENERATE, level=2, problem_id=9)], config,
                                  store=store)
        with pytest.raises(AssertionError, match="a pool was opened"):  # a stricter tolerance is another audit
            batch.run_audit([task(4, code=DEGENERATE)], EvalConfig(device="cpu", n_checks=2, atol=1e-6, rtol=1e-6),
                            store=store)
    assert "zeros" in row["accepts"] and "zeros" in row["degenerate"] and "error" not in row
    assert again == {**row, "level": 2, "problem_id": 9, "name": "9_same_code"}


def test_eval_run_and_audit_from_the_cli_share_audit_rows_and_keep_precisions_apart(tmp_path, monkeypatch, capsys):
    """The real CLI on the bundled examples: `audit kernelbench --db` stores rows that a second audit
    and `eval run` reuse; `eval run --precision kernelbench` beside a strict run of the same name."""
    from cudagym.cli import _eval_config, build_parser, main
    from cudagym.eval import batch
    from cudagym.eval.store import Store

    examples = Path(__file__).resolve().parents[2] / "examples"
    db = str(tmp_path / "runs.duckdb")
    select = ["--problems", str(examples / "problems"), "--levels", "1", "--ids", "2-3", "--device", "cpu",
              "--n-checks", "2", "--timeout", "30", "--db", db]
    assert main(["audit", "kernelbench", "--json", *select]) == 0
    out = capsys.readouterr().out
    audit = json.loads(out)
    assert [r["problem_id"] for r in audit] == [2, 3] and "passthrough" in audit[0]["accepts"]
    assert "passthrough" in audit[0]["degenerate"] and audit[1]["degenerate"] is None
    real = batch.run_references
    monkeypatch.setattr(batch, "run_references", _no_pool)  # stored: no judge runs for the audit again
    assert main(["audit", "kernelbench", "--json", *select]) == 0
    assert capsys.readouterr().out == out
    run = ["eval", "run", str(examples / "submission_cpu"), "--name", "mine", "--json", *select]
    assert main(run) == 0  # the audit rows are reused here too
    strict = {v["problem_id"]: v for v in map(json.loads, capsys.readouterr().out.splitlines())}
    monkeypatch.setattr(batch, "run_references", real)
    assert main([*run, "--precision", "kernelbench"]) == 0
    kb = {v["problem_id"]: v for v in map(json.loads, capsys.readouterr().out.splitlines())}
    assert main([*run, "--precision", "fp16"]) == 1 and "unknown precision" in capsys.readouterr().err
    for command in (["eval", "one", "--ref", "r.py", "--candidate", "c.py"], ["baseline", "run"], ["audit", "kernelbench"]):
        args = build_parser().parse_args([*command, "--device", "cpu", "--precision", "kernelbench"])
        assert _eval_config(args).precision == "kernelbench", command
        assert _eval_config(build_parser().parse_args([*command, "--device", "cpu"])).precision == "strict"
    for rows, precision in ((strict, "strict"), (kb, "kernelbench")):
        assert {pid: v["precision"] for pid, v in rows.items()} == {2: precision, 3: precision}
        assert rows[2]["status"] == "rejected" and "passthrough" in rows[2]["degenerate"]  # the example's reward hack
        assert rows[3]["reason"] == batch.NO_FILE and rows[3]["degenerate"] is None
    with Store(db) as store:
        assert len(store.verdicts("mine")) == 4
        assert sorted(store.sql("SELECT precision, count(*) FROM audits GROUP BY precision")) == [
            ("kernelbench", 2), ("strict", 2)]
        [s] = store.submissions()
        assert [(r["timing_mode"], r["precision"], r["n"]) for r in s["runs"]] == [
            ("strict", "strict", 2), ("strict", "kernelbench", 2)]


def test_baseline_progress_events_show_where_each_judge_spent_its_time():
    """A stored or compiled event carries its judge's phases (on the H200 a cold run's timing judges
    took ~5 s a problem for ~0.2 s of timing: the phases say where the rest went)."""
    import io

    from cudagym.eval.batch import BaselineProgress

    out = io.StringIO()
    meter = BaselineProgress(out)
    meter.start(2, 0)
    task = Task(id="v0.1/L1/1", name="t", code="")
    meter.compiled(task, {"compile_s": 12.3, "phase_s": {"memory": 40.06, "inputs": 1.0, "compile": 12.3}})
    meter.timed(task, {"t_eager_ms": 3.0, "phase_s": {"memory": 0.0, "turn": 2.25, "timing": 0.2}}, stored=True)
    meter.timed(Task(id="v0.1/L1/2", name="t", code=""), {"reason": "judge died"}, stored=False)
    lines = out.getvalue().splitlines()
    assert lines[1].endswith("· v0.1/L1/1 compiled (memory 40.1, inputs 1.0, compile 12.3 s)")
    assert lines[2].startswith("baselines: compiled 1/2 · timed 1/2 · stored 1/2 · failed 0")
    assert lines[2].endswith("· v0.1/L1/1 stored (memory 0.0, turn 2.2, timing 0.2 s)")
    assert lines[3].endswith("· v0.1/L1/2 failed: judge died")


@pytest.mark.parametrize("setting, threads", [(None, 3), ("4", 4), ("0", 3), ("many", 3)])
def test_judges_compile_threads_are_the_users_torch_setting_else_a_share_of_the_cores(monkeypatch, setting, threads):
    from cudagym.eval.pool import batch_config, compile_threads
    if setting is None:
        monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    else:
        monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", setting)
    assert compile_threads(cores=14, judges=4) == threads
    config = batch_config(EvalConfig(device="cpu", work_cpus=tuple(range(14))), parallel=4)
    assert config.compile_threads == threads


def test_judges_get_a_few_compile_workers_on_a_big_machine_one_on_a_small_one(monkeypatch):
    from cudagym.eval.pool import compile_threads
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    assert compile_threads(cores=16, judges=16) == 4  # a network's kernels compile four at a time
    assert compile_threads(cores=8, judges=16) == 2
    assert compile_threads(cores=2, judges=2) == 1  # CI: never more workers than a share of the cores
    assert compile_threads(cores=64, judges=4) == 16


def test_compile_judges_take_the_longest_compiles_first():
    from cudagym.eval.batch import longest_compiles_first
    tasks = [Task(id=f"L{lv}/{i}", name="t", code="x" * n, level=lv)
             for lv, i, n in [(1, 1, 900), (2, 1, 1200), (3, 1, 1300), (3, 2, 4800), (1, 2, 2000), (3, 3, 23000)]]
    order = [t.id for t in longest_compiles_first(tasks)]
    # Networks first, the longest source first among them; a long docstring does not lift an operator.
    assert order == ["L3/3", "L3/2", "L3/1", "L2/1", "L1/2", "L1/1"]
    assert longest_compiles_first([]) == []
