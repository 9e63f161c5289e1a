"""Stage 3, filter: keep only tasks an agent can be trained and rewarded on.

Every task runs in the evaluation harness's sandboxed judge (`cudagym.eval.judge.measure_task`, the
judge's "filter" mode: same process isolation, time and memory limits, GPU lock and input
generation as an evaluation), which measures; `decide` here turns the measurement into keep or
(drop, reason). A task is kept when:

- its forward runs in eager mode, and under torch.compile (inductor) with agreeing outputs
  (the harness's tolerance, atol = rtol = 1e-2 by default): `eager_error`, `compile_error`,
  `compile_mismatch`;
- no stochastic ATen op runs in its forward (dropout, rand*, bernoulli, ...: `stochastic_op`), and
  two runs on the same inputs agree (`nondeterministic`);
- its outputs are finite (`non_finite`), not empty (`empty_output`), and the harness's degenerate
  probes fail on them: not zeros, not a constant, not a row mean, not an input passed through, and
  different for different inputs (`degenerate_<probe>`, the probes of `cudagym.eval.checks`; a task
  that accepts one would reward that cheat);
- its eager runtime (median of the harness's timer) lies in the window: `too_fast`, `too_slow`
  (default 1-100 ms on a GPU, as in the paper; 0.01-1000 ms on the CPU for local runs); a task
  whose first eager call, and a warm one after it, already take `slow_factor` (20) times the
  window's top is too_slow without further checks;
- the judge neither timed out (`timeout`) nor died (`crash`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from cudagym.eval.evaluate import EvalConfig
from cudagym.tasks import Task

log = logging.getLogger(__name__)

GPU_WINDOW_MS = (1.0, 100.0)
# A scale-search probe timed beside other judges (the shared GPU lock) under this share of the window's floor
# is too fast without a timing turn of its own (judge.probe_task, PROBE_SHARED_GATE: sharing only slows a
# kernel down); the margin covers the noise of the few reps that turn would have timed.
PROBE_SHARED_FLOOR = 0.9
CPU_WINDOW_MS = (0.01, 1000.0)
REASONS = ("eager_error", "stochastic_op", "nondeterministic", "non_finite", "empty_output", "degenerate_<probe>",
           "compile_error", "compile_mismatch", "timing_error", "too_fast", "too_slow", "timeout", "crash")


@dataclass(frozen=True)
class FilterConfig:
    device: str = "cpu"
    min_eager_ms: float | None = None  # None: the device's default window
    max_eager_ms: float | None = None
    atol: float = 1e-2
    rtol: float = 1e-2
    task_timeout_s: float = 300.0  # one task's whole judge run: eager, compile, timing
    parallel: int = 1  # judges at once (per GPU with the ray runner)
    # Judges share a pass's tasks as one queue (batch.run_queue); on a Ray pool, whose workers see no queue
    # folder of this machine, each judge gets a share of at most `chunk` tasks (torch and inductor start once
    # for them), spread evenly (even_chunk)
    chunk: int = 8
    # Judges of the GPU's timing pass (pass 2 of run_filter): nothing else runs then, and each judge
    # spends seconds getting a task ready (its compile a cache hit, inputs) per fraction of a second it
    # holds the GPU alone: on the H200 (session 16) 4 judges timed ~100 tasks in 111 s, 0.36 s of
    # timing each. Baselines keep batch.TIMING_JUDGES_PER_GPU: their compile judges run beside.
    timing_judges: int = 8
    runner: str = "local"
    address: str | None = None
    max_timing_s: float = 2.0  # timing of one task: enough for a stable median, not a benchmark
    min_reps: int = 5
    max_reps: int = 50
    seed: int | None = None  # None: fresh secret input seeds, as in an evaluation
    two_pass: bool | None = None  # check all, then time the survivors (run_filter); None: on a GPU
    # The two passes streamed to one set of long-lived judges (`feed.JudgeFeed`, local pools only): each
    # task that passes its checks is timed as soon as it does, by the next idle judge, so the timing does
    # not wait for the slowest check and no second set of judges starts (run_filter). None: streamed
    # wherever two passes run on a local pool. On the H100 (sessions 31-32) the build's full call streamed
    # kept 20.4 a GPU-minute against 12.5-18.3 in two passes (session 29), and a call stopped on its clock
    # left 1 task checked and not timed against 48 (the timing pass begins only after the whole check pass).
    streamed: bool | None = None
    # The scale search's probes (`eager_times`): a rough eager time is all it needs
    probe_chunk: int = 16  # on a Ray pool: probes per judge process (judges start, torch and CUDA, once per chunk)
    probe_reps: tuple[int, int] = (3, 10)
    probe_timing_s: float = 0.5
    # One probe's budget (its judge's start included for the first): a chain whose first call runs for
    # minutes holds the GPU, and every probe of its wave waits behind it. On the H200 (session 21) one
    # probe ran past 200 s with the GPU at 100% and the rest of its wave of 148 waiting until the call
    # ended. Beyond the budget the probe times out (the search takes a smaller scale), and the rest of
    # its judge's probes go to a new judge. Capped by task_timeout_s (probe_config).
    probe_timeout_s: float = 60.0
    # A first eager call, and a warm one after it, each longer than slow_factor x the window's max drop
    # the task as too_slow at once (no checks, compile or timing). Generous: up to `parallel` judges
    # share the GPU then.
    slow_factor: float = 20.0

    def __post_init__(self):
        lo, hi = self.window_ms
        if not 0 <= lo < hi:
            raise ValueError(f"runtime window must satisfy 0 <= min < max, got {lo}..{hi} ms")
        if (min(self.task_timeout_s, self.probe_timeout_s) <= 0 or min(self.parallel, self.chunk, self.timing_judges) < 1
                or self.slow_factor <= 1):
            raise ValueError("task_timeout_s, probe_timeout_s, parallel, chunk and timing_judges must be positive, "
                             "slow_factor above 1")
        self.eval_config()  # device and the rest are checked where they are defined

    @property
    def two_passes(self) -> bool:
        """Whether this filter checks and times in two passes (two_pass None: on a GPU)."""
        return self.device.startswith("cuda") if self.two_pass is None else self.two_pass

    @property
    def streams(self) -> bool:
        """Whether its two passes stream to one feed of judges: on a local pool (a Ray worker sees no feed
        folder of this machine), unless turned off."""
        return self.two_passes and self.streamed is not False and self.runner == "local"

    @property
    def window_ms(self) -> tuple[float, float]:
        default = CPU_WINDOW_MS if self.device == "cpu" else GPU_WINDOW_MS
        return (default[0] if self.min_eager_ms is None else self.min_eager_ms,
                default[1] if self.max_eager_ms is None else self.max_eager_ms)

    def eval_config(self) -> EvalConfig:
        return EvalConfig(device=self.device, atol=self.atol, rtol=self.rtol, n_checks=2,
                          timeout_s=self.task_timeout_s, build_timeout_s=self.task_timeout_s,
                          task_timeout_s=self.task_timeout_s, max_timing_s=self.max_timing_s,
                          min_reps=self.min_reps, max_reps=self.max_reps, seed=self.seed,
                          slow_call_s=self.slow_factor * self.window_ms[1] / 1000)

    def probe_config(self) -> EvalConfig:
        """The judges' settings for the scale search's probes: few reps, a short timing, and a probe timed
        under PROBE_SHARED_FLOOR x the window's floor beside other judges decided without a timing turn."""
        budget = min(self.probe_timeout_s, self.task_timeout_s)  # never more than a task's own budget
        return replace(self.eval_config(), min_reps=self.probe_reps[0], max_reps=self.probe_reps[1],
                       max_timing_s=self.probe_timing_s, timeout_s=budget, build_timeout_s=budget,
                       task_timeout_s=budget, fast_ms=PROBE_SHARED_FLOOR * self.window_ms[0] or None)


@dataclass(frozen=True)
class FilterResult:
    keep: bool
    reason: str  # "" when kept, else one of REASONS
    detail: str = ""
    t_eager_ms: float | None = None
    t_compile_ms: float | None = None
    device: str = ""  # the GPU model (or "cpu") the task was measured on
    compile_s: float | None = None  # torch.compile's first call (CPU-heavy, GPU shared)
    timing_s: float | None = None  # the timing phase (GPU held alone)
    wait_s: float | None = None  # waiting for the GPU: its memory budget, the shared and the exclusive lock
    admit_s: float | None = None  # the part of wait_s spent waiting for admission to the GPU's memory budget
    share_gib: float | None = None  # its share of the GPU's memory budget (judge.task_memory), GPU only
    peak_gib: float | None = None  # the most its judge's allocator held
    compile_gib: float | None = None  # the share it lowered that to for its compile (check tasks), GPU only
    construct_s: float | None = None  # building the model on the CPU, before any GPU lock
    inputs_s: float | None = None  # moving the model to the device and building its inputs
    checks_s: float | None = None  # the checks, the compile apart
    start_s: float | None = None  # its judge's start (interpreter, imports), on a judge's first task only
    task_s: float | None = None  # the whole task in its judge: the phases above and what none of them names
    release_s: float | None = None  # its judge releasing the task before it (dynamo's caches, the allocator)

    @property
    def phases(self) -> dict | None:
        """Where the judges' time went (the `PHASES` recorded), for the build's records: what a faster
        filter has to cut."""
        return {k: round(getattr(self, k), 3) for k in PHASES + MEMORY if getattr(self, k) is not None} or None

    def to_dict(self) -> dict:
        return {"keep": self.keep, "reason": self.reason, "detail": self.detail, "t_eager_ms": self.t_eager_ms,
                "t_compile_ms": self.t_compile_ms, "device": self.device}


# a judge's seconds: FilterResult's fields. task_s is each task's whole time in its judge (start apart):
# what it has beyond the phases before it is time no phase names; release_s the judge's clean-up between tasks
PHASES = ("start_s", "construct_s", "inputs_s", "checks_s", "compile_s", "timing_s", "wait_s", "admit_s", "task_s",
          "release_s")
# a scale-search probe's seconds (judge.probe_task): call_s, its untimed eager calls (one-off costs, or
# a monster's whole answer), is where a probe wave's GPU time goes besides its timing; shared_s its timing
# beside other judges (under the shared lock) before any turn alone
# a judge's GPU memory (GiB), what it reserved and what it held at most: recorded with the phases, never summed
MEMORY = ("share_gib", "peak_gib", "compile_gib")
PROBE_PHASES = ("start_s", "construct_s", "inputs_s", "call_s", "shared_s", "timing_s", "wait_s", "admit_s", "task_s",
                "release_s")


def pass_line(what: str, n: int | None, seconds: float, measured: list[dict], stopped: bool = False,
              phases: tuple[str, ...] = PHASES, done_at: list[float] | None = None) -> str:
    """One line on a pass of judges: its tasks (those finished of n, when stopped), wall time, and the
    judges' seconds per phase (sum and median over the tasks that report it): where a faster build has
    to cut. A stopped pass says so: a pass that never ends is the one whose line matters most.
    done_at: when each task's result came in (seconds into the pass): the line adds when half and all
    of them had, so a pass whose tail is one slow judge (its last share, a long compile) shows it."""
    parts = []
    for key in phases:
        values = sorted(m[key] for m in measured if isinstance(m.get(key), (int, float)))
        if values:
            parts.append(f"{key[:-2]} {sum(values):.0f} (median {values[len(values) // 2]:.2f})")
    memory = [(m["share_gib"], m.get("peak_gib") or 0.0) for m in measured if isinstance(m.get("share_gib"), (int, float))]
    held = ""
    if memory:  # what the memory budget charged the tasks against what they held (GPU only)
        shares, peaks = sorted(s for s, _ in memory), sorted(p for _, p in memory)
        held = (f"; memory GiB reserved median {shares[len(shares) // 2]:.1f} (max {shares[-1]:.1f}), "
                f"held median {peaks[len(peaks) // 2]:.1f} (max {peaks[-1]:.1f})")
        lowered = sorted(m["compile_gib"] for m in measured if isinstance(m.get("compile_gib"), (int, float)))
        if lowered:  # check tasks: the share they kept for their compile
            held += f", for the compile median {lowered[len(lowered) // 2]:.1f} (max {lowered[-1]:.1f})"
    shared = [m for m in measured if isinstance(m.get("shared_ms"), (int, float))]
    if shared:  # probes timed beside other judges first (judge.probe_task): how many that decided, how much
        # sharing slowed the rest (their time shared over their time alone): whether a wider band could be decided so
        decided = sum(m.get("decided") == "shared" for m in shared)
        ratios = sorted(m["shared_ms"] / m["t_eager_ms"] for m in shared
                        if m.get("decided") != "shared" and m.get("t_eager_ms"))
        held += f"; timed shared {len(shared)}, decided there {decided}"
        if ratios:
            held += (f", the rest's shared/alone median {ratios[len(ratios) // 2]:.2f} "
                     f"(p10 {ratios[len(ratios) // 10]:.2f}, p90 {ratios[len(ratios) * 9 // 10]:.2f})")
    done = f"{len(measured)}" if n is None else f"{len(measured)} of {n}" if stopped else f"{n}"
    tail = ""
    if done_at:
        at = sorted(done_at)
        tail = f"; half done at {at[(len(at) - 1) // 2]:.0f} s, the last at {at[-1]:.0f} s"
    return (f"{what}: {done} in {seconds:.0f} s{', stopped' if stopped else ''}; "
            f"judge seconds {', '.join(parts) or 'none reported'}{held}{tail}")


class PassTally:
    """A pass's measurements as they come in, and when (seconds since the tally began), for its `pass_line`."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.measured: list[dict] = []
        self.done_at: list[float] = []

    def add(self, measurement: dict) -> None:
        self.measured.append(measurement)
        self.done_at.append(time.monotonic() - self.t0)

    def line(self, what: str, n: int | None, stopped: bool = False, phases: tuple[str, ...] = PHASES) -> str:
        return pass_line(what, n, time.monotonic() - self.t0, self.measured, stopped, phases, self.done_at)


@contextlib.contextmanager
def reported_pass(say: Callable[[str], None] | None, what: str, n: int | None, phases: tuple[str, ...] = PHASES):
    """Around a pass of judges of n tasks (None: as many as come, a feed's): yields add(measurement), to be
    called as each task's result comes in; says the pass's `pass_line` over them when it ends, or is stopped."""
    tally, stopped = PassTally(), True
    try:
        yield tally.add
        stopped = False
    finally:
        if say:
            say(tally.line(what, n, stopped, phases))


def passed_checks(measured: dict) -> bool:
    """Whether a check task (pass 1, "filter-check") passed every check: its timing comes next."""
    return measured.get("stage") == "checked" and not measured.get("error")


def decide(measured: dict, window_ms: tuple[float, float], device: str = "") -> FilterResult:
    """Keep or (drop, reason) from what the judge measured (`measure_task`'s dict, or a judge failure)."""
    seconds = {k: measured.get(k) for k in PHASES + MEMORY}

    def drop(reason: str, detail: object = "") -> FilterResult:
        return FilterResult(False, reason, str(detail)[:300], measured.get("t_eager_ms"), measured.get("t_compile_ms"),
                            device, **seconds)

    if measured.get("status") == "timeout":
        return drop("timeout", measured.get("reason", ""))
    if "stage" not in measured:  # the judge itself failed: a crash, an OOM, an unloadable task
        return drop("crash", measured.get("reason", "no result"))
    stage = measured["stage"]
    if measured.get("slow_call_s"):
        return drop("too_slow", f"warm eager call {measured['slow_call_s']:.3g} s, far beyond {window_ms[1]} ms")
    if measured.get("error"):
        return drop(f"{stage}_error" if stage in ("eager", "compile", "timing") else "eager_error", measured["error"])
    if measured.get("stochastic_ops"):
        return drop("stochastic_op", ", ".join(measured["stochastic_ops"]))
    if measured.get("rerun_mismatch"):
        return drop("nondeterministic", measured["rerun_mismatch"])
    if measured.get("non_finite"):
        return drop("non_finite", f"outputs {measured['non_finite']}")
    if measured.get("empty"):
        return drop("empty_output", f"outputs {measured['empty']}")
    if measured.get("degenerate"):
        return drop(f"degenerate_{measured['degenerate'][0]}", "accepts " + ", ".join(measured["degenerate"]))
    if measured.get("compile_mismatch"):
        return drop("compile_mismatch", measured["compile_mismatch"])
    if stage != "done" or measured.get("t_eager_ms") is None:
        return drop("crash", f"stopped at stage {stage}")
    lo, hi = window_ms
    t = measured["t_eager_ms"]
    if t < lo:
        return drop("too_fast", f"eager {t:.4g} ms < {lo} ms")
    if t > hi:
        return drop("too_slow", f"eager {t:.4g} ms > {hi} ms")
    return FilterResult(True, "", "", t, measured.get("t_compile_ms"), device, **seconds)


def run_filter(tasks: Iterable[Task], config: FilterConfig, on_result: Callable[[Task, FilterResult], None],
               checked: dict[str, dict] | None = None, on_checked: Callable[[Task, dict], None] | None = None,
               say: Callable[[str], None] | None = None, judges: "StandingJudges | None" = None) -> None:
    """Measure and decide every task on the runner's workers; on_result(task, result) runs in the
    calling thread, once per task, as results arrive (store them there: a killed run keeps them).

    On a GPU, by default in two passes, as the baselines are: checking and compiling a task held the
    GPU's shared lock for seconds, and a judge waiting to time blocked every other judge until all
    those holders were done, so one pass of many judges spent most of its time waiting (H200, 32
    judges: ~40 judge-seconds per task against ~3 s of work). Since session 16 the compile runs outside
    the lock (judge._measure_task); `two_pass=False` is one pass again, to measure against two. Pass 1
    checks and compiles every task, nothing timed; pass 2 only times the tasks that passed (no checks
    again: on the H200 the checks kept the GPU busy), on `timing_judges` long-lived judges per GPU
    whose compiles are now cache hits. Stopped before
    pass 2 timed them, the tasks that passed pass 1 are not reported; on_checked(task, measurement)
    gets each of them as pass 1 finishes it (store it there), and a re-run given those measurements
    as `checked` ({task.sha256: measurement}) times them without checking and compiling them again
    (on the H200, 344 re-checked tasks cost 282 s of compile and 71 s of wall). `streamed` (None or True:
    local pools, by default) runs both passes on one feed of judges, each task timed as soon as its checks
    pass (`run_streamed`); False runs them one after the other. `judges`: a build's standing judges
    (`standing_judges`), whose check feed streams the passes instead of a pool and feed of this call's own.
    say(line), if given, hears a `pass_line` as each pass ends."""
    from cudagym.eval.batch import open_pool, run_queue

    tasks, eval_config = list(tasks), config.eval_config()
    checked = dict(checked or {})  # pass 1's measurement of the tasks waiting for pass 2, by sha256

    def run_pass(tasks: list[Task], judges: int, chunk: int, mode: str, on_task, what: str) -> None:
        """`judges` judges sharing the tasks as one queue (shares of `chunk` on a Ray pool)."""
        with reported_pass(say, what, len(tasks)) as seen:  # the pass's measurements, for its line
            run_queue(pool, tasks, mode, judges, chunk,
                      lambda task, env, measured: (seen(measured), on_task(task, env, measured)),
                      f"{what}: {len(tasks)} tasks, {min(judges, len(tasks))} judges")

    def record(task: Task, env: dict, measured: dict) -> None:
        if task.sha256 in checked and "stage" in measured:  # pass 2 timed what pass 1 checked: one measurement
            measured = merged_measurement(checked[task.sha256], measured)
        on_result(task, decide(measured, config.window_ms, env.get("gpu", "")))

    def record_checked(task: Task, env: dict, measured: dict) -> None:
        if passed_checks(measured):
            checked[task.sha256] = measured
            if on_checked:
                on_checked(task, measured)
        else:
            record(task, env, measured)

    def run_streamed(env: dict, feed) -> None:
        """Both passes on one feed of judges (`FilterStream`), its answers handled in this thread."""
        stream = FilterStream(feed, env, config, on_result, checked, on_checked, say)
        stream.add(tasks)
        stream.close()
        try:
            stream.serve()
        except BaseException:
            stream.report(stopped=True)
            raise
        stream.report()

    if judges is not None and judges.checks is not None:
        run_streamed(judges.check_pool.worker.env, judges.checks)
        return
    from cudagym.eval.feed import judge_feed

    with open_pool(eval_config, config.parallel, config.runner, config.address) as pool:
        slots = pool.n_workers * config.parallel
        if not config.two_passes:  # the CPU (no GPU lock to wait for), or one pass asked for
            run_pass(tasks, slots, even_chunk(len(tasks), slots, config.chunk), "filter", record, "filter")
            return
        if config.streams:
            with judge_feed(pool.worker.config, "filter-check", slots) as feed:
                run_streamed(pool.worker.env, feed)
            return
        to_check = [t for t in tasks if t.sha256 not in checked]
        if to_check:
            run_pass(to_check, slots, even_chunk(len(to_check), slots, config.chunk), "filter-check", record_checked,
                     "filter check pass")
        to_time = [t for t in tasks if t.sha256 in checked]
        if to_time:
            timers = pool.n_workers * min(config.parallel, config.timing_judges)
            run_pass(to_time, timers, math.ceil(len(to_time) / timers), "filter-time", record, "filter timing pass")


def merged_measurement(first: dict, second: dict) -> dict:
    """One measurement of a task whose pass 1 (checks and compile) and pass 2 (timing) ran apart: its
    compile is pass 1's (pass 2's is a cache hit); waits, inputs, task time and judge starts add up."""
    measured = {**first, **second, "compile_s": first.get("compile_s") or second.get("compile_s"),
                **{k: first.get(k, 0.0) + second.get(k, 0.0) for k in ("wait_s", "admit_s", "inputs_s", "task_s", "release_s")},
                **{k: max(m.get(k) or 0.0 for m in (first, second)) for k in MEMORY if k in first or k in second}}
    starts = [m["start_s"] for m in (first, second) if m.get("start_s") is not None]
    measured.pop("start_s", None)
    if starts:
        measured["start_s"] = sum(starts)
    return measured


class FilterStream:
    """The filter's two passes streamed to one feed of judges (`feed.JudgeFeed` in "filter-check" mode),
    open-ended: tasks go in (`add`) while earlier ones are being decided, each task's timing goes in as
    its checks come back passed (a task checked before, `checked`, is timed at once), and `serve`, in one
    thread, handles the answers: on_checked(task, measurement) as a task passes its checks,
    on_result(task, FilterResult) as it is decided (the store's writes, all in that thread). `close`:
    no more tasks; `serve` returns when every task added is decided. A feed whose judges were stopped
    (Ctrl-C elsewhere) makes `serve` raise `Interrupted`.

    `run_filter` streams a fixed list through one; an overlapped build keeps one for all its rounds
    (`build.streamed_rounds`), adding each round's candidates as they are sized: with a stream per round,
    a round's last checks and timings (on the H100 in session 33, half a round's candidates were checked
    5-10 s into the round and the last timed 35-50 s in) held back the next round's candidates."""

    def __init__(self, feed, env: dict, config: FilterConfig, on_result: Callable[[Task, "FilterResult"], None],
                 checked: dict[str, dict] | None = None, on_checked: Callable[[Task, dict], None] | None = None,
                 say: Callable[[str], None] | None = None):
        self.feed, self.env, self.config, self.say = feed, env, config, say
        self.on_result, self.on_checked = on_result, on_checked
        self.checked = dict(checked or {})  # pass 1's measurements of tasks not yet timed, by sha256
        self.answers: queue.Queue = queue.Queue()
        self.cond = threading.Condition()
        self.in_flight: dict[str, Task] = {}  # added, not decided yet, by sha256
        self.closed = False
        self.tallies = {"filter-check": PassTally(), "filter-time": PassTally()}  # since the last `report`

    def __contains__(self, sha: str) -> bool:
        with self.cond:
            return sha in self.in_flight

    @property
    def outstanding(self) -> int:
        """Tasks added and not decided yet."""
        with self.cond:
            return len(self.in_flight)

    def add(self, tasks: Iterable[Task]) -> int:
        """Send tasks to the judges (those already in flight are skipped); how many went."""
        sent = 0
        for task in tasks:
            with self.cond:
                if self.closed:
                    raise RuntimeError("the filter stream is closed")
                if task.sha256 in self.in_flight:
                    continue
                self.in_flight[task.sha256] = task
            self._submit(task, "filter-time" if task.sha256 in self.checked else "filter-check")
            sent += 1
        return sent

    def _submit(self, task: Task, mode: str) -> None:
        self.feed.submit(task, lambda result: self.answers.put((task, mode, result)), mode=mode)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def wait_until(self, ready: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Wait (in another thread than `serve`'s) until ready() holds, checked as each task is decided
        and on close; whether it holds."""
        with self.cond:
            return self.cond.wait_for(ready, timeout=timeout_s)

    def serve(self) -> None:
        """Handle the answers as they come, until closed and every task added is decided."""
        from cudagym.eval.evaluate import Interrupted

        while True:
            with self.cond:
                if self.closed and not self.in_flight:
                    return
            try:
                task, mode, measured = self.answers.get(timeout=1.0)
            except queue.Empty:
                if self.feed.ended():  # its judges were stopped (Ctrl-C in another thread): nothing more comes
                    raise Interrupted() from None
                continue
            self._handle(task, mode, measured)

    def _handle(self, task: Task, mode: str, measured: dict) -> None:
        self.tallies[mode].add(measured)
        if mode == "filter-check" and passed_checks(measured):
            self.checked[task.sha256] = measured
            if self.on_checked:
                self.on_checked(task, measured)
            self._submit(task, "filter-time")  # passed: timed next
            return
        if task.sha256 in self.checked and "stage" in measured:  # pass 2 timed what pass 1 checked
            measured = merged_measurement(self.checked.pop(task.sha256), measured)
        self.on_result(task, decide(measured, self.config.window_ms, self.env.get("gpu", "")))
        with self.cond:
            self.in_flight.pop(task.sha256, None)
            self.cond.notify_all()

    def report(self, stopped: bool = False) -> None:
        """Say a `pass_line` for the checks and one for the timings answered since the last report."""
        if self.say:
            for mode, what in (("filter-check", "filter checks, streamed"), ("filter-time", "filter timing, streamed")):
                self.say(self.tallies[mode].line(what, None, stopped))
        self.tallies = {mode: PassTally() for mode in self.tallies}


def even_chunk(n: int, slots: int, most: int) -> int:
    """Tasks per judge for n tasks on `slots` judges at once: as few waves of judges as `most` tasks a
    judge allow, the tasks spread evenly over each wave (a pass ends with its slowest judge: no short
    last wave of full judges, and no idle slots while fewer, fuller judges run; on the H200 89
    candidates in chunks of 8 ran on 12 of 16 slots)."""
    waves = max(1, math.ceil(n / (slots * most)))
    return max(1, math.ceil(n / (slots * waves)))


def eager_times(tasks: list[Task], config: FilterConfig, pool, say: Callable[[str], None] | None = None
                ) -> list[float | None]:
    """Each task's eager time (ms), roughly, measured on an open pool (`batch.open_pool` of
    `config.probe_config()`): the judge's filter-probe mode, which neither checks nor compiles and
    times a few reps. None where it failed, ran out of memory or time. A task whose first and warm
    calls are beyond slow_factor x the window's top gets that warm call's time. The scale search's
    probes: on the H200, timing each probe as the filter times a task (compile included) took longer
    than a 470 s call for one round of 300 candidates. say(line), if given, hears a `pass_line`."""
    from cudagym.eval.batch import run_queue

    measured: dict[str, dict] = {}
    slots = pool.n_workers * config.parallel
    with reported_pass(say, "scale search probes", len(tasks), PROBE_PHASES) as seen:
        run_queue(pool, tasks, "filter-probe", slots, even_chunk(len(tasks), slots, config.probe_chunk),
                  lambda task, env, result: (measured.__setitem__(task.id, result), seen(result)),
                  f"scale search: time {len(tasks)} probes, {min(slots, len(tasks))} judges")
    return [probe_ms(measured.get(task.id)) for task in tasks]


def probe_ms(result: dict | None) -> float | None:
    """A probe's eager time (ms) from its judge's result; None where it failed, ran out of memory or time."""
    ok = result is not None and result.get("stage") == "done" and not result.get("error")
    return result.get("t_eager_ms") if ok else None


@contextlib.contextmanager
def streamed_probes(pool, config: FilterConfig, say: Callable[[str], None] | None = None, feed=None):
    """The scale search's probes streamed (`scale.size_chains(stream=...)`): yields stream(task, answer),
    which sends the task to one set of long-lived judges (`feed.judge_feed`, `config.parallel` of them on
    the local pool's machine) and calls answer(eager ms or None) when it is timed, as `eager_times` would
    time it. The judges start at once and serve the whole search, so no probe waits for a wave's slowest
    or a new judge's start. say(line), if given, hears one `pass_line` over every probe at the end.
    feed: a build's standing probe judges (`standing_judges`) instead of a feed of its own."""
    from cudagym.eval.feed import judge_feed

    with reported_pass(say, "scale search probes, streamed", None, PROBE_PHASES) as seen, \
            (contextlib.nullcontext(feed) if feed is not None else
             judge_feed(pool.worker.config, "filter-probe", config.parallel)) as feed:
        def stream(task: Task, answer: Callable[[float | None], None]) -> None:
            feed.submit(task, lambda result: (seen(result), answer(probe_ms(result))))

        yield stream


@dataclass
class StandingJudges:
    """A build's long-lived judges on this machine, kept across its rounds (`standing_judges`): the scale
    search's probe feed and the filter's check-and-timing feed, with the pools whose settings they run."""
    probe_pool: object = None
    probes: object = None  # feed.JudgeFeed in "filter-probe" mode, or None: the build sizes nothing by search
    check_pool: object = None
    checks: object = None  # feed.JudgeFeed in "filter-check" mode, or None: the filter does not stream


@contextlib.contextmanager
def standing_judges(config: FilterConfig, probes: bool, checks: bool):
    """Judges that serve every round of a build (on a local pool): `probes`, a feed for the scale search's
    probes (`streamed_probes`), `checks`, one for the filter's streamed passes (`run_filter`). Each round
    used to start its own: on the H100 (session 33) 16 probe judges and 16 filter judges a round, 8-12 s
    each under a load of 20 on 16 cores (250-280 judge-s of a ~100-s round's CPU), and at every round's
    start the GPU stood empty while they did. The judges start at once, beside the build's first compose.
    Closed with the build (every task answered); stopped if it raised (Ctrl-C)."""
    from cudagym.eval.batch import open_pool
    from cudagym.eval.feed import judge_feed

    with contextlib.ExitStack() as stack:
        judges = StandingJudges()
        if checks:
            judges.check_pool = stack.enter_context(open_pool(config.eval_config(), config.parallel))
            judges.checks = stack.enter_context(judge_feed(judges.check_pool.worker.config, "filter-check",
                                                           config.parallel))
        if probes:
            judges.probe_pool = stack.enter_context(open_pool(config.probe_config(), config.parallel))
            judges.probes = stack.enter_context(judge_feed(judges.probe_pool.worker.config, "filter-probe",
                                                           config.parallel))
        yield judges


def with_measurement(task: Task, result: FilterResult) -> Task:
    """The kept task, carrying its runtimes and where they were measured."""
    return replace(task, provenance={**task.provenance, "eager_ms": result.t_eager_ms,
                                     "compile_ms": result.t_compile_ms, "filter_device": result.device})


def filter_tasks(tasks: Iterable[Task], config: FilterConfig) -> tuple[list[Task], list[tuple[Task, FilterResult]], Counter]:
    """(kept tasks in input order, rejects with their results, stats `in`/`kept`/`dropped_<reason>`)."""
    tasks = list(tasks)
    results: dict[str, FilterResult] = {}
    run_filter(tasks, config, lambda task, result: results.__setitem__(task.id, result))
    stats: Counter = Counter(**{"in": len(tasks)})
    kept, rejects = [], []
    for task in tasks:
        result = results[task.id]
        stats["kept" if result.keep else f"dropped_{result.reason}"] += 1
        if result.keep:
            kept.append(with_measurement(task, result))
        else:
            rejects.append((task, result))
    log.info("filter: %s", dict(stats))
    return kept, rejects, stats
