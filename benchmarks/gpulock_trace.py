"""Where the judges' waits went, from a GPU lock trace (`gpulock.TRACE_ENV`: every hold of the GPU lock,
shared or exclusive, and of the memory budget, one JSON line each).

Splits the traced span by what the GPU lock was doing:
- exclusive: a timing turn held it;
- shared: readers (builds, inputs, first calls, checks, autotuning) held it, no timer; the part of it
  with a timer waiting is a drain (reported with the share of it one reader held alone);
- handoff: nobody held it while someone waited for it (a reader let in after a timer, flock wake-ups);
- idle, waiting for memory: nobody held or wanted it while judges waited to be admitted to the memory budget;
- idle: nobody held, wanted it or waited for memory (judges compiling, starting, between tasks, or none).
And per kind of hold: how many, how long they were held and waited for; for the memory budget, how many
judges it admitted at once and how much it had reserved.

    python benchmarks/gpulock_trace.py TRACE.jsonl [--out gpulock.md] [--plot gpulock.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STATES = ("exclusive", "shared", "handoff", "idle, waiting for memory", "idle")


def read_trace(path: str | Path) -> list[dict]:
    """The trace's holds; a torn or foreign line is skipped."""
    events = []
    for line in Path(path).read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and {"lock", "asked", "got", "released"} <= event.keys():
            events.append(event)
    return events


def _quantile(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def intervals(events: list[dict]):
    """The traced span cut where anything changes: (start s, end s, the lock's state, judges admitted to
    the memory budget, GiB they reserved, readers holding the lock, timers waiting for it), in order."""
    # +1/-1 at each boundary of each hold's wait (asked..got) and hold (got..released), per lock kind
    deltas: list[tuple[float, str, float]] = []
    for e in events:
        kind = "gpu" if e["lock"] in ("ex", "sh") else "mem"
        deltas += [(e["asked"], f"{kind}_wait", 1), (e["got"], f"{kind}_wait", -1)]
        if e["lock"] == "ex":
            deltas += [(e["asked"], "ex_wait", 1), (e["got"], "ex_wait", -1)]
        deltas += [(e["got"], e["lock"], 1), (e["released"], e["lock"], -1)]
        if kind == "mem":
            deltas += [(e["got"], "gib", e.get("gib", 0.0)), (e["released"], "gib", -e.get("gib", 0.0))]
    deltas.sort(key=lambda d: d[0])
    level = {"gpu_wait": 0, "mem_wait": 0, "ex_wait": 0, "ex": 0, "sh": 0, "mem": 0, "gib": 0.0}
    t = deltas[0][0] if deltas else 0.0
    for at, key, step in deltas:
        if at > t:
            if level["ex"]:
                state = "exclusive"
            elif level["sh"]:
                state = "shared"
            elif level["gpu_wait"]:
                state = "handoff"
            elif level["mem_wait"]:
                state = "idle, waiting for memory"
            else:
                state = "idle"
            yield t, at, state, level["mem"], level["gib"], level["sh"], level["ex_wait"]
            t = at
        level[key] += step


def summarize(events: list[dict]) -> dict:
    """{"span_s", "states": {state: seconds}, "holds": {lock: {...}}, "memory": {...}} (see the module)."""
    if not events:
        return {"span_s": 0.0, "states": {s: 0.0 for s in STATES}, "drain_s": 0.0, "drain_one_reader_s": 0.0,
                "holds": {}, "memory": {}}
    start = min(e["asked"] for e in events)
    end = max(e["released"] for e in events)
    states = {s: 0.0 for s in STATES}
    admitted_s = reserved_gib_s = 0.0
    most_admitted, most_gib = 0, 0.0
    drain = {"drain_s": 0.0, "drain_one_reader_s": 0.0}
    for t0, t1, state, admitted, gib, readers, timers_waiting in intervals(events):
        states[state] += t1 - t0
        if state == "shared" and timers_waiting:  # a drain: no new reader gets in under writers-first
            drain["drain_s"] += t1 - t0
            drain["drain_one_reader_s"] += (t1 - t0) if readers == 1 else 0.0
        admitted_s += admitted * (t1 - t0)
        reserved_gib_s += gib * (t1 - t0)
        most_admitted, most_gib = max(most_admitted, admitted), max(most_gib, gib)
    span = end - start
    holds = {}
    for lock in ("ex", "sh", "mem"):
        mine = [e for e in events if e["lock"] == lock]
        if mine:
            waits = [e["got"] - e["asked"] for e in mine]
            held = [e["released"] - e["got"] for e in mine]
            holds[lock] = {"n": len(mine), "per_s": len(mine) / span if span else None,
                           "wait_sum_s": sum(waits), "wait_p50_s": _quantile(waits, 0.5), "wait_p90_s": _quantile(waits, 0.9),
                           "held_sum_s": sum(held), "held_p50_s": _quantile(held, 0.5), "held_p90_s": _quantile(held, 0.9),
                           "pids": len({e.get("pid") for e in mine})}
    memory = {}
    if "mem" in holds and span:
        memory = {"admitted_mean": admitted_s / span, "admitted_max": most_admitted,
                  "reserved_gib_mean": reserved_gib_s / span, "reserved_gib_max": most_gib}
    return {"span_s": span, "states": states, **drain, "holds": holds, "memory": memory}


def timeline(events: list[dict], bins: int = 120) -> tuple[list[float], dict[str, list[float]]]:
    """The span in `bins` equal bins: (each bin's start, s from the first event; {state: its share of each bin})."""
    if not events:
        return [], {s: [] for s in STATES}
    start = min(e["asked"] for e in events)
    width = max(1e-9, (max(e["released"] for e in events) - start) / bins)
    shares = {s: [0.0] * bins for s in STATES}
    for t0, t1, state, *_ in intervals(events):
        i = min(bins - 1, int((t0 - start) / width))
        while t0 < t1:  # an interval may cross bins; a bin's edge that rounding puts at t0 moves on to the next
            edge = t1 if i >= bins - 1 else min(t1, start + (i + 1) * width)
            if edge > t0:
                shares[state][i] += (edge - t0) / width
                t0 = edge
            i += 1
    return [i * width for i in range(bins)], shares


def plot(events: list[dict], path: str | Path) -> None:
    """The lock's states over the run, as shares of each bin stacked (matplotlib, imported here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    starts, shares = timeline(events)
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.stackplot(starts, *[shares[s] for s in STATES], labels=STATES, step="post")
    ax.set_xlabel("s from the first traced hold")
    ax.set_ylabel("share of each bin")
    ax.set_ylim(0, 1)
    ax.set_title("What the GPU lock was doing")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(summary: dict) -> str:
    span = summary["span_s"] or 1.0
    lines = [f"# GPU lock trace: {summary['span_s']:.0f} s", "", "| the GPU lock was | s | share |", "| --- | --- | --- |"]
    lines += [f"| {state} | {seconds:.1f} | {seconds / span:.1%} |" for state, seconds in summary["states"].items()]
    lines += ["", f"Drains (readers hold the lock while a timer waits for it): {summary['drain_s']:.1f} s, "
                  f"{summary['drain_s'] / span:.1%} of the span; {summary['drain_one_reader_s']:.1f} s of it with one "
                  "reader alone (a long build, call or check that every timer, and under writers-first every "
                  "reader, waits for)."]
    names = {"ex": "exclusive (timing turns)", "sh": "shared (readers)", "mem": "memory budget"}
    lines += ["", "| holds | n | per s | judges | wait sum s | wait p50 s | wait p90 s | held sum s | held p50 s | held p90 s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for lock, h in summary["holds"].items():
        lines.append(f"| {names[lock]} | {h['n']} | {h['per_s']:.2f} | {h['pids']} | {h['wait_sum_s']:.0f} | {h['wait_p50_s']:.3f} | "
                     f"{h['wait_p90_s']:.3f} | {h['held_sum_s']:.0f} | {h['held_p50_s']:.3f} | {h['held_p90_s']:.3f} |")
    m = summary["memory"]
    if m:
        lines += ["", f"Memory budget: {m['admitted_mean']:.1f} judges admitted on average (at most {m['admitted_max']}), "
                      f"{m['reserved_gib_mean']:.1f} GiB reserved on average (at most {m['reserved_gib_max']:.1f}; "
                      "a share lowered for a compile counts at its first size)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--out", help="also write the report here")
    parser.add_argument("--plot", help="also plot the lock's states over the run here (PNG)")
    args = parser.parse_args(argv)
    if not Path(args.trace).is_file():
        print(f"gpulock_trace: no trace at {args.trace}", file=sys.stderr)
        return 2
    events = read_trace(args.trace)
    text = report(summarize(events))
    if args.plot:
        plot(events, args.plot)
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
