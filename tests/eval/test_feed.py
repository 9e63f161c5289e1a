"""Long-lived judges fed one task at a time (`cudagym.eval.feed`): real judge processes on the CPU."""

from __future__ import annotations

import threading
import time

import pytest

from cudagym.eval import evaluate
from cudagym.eval.feed import judge_feed
from cudagym.synth.filter import FilterConfig
from cudagym.tasks import Task


def _task(name: str, forward: str, imports: str = "") -> Task:
    code = f"""import torch
import torch.nn as nn
{imports}

class Model(nn.Module):
    def forward(self, x):
        {forward}


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
"""
    return Task(id=name, name=name, code=code, source="test")


class Answers:
    """What a feed answered, per task name, with when (seconds since t0)."""

    def __init__(self):
        self.t0, self.lock, self.got = time.monotonic(), threading.Lock(), {}

    def __call__(self, task: Task):
        def on_done(result: dict) -> None:
            with self.lock:
                self.got.setdefault(task.id, []).append((time.monotonic() - self.t0, result))
        return on_done

    def wait_for(self, names, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(n in self.got for n in names):
            assert time.monotonic() < deadline, f"no answer for {set(names) - set(self.got)} in {timeout_s} s"
            time.sleep(0.2)


def _each_answered_once(names: str) -> list[dict]:
    """Tasks named by the letters of `names` through a feed of two judges that cannot run them: each answered
    once, and the feed closed; their results."""
    answers = Answers()
    with judge_feed(FilterConfig(device="cpu", seed=1).probe_config(), "filter-probe", 2) as feed:
        for task in [_task(n, "return x + 1") for n in names]:
            feed.submit(task, answers(task))
    assert sorted(answers.got) == list(names) and all(len(g) == 1 for g in answers.got.values())
    return [answers.got[n][0][1] for n in names]


@pytest.mark.slow
def test_fed_judges_stay_up_between_tasks_answer_each_once_and_a_hung_task_ends_only_its_judge():
    """Two judges: tasks submitted while the feed is open are answered while it stays open; judges idle
    longer than a task's budget are not killed for it (the stall clock runs only while one holds a task),
    and take later tasks without a new start; a task that hangs is its timeout at the budget, and a new
    judge takes its judge's place for the rest."""
    config = FilterConfig(device="cpu", task_timeout_s=300.0, probe_timeout_s=12.0, seed=1).probe_config()
    first = [_task("a", "return x.tanh() * 2"), _task("b", "return x.sigmoid() + 1")]
    hangs = _task("hangs", "return x", imports="import time\ntime.sleep(600)")  # hangs loading, outside the GPU lock
    later = [_task("c", "return x.cos() + 1"), _task("d", "return x.exp() - 2"), _task("e", "return x * 3 + 1")]
    answers = Answers()
    with judge_feed(config, "filter-probe", 2) as feed:
        for task in first:
            feed.submit(task, answers(task))
        answers.wait_for(["a", "b"], 120)  # answered with the feed still open
        time.sleep(14)  # both judges idle for more than a task's budget
        for task in [hangs, *later]:
            feed.submit(task, answers(task))
    assert time.monotonic() - answers.t0 < 200
    assert sorted(answers.got) == ["a", "b", "c", "d", "e", "hangs"]
    assert all(len(got) == 1 for got in answers.got.values())  # each answered once
    (_, hung), = answers.got["hangs"]
    assert hung["status"] == "timeout" and "finished nothing in 12 s" in hung["reason"], hung
    results = [answers.got[name][0][1] for name in "abcde"]
    assert all(r["stage"] == "done" and r["t_eager_ms"] > 0 for r in results), results
    # at most three judges started (two, and one in place of the hung one): the idle ones served later tasks
    assert sum("start_s" in r for r in results) <= 3 and any("release_s" in answers.got[n][0][1] for n in "cde")
    assert not evaluate._LIVE_JUDGES


def test_a_fed_judge_that_cannot_start_fails_each_task_once_instead_of_restarting_forever(monkeypatch):
    """A judge that dies before taking any task: the driver runs the next task alone in its place, so
    each task ends once, with the judge's failure, and the feed closes."""
    monkeypatch.setattr("sys.executable", "/bin/false")
    results = _each_answered_once("abc")
    assert all(r["status"] == "runtime_error" and r.get("judge_error") for r in results)


@pytest.mark.slow
def test_a_stopped_feed_kills_its_judges_at_once():
    """Ctrl-C in the block: the judges go (a hung task included), the stop is raised, nothing is left running."""
    config = FilterConfig(device="cpu", task_timeout_s=300.0, seed=1).probe_config()
    hangs = _task("hangs", "return x", imports="import time\ntime.sleep(600)")
    answers = Answers()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with judge_feed(config, "filter-probe", 2) as feed:
            feed.submit(hangs, answers(hangs))
            time.sleep(3)
            raise KeyboardInterrupt
    assert time.monotonic() - t0 < 40 and not evaluate._LIVE_JUDGES and "hangs" not in answers.got


@pytest.mark.slow
def test_a_batch_that_stops_beside_a_feed_stops_only_its_own_judges():
    """An overlapped dataset build runs two batches in one process: the next round's scale search (a
    feed) and this round's filter (a pool's run, another thread). The filter failing mid-run (here: its
    store raising on the first result) stops its own judges, the hung one among them, and raises at
    once; the feed's judges stay up and answer what is submitted next. (With stops process-wide, the
    feed's idle judges were killed too, and the search waited for answers that never came.)"""
    from cudagym.eval.evaluate import run_reference_job
    from cudagym.eval.pool import run_all

    config = FilterConfig(device="cpu", task_timeout_s=300.0, seed=1).probe_config()
    quick = _task("quick", "return x + 1")
    hangs = _task("hangs", "return x", imports="import time\ntime.sleep(600)")
    answers = Answers()
    failed: list[BaseException] = []

    def store_fails(key, result) -> None:
        raise RuntimeError(f"the store failed at {key}")

    def filtering() -> None:
        try:
            run_all(((t.id, lambda t=t: run_reference_job(t, "filter-probe", config)) for t in [quick, hangs]),
                    2, store_fails, "filter", 2)
        except BaseException as e:  # noqa: BLE001
            failed.append(e)

    first = _task("a", "return x.tanh() * 2")
    with judge_feed(config, "filter-probe", 2) as feed:
        feed.submit(first, answers(first))
        answers.wait_for(["a"], 120)  # the feed's judges are up and idle
        other = threading.Thread(target=filtering)
        t0 = time.monotonic()
        other.start()
        other.join(120)
        assert not other.is_alive() and time.monotonic() - t0 < 100, "the failed batch waited for its hung task"
        assert len(failed) == 1 and "the store failed at quick" in str(failed[0])
        later = [_task("b", "return x.cos() + 1"), _task("c", "return x * 3 + 1")]
        for task in later:
            feed.submit(task, answers(task))
        try:
            answers.wait_for(["b", "c"], 120)
        except AssertionError:
            feed.stop()  # the feed's judges were stopped with the other batch: do not hang the suite
            raise
    results = [answers.got[n][0][1] for n in "abc"]
    assert all(r["stage"] == "done" and r["t_eager_ms"] > 0 for r in results), results
    assert sum("start_s" in r for r in results) <= 2  # the same two judges served b and c: none was restarted
    assert not evaluate._LIVE_JUDGES


def test_a_closed_feed_takes_no_more_tasks(monkeypatch):
    monkeypatch.setattr("sys.executable", "/bin/false")
    with judge_feed(FilterConfig(device="cpu", seed=1).probe_config(), "filter-probe", 1) as feed:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        feed.submit(_task("late", "return x"), lambda result: None)


def test_a_judge_that_cannot_even_be_set_up_answers_each_task_and_the_feed_still_closes(monkeypatch):
    """No temporary folder for a judge's workdir (a full or missing /tmp): no judge process at all. Each task
    is answered with why, once, and close() does not wait for answers that would never come."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent/cudagym-test")
    assert all("judge not started" in r["reason"] for r in _each_answered_once("ab"))
