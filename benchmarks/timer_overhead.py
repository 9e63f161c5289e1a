"""Where the filter's timing of one task goes, on a GPU: the strict timer's fixed and per-rep costs.

The dataset build's timing pass holds the GPU alone ~0.44 s per task (H200, session 20) for a median
of ~10 rep pairs of a ~3 ms eager and a ~2 ms compiled call: some 30 ms of hold per rep pair against
~5 ms of calls. This script times the parts on the device: building a `Timer` (its flush buffer,
the spin's calibration, finding cudart), one `flush()`, one rep (`time_ms`) of a short and of a
~3 ms call in the strict ("queued") and the plain ("window") method, and `judge.time_reference` as the
filter runs it (eager and compiled, two input sets). Prints a table; writes JSON to argv[1].

    python3 benchmarks/timer_overhead.py $OUT/timer_overhead.json      (on the GPU box)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from types import SimpleNamespace


def wall(fn, n: int) -> dict:
    """fn() n times: median and max wall seconds."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_ms": 1e3 * statistics.median(times), "max_ms": 1e3 * max(times), "n": n}


def main(out_path: str) -> int:
    import torch

    from cudagym.eval.judge import time_reference
    from cudagym.eval.timing import Timer

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a check of this script, not a number
    n, rows = (4096, 16384) if device == "cuda" else (256, 64)
    results: dict = {"gpu": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__, "cuda": torch.version.cuda}
    results["timer_init"] = wall(lambda: Timer(device), 5)
    timer = Timer(device)
    results["flush"] = wall(timer.flush, 50)
    small = torch.randn(1024, device=device)
    a = torch.randn(n, n, device=device)
    big = lambda: [a @ a for _ in range(3)]  # noqa: E731 - ~1 ms each on an H200 in fp32
    Timer(device).sync()
    t0 = time.perf_counter()
    big()
    Timer(device).sync()
    results["big_call_ms"] = 1e3 * (time.perf_counter() - t0)
    for method in ("queued", "window"):
        t = Timer(device, method=method)
        results[f"rep_small_{method}"] = wall(lambda: t.time_ms(lambda: small + 1), 50)
        results[f"rep_big_{method}"] = wall(lambda: t.time_ms(big), 20)
        results[f"rep_big_{method}"]["device_ms"] = t.time_ms(big)[0]
        results[f"flush_and_rep_big_{method}"] = wall(lambda: (t.flush(), t.time_ms(big)), 20)

    class Chain(torch.nn.Module):  # a typical kept task: a few ms eager, elementwise work inductor fuses
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2048, 2048)

        def forward(self, x):
            y = torch.nn.functional.gelu(self.linear(x))
            return torch.nn.functional.layer_norm(y * torch.sigmoid(y), y.shape[-1:]).softmax(-1)

    model = Chain().to(device).eval()
    compiled = torch.compile(model)
    sets = [[torch.randn(rows, 2048, device=device)] for _ in range(2)]
    with torch.no_grad():
        compiled(*sets[0])
    req = SimpleNamespace(min_reps=5, max_reps=50, max_timing_s=2.0, ref_code="chain", mode="filter")
    for mode in ("strict", "kernelbench"):
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            times = time_reference(model, compiled, sets, device, mode, req)
            runs.append({"wall_s": time.perf_counter() - t0, "t_eager_ms": times["t_eager_ms"],
                         "t_compile_ms": times["t_compile_ms"], "reps": times["eager"]["reps"]})
        results[f"time_reference_{mode}"] = runs
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"{results['gpu']}, torch {results['torch']}, CUDA {results['cuda']}")
    for key, value in results.items():
        if isinstance(value, dict):
            print(f"{key:28s} median {value['median_ms']:8.3f} ms  max {value['max_ms']:8.3f} ms  (n {value['n']})"
                  + (f"  device {value['device_ms']:.3f} ms" if "device_ms" in value else ""))
        elif isinstance(value, list):
            for run in value:
                print(f"{key:28s} wall {run['wall_s']:.3f} s  eager {run['t_eager_ms']:.3f} ms  "
                      f"compiled {run['t_compile_ms']:.3f} ms  reps {run['reps']}")
    print(f"big call (3 fp32 4096^2 matmuls), one synchronised run: {results['big_call_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "timer_overhead.json"))
