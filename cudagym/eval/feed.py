"""Long-lived judges fed one task at a time: the streaming alternative to a pass of judges.

A pass (`batch.run_queue`) starts its judges, hands them one fixed list and ends when the list is done,
so every pass pays its judges' start (a median of 3-7 s on the H100) and a barrier at its end, where
judges that ran out of tasks wait for the last long one. The dataset build's scale search asks for its
probes in waves (a search's next probe depends on its last one), so each round ran three passes of
probes: on the H100 (session 27) the small late waves of 1-30 probes took 10-38 s each, behind one slow
chain or a judge's start. A feed keeps `judges` judges running for as long as it is open: `submit` adds
a task the moment it is known, the next idle judge claims it (the queue's claims, `gpulock.claim_task`),
and the result reaches the caller's callback as soon as the judge writes it, so a search's next probe
goes in as its last comes back and no wave waits for another.

What goes wrong with one task stays that task's result, as in a queue (`evaluate.run_queued_jobs`): a
task that hangs (nothing finished for one task's budget while its judge holds it) or kills its judge
is answered with the judge's end, and a new judge takes that judge's place; a judge that dies before
taking any task is replaced by this driver running the next unclaimed task alone, so a judge that
cannot start fails each task once instead of restarting forever; a task that ran out of GPU memory
beside others runs again alone. Local pools only: a Ray worker sees no queue folder of this machine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import uuid
from typing import Callable

from cudagym.eval.evaluate import (EvalConfig, Interrupted, _run_judge_once, ended_task_result, enter_scope,
                                   judges_lock_dir, new_scope, out_of_memory, reference_request, run_reference_job,
                                   stop_live_judges)
from cudagym.eval.gpulock import claim_task, task_claimant, task_queue
from cudagym.tasks import Task

log = logging.getLogger(__name__)

# A fed judge lives as long as its feed; each task it holds is bounded by the stall clock (one task's budget).
FEED_LIFETIME_S = 7 * 24 * 3600.0
END_MARK = "end"  # in the feed folder: no item comes after those already written (judge.fed_tasks)
DRAIN_S = 30.0  # stopped (Ctrl-C), how long to wait for the judges' threads


def item_path(folder: str, n: int) -> str:
    """Item n of a feed: the driver writes it (`write_item`), judges read it in order (`judge.fed_tasks`)."""
    return os.path.join(folder, f"{n:08d}.json")


def write_item(folder: str, n: int, entry: dict) -> None:
    """Item n of a feed, whole or not at all (a judge polling for it never reads half a file)."""
    path = item_path(folder, n)
    with open(path + ".tmp", "w") as f:
        json.dump(entry, f)
    os.replace(path + ".tmp", path)


class JudgeFeed:
    """`judges` long-lived judges in `mode` on this machine, taking tasks as they are submitted."""

    def __init__(self, config: EvalConfig, mode: str, judges: int, folder: str):
        self.config, self.mode, self.folder = config, mode, folder
        self.cond = threading.Condition()
        self.items = 0  # item files written
        # submitted, not yet answered (oldest first): the task, its callback and the mode it runs in
        self.pending: dict[str, tuple[Task, Callable[[dict], None], str]] = {}
        self.alone: set[str] = set()  # pending tasks run again alone (out of memory): no judge of the feed holds them
        self.claims: dict[str, str] = {}  # key -> the token that claimed it, as read (a claim never changes)
        self.closed = False
        self.errors: list[BaseException] = []  # raised by a callback: raised again by close()
        self.scope = new_scope()  # the feed's judges, its own to stop (`evaluate.StopScope`)
        self.threads = [threading.Thread(target=self._slot, name=f"fed-judge-{i}", daemon=True)
                        for i in range(max(1, judges))]
        for thread in self.threads:  # judges start now: their start overlaps whatever comes before the first task
            thread.start()

    def submit(self, task: Task, on_done: Callable[[dict], None], mode: str | None = None) -> None:
        """Add a task; on_done(result) runs once, in a judge's driving thread, when its result is known.
        mode: another reference mode than the feed's for this task (the filter's checks and timing share
        one feed: `filter.run_filter`), with the feed's settings."""
        key = uuid.uuid4().hex  # not the task's id: the same task may be submitted twice
        with self.cond:
            if self.closed:
                raise RuntimeError("the judge feed is closed")
            self.pending[key] = (task, on_done, mode or self.mode)
            write_item(self.folder, self.items, {"key": key, "code": task.code, **({"mode": mode} if mode else {})})
            self.items += 1
            self.cond.notify_all()

    def close(self) -> None:
        """No more tasks: wait for every submitted one to be answered and every judge to end."""
        with self.cond:
            if not self.closed:
                self.closed = True
                open(os.path.join(self.folder, END_MARK), "w").close()
                self.cond.notify_all()
            self.cond.wait_for(lambda: not self.pending)
        for thread in self.threads:
            thread.join()
        if self.errors:
            raise self.errors[0]

    def ended(self) -> bool:
        """Every judge slot returned: the feed was stopped (open, its slots return only when interrupted)."""
        return not any(thread.is_alive() for thread in self.threads)

    def stop(self) -> None:
        """Stopped (Ctrl-C): kill the judges; what was answered was answered."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        stop_live_judges(self.scope)
        for thread in self.threads:
            thread.join(timeout=DRAIN_S)

    # -- a judge slot: one judge at a time, another in its place when it ends early --------------------
    def _slot(self) -> None:
        enter_scope(self.scope)
        while True:
            token = uuid.uuid4().hex
            took: list[str] = []

            def on_line(_: int, result: dict) -> None:
                key = result.pop("feed_key", None)
                if key:
                    took.append(key)
                    self._answer(key, result)

            request = dict(reference_request("", self.mode, self.config, True), feed=self.folder, claim_token=token)
            try:
                ended = _run_judge_once(request, self.config, stall_s=self.config.judge_timeout_s, on_line=on_line,
                                        timeout_s=FEED_LIFETIME_S, busy=lambda: bool(self._held_by(token)))
            except Interrupted:
                return
            except Exception as e:  # noqa: BLE001 - not started (no workdir, no process): as a judge that died at once
                ended = not_started(e)
            orphans = self._held_by(token)  # claimed, never answered: the task it hung on or died with
            failure = ended_task_result(ended)
            for key in orphans:
                self._answer(key, dict(failure))
            with self.cond:
                if self.closed and not self._unclaimed():
                    return  # the feed is done (the judges still at work answer their own tasks)
            if not took and not orphans:  # it ended before taking any task: its start failed
                log.warning("a fed judge ended before its first task: %s", str(failure.get("reason", failure))[:300])
                if not self._run_alone():
                    return

    def _claimants(self, keys: list[str]) -> dict[str, str | None]:
        """Who claimed each of these tasks (None: nobody yet). Every judge's driver asks each second: one
        listing of the folder, and only claims not read before are opened (a claim never changes)."""
        present = set(os.listdir(self.folder))
        for key in keys:
            if key not in self.claims and key in present:
                claimant = task_claimant(self.folder, key)
                if claimant is not None:
                    self.claims[key] = claimant
        return {key: self.claims.get(key) for key in keys}

    def _held_by(self, token: str) -> list[str]:
        """The pending tasks a judge (its token) has claimed and holds (not those run again alone)."""
        with self.cond:
            keys = [key for key in self.pending if key not in self.alone]
        return [key for key, claimant in self._claimants(keys).items() if claimant == token]

    def _unclaimed(self) -> list[str]:
        return [key for key, claimant in self._claimants(list(self.pending)).items() if claimant is None]

    def _run_alone(self) -> bool:
        """The next unclaimed task, run alone in its own judge (the chunked path's answer to a dead judge);
        False when the feed closed with nothing left to take."""
        token = uuid.uuid4().hex
        with self.cond:
            while True:
                key = next((k for k in list(self.pending) if claim_task(self.folder, k, token)), None)
                if key is not None:
                    task, _, mode = self.pending[key]
                    break
                if self.closed:
                    return False
                self.cond.wait(timeout=1.0)
        return self._answer_alone(key, task, mode)

    def _answer_alone(self, key: str, task: Task, mode: str) -> bool:
        """Run the task alone in its own judge (run_judge holds the GPU alone if it runs out of memory) and
        answer it; False when stopped. A judge that cannot be set up is the task's answer, so that close()
        never waits for it."""
        enter_scope(self.scope)  # this may be a thread of its own (out of memory beside others)
        try:
            result = run_reference_job(task, mode, self.config)
        except Interrupted:
            return False
        except Exception as e:  # noqa: BLE001
            result = not_started(e)
        self._answer(key, result, rerun=False)
        return True

    def _answer(self, key: str, result: dict, rerun: bool = True) -> None:
        with self.cond:
            entry = self.pending.get(key)
        if entry is None:
            return
        task, on_done, mode = entry
        if rerun and self.config.device.startswith("cuda") and out_of_memory(result):
            # beside other judges: again alone, in a thread of its own so that this judge's other results keep coming
            with self.cond:
                self.alone.add(key)
            threading.Thread(target=self._answer_alone, args=(key, task, mode), daemon=True).start()
            return
        try:
            on_done(result)
        except BaseException as e:  # noqa: BLE001 - the caller's bug: raised again by close()
            self.errors.append(e)
        with self.cond:
            self.pending.pop(key, None)
            self.alone.discard(key)
            self.claims.pop(key, None)
            self.cond.notify_all()


def not_started(error: Exception) -> dict:
    """A task's result when its judge could not even be set up (no workdir, no process)."""
    return {"status": "runtime_error", "judge_error": True, "reason": f"judge not started: {error}"[:300]}


@contextlib.contextmanager
def judge_feed(config: EvalConfig, mode: str, judges: int):
    """A `JudgeFeed` of `judges` judges in `mode`, its folder in the machine's lock folder (which judges may
    write); closed at the end (every task answered), stopped if the block raised (Ctrl-C)."""
    with task_queue(judges_lock_dir(config)) as folder:
        feed = JudgeFeed(config, mode, judges, folder)
        try:
            yield feed
        except BaseException:
            feed.stop()
            raise
        feed.close()
