"""Strict timing's queued method on a GPU, before anything relies on it (benchmarks/judge_gpu.sh repeat).

    python benchmarks/timing_sanity.py [--json OUT.json]

Times, with the judge's Timer (method queued, then the plain synchronised window), one elementwise
op, a chain of 400 small ops (launch-bound: its host path outlasts the first spin, which must grow
until it hides it) and one large matmul; prints the medians of each rep's parts (whole window, spin,
call, tail, host time to enqueue, exposed reps) and what a rep costs the host. Then the paper mode's
profiler over the same op. Exits 1 if the queued parts do not hold together, so a GPU call stops early.
"""

import argparse
import json
import statistics
import sys
import time

import torch

from cudagym.eval.timing import Timer, profiler_kernel_ms


def measure(timer: Timer, fn, reps: int = 30) -> dict:
    times, parts, host = [], [], []
    for _ in range(reps):
        timer.flush()
        t0 = time.perf_counter()
        ms, _ = timer.time_ms(fn)
        host.append((time.perf_counter() - t0) * 1e3)
        times.append(ms)
        parts.append(dict(timer.last_parts))
    out = {"median_ms": statistics.median(times), "host_per_rep_ms": statistics.median(host), "spin_us_after": timer.spin_us}
    for key in ("window_ms", "spin_ms", "call_ms", "tail_ms", "host_ms", "exposed"):
        values = [p[key] for p in parts if key in p]
        if values:
            out[key] = statistics.median(values) if key != "exposed" else sum(values)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    x = torch.randn(2**18, device="cuda")
    small = [torch.randn(64, 64, device="cuda") for _ in range(2)]
    big = torch.randn(8192, 8192, device="cuda")

    def chain():
        y = small[0]
        for _ in range(200):
            y = torch.tanh(y + small[1])
        return y

    calls = {"relu 1 MB": lambda: torch.relu(x), "chain of 400 small ops": chain, "matmul 8192": lambda: big @ big}
    report = {}
    for method in ("queued", "window"):
        timer = Timer("cuda", method=method)
        for name, fn in calls.items():
            fn()
            report[f"{method} / {name}"] = measure(timer, fn)
    report["paper relu 1 MB ms"] = profiler_kernel_ms(lambda: torch.relu(x))
    for name, row in report.items():
        print(f"{name}: {json.dumps(row) if isinstance(row, dict) else round(row, 5)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    queued = [report[f"queued / {n}"] for n in calls]
    ok = all(0 < r["call_ms"] < r["window_ms"] and abs(r["spin_ms"] + r["call_ms"] + r["tail_ms"] - r["window_ms"]) < 0.05
             for r in queued)
    print("queued sanity:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
