"""Tool-call overhead of the agent environment (no judge, no compile): p50 / p95 per tool.

    python benchmarks/agent_tool_overhead.py [--calls 50] [--concurrent 1] [--device cpu]

Each of `--concurrent` environments (own workdir, own sandbox uid) runs `--calls` calls of each
tool in a thread of its own; the numbers are KernelEnv.execute's wall time as the loop sees it.
bash is the sandbox's cost (launcher, namespaces, mounts, uid drop, cleanup) around `true`.
Prints one JSON object. Needs root (the confined shell fails closed otherwise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
from pathlib import Path

from cudagym.agent.environment import EnvConfig, KernelEnv
from cudagym.tasks import task_from_file

TASK = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "problems" / "add_scale.py"
KERNEL = "// v0\n" + "__global__ void k() {}\n" * 50
CALLS = {"bash": lambda i: {"command": "true"}, "read_file": lambda i: {"path": "model.py"},
         "write_file": lambda i: {"path": "kernels/k.cu", "content": KERNEL},
         "edit_file": lambda i: {"path": "kernels/k.cu", "old": f"// v{i}\n", "new": f"// v{i + 1}\n"},
         "glob": lambda i: {"pattern": "**/*"}, "grep": lambda i: {"pattern": "forward"}}


def measure(env: KernelEnv, calls: int, times: dict[str, list[float]], errors: list[str], lock: threading.Lock) -> None:
    for name, arguments in CALLS.items():
        for i in range(calls):
            result = env.execute(name, arguments(i))
            with lock:
                if not result.ok:
                    errors.append(f"{name}: {result.output[:200]}")
                    return
                times[name].append(result.elapsed_s * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--concurrent", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cudagym-overhead-"))
    envs = [KernelEnv(task_from_file(TASK), root / "workdirs" / f"r{i}", EnvConfig(device=args.device))
            for i in range(args.concurrent)]
    times: dict[str, list[float]] = {name: [] for name in CALLS}
    errors: list[str] = []
    lock = threading.Lock()
    try:
        threads = [threading.Thread(target=measure, args=(env, args.calls, times, errors, lock)) for env in envs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for env in envs:
            env.close()
    if errors:
        raise SystemExit("cudagym: error: " + errors[0])
    report = {name: {"p50_ms": round(statistics.median(ms), 2),
                     "p95_ms": round(statistics.quantiles(ms, n=20)[-1], 2) if len(ms) > 1 else round(ms[0], 2),
                     "calls": len(ms)} for name, ms in times.items() if ms}
    print(json.dumps({"concurrent": args.concurrent, "tools": report}))


if __name__ == "__main__":
    main()
