"""Sizing a chain to the runtime window (cudagym/synth/scale.py): the search's logic on made-up
runtimes, and real chains re-composed at the scales it probes (shapes from meta tensors, no timing)."""

from __future__ import annotations

import math
import threading
import time

import pytest

from cudagym.synth.crawl import crawl_torch, exec_task, tensor_numels
from cudagym.synth.scale import REASONS, FitBound, ScaleSearch, search_scale, size_chain, size_chains

GPU_WINDOW = (1.0, 100.0)


def _probe_counter(runtime):
    calls = []

    def measure(scale):
        calls.append(scale)
        return runtime(scale)

    return measure, calls


@pytest.mark.parametrize("runtime", [
    lambda s: 1e-4 * s ** 3,  # a conv chain: most dims scale
    lambda s: 2e-3 * s ** 2,  # a norm over a scaled matrix
    lambda s: 0.02 * s,  # launch-bound, then linear
    lambda s: 0.05 + 3e-6 * s ** 4,  # a flat start, then steep
])
def test_lands_in_the_window_in_few_probes(runtime):
    measure, calls = _probe_counter(runtime)
    choice = search_scale(measure, lambda s: True, ScaleSearch(GPU_WINDOW, max_scale=512))
    assert choice.reason == "in_window", choice
    assert GPU_WINDOW[0] <= choice.eager_ms <= GPU_WINDOW[1] and choice.eager_ms == runtime(choice.scale)
    assert len(calls) == len(set(calls)) <= 6  # never the same scale twice
    assert calls[0] == 16  # the first probe is the start


def test_a_steep_chain_starts_small_and_grows_at_most_twofold_a_probe():
    """Chains with a STEEP_OPS operator (an SVD, a pseudo-inverse: cubic and more): the default first
    probe at 16 of a chain taking 6 ms at scale 1 would run for seconds, holding the GPU."""
    svd_like = lambda s: 6.0 * s ** 3  # noqa: E731 - 6 ms at 1, 24.6 s at 16
    measure, calls = _probe_counter(svd_like)
    choice = search_scale(measure, lambda s: True, ScaleSearch(GPU_WINDOW), steep=True)
    assert choice.reason == "in_window" and calls == [2] and choice.eager_ms == 48.0
    measure, calls = _probe_counter(svd_like)
    assert search_scale(measure, lambda s: True, ScaleSearch(GPU_WINDOW)).reason == "in_window" and calls[0] == 16
    # cheap at small scales, it still climbs, never more than doubling the scale over a too-fast probe
    measure, calls = _probe_counter(lambda s: 1e-3 * s ** 2)
    choice = search_scale(measure, lambda s: True, ScaleSearch(GPU_WINDOW), steep=True)
    assert choice.reason == "in_window" and calls == [2, 4, 8, 16, 32]
    assert all(b <= 2 * a for a, b in zip(calls, calls[1:]))


def test_the_memory_bound_caps_the_scale():
    fits = lambda s: s <= 24  # noqa: E731
    bound = FitBound(fits, 1, 128)
    assert bound.top is None and bound.largest_at_most(16) == 16 and bound.top is None  # 16 fits: nothing more asked
    assert bound.largest_at_most(100) == 24 and bound.top == 24
    assert FitBound(lambda s: False, 1, 128).largest_at_most(16) is None
    measure, calls = _probe_counter(lambda s: 1e-4 * s ** 2)  # 0.06 ms at 24: too fast anywhere that fits
    choice = search_scale(measure, fits, ScaleSearch(GPU_WINDOW))
    assert choice.reason == "too_fast" and choice.scale == 24 and max(calls) == 24
    assert search_scale(measure, lambda s: False, ScaleSearch(GPU_WINDOW)).reason == "no_fit"


def test_the_memory_bound_is_asked_only_about_scales_the_search_wants():
    """Each `fits` answer recomposes the chain (~0.1 s): a search that lands inside at once must not
    bisect [1, 128] first (on the H200 that kept the GPU idle for minutes a round of 300)."""
    asked = []

    def fits(scale):
        asked.append(scale)
        return scale <= 64

    choice = search_scale(lambda s: 0.01 * s ** 2, fits, ScaleSearch(GPU_WINDOW))  # 2.56 ms at 16
    assert choice.reason == "in_window" and asked == [16]
    asked.clear()
    choice = search_scale(lambda s: 1e-3 * s ** 2, fits, ScaleSearch(GPU_WINDOW))  # 0.26 ms at 16: up to ~100
    assert choice.reason == "in_window" and choice.scale <= 64 and len(asked) <= 8, asked


def test_too_slow_at_the_smallest_scale_and_failures_count_as_too_slow():
    choice = search_scale(lambda s: 500.0 * s, lambda s: True, ScaleSearch(GPU_WINDOW))
    assert choice.reason == "too_slow" and 1 in choice.probes
    # a probe that fails (out of memory, timeout) bounds the search from above
    runtime = lambda s: None if s > 20 else 0.01 * s ** 2  # noqa: E731 - 4 ms at 20
    choice = search_scale(runtime, lambda s: True, ScaleSearch(GPU_WINDOW, start=64))
    assert choice.reason == "in_window" and choice.scale <= 20 and choice.probes[64] is None


def test_a_time_that_jumps_over_the_window_is_reported():
    choice = search_scale(lambda s: 0.2 if s < 9 else 400.0, lambda s: True, ScaleSearch(GPU_WINDOW, max_probes=12))
    assert choice.reason == "no_scale_in_window" and {8, 9} <= set(choice.probes)
    assert set(REASONS) >= {"in_window", "too_fast", "too_slow", "no_scale_in_window", "out_of_probes", "no_fit"}


def test_config_checks():
    for bad in [dict(window_ms=(5.0, 1.0)), dict(window_ms=(1.0, 100.0), start=0),
                dict(window_ms=(1.0, 100.0), max_probes=0), dict(window_ms=(1.0, 100.0), start=256),
                dict(window_ms=(1.0, 100.0), min_scale=2, steep_start=1), dict(window_ms=(1.0, 100.0), steep_step=1.0)]:
        with pytest.raises(ValueError):
            ScaleSearch(**bad)


@pytest.mark.slow  # the torch crawl, when no other test of the process has made it
def test_size_chain_recomposes_real_seeds_at_the_chosen_scale():
    """A stand-in measure (elements a forward touches, as ms) so the test does not time anything:
    the chain is re-composed at each probed scale, and the task returned is the one at the choice."""
    by_id = {s.id: s for s in crawl_torch()[0]}
    seeds = [by_id["torch.nn.Conv2d"], by_id["torch.nn.ReLU"]]

    def measure(task) -> float:
        return sum(tensor_numels(exec_task(task.code))) / 1e6  # "ms": one per million elements

    task, choice = size_chain(seeds, measure, ScaleSearch((10.0, 40.0), max_scale=32, start=2))
    assert choice.reason == "in_window" and task is not None, choice
    assert 10.0 <= measure(task) <= 40.0 and measure(task) == choice.eager_ms and len(choice.probes) >= 2
    assert f"in_channels = {8 * choice.scale}" in task.code  # every dim times the scale
    assert next(iter(choice.probes)) == 2  # the start given: the chain has no steep operator
    steep = [by_id["torch.linalg.svdvals"], by_id["torch.nn.ReLU"]]
    _, choice = size_chain(steep, measure, ScaleSearch((10.0, 40.0), max_scale=32, start=16, steep_start=3))
    assert next(iter(choice.probes)) == 3  # svdvals: the steep start, not 16
    assert all(t is None or t > 0 for t in choice.probes.values()) and len(choice.probes) <= 6
    # the composer's element bound is the memory bound: a window no scale under it reaches
    task, choice = size_chain(seeds, measure, ScaleSearch((1e6, 2e6), max_scale=512))
    assert task is None and choice.reason == "too_fast"
    assert math.isfinite(choice.eager_ms) and choice.scale < 512


@pytest.mark.slow  # the torch crawl, when no other test of the process has made it
def test_size_chains_times_every_running_search_in_one_pass():
    """Many searches at once: each pass of `time_tasks` gets one probe of every search still running
    (so the passes are as many as the longest search's probes), and each search ends as size_chain would."""
    by_id = {s.id: s for s in crawl_torch()[0]}
    chains = {"conv": [by_id["torch.nn.Conv2d"], by_id["torch.nn.ReLU"]], "relu": [by_id["torch.nn.ReLU"]]}

    def measure(task) -> float:
        return sum(tensor_numels(exec_task(task.code))) / 1e6

    passes, sized = [], {}

    def time_tasks(tasks):
        passes.append(len(tasks))
        return [measure(task) for task in tasks]

    config = ScaleSearch((10.0, 40.0), max_scale=32, start=2)
    size_chains(chains, time_tasks, config, on_sized=lambda key, task, choice: sized.__setitem__(key, (task, choice)))
    assert set(sized) == set(chains)
    for key, seeds in chains.items():
        task, choice = sized[key]
        alone_task, alone = size_chain(seeds, measure, config)
        assert choice == alone and (task and task.code) == (alone_task and alone_task.code)
    assert len(passes) == max(len(choice.probes) for _, choice in sized.values())
    assert passes[0] == 2 and sum(passes) == sum(len(choice.probes) for _, choice in sized.values())


def test_size_chains_raises_a_search_failure_in_the_calling_thread():
    with pytest.raises(IndexError):  # no seeds: size_chain cannot start a chain
        size_chains({"empty": []}, lambda tasks: [1.0] * len(tasks), ScaleSearch((1.0, 2.0)))


def test_size_chains_streamed_sends_each_probe_as_its_search_asks_and_ends_as_the_waves_do():
    """With `stream`, a search's next probe goes out as its last is answered: every probe of a fast
    search is answered before the first answer of a slow one (waves would hold the fast search at
    each step), and every search ends as size_chain alone would."""
    by_id = {s.id: s for s in crawl_torch()[0]}
    chains = {"conv": [by_id["torch.nn.Conv2d"], by_id["torch.nn.ReLU"]], "relu": [by_id["torch.nn.ReLU"]]}

    def measure(task) -> float:
        return sum(tensor_numels(exec_task(task.code))) / 1e6

    answered, sized = [], {}

    def stream(task, answer):
        slow = "torch.nn.Conv2d" in task.provenance["seed_ids"]

        def later():
            time.sleep(0.5 if slow else 0.0)
            answered.append("conv" if slow else "relu")
            answer(measure(task))

        threading.Thread(target=later).start()

    config = ScaleSearch((10.0, 40.0), max_scale=32, start=2)
    size_chains(chains, None, config, on_sized=lambda key, task, choice: sized.__setitem__(key, (task, choice)),
                stream=stream)
    assert set(sized) == set(chains)
    for key, seeds in chains.items():
        task, choice = sized[key]
        alone_task, alone = size_chain(seeds, measure, config)
        assert choice == alone and (task and task.code) == (alone_task and alone_task.code)
    n_relu = len(sized["relu"][1].probes)
    assert n_relu >= 2 and answered[:n_relu] == ["relu"] * n_relu
    with pytest.raises(ValueError, match="one of"):
        size_chains(chains, lambda tasks: [1.0] * len(tasks), config, stream=stream)


def test_a_ctrl_c_while_the_searches_run_ends_size_chains_in_keyboard_interrupt():
    """Ctrl-C lands while the calling thread waits for the searches' lock (here each probe holds it 0.2 s
    while it is sent, as a slow composing would, and the searches go on probing), at several moments
    after a tick: each call ends in KeyboardInterrupt, the stop the build handles, never in a lock error
    (before session 36's fix, one landing in the lock's re-acquire after a tick raised "cannot release
    un-acquired lock")."""
    import os
    import signal

    by_id = {s.id: s for s in crawl_torch()[0]}
    for delay_s in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35):
        chains = {f"relu{i}": [by_id["torch.nn.ReLU"]] for i in range(4)}
        stopped, sent = [], []

        def stream(task, answer):
            if stopped:  # after the stop, the searches end at once
                answer(None)
                return
            time.sleep(0.2)  # called holding the searches' lock
            threading.Thread(target=answer, args=(0.001,)).start()  # too fast: the search probes on

        def tick():
            if not sent:
                sent.append(threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGINT)))
                sent[0].start()

        with pytest.raises(KeyboardInterrupt):
            size_chains(chains, None, ScaleSearch((10.0, 40.0), max_scale=1 << 20, start=2, max_probes=40), stream=stream,
                        tick=tick, tick_s=0.05)
            time.sleep(5)  # not reached: the stop lands within size_chains
        stopped.append(True)
        deadline = time.monotonic() + 30
        while [t for t in threading.enumerate() if "(search)" in t.name] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [t for t in threading.enumerate() if "(search)" in t.name]
