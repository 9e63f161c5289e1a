"""The GPU lock's order on a convoy, on any machine (no GPU: holds are sleeps, so 2 cores suffice).

N judges each run K tasks of a shared phase (a build, inputs, a first call: SHARED_S) then an exclusive
timing turn (EXCL_S), as a scale-search probe wave's or a filter timing pass's judges do, through the
real `gpulock.gpu_lock` under each policy. Prints the wall time of each policy against two bounds:
the exclusive turns alone (N x K x EXCL_S, what no order beats) and every phase one after another.

    python benchmarks/gpulock_convoy.py [N] [K] [SHARED_S] [EXCL_S]      (16 10 0.1 0.02)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cudagym.eval.gpulock import LOCK_POLICIES, gpu_lock  # noqa: E402


def judge(path: str, policy: str, k: int, shared_s: float, excl_s: float, start: float) -> None:
    time.sleep(max(0.0, start - time.time()))
    for _ in range(k):
        with gpu_lock(path, exclusive=False, policy=policy):
            time.sleep(shared_s)
        with gpu_lock(path, exclusive=True, policy=policy):
            time.sleep(excl_s)


def run(policy: str, n: int, k: int, shared_s: float, excl_s: float) -> float:
    path = os.path.join(tempfile.mkdtemp(), "gpu.lock")
    start = time.time() + 1.0  # every judge started before the first takes the lock
    judges = [mp.Process(target=judge, args=(path, policy, k, shared_s, excl_s, start)) for _ in range(n)]
    for p in judges:
        p.start()
    for p in judges:
        p.join()
    return time.time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=16, help="judges")
    ap.add_argument("k", type=int, nargs="?", default=10, help="tasks per judge")
    ap.add_argument("shared_s", type=float, nargs="?", default=0.1, help="each task's shared phase, seconds")
    ap.add_argument("excl_s", type=float, nargs="?", default=0.02, help="each task's exclusive turn, seconds")
    args = ap.parse_args()
    n, k, shared_s, excl_s = args.n, args.k, args.shared_s, args.excl_s
    print(f"{n} judges x {k} tasks, shared {shared_s} s then exclusive {excl_s} s: exclusive turns alone "
          f"{n * k * excl_s:.2f} s, every phase in turn {n * k * (shared_s + excl_s):.2f} s")
    for policy in LOCK_POLICIES:
        print(f"  {policy:14s} {run(policy, n, k, shared_s, excl_s):6.2f} s")


if __name__ == "__main__":
    main()
