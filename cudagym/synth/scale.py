"""Sizing a composed chain to the runtime window: search its scale until the eager time lands inside.

At fixed scales (16 and 32 on the H200), 43% of the candidates ran under the 1 ms floor (norms,
embeddings, RNN cells, elementwise chains) while heavy modules filled the window; one scale cannot
suit both. The search measures a chain at a scale, predicts the scale that puts its eager time at
the window's geometric middle from a power law (time ~ scale^p, p fitted from the probes so far,
`exponent` until there are two), and narrows a bracket: every scale at or below a too-fast probe is
too fast, every scale at or above a too-slow (or failed) one too slow. Larger scales must also fit
in memory: the composer's element bound (`ComposeConfig.max_numel`) makes a chain that exceeds it
a Reject, which the search treats as the memory bound.

`search_scale` is the logic alone (a measure function and a memory predicate in, a `ScaleChoice`
out), so it is tested on the CPU with made-up runtimes. `size_chain` applies it to seeds: it
re-chains them at each probed scale (`ProgrammaticComposer.chain`) and asks `measure` for the eager
time of the resulting task; on a GPU, `measure` is the filter's sandboxed eager timing.

`size_chains` runs many searches at once, timing their probes together (one pass of judges for
every search still running); `cudagym dataset build --scale search` sizes each programmatic candidate
with it, timed by the filter's judges (`synth.build.scale_stage`). Off unless asked: on the CPU the
window is wide and scale 1 is the point.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from cudagym.synth.compose import ComposeConfig, ProgrammaticComposer, Reject
from cudagym.synth.seeds import Seed
from cudagym.tasks import Task

REASONS = {
    "in_window": "a scale whose eager time is inside the window",
    "too_fast": "too fast even at the largest scale that fits in memory",
    "too_slow": "too slow even at the smallest scale",
    "no_scale_in_window": "the time jumps over the window between two neighbouring scales",
    "out_of_probes": "max_probes measured without landing inside",
    "no_fit": "not even the smallest scale fits in memory (or composes)",
}


# Operators whose time grows far faster than the elements a scale adds, so that the default first probe
# (or a large step up) runs for seconds: iterative decompositions (SVD, pseudo-inverse, symmetric
# eigenvalues) and CUDA's per-sample loop of the multilabel margin loss. On the H200 (sessions 19-20)
# the probes over 300 ms (114 s of the 116 s of eager time of 558 probes, each holding the GPU while
# the rest of its wave waited) were first probes or steps up of chains with these where the chain is
# known: svdvals and pinv at scale 16 1.7-2.1 s a call, eigvalsh 0.54 s, a pinv chain stepped from
# scale 1 (1.2 ms) to 10 took 21 s, a multilabel-margin chain at 16 37 s. Other linear algebra and
# recurrent layers (logdet, matrix_exp, inv, cholesky, GRU, LSTM) landed inside at 16 (3-36 ms).
STEEP_OPS = frozenset({"svdvals", "pinv", "eigvalsh", "multilabel_margin_loss", "MultiLabelMarginLoss"})


@dataclass(frozen=True)
class ScaleSearch:
    window_ms: tuple[float, float]  # the filter's eager window (GPU: 1-100 ms)
    min_scale: int = 1
    max_scale: int = 128
    start: int = 16  # the first probe (the H200 runs used 16 and 32)
    max_probes: int = 6  # eager timings per candidate: each one is a judge call
    exponent: float = 2.0  # time ~ scale^exponent until two probes give a slope (most dims scale, batch too)
    # A steep chain (`STEEP_OPS`): its first probe, and the most a probe may grow the scale over a
    # too-fast one (a slope fitted at small scales understates what comes)
    steep_start: int = 2
    steep_step: float = 2.0

    def __post_init__(self):
        lo, hi = self.window_ms
        if not 0 < lo < hi:
            raise ValueError(f"window_ms must be 0 < low < high, got {self.window_ms}")
        if not 1 <= self.min_scale <= self.start <= self.max_scale:
            raise ValueError(f"need 1 <= min_scale <= start <= max_scale, got {self.min_scale}, {self.start}, "
                             f"{self.max_scale}")
        if self.max_probes < 1 or self.exponent <= 0:
            raise ValueError("max_probes must be >= 1 and exponent > 0")
        if not self.min_scale <= self.steep_start or self.steep_step <= 1:
            raise ValueError(f"need min_scale <= steep_start and steep_step > 1, got {self.steep_start}, {self.steep_step}")


@dataclass(frozen=True)
class ScaleChoice:
    scale: int | None  # the chosen scale (None: none fits)
    eager_ms: float | None  # its measured time
    reason: str  # a key of REASONS
    probes: dict = field(default_factory=dict)  # scale -> eager ms (None: failed or over memory)


class FitBound:
    """The memory bound, found lazily: `fits` (monotone: larger scales hold more) is asked only about
    scales the search wants to probe, and a bisection runs only when one does not fit. Each answer
    recomposes the chain at that scale (~0.1 s of shape inference): bisecting all of [1, 128] up
    front for every candidate, before its first probe, kept the H200 idle for minutes a round."""

    def __init__(self, fits: Callable[[int], bool], min_scale: int, max_scale: int):
        self.fits, self.min_scale = fits, min_scale
        self.fit = min_scale - 1  # the largest scale known to fit
        self.hi = max_scale  # every scale above is known not to fit (or beyond the search's max)

    def _fits(self, scale: int) -> bool:
        if scale <= self.fit:
            return True
        if scale > self.hi:
            return False
        if self.fits(scale):
            self.fit = scale
            return True
        self.hi = scale - 1
        return False

    def largest_at_most(self, scale: int) -> int | None:
        """The largest scale <= scale that fits (None: not even the smallest)."""
        scale = min(scale, self.hi)
        if self._fits(scale):
            return scale
        lo, hi = self.min_scale, self.hi
        if lo > hi or not self._fits(lo):
            return None
        lo = max(lo, self.fit)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self._fits(mid) else (lo, mid - 1)
        return lo

    @property
    def top(self) -> int | None:
        """The largest scale that fits, when the answers so far pin it down."""
        return self.fit if self.fit == self.hi else None


def _slope(probes: dict[int, float | None]) -> float | None:
    """log-log slope of time over scale from the two measured probes nearest each other, if positive."""
    points = sorted((s, t) for s, t in probes.items() if t is not None and t > 0)
    pairs = [(a, b) for a, b in zip(points, points[1:]) if a[0] != b[0]]
    if not pairs:
        return None
    (s1, t1), (s2, t2) = min(pairs, key=lambda pair: math.log(pair[1][0] / pair[0][0]))
    slope = math.log(t2 / t1) / math.log(s2 / s1)
    return slope if slope > 0.25 else None  # flat (launch-bound) or noisy: the default exponent is safer


def search_scale(measure: Callable[[int], float | None], fits: Callable[[int], bool], config: ScaleSearch,
                 steep: bool = False) -> ScaleChoice:
    """The scale whose eager time lands in the window, found with at most `max_probes` measurements.
    steep: the chain's time may grow much faster than its elements (`STEEP_OPS`): the search
    starts at `steep_start` and grows the scale by at most `steep_step` a probe."""
    low_ms, high_ms = config.window_ms
    target = math.sqrt(low_ms * high_ms)
    bound = FitBound(fits, config.min_scale, config.max_scale)
    scale = bound.largest_at_most(min(config.steep_start, config.start) if steep else config.start)
    if scale is None:
        return ScaleChoice(None, None, "no_fit")
    lo, hi = config.min_scale, config.max_scale  # the scales still possible
    probes: dict[int, float | None] = {}
    while len(probes) < config.max_probes:
        t = probes[scale] = measure(scale)
        if t is not None and low_ms <= t <= high_ms:
            return ScaleChoice(scale, t, "in_window", probes)
        if t is not None and t < low_ms:
            lo = max(lo, scale + 1)
        else:  # too slow, or failed (out of memory, timed out): smaller is the only way
            hi = min(hi, scale - 1)
        if t is None:
            guess = (lo * hi) ** 0.5
        else:
            guess = scale * (target / t) ** (1.0 / (_slope(probes) or config.exponent))
            if steep and t < low_ms:
                guess = min(guess, math.floor(scale * config.steep_step))
        scale = _next_scale(round(guess), lo, hi, bound)
        if scale in probes:  # the model points at a probed scale: bisect the bracket instead
            scale = _next_scale(round((lo * min(hi, bound.hi)) ** 0.5), lo, hi, bound)
        if scale is None or scale in probes:
            break
    return _give_up(probes, config, bound.top)


def _next_scale(guess: int, lo: int, hi: int, bound: FitBound) -> int | None:
    """The guess within the bracket [lo, hi], lowered to the largest scale that fits; None when no
    scale of the bracket fits or the bracket is empty."""
    if lo > min(hi, bound.hi):
        return None
    scale = bound.largest_at_most(min(max(guess, lo), hi))
    return scale if scale is not None and scale >= lo else None


def _give_up(probes: dict[int, float | None], config: ScaleSearch, top: int | None) -> ScaleChoice:
    low_ms, high_ms = config.window_ms
    measured = {s: t for s, t in probes.items() if t is not None}
    if not measured:
        return ScaleChoice(None, None, "too_slow", probes)
    fast = [s for s, t in measured.items() if t < low_ms]
    slow = [s for s, t in probes.items() if t is None or t > high_ms]
    if fast and top is not None and max(fast) >= top:
        reason = "too_fast"
    elif slow and min(slow) <= config.min_scale:
        reason = "too_slow"
    elif fast and slow and min(slow) - max(fast) <= 1:
        reason = "no_scale_in_window"
    else:
        reason = "out_of_probes"
    best = min(measured, key=lambda s: abs(math.log(measured[s] / math.sqrt(low_ms * high_ms))))
    return ScaleChoice(best, measured[best], reason, probes)


def size_chain(seeds: Sequence[Seed], measure: Callable[[Task], float | None], config: ScaleSearch,
               compose: ComposeConfig | None = None) -> tuple[Task | None, ScaleChoice]:
    """Chain `seeds` (in order) at the scale `search_scale` finds: (the task at that scale, or None
    when none fits or lands inside; the choice). `measure` times a task's eager forward in ms."""
    compose = compose or ComposeConfig()
    tasks: dict[int, Task | Reject] = {}

    def chain(scale: int) -> Task | Reject:
        if scale not in tasks:
            # the element bound at this scale, as a composition at this scale would have it
            config_at = ComposeConfig(**{**_fields(compose), "scale": scale, "max_numel": None})
            tasks[scale] = ProgrammaticComposer(config_at).chain(list(seeds))
        return tasks[scale]

    def timed(scale: int) -> float | None:
        task = chain(scale)
        return None if isinstance(task, Reject) else measure(task)

    steep = any(STEEP_OPS.intersection(seed.ops) for seed in seeds)
    choice = search_scale(timed, lambda scale: isinstance(chain(scale), Task), config, steep=steep)
    task = chain(choice.scale) if choice.reason == "in_window" else None
    return (task if isinstance(task, Task) else None), choice


def size_chains(chains: Mapping[str, Sequence[Seed]], time_tasks: Callable[[list[Task]], list[float | None]] | None,
                config: ScaleSearch, compose: ComposeConfig | None = None,
                on_sized: Callable[[str, Task | None, ScaleChoice], None] | None = None,
                stream: Callable[[Task, Callable[[float | None], None]], None] | None = None,
                tick: Callable[[], None] | None = None, tick_s: float = 2.0) -> None:
    """`size_chain` for every chain of `chains` ({key: seeds}); on_sized(key, task or None, choice)
    runs in this thread as each search ends. A search's next probe depends on its last, so probes
    cannot be listed ahead: each search runs in its own thread. With `time_tasks`, when every search
    still running waits for a time, it times all those tasks in one pass (a few tasks per judge, as the
    filter runs), not one judge process per probe: a wave of probes per step of the searches. With
    `stream` instead (stream(task, answer): answer(eager ms or None) is called once, from any thread,
    when the task is timed; `feed.JudgeFeed`), each probe goes to the judges the moment its search
    asks, and no search waits for the others. The threads take turns (a search runs only while
    holding `turn`, released while it waits), so composing is never concurrent. tick: with `stream`,
    called in this thread at least every tick_s while searches run and after searches end, with `turn`
    released (the searches go on meanwhile): what the caller does with the sized tasks so far, e.g. send
    them on to the filter before the slowest search ends."""
    if (time_tasks is None) == (stream is None):
        raise ValueError("size_chains needs one of time_tasks and stream")
    turn = threading.Condition()
    # This thread waits on `changed` (set whenever a search ends or asks for a wave's probe), never on
    # `turn`, and takes `turn` only at a `with`'s entry: a Ctrl-C that lands while it blocks there leaves
    # `turn` not held, and nothing releases it. One that landed in a wait's re-acquire of `turn` (on the
    # H100, session 36, after a tick) ended the build in "cannot release un-acquired lock" instead of its stop.
    changed = threading.Event()
    pending: list[list] = []  # probes asked for and not yet sent (waves): [task, eager ms, answered]
    finished: list[tuple] = []  # (key, size_chain's result or the exception it raised)
    live = len(chains)

    def measure(task: Task) -> float | None:
        probe = [task, None, False]
        if stream is not None:
            def answer(eager_ms: float | None) -> None:
                with turn:
                    probe[1], probe[2] = eager_ms, True
                    turn.notify_all()

            stream(task, answer)
        else:
            pending.append(probe)
            changed.set()
        turn.wait_for(lambda: probe[2])
        return probe[1]

    def search(key: str, seeds: Sequence[Seed]) -> None:
        nonlocal live
        with turn:
            try:
                finished.append((key, size_chain(seeds, measure, config, compose)))
            except Exception as e:  # noqa: BLE001 - raised again in the calling thread
                finished.append((key, e))
            finally:
                live -= 1
                changed.set()

    # daemon: stopped (Ctrl-C) while timing, the searches waiting for an answer never get one
    threads = [threading.Thread(target=search, args=item, daemon=True) for item in chains.items()]
    with turn:
        for thread in threads:
            thread.start()
    while True:
        changed.wait(timeout=tick_s if stream is not None and tick is not None else None)
        changed.clear()  # before reading the state: a change after the read sets it again
        with turn:
            for key, result in finished:
                if isinstance(result, Exception):
                    raise result
                if on_sized:
                    on_sized(key, *result)
            finished.clear()
            if live == 0 and not pending:  # every search has ended
                break
            if stream is None and len(pending) >= live:  # every search still running waits: one wave
                batch = pending[:]
                pending.clear()
                for probe, eager_ms in zip(batch, time_tasks([probe[0] for probe in batch]), strict=True):
                    probe[1], probe[2] = eager_ms, True
                turn.notify_all()
        if stream is not None and tick is not None:
            tick()


def _fields(config: ComposeConfig) -> dict:
    from dataclasses import fields

    return {f.name: getattr(config, f.name) for f in fields(config)}
