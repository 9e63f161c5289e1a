"""Many problems at once: submission layout, several tasks per judge, a judge that dies mid-batch."""

from __future__ import annotations

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


def test_timing_shares_hold_every_task_once_and_mix_the_levels():
    tasks = [Task(id=f"L{1 + i // 10}/{i}", name=f"p{i}", code="", level=1 + i // 10, problem_id=i) for i in range(30)]
    shares = strided(tasks, 4)
    assert len(shares) == 4 and sorted(t.problem_id for s in shares for t in s) == list(range(30))
    assert all({t.level for t in s} == {1, 2, 3} for s in shares)  # no judge gets only the heavy level
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert strided(tasks[:2], 4) == [[tasks[0]], [tasks[1]]] and strided([], 4) == []



HANGING = TASK.format(body="__import__('time').sleep(300) or x", gen="randn")


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
