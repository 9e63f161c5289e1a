"""Timing methods, picked by name (contract: "Timing modes").

`strict`: CUDA events around device-wide synchronisation (so work on any stream is inside the
window), L2 flushed (a write of 2x the L2 size) and persisting L2 reset before every rep, inputs
rotated by the caller, reps adaptive until the median is stable.
`paper`: CUDA Agent's method: torch.profiler CUDA kernel time summed over all streams, 5 warm-up
and 10 timed calls, no flush.

`Timer` captures every primitive it uses when it is built, before any untrusted code is imported:
a candidate that later replaces `torch.cuda.synchronize` or `Event.elapsed_time` changes the module
attribute, not the function this timer already holds (and `integrity` reports the change).
"""

from __future__ import annotations

import ctypes
import statistics
import time
from pathlib import Path
from typing import Callable

TIMING_MODES = ("strict", "paper")


class Timer:
    def __init__(self, device: str):
        import torch

        self.device = device
        self._perf_counter = time.perf_counter
        self.cuda = device.startswith("cuda")
        if not self.cuda:
            return
        self._sync = torch.cuda.synchronize
        self._event = torch.cuda.Event
        self._record = torch.cuda.Event.record
        self._elapsed = torch.cuda.Event.elapsed_time
        self._event_sync = torch.cuda.Event.synchronize
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
        self._flush_buf = torch.empty(max(2 * l2_bytes, 128 * 2**20) // 4, dtype=torch.float32, device=device)
        self._cudart = _load_cudart()

    def flush(self) -> None:
        """Evict L2 and drop persisting lines, so each rep starts cold (as the first call in a net would)."""
        if not self.cuda:
            return
        if self._cudart is not None:
            self._cudart.cudaCtxResetPersistingL2Cache()
            self._cudart.cudaDeviceSetLimit(0x06, ctypes.c_size_t(0))  # cudaLimitPersistingL2CacheSize
        self._flush_buf.fill_(1.0)
        self._sync()

    def time_ms(self, fn: Callable[[], object]) -> tuple[float, object]:
        """One rep of fn(), returns (milliseconds, fn's result)."""
        if not self.cuda:
            t0 = self._perf_counter()
            out = fn()
            return (self._perf_counter() - t0) * 1e3, out
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        self._sync()
        self._record(start)
        out = fn()
        self._sync()  # device-wide: work the callee put on any stream ends before `end`
        self._record(end)
        self._event_sync(end)
        return self._elapsed(start, end), out

    def sync(self) -> None:
        if self.cuda:
            self._sync()


def _load_cudart():
    """The CUDA runtime this process already loaded (torch's), found through /proc/self/maps."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1]
            if "libcudart.so" in path:
                lib = ctypes.CDLL(path)
                lib.cudaDeviceSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
                return lib
    except OSError:
        pass
    return None


def adaptive_reps(run_rep: Callable[[int], float], min_reps: int = 10, max_reps: int = 200,
                  max_seconds: float = 10.0, rel_tol: float = 0.01) -> list[float]:
    """Call run_rep(i) -> ms until the running median moves less than rel_tol between checkpoints."""
    times: list[float] = []
    last_median = None
    t_start = time.perf_counter()
    while True:
        times.append(run_rep(len(times)))
        n = len(times)
        if n >= max_reps or (n >= 3 and time.perf_counter() - t_start > max_seconds):
            return times
        if n >= min_reps and n % 5 == 0:
            median = statistics.median(times)
            if last_median is not None and abs(median - last_median) <= rel_tol * last_median:
                return times
            last_median = median


def summarize(times_ms: list[float]) -> dict:
    ordered = sorted(times_ms)
    q1, _, q3 = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else (ordered[0],) * 3
    return {"median_ms": statistics.median(ordered), "iqr_ms": q3 - q1, "min_ms": ordered[0], "reps": len(ordered)}


def profiler_kernel_ms(fn: Callable[[], object], warmup: int = 5, reps: int = 10) -> float:
    """CUDA Agent's published method: profiler CUDA kernel time over all streams, per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    # Kernel events only (device type CUDA): the CPU-side op rows would count the same kernels again.
    total_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return total_us / 1e3 / reps
