"""Timing: adaptive repetition, summary statistics, and the CPU Timer."""

from __future__ import annotations

import random
import statistics
import time

import pytest

from cudagym.eval import timing
from cudagym.eval.timing import TIMING_MODES, Timer, adaptive_reps, summarize


def test_timing_modes():
    assert set(TIMING_MODES) == {"strict", "paper"}


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
