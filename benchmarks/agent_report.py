"""Issue 13 acceptance 4's numbers: an agent eval of replayed kernels against `eval run` of the same kernels.

    python benchmarks/agent_report.py --eval-db EXPERT.duckdb --name NAME --run AGENT_OUT \
        [--smi SMI.csv --window START,END] [--out-json F] [--out-md F]

--eval-db / --name: the `cudagym eval run ... --db --name` store and submission. --run: an `agent eval`
--out folder or its trajectories.duckdb. --smi: `nvidia-smi --query-gpu=timestamp,utilization.gpu,
memory.used --format=csv,noheader -lms 500` output; --window: the agent eval's start and end (epoch
seconds, as `date +%s.%N` gives them on the machine that ran nvidia-smi: its timestamps are local time).

Prints (and writes) markdown and JSON:
- per problem, eval run's status / reward / speedups beside each finished rollout's final verdict, and
  whether they agree (status and correctness: must; reward: the same unless timing noise moves a speedup
  across a 5% milestone, so the speedups are shown side by side);
- the tool-call overhead p50 / p95 per tool and over all the environment's own tools (every call
  but verify / profile, which are the judge's: a build, the checks, the timing);
- verify and profile latency p50 / p95, whole and less the build (`build_s`), and the model turn latency;
- how many rollouts ran at once (from their start / finish times);
- the GPU's busy fraction (samples with utilization > 0) and mean utilization in the window.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

from cudagym.agent.rollout import DB_NAME
from cudagym.agent.store import TrajectoryStore
from cudagym.eval.store import Store

JUDGE_TOOLS = ("verify", "profile")


def fail(message: str) -> None:
    print(f"agent_report: error: {message}", file=sys.stderr)
    raise SystemExit(1)


def percentiles(values: list[float]) -> dict:
    """n, p50, p95 (linear interpolation between ranks, as numpy's default) and max, rounded to 0.01."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    p95 = statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 else values[0]
    return {"n": len(values), "p50": round(statistics.median(values), 2), "p95": round(p95, 2),
            "max": round(max(values), 2)}


def _verdict_view(v: dict) -> dict:
    return {k: v.get(k) for k in ("status", "correct", "reward", "speedup_vs_eager", "speedup_vs_compile")}


def compare(eval_verdicts: list[dict], rollouts: list[dict]) -> tuple[list[dict], dict]:
    """Per problem: eval run's verdict and each rollout's, with agreement; and the totals."""
    # eval run's verdicts of the timing mode and precision the agent's judge used
    direct = {(v["level"], v["problem_id"], v.get("timing_mode"), v.get("precision")): v for v in eval_verdicts}
    problems: dict[tuple[int, int], dict] = {}
    totals = {"rollouts": len(rollouts), "finished": 0, "compared": 0, "verdict_agree": 0, "reward_agree": 0,
              "no_eval_verdict": 0}
    for r in rollouts:
        mine = r.get("verdict") or {}
        theirs = direct.get((r["level"], r["problem_id"], mine.get("timing_mode", "strict"), mine.get("precision", "strict")))
        entry = problems.setdefault((r["level"], r["problem_id"]), {
            "level": r["level"], "problem_id": r["problem_id"], "name": r["task_name"], "eval": _verdict_view(theirs) if theirs else None,
            "rollouts": []})
        row = {"sample": r["sample"], "rollout_status": r["status"], "stop_reason": r["stop_reason"],
               **_verdict_view(mine),
               "verdict_agree": None, "reward_agree": None}
        entry["rollouts"].append(row)
        if r["status"] != "finished":  # stopped by the time limit (or failed on our side): no final verdict
            continue
        totals["finished"] += 1
        if theirs is None:  # eval run did not get to this problem
            totals["no_eval_verdict"] += 1
            continue
        row["verdict_agree"] = (mine.get("status"), mine.get("correct")) == (theirs["status"], theirs["correct"])
        row["reward_agree"] = r["reward"] == theirs["reward"]
        totals["compared"] += 1
        totals["verdict_agree"] += row["verdict_agree"]
        totals["reward_agree"] += row["reward_agree"]
    return [problems[k] for k in sorted(problems)], totals


def timings(store: TrajectoryStore, rollouts: list[dict]) -> dict:
    """Milliseconds: per tool, the environment's tools together, the judge's less its builds, model turns."""
    per_tool: dict[str, list[float]] = {}
    env_tools, turns = [], []
    less_build: dict[str, list[float]] = {t: [] for t in JUDGE_TOOLS}
    builds: dict[str, list[float]] = {t: [] for t in JUDGE_TOOLS}
    for r in rollouts:
        for c in store.tool_calls(r["rollout_id"]):
            if c["elapsed_s"] is None:
                continue
            ms = c["elapsed_s"] * 1000
            per_tool.setdefault(c["name"], []).append(ms)
            if c["name"] in JUDGE_TOOLS:
                build_ms = (c["build_s"] or 0.0) * 1000
                less_build[c["name"]].append(ms - build_ms)
                builds[c["name"]].append(build_ms)
            else:
                env_tools.append(ms)
        turns += [t["latency_s"] * 1000 for t in store.turns(r["rollout_id"]) if t["latency_s"] is not None]
    return {"tools_ms": {name: percentiles(ms) for name, ms in sorted(per_tool.items())},
            "env_tools_ms": percentiles(env_tools),
            "judge_less_build_ms": {name: percentiles(ms) for name, ms in less_build.items()},
            "judge_build_ms": {name: percentiles(ms) for name, ms in builds.items()},
            "model_turn_ms": percentiles(turns)}


def max_concurrent(rollouts: list[dict]) -> int:
    """The most rollouts that were running at one moment (a finish before a start at the same instant)."""
    events = []
    for r in rollouts:
        if r["started"] and r["finished"]:
            events += [(r["started"], 1), (r["finished"], -1)]
    running = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        running += step
        peak = max(peak, running)
    return peak


def gpu_busy(smi_csv: Path, window: tuple[float, float] | None) -> dict:
    """From nvidia-smi's csv (timestamp, utilization.gpu, memory.used): samples, busy fraction, mean %."""
    samples = []
    for line in smi_csv.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            when = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local time, as nvidia-smi
            util = float(parts[1].split()[0])
            mem = float(parts[2].split()[0])
        except (IndexError, ValueError):  # a header, [N/A] or a line cut short when the sampler was stopped
            continue
        if window is None or window[0] <= when <= window[1]:
            samples.append((util, mem))
    if not samples:
        return {"samples": 0, "busy_fraction": None, "mean_util_pct": None, "max_mem_mib": None}
    utils = [u for u, _ in samples]
    return {"samples": len(samples), "busy_fraction": round(sum(u > 0 for u in utils) / len(utils), 3),
            "mean_util_pct": round(statistics.fmean(utils), 1), "max_mem_mib": max(m for _, m in samples)}


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _verdict_text(v: dict | None) -> str:
    if not v or v["status"] is None:  # no eval run verdict, or a rollout stopped before its final verdict
        return v["rollout_status"] if v else "-"
    return f"{v['status']} r={v['reward']} x{_fmt(v['speedup_vs_eager'])}/x{_fmt(v['speedup_vs_compile'])}"


def markdown(report: dict) -> str:
    t, a = report["timings"], report["agreement"]
    lines = [f"agent eval {report['run']} vs eval run {report['eval_name']!r}: {a['rollouts']} rollouts "
             f"({a['finished']} finished, at most {report['max_concurrent_rollouts']} at once; {a['no_eval_verdict']} "
             f"finished without an eval run verdict), verdicts agree {a['verdict_agree']}/{a['compared']}, rewards "
             f"agree {a['reward_agree']}/{a['compared']}",
             "", "| problem | eval run: status reward xeager/xcompile | rollouts | agree (verdict, reward) |",
             "|---|---|---|---|"]
    for p in report["problems"]:
        mine = "; ".join(_verdict_text(r) for r in p["rollouts"])
        agree = " ".join("-" if r["verdict_agree"] is None else
                         f"{'y' if r['verdict_agree'] else 'N'}{'y' if r['reward_agree'] else 'n'}" for r in p["rollouts"])
        lines.append(f"| L{p['level']}/{p['name']} | {_verdict_text(p['eval'])} | {mine} | {agree} |")
    lines += ["", "| ms | n | p50 | p95 | max |", "|---|---|---|---|---|"]
    rows = [("env tools (all but verify/profile)", t["env_tools_ms"])]
    rows += [(name, s) for name, s in t["tools_ms"].items()]
    rows += [(f"{name} less build", s) for name, s in t["judge_less_build_ms"].items()]
    rows += [(f"{name} build", s) for name, s in t["judge_build_ms"].items()]
    rows += [("model turn", t["model_turn_ms"])]
    lines += [f"| {name} | {s['n']} | {_fmt(s['p50'])} | {_fmt(s['p95'])} | {_fmt(s['max'])} |" for name, s in rows]
    if report.get("gpu"):
        g = report["gpu"]
        lines += ["", f"GPU in the agent eval window: {g['samples']} samples, busy (utilization > 0) "
                      f"{_fmt(g['busy_fraction'], 3)}, mean utilization {_fmt(g['mean_util_pct'], 1)}%, "
                      f"max memory {_fmt(g['max_mem_mib'], 0)} MiB"]
    return "\n".join(lines) + "\n"


def build_report(eval_db: Path, name: str, run: Path, smi: Path | None = None,
                 window: tuple[float, float] | None = None) -> dict:
    db = run / DB_NAME if run.is_dir() else run
    for path, what in ((eval_db, "--eval-db"), (db, "--run trajectory store")):
        if not path.is_file():
            fail(f"{what}: no such file {path}")
    if smi is not None and not smi.is_file():
        fail(f"--smi: no such file {smi}")
    with Store(eval_db) as lb:
        eval_verdicts = lb.verdicts(name)
    if not eval_verdicts:
        fail(f"{eval_db} holds no verdicts of {name!r}")
    with TrajectoryStore(db, read_only=True) as store:
        rollouts = store.rollouts()
        if not rollouts:
            fail(f"{db} holds no rollouts")
        times = timings(store, rollouts)
    problems, agreement = compare(eval_verdicts, rollouts)
    return {"run": str(run), "eval_db": str(eval_db), "eval_name": name, "agreement": agreement,
            "max_concurrent_rollouts": max_concurrent(rollouts), "problems": problems, "timings": times,
            "gpu": gpu_busy(smi, window) if smi is not None else None,
            "window": list(window) if window else None}


def _window(text: str) -> tuple[float, float]:
    try:
        start, end = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("START,END in epoch seconds expected") from None
    return start, end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-db", type=Path, required=True, help="the eval run's DuckDB store")
    parser.add_argument("--name", required=True, help="the eval run's submission name (--name)")
    parser.add_argument("--run", type=Path, required=True, help="agent eval --out folder or its trajectories.duckdb")
    parser.add_argument("--smi", type=Path, default=None, help="nvidia-smi csv (timestamp, utilization.gpu, memory.used)")
    parser.add_argument("--window", type=_window, default=None, help="START,END epoch seconds of the agent eval")
    parser.add_argument("--out-json", type=Path, default=None)
    parser.add_argument("--out-md", type=Path, default=None)
    args = parser.parse_args(argv)
    report = build_report(args.eval_db, args.name, args.run, args.smi, args.window)
    text = markdown(report)
    print(text, end="")
    if args.out_json:
        args.out_json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    if args.out_md:
        args.out_md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
