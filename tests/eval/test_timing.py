"""Timing: adaptive repetition, summary statistics, and the CPU Timer."""

from __future__ import annotations

import random
import statistics
import time

import pytest

from cudagym.eval import timing
from cudagym.eval.timing import TIMING_MODES, Timer, adaptive_reps, summarize


def test_timing_modes():
    assert set(TIMING_MODES) == {"strict", "paper", "kernelbench"}


def test_constant_series_stops_early():
    calls = []
    times = adaptive_reps(lambda i: calls.append(i) or 1.0, min_reps=10, max_reps=200, max_seconds=60)
    assert len(times) < 200
    assert len(times) == 15  # median checked at 10 (first) and 15 (unchanged)
    assert calls == list(range(15))  # run_rep gets the rep index


def test_min_reps_respected():
    times = adaptive_reps(lambda i: 1.0, min_reps=30, max_reps=200, max_seconds=60)
    assert 30 <= len(times) <= 35


def test_noisy_increasing_series_runs_to_max():
    rng = random.Random(0)
    times = adaptive_reps(lambda i: 1.0 + i + rng.random(), min_reps=5, max_reps=60, max_seconds=60)
    assert len(times) == 60


def test_max_seconds_respected():
    def slow(i):
        time.sleep(0.02)
        return float(i + 1)  # never stable

    t0 = time.perf_counter()
    times = adaptive_reps(slow, min_reps=5, max_reps=10_000, max_seconds=0.3)
    elapsed = time.perf_counter() - t0
    assert 3 <= len(times) < 40
    assert elapsed < 2.0


def test_max_seconds_still_takes_three_reps():
    def very_slow(i):
        time.sleep(0.05)
        return 1.0

    assert len(adaptive_reps(very_slow, min_reps=10, max_reps=100, max_seconds=0.0)) == 3


def test_summarize_known_lists():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])  # unsorted on purpose
    assert s["median_ms"] == 3.0 and s["min_ms"] == 1.0 and s["reps"] == 5
    assert s["iqr_ms"] == pytest.approx(3.0)  # exclusive quartiles of 1..5: 1.5 and 4.5

    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s["median_ms"] == 2.5
    assert s["iqr_ms"] == pytest.approx(3.75 - 1.25)

    s = summarize([7.0])
    assert s == {"median_ms": 7.0, "iqr_ms": 0.0, "min_ms": 7.0, "reps": 1}

    s = summarize([2.0] * 9 + [1000.0])  # one outlier moves neither median nor IQR much
    assert s["median_ms"] == 2.0 and s["iqr_ms"] < 300


def test_summarize_matches_statistics():
    rng = random.Random(1)
    data = [rng.random() for _ in range(101)]
    q1, _, q3 = statistics.quantiles(data, n=4)
    s = summarize(data)
    assert s["median_ms"] == statistics.median(data) and s["iqr_ms"] == pytest.approx(q3 - q1)


def test_cpu_timer_returns_result_and_time():
    timer = Timer("cpu")
    assert not timer.cuda
    ms, out = timer.time_ms(lambda: (time.sleep(0.02), 42)[1])
    assert out == 42
    assert 15 <= ms < 2000
    ms, out = timer.time_ms(lambda: None)
    assert out is None and 0 <= ms < 15
    timer.flush()  # no-ops on CPU
    timer.sync()


def test_timer_keeps_the_clock_it_was_built_with():
    timer = Timer("cpu")
    original = time.perf_counter
    try:
        time.perf_counter = lambda: 0.0  # a candidate freezing the clock after the timer exists
        ms, _ = timer.time_ms(lambda: time.sleep(0.01))
    finally:
        time.perf_counter = original
    assert ms >= 5
    assert timing.time.perf_counter is original


# -- paper mode: the profiler's threads are not the candidate's -----------------------------------
def test_profile_calls_tells_the_profilers_threads_from_a_candidates():
    """A call that leaves a thread running is not hidden by the profiler's own threads, and the
    results of the last `keep` timed calls come back for checking (CPU profiler: the same logic as
    the CUDA one the paper mode uses)."""
    import threading

    import torch

    from cudagym.eval.integrity import Snapshot, thread_ids
    from cudagym.eval.timing import profile_calls

    snapshot = Snapshot.take()
    stop = threading.Event()
    calls = []

    def fn():
        calls.append(1)
        if len(calls) == 7:  # a timed call (after 5 warm-ups) starts a thread that outlives it
            threading.Thread(target=stop.wait, daemon=True).start()
        return torch.full((4,), float(len(calls)))

    try:
        ms, kept, profiler_threads = profile_calls(fn, keep=3, census=lambda: thread_ids()[1], device_type="cpu")
        snapshot.allow_threads(profiler_threads)
        assert "background_thread" in snapshot.changes(), "the candidate's thread was taken for the profiler's"
    finally:
        stop.set()
    assert [int(t[0]) for t in kept] == [13, 14, 15] and ms >= 0


def test_the_profilers_own_threads_are_not_a_background_thread():
    import torch

    from cudagym.eval.integrity import Snapshot, thread_ids
    from cudagym.eval.timing import profile_calls

    snapshot = Snapshot.take()
    _, kept, profiler_threads = profile_calls(lambda: torch.ones(3) * 2, keep=1, census=lambda: thread_ids()[1],
                                              device_type="cpu")
    snapshot.allow_threads(profiler_threads)
    assert "background_thread" not in snapshot.changes() and len(kept) == 1


def test_a_fast_call_gets_at_least_a_hundred_reps_and_a_slow_one_does_not():
    from cudagym.eval.timing import FAST_MIN_REPS

    assert FAST_MIN_REPS <= len(adaptive_reps(lambda i: 0.02, min_reps=10, max_reps=100, max_seconds=60)) <= FAST_MIN_REPS + 5
    assert len(adaptive_reps(lambda i: 2.0, min_reps=10, max_reps=100, max_seconds=60)) < FAST_MIN_REPS


def test_activity_span_and_busy_time_over_streams():
    """Records on two streams: the span runs from the first start to the last end; the busy time
    counts overlapping work once and the gaps not at all."""
    from cudagym.eval.timing import activity_ms

    assert activity_ms([]) == (0.0, 0.0)
    ranges = [(100.0, 110.0), (105.0, 120.0),  # two streams overlapping: busy 100-120
              (150.0, 160.0),  # after a 30 us gap (a host launch)
              (152.0, 155.0)]  # inside the previous one
    span, busy = activity_ms(ranges)
    assert span == pytest.approx(0.060) and busy == pytest.approx(0.030)


def test_profiled_records_span_the_work_and_not_the_host_before_it():
    """On the CPU (the logic without a GPU: CPU op rows stand in for device records), a call with a
    pause between two ops spans the pause; the ranges come from the work run() did, and the profiler's
    threads are told apart from one run() started."""
    import threading
    import time as _time

    import torch

    from cudagym.eval.integrity import thread_ids
    from cudagym.eval.timing import activity_ms, profiled

    x = torch.randn(64, 64)
    started = threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), _time.sleep(0.5)))

    def run():
        torch.mm(x, x)
        _time.sleep(0.05)
        worker.start()
        started.wait()
        torch.mm(x, x)

    ranges, profiler_threads = profiled(run, census=lambda: thread_ids()[1], device_type="cpu")
    span, busy = activity_ms(ranges)
    assert len(ranges) >= 2
    assert span >= 50.0 and busy < span  # ms: the pause is inside the span, not in the busy time
    assert str(worker.native_id) not in profiler_threads
    worker.join()


def test_the_spin_follows_the_recent_host_paths_so_one_stalled_rep_does_not_slow_every_later_one():
    """The queued method's spin must outlast the host's path through the call, but one stalled path (a
    lazy module load on a process's first call, a descheduled thread) must not keep every later rep
    at the cap: on the H200 a spin that only grew made each rep of a 0.04 ms call cost 19 ms."""
    from cudagym.eval.timing import SPIN_MAX_US, SPIN_START_US, next_spin_us

    assert next_spin_us([]) == SPIN_START_US
    assert next_spin_us([0.03]) == SPIN_START_US  # a fast call: the floor
    assert next_spin_us([3.0]) == pytest.approx(6000.0)  # a launch-bound chain: twice its path, at once
    assert next_spin_us([40.0]) == SPIN_MAX_US  # host-bound beyond the cap
    paths, spins = [15.0] + [0.03] * 6, []  # a stall on the first rep, then fast reps
    for i in range(len(paths)):
        spins.append(next_spin_us(paths[: i + 1]))
    assert spins[0] == SPIN_MAX_US and spins[2:] == [SPIN_START_US] * 5
    assert next_spin_us([2.0, 2.0, 2.0, 2.0, 0.03]) == pytest.approx(4000.0)  # one fast rep keeps a long path's spin


def test_reference_timing_makes_one_untimed_call_of_each_before_its_reps():
    """A fresh judge's first call of a model loads its kernels and library handles: not the task's time."""
    from types import SimpleNamespace

    import torch

    from cudagym.eval.judge import time_reference

    calls = {"eager": 0, "compiled": 0}

    class Counted(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def forward(self, x):
            calls[self.name] += 1
            return x * 2

    req = SimpleNamespace(min_reps=5, max_reps=8, max_timing_s=5.0, ref_code="x", mode="filter")
    out = time_reference(Counted("eager"), Counted("compiled"), [[torch.ones(4)]], "cpu", "strict", req)
    assert out["eager"]["reps"] == out["compile"]["reps"] >= 5
    assert calls == {"eager": out["eager"]["reps"] + 1, "compiled": out["compile"]["reps"] + 1}


# -- strict on CUDA: launches queued behind a spin; the whole window is the evidence ---------------
def queued_parts(call: float, spin: float = 0.30, tail: float = 0.025, exposed: int = 0) -> dict:
    return {"window_ms": spin + call + tail, "spin_ms": spin, "call_ms": call, "tail_ms": tail, "host_ms": 0.06,
            "exposed": exposed}


def test_a_queued_reps_parts_add_up_and_its_time_is_the_calls_part():
    """The candidate's process reports each CUDA rep's call time with the parts of its whole window: parts
    that do not add up to the window (timed by its own pair of events), a time that is not the call's
    part, or a malformed report is a timer that lies; an honest report comes back as numbers."""
    from cudagym.eval.judge import CandidateFailed, reply_parts

    honest = queued_parts(0.008)
    assert reply_parts({"parts": honest}, 0.008) == honest
    assert reply_parts({}, 0.110) == {}  # no parts: a CPU rep, or the window method
    assert reply_parts({"parts": {**honest, "window_ms": honest["window_ms"] + 0.002}}, 0.008)  # event resolution
    for bad, ms, flag in (({"parts": {**honest, "window_ms": "1"}}, 0.008, "protocol_tamper"),
                          ({"parts": {**honest, "call_ms": True}}, 0.008, "protocol_tamper"),
                          ({"parts": {**honest, "tail_ms": -1.0}}, 0.008, "protocol_tamper"),
                          ({"parts": {**honest, "exposed": 2}}, 0.008, "protocol_tamper"),
                          ({"parts": [0.1, 0.1, 0.1]}, 0.008, "protocol_tamper"),
                          ({"parts": honest}, 0.002, "timer_tamper"),  # reports less than its call took
                          ({"parts": {**honest, "call_ms": 0.002}}, 0.002, "timer_tamper")):  # time moved out of the call
        with pytest.raises(CandidateFailed) as failed:
            reply_parts(bad, ms)
        assert failed.value.status == "rejected" and flag in failed.value.flags, bad


def test_work_that_outlasts_the_calls_stream_is_evidence():
    """A call's tail (its end event to the device-wide synchronisation's) is the synchronisation's wake-up,
    as in an empty rep; kernels left on another stream lengthen it. A little more is noise."""
    from cudagym.eval.judge import tail_evidence

    empty = [queued_parts(0.0, tail=t) for t in (0.024, 0.026, 0.025, 0.03)]
    honest = [queued_parts(0.008, tail=t) for t in (0.025, 0.027, 0.026, 0.024, 0.09)]
    side_stream = [queued_parts(0.001, tail=t) for t in (0.4, 0.41, 0.39, 0.4)]
    assert tail_evidence(honest, empty) is None
    assert "outlasted" in tail_evidence(side_stream, empty)
    assert tail_evidence(side_stream[:2], empty) is None  # too few reps to say


def test_the_evidence_is_the_whole_window_and_the_summary_names_the_method():
    """Tamper evidence reads each rep's whole window (the spin hides the host's path from the call's time,
    not from the window, which the judge's clocks bound); the timing summary says how the reps were
    timed and gives the medians of their parts."""
    import types

    from cudagym.eval.judge import method_summary, windows

    parts = [queued_parts(c, exposed=e) for c, e in ((0.006, 0), (0.008, 1), (0.007, 0))]
    assert windows([0.006, 0.008, 0.007], parts) == [p["window_ms"] for p in parts]
    assert windows([1.5, 2.0], [{}, {}]) == [1.5, 2.0]
    summary = method_summary(types.SimpleNamespace(cuda=True, queued=True), parts)
    assert summary["method"] == "queued" and summary["call_median_ms"] == 0.007
    assert summary["window_median_ms"] == pytest.approx(0.332) and summary["exposed_fraction"] == pytest.approx(1 / 3)
    assert method_summary(types.SimpleNamespace(cuda=True, queued=False), [])["method"] == "window"
    assert method_summary(Timer("cpu"), []) == {"method": "wall"}


def test_strict_baselines_on_a_gpu_are_keyed_by_their_method():
    """A store timed by the earlier event window is never read as a queued baseline; CPU and paper keys
    are unchanged."""
    from cudagym.eval.batch import baseline_key
    from cudagym.tasks import Task

    task = Task(id="t", name="t", code="class Model: pass")
    gpu = {"gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0"}
    cpu = {"gpu": "cpu", "torch": "2.13.0", "cuda": ""}
    assert baseline_key(task, gpu, "strict").timing_mode == "strict-queued"
    assert baseline_key(task, gpu, "paper").timing_mode == "paper"
    assert baseline_key(task, cpu, "strict").timing_mode == "strict"
    assert baseline_key(task, gpu, "strict") != baseline_key(task, gpu, "paper")

