"""A standing judge's host memory over many tasks. The dataset build's feeds keep their judges for a whole
call (~40 tasks a judge on the H100 in session 33; a longer build, more), each judge compiling every task
it checks: does a judge's resident memory grow with the tasks it has run? Runs N distinct small tasks (a
chain of elementwise ops and a linear layer, constants drawn per task, so each one compiles anew) through
one feed of `--judges` judges in `--mode` on this machine, and samples every judge's RSS after each
answer (of any judge). Prints, per judge, its RSS after the first answer, at a quarter, half and three
quarters of them, after the last, and the growth per 100 answers.

    python benchmarks/judge_rss.py [--tasks 60] [--judges 2] [--mode filter-check] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cudagym.eval import evaluate  # noqa: E402
from cudagym.eval.feed import judge_feed  # noqa: E402
from cudagym.synth.filter import FilterConfig  # noqa: E402
from cudagym.tasks import Task  # noqa: E402

OPS = ["torch.tanh({})", "torch.sigmoid({})", "torch.relu({}) * {c}", "torch.nn.functional.gelu({})",
       "torch.nn.functional.softplus({})", "({}).clamp(-{c}, {c})", "torch.sin({}) + {c}", "({}) * ({}) * {c}"]


def task(i: int, rng: random.Random) -> Task:
    expr = "self.linear(x)"
    for _ in range(rng.randint(2, 4)):
        expr = rng.choice(OPS).format(expr, expr, c=round(rng.uniform(0.1, 3.0), 3))
    code = f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, {rng.choice([32, 48, 64, 96])})

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn({rng.choice([64, 128, 256])}, 64)]


def get_init_inputs():
    return []
'''
    return Task(id=f"rss{i}", name=f"rss{i}", code=code, source="benchmark")


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--judges", type=int, default=2)
    parser.add_argument("--mode", default="filter-check")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    rng = random.Random(0)
    tasks = [task(i, rng) for i in range(args.tasks)]
    config = FilterConfig(device=args.device, parallel=args.judges, task_timeout_s=300.0, min_eager_ms=0.0)
    samples: dict[int, list[tuple[int, float]]] = {}  # judge pid -> (answers so far, RSS MiB)
    answered, lock, done = [0], threading.Lock(), threading.Event()
    t0 = time.monotonic()

    def on_done(result: dict) -> None:
        with lock:
            answered[0] += 1
            n = answered[0]
            for proc in list(evaluate._LIVE_JUDGES):
                mib = rss_mib(proc.pid)
                if mib is not None:
                    samples.setdefault(proc.pid, []).append((n, mib))
            if n % 10 == 0 or n == len(tasks):
                print(f"{n} of {len(tasks)} answered, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            if n == len(tasks):
                done.set()

    with judge_feed(config.eval_config(), args.mode, args.judges) as feed:
        for t in tasks:
            feed.submit(t, on_done)
        done.wait()
    print(f"{args.tasks} tasks, {args.judges} judges, mode {args.mode}, device {args.device}, "
          f"{time.monotonic() - t0:.0f} s")
    # RSS at a quarter, half, three quarters of the answers too: a growth that levels off is a warm-up,
    # one that does not is what a judge of a long build carries
    marks = [max(1, round(len(tasks) * q)) for q in (0.25, 0.5, 0.75)]
    print(f"| judge pid | samples | RSS MiB first | at answer {' / '.join(map(str, marks))} | last | MiB per 100 answers |")
    print("| --- | --- | --- | --- | --- | --- |")
    for pid, points in samples.items():
        (n0, first), (n1, last) = points[0], points[-1]
        at = [next((mib for n, mib in points if n >= mark), last) for mark in marks]
        per = 100 * (last - first) / (n1 - n0) if n1 > n0 else 0.0
        print(f"| {pid} | {len(points)} | {first:.0f} | {' / '.join(f'{m:.0f}' for m in at)} | {last:.0f} | {per:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
