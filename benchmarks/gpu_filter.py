"""The filter stage on a GPU: compose programmatic candidates at GPU scale and filter them.

    python benchmarks/gpu_filter.py OUT.json --scales 16,24,32 --n 400 --parallel 16 [--chunk 8] [--seconds 480]
        [--runner ray] [--resume PREV.json]

Composes about `--n` candidates per scale (`--compose-procs` processes per scale with different
seeds, in parallel: composing is single-threaded CPU work), then filters them all with the GPU
runtime window (default 1-100 ms; in two passes, see `synth.filter.run_filter`: a stop during the
first reports only the candidates a check dropped) and writes the funnel, the throughput
(candidates per minute; CPU-side compile seconds against seconds holding the GPU alone and
seconds judges waited for it) and the eager-runtime distribution per scale to OUT.json. Needs
torch, libcst and duckdb only (no datasets, prefect or openai), so it runs on the GPU box as is.
`--seconds` stops the filter cleanly so a bounded device call still returns what was measured;
`--resume PREV.json` (an earlier OUT.json of the same arguments: composing is seeded, so the
candidates are the same) filters only the candidates PREV.json has no result for (those its first
pass passed, kept under "checked", go straight to timing), and reports over both calls (walls and
compile/GPU seconds summed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor


def compose(scale: int, n: int, seed: int) -> list[dict]:
    from cudagym.synth.compose import ComposeConfig, compose_tasks
    from cudagym.synth.crawl import crawl_torch

    seeds, _ = crawl_torch()
    config = ComposeConfig(n_tasks=n, seed=seed, scale=scale)  # its max_numel bounds each tensor by the scale
    return [{"id": t.id, "name": t.name, "code": t.code, "k": t.provenance["k"], "scale": scale}
            for t in compose_tasks(seeds, config)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--scales", default="16,24,32")
    parser.add_argument("--n", type=int, default=400, help="candidates per scale")
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--chunk", type=int, default=8, help="tasks per judge in the check pass (one start-up each)")
    parser.add_argument("--seconds", type=float, default=480)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compose-procs", type=int, default=4, help="processes composing each scale")
    parser.add_argument("--runner", default="local", choices=["local", "ray"], help="ray: every GPU of the box")
    parser.add_argument("--resume", help="an earlier OUT.json: keep its results, filter the rest")
    parser.add_argument("--check-only", action="store_true",
                        help="stop once the first pass is over (time the tasks it passed in a later --resume call)")
    parser.add_argument("--timing-judges", type=int, help="judges per GPU of the timing pass (default: FilterConfig's)")
    args = parser.parse_args()
    if args.timing_judges is not None and args.timing_judges < 1:
        parser.error("--timing-judges must be at least 1")

    from cudagym.synth.filter import FilterConfig, run_filter
    from cudagym.tasks import Task

    t0 = time.time()
    scales = [int(s) for s in args.scales.split(",")]
    jobs = [(scale, math.ceil(args.n / args.compose_procs), 1000 * scale + j) for scale in scales
            for j in range(args.compose_procs)]
    with ProcessPoolExecutor(len(jobs)) as pool:
        parts = pool.map(compose, *zip(*jobs))
        # scales dealt out in turn, so that a run stopped early has measured every scale
        rows = list({r["id"]: r for group in itertools.zip_longest(*parts) for r in group if r}.values())
    compose_s = time.time() - t0
    tasks = [Task(id=r["id"], name=r["name"], code=r["code"], provenance=r) for r in rows]
    print(f"composed {len(tasks)} candidates in {compose_s:.0f} s", flush=True)

    prior = {"report": {}, "results": {}}
    if args.resume and os.path.exists(args.resume):
        with open(args.resume) as f:
            prior = json.load(f)
    results: dict[str, dict] = dict(prior["results"])
    checked: dict[str, dict] = dict(prior.get("checked", {}))  # passed pass 1, not timed yet: by sha256
    todo = [t for t in tasks if t.id not in results]
    print(f"{len(tasks) - len(todo)} already filtered ({args.resume}), {len(todo)} to go "
          f"({sum(t.sha256 in checked for t in todo)} of them checked, waiting to be timed)", flush=True)
    config = FilterConfig(device=args.device, parallel=args.parallel, chunk=args.chunk, task_timeout_s=240,
                          runner=args.runner,
                          **({"timing_judges": args.timing_judges} if args.timing_judges else {}))
    def stop() -> None:  # an interrupted batch kills its judges and keeps what they had finished
        os.kill(os.getpid(), signal.SIGINT)  # a real signal: it wakes the main thread where it waits

    signal.signal(signal.SIGINT, signal.default_int_handler)  # started in the background, SIGINT is ignored

    def first_pass_over() -> None:  # callbacks run in this thread: the raise stops the batch here
        if args.check_only and all(t.id in results or t.sha256 in checked for t in todo):
            raise KeyboardInterrupt

    def record(task: Task, result) -> None:  # after a stop too: only finished tasks are reported
        results[task.id] = {**result.to_dict(), "compile_s": result.compile_s, "timing_s": result.timing_s,
                            "wait_s": result.wait_s, "scale": task.provenance["scale"]}
        first_pass_over()

    def record_checked(task: Task, measured: dict) -> None:
        checked[task.sha256] = measured
        first_pass_over()

    timer = threading.Timer(args.seconds, stop)
    timer.start()
    t1 = time.time()
    try:
        run_filter(todo, config, record, checked=checked, on_checked=record_checked)
    except KeyboardInterrupt:
        pass
    finally:
        timer.cancel()
    call_s = time.time() - t1
    filter_s = call_s + prior["report"].get("filter_wall_s", 0)

    done = list(results.values())
    timed = {t.sha256 for t in tasks if t.id in results}
    report = {
        "candidates": len(tasks), "filtered": len(done), "compose_s": round(compose_s, 1),
        "filter_wall_s": round(filter_s, 1), "calls": prior["report"].get("calls", 0) + 1,
        "this_call_filter_s": round(call_s, 1), "this_call_filtered": sum(t.id in results for t in todo),
        "timing_judges_per_gpu": config.timing_judges,
        "candidates_per_min": round(len(done) / filter_s * 60, 1) if filter_s else None,
        "sum_compile_s": round(sum(r["compile_s"] or 0 for r in done), 1),
        "sum_gpu_exclusive_s": round(sum(r["timing_s"] or 0 for r in done), 1),
        "sum_wait_s": round(sum(r.get("wait_s") or 0 for r in done), 1),  # judges waiting for the GPU
        "funnel": dict(Counter("kept" if r["keep"] else r["reason"] for r in done)),
        "per_scale": {},
        "device": next((r["device"] for r in done if r["device"]), ""),
    }
    for scale in scales:
        mine = [r for r in done if r["scale"] == scale]
        eager = sorted(r["t_eager_ms"] for r in mine if r["t_eager_ms"])
        report["per_scale"][scale] = {
            "filtered": len(mine), "funnel": dict(Counter("kept" if r["keep"] else r["reason"] for r in mine)),
            "eager_ms_p10_p50_p90": [eager[int(q * (len(eager) - 1))] for q in (0.1, 0.5, 0.9)] if eager else None,
            "eager_ms_log10_histogram": dict(sorted(Counter(math.floor(math.log10(max(t, 1e-4)))
                                                            for t in eager).items())),
            "median_compile_s": statistics.median([r["compile_s"] for r in mine if r["compile_s"]] or [0]),
        }
    with open(args.out, "w") as f:
        json.dump({"report": report, "results": results,
                   "checked": {sha: m for sha, m in checked.items() if sha not in timed}}, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
