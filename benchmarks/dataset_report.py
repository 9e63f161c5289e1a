"""Issue 17 acceptance 2-3: what a `cudagym dataset build` call on the GPU achieved, from the build's
own records (BUILD/build.duckdb, BUILD/funnel.json, BUILD/dataset/).

    python benchmarks/dataset_report.py BUILD --wall-s SECONDS [--gpus 1] [--out DIR]

Each run given --wall-s is one device call: it appends the call's totals to BUILD/calls.jsonl (so the next call's
report takes its deltas from there: the build folder travels between calls) and writes DIR/report.md
and DIR/report.json over all calls so far:

- kept tasks per GPU-minute (target >= 60): candidates the filter kept during the call over the
  call's build wall x GPUs;
- yield (target >= 60%): filter kept / filtered, per call and overall, and published / composed;
- the funnel (funnel.json's stages), the K and data-source distribution against CUDA-Agent-Ops-6K's,
  and the eager times and scales of the kept candidates against all filtered (the scale sizing);
- re-execution: published rows that ran eager and under torch.compile on a GPU (filter_device not
  cpu, both times present);
- the state that must travel to resume: build.duckdb's size, per 1,000 published rows;
- the last rounds' timeline, from the store's own timestamps (`round_timeline`): how long each round sized
  its candidates, how long it filtered them, and the gap before it, one stage after another;
- DIR/progress.png (where matplotlib is installed): kept tasks against GPU-minutes over the calls, beside
  the target's rate, and each call's rate coloured by its setup (`plot`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cudagym.synth.filter import MEMORY, PHASES, FilterConfig  # noqa: E402
from cudagym.synth.labels import OPS_6K_SOURCES  # noqa: E402

PAPER_SOURCES = OPS_6K_SOURCES  # CUDA-Agent-Ops-6K's composition (6,000 tasks): data_source -> tasks
TARGET_PER_GPU_MIN, TARGET_YIELD = 60.0, 0.60


def totals(build: Path) -> dict:
    """Cumulative counts of the build so far (read-only: the build must not be running)."""
    db = duckdb.connect(str(build / "build.duckdb"), read_only=True)
    try:
        composed = db.execute("SELECT count(*) FROM candidates").fetchone()[0]
        filtered, kept = db.execute("SELECT count(*), count(*) FILTER (WHERE keep) FROM filtered").fetchone()
        checked = db.execute("SELECT count(*) FROM checked").fetchone()[0]
    finally:
        db.close()
    return {"composed": composed, "filtered": filtered, "kept": kept, "checked_untimed": checked,
            "published": len(published_rows(build))}


def published_rows(build: Path) -> list[dict]:
    """The rows of BUILD/dataset (pyarrow, not datasets: the report needs no more than the build)."""
    shards = sorted((build / "dataset" / "data").glob("*.parquet"))
    return [row for shard in shards for row in pq.read_table(shard).to_pylist()]


def filter_detail(build: Path) -> list[dict]:
    """Every filter decision with its candidate's scale and K (from the candidate's provenance)."""
    db = duckdb.connect(str(build / "build.duckdb"), read_only=True)
    try:
        rows = db.execute("SELECT f.keep, f.reason, f.t_eager_ms, c.provenance FROM filtered f "
                          "JOIN candidates c USING (sha256)").fetchall()
    finally:
        db.close()
    out = []
    for keep, reason, t_eager, prov in rows:
        prov = json.loads(prov)
        out.append({"keep": keep, "reason": reason, "eager_ms": t_eager, "scale": prov.get("scale"),
                    "k": prov.get("k")})
    return out


def judge_seconds(build: Path) -> dict:
    """Where the filter's and the scale search's judge time went: per phase recorded (filter.PHASES), the
    decisions that recorded it (builds since session 15), their sum and median; and the scale search's outcomes and probes."""
    db = duckdb.connect(str(build / "build.duckdb"), read_only=True)
    try:
        has_phases = "phases" in [c for (c,) in db.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'filtered'").fetchall()]
        phases = [json.loads(p) for (p,) in db.execute("SELECT phases FROM filtered WHERE phases IS NOT NULL").fetchall()] \
            if has_phases else []
        sized = db.execute("SELECT reason, probes FROM sized").fetchall()
    finally:
        db.close()
    filter_s = {}
    recorded = dict.fromkeys(k for p in phases for k in p)
    for name in [k for k in PHASES if k in recorded] + [k for k in recorded if k not in PHASES + MEMORY]:  # a judge's order
        values = [p[name] for p in phases if p.get(name) is not None]
        filter_s[name] = {"n": len(values), "sum": round(sum(values), 1), "median": round(statistics.median(values), 3)}
    memory = {}  # GiB reserved and held at most, per decision that recorded it (since session 28): medians, not sums
    for name in [k for k in MEMORY if k in recorded]:
        values = sorted(p[name] for p in phases if p.get(name) is not None)
        memory[name] = {"n": len(values), "median": round(statistics.median(values), 3), "max": round(values[-1], 3)}
    probes = [len(json.loads(p)) for _, p in sized]
    return {"filter": filter_s, "memory_gib": memory, "scale_search": {"candidates": len(sized), "probes": sum(probes),
                                                 "reasons": dict(Counter(r for r, _ in sized))}}


ROUNDS_SHOWN = 8
# Nothing stored for longer than one task's whole judge run (300 s): no task holds a judge longer, so that
# is the time between two runs of the build (device calls; back to back on a warm box they lie 7-8 minutes apart)
CALL_GAP_S = FilterConfig().task_timeout_s


def call_breaks(times: list) -> list[tuple]:
    """The pauses between runs of the build (device calls): each stretch longer than CALL_GAP_S in which
    the store wrote nothing, as (last write before, first write after); a running build stores a sized
    chain or a decision every few seconds."""
    times = sorted(times)
    return [(a, b) for a, b in zip(times, times[1:]) if (b - a).total_seconds() > CALL_GAP_S]


def _span_s(start, end, breaks: list[tuple]) -> float | None:
    """end - start in seconds, None where either is missing or a pause between calls lies between them."""
    if start is None or end is None or any(start <= a and b <= end for a, b in breaks):
        return None
    return round((end - start).total_seconds(), 1)


def round_timeline(build: Path, last: int = ROUNDS_SHOWN) -> list[dict]:
    """The last rounds' stages in time, from what the store writes as it goes: a round's sized candidates are
    stored as each scale search ends (`sized`, keyed by the composed chain, so told to a round by time: those
    after the round before's candidates), its candidates all at once when its search is done, and each
    filter decision as it comes. Per round: `size_s` (its first sized chain to its candidates stored: the
    probe pass less its start), `filter_s` (its candidates stored to its last decision: checks and timing),
    `gap_s` (the round before's last decision to this round's first sized chain: composing, the probe
    judges' start) and `kept`. A span with a pause between device calls inside (`call_breaks`) is None: a
    round stopped by one call's end and finished by the next says nothing about either (on the H100 in
    session 31 such spans read 13,874 and 27,349 s).
    Overlapped rounds (--overlap) compose and size a round while the round before filters, so its candidates
    wait for that filter: `filtering_s` is its first decision to its last (a decision is stored when a check
    drops a task or its timing ends, so its filter began a check earlier: judges' start, a check, a compile),
    and `overlap_s` how long its sizing ran while the round before's decisions came (0: one after the other)."""
    db = duckdb.connect(str(build / "build.duckdb"), read_only=True)
    try:
        rounds = db.execute(
            "SELECT c.round, min(c.created), count(*), max(f.created), count(f.sha256), count(*) FILTER (WHERE f.keep), "
            "min(f.created) "
            "FROM candidates c LEFT JOIN filtered f USING (sha256) GROUP BY c.round ORDER BY c.round").fetchall()
        sized = [t for (t,) in db.execute("SELECT created FROM sized ORDER BY created").fetchall()]
        decided = [t for (t,) in db.execute("SELECT created FROM filtered").fetchall()]
    finally:
        db.close()
    breaks = call_breaks(sized + decided + [r[1] for r in rounds])
    out, before = [], None  # before: the previous round's (candidates stored, last decision, first decision)
    for round_, stored, n, last_decision, filtered, kept, first_decision in rounds:
        since = before[0] if before else None
        first_sized = next((t for t in sized if (since is None or t > since) and t <= stored), None)
        overlap = None
        if first_sized and before and before[1] and before[2] and _span_s(
                min(first_sized, before[2]), max(stored, before[1]), breaks) is not None:  # all in one call
            overlap = round(max(0.0, (min(stored, before[1]) - max(first_sized, before[2])).total_seconds()), 1)
        gap = _span_s(before[1], first_sized, breaks) if before else None
        out.append({"round": round_, "candidates": n, "filtered": filtered, "kept": kept,
                    "size_s": _span_s(first_sized, stored, breaks),
                    "filter_s": _span_s(stored, last_decision, breaks),
                    "filtering_s": _span_s(first_decision, last_decision, breaks),
                    "overlap_s": overlap,
                    "gap_s": gap if gap is None or gap >= 0 else None})
        before = (stored, last_decision, first_decision)
    return out[-last:]


def record_call(build: Path, wall_s: float, gpus: int, setup: str = "") -> list[dict]:
    """Append this call's deltas to BUILD/calls.jsonl (with `setup`: what this call ran, for an A/B); all calls so far."""
    log = build / "calls.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    now = totals(build)
    before = calls[-1]["totals"] if calls else {k: 0 for k in now}
    delta = {k: now[k] - before.get(k, 0) for k in now}
    calls.append({"call": len(calls) + 1, "wall_s": round(wall_s, 1), "gpus": gpus, "setup": setup, "totals": now,
                  "delta": delta})
    with log.open("a") as f:
        f.write(json.dumps(calls[-1]) + "\n")
    return calls


def per_call(call: dict) -> dict:
    d, gpu_min = call["delta"], call["wall_s"] * call["gpus"] / 60
    return {"call": call["call"], "wall_s": call["wall_s"], "gpus": call["gpus"], "setup": call.get("setup") or "", **d,
            "kept_per_gpu_min": round(d["kept"] / gpu_min, 1) if gpu_min else None,
            "yield": round(d["kept"] / d["filtered"], 4) if d["filtered"] else None}


def _or_dash(value) -> str:
    return "–" if value is None else str(value)


def _pct(n: float, total: float) -> str:
    return f"{100 * n / total:.2f}%" if total else "–"


def report(build: Path, calls: list[dict], packed: Path | None = None) -> dict:
    funnel = json.loads((build / "funnel.json").read_text())
    rows = published_rows(build)
    detail = filter_detail(build)
    now = calls[-1]["totals"]
    wall_gpu_min = sum(c["wall_s"] * c["gpus"] for c in calls) / 60
    sources = Counter(r["data_source"] for r in rows)
    on_gpu = [r for r in rows if r["filter_device"] != "cpu" and r["eager_ms"] > 0 and r["compile_ms"] > 0]
    kept_ms = [d["eager_ms"] for d in detail if d["keep"]]
    by_scale = {}
    for d in detail:
        s = by_scale.setdefault(str(d["scale"]), Counter())
        s["filtered"] += 1
        s["kept" if d["keep"] else d["reason"]] += 1
    size = (build / "build.duckdb").stat().st_size
    return {
        "calls": [per_call(c) for c in calls],
        "overall": {**now, "gpu_min": round(wall_gpu_min, 2),
                    "kept_per_gpu_min": round(now["kept"] / wall_gpu_min, 1) if wall_gpu_min else None,
                    "yield": round(now["kept"] / now["filtered"], 4) if now["filtered"] else None,
                    "published_per_composed": round(now["published"] / now["composed"], 4) if now["composed"] else None,
                    "targets": {"kept_per_gpu_min": TARGET_PER_GPU_MIN, "yield": TARGET_YIELD}},
        "status": funnel.get("status"), "note": funnel.get("note"), "config": funnel["config"],
        "stages": funnel["stages"],
        "k_distribution": funnel["k_distribution"],
        "sources": {src: {"here": sources.get(src, 0), "share": _pct(sources.get(src, 0), len(rows)),
                          "paper": PAPER_SOURCES.get(src, 0), "paper_share": _pct(PAPER_SOURCES.get(src, 0), 6000)}
                    for src in sorted(set(PAPER_SOURCES) | set(sources))},
        "re_executed_on_gpu": {"rows": len(rows), "eager_and_compiled_on_gpu": len(on_gpu),
                               "devices": dict(Counter(r["filter_device"] for r in rows))},
        "kept_eager_ms": {"n": len(kept_ms), "min": min(kept_ms, default=None), "median":
                          statistics.median(kept_ms) if kept_ms else None, "max": max(kept_ms, default=None)},
        "by_scale": {k: dict(v) for k, v in sorted(by_scale.items())},
        "judge_seconds": judge_seconds(build),
        "rounds": round_timeline(build),
        # what travels between calls; per 1,000 rows only means something beyond DuckDB's fixed blocks (MBs)
        "state": {"build_duckdb_bytes": size, **({"packed_bytes": packed.stat().st_size,
                  "packed_per_1000_rows": round(packed.stat().st_size / len(rows) * 1000) if rows else None}
                  if packed else {})},
    }


def markdown(r: dict) -> str:
    o = r["overall"]
    lines = [f"# Dataset build report ({r['status']}: {o['published']} rows published)", ""]
    if r["note"]:
        lines += [f"Note: {r['note']}", ""]
    lines += ["| call | setup | wall s | GPUs | composed | filtered | kept | published | kept / GPU-min | yield |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in r["calls"]:
        lines.append(f"| {c['call']} | {c['setup'] or '–'} | {c['wall_s']} | {c['gpus']} | {c['composed']} | "
                     f"{c['filtered']} | {c['kept']} | {c['published']} | {c['kept_per_gpu_min']} | {c['yield']} |")
    lines += [f"| all | | {sum(c['wall_s'] for c in r['calls'])} | | {o['composed']} | {o['filtered']} | {o['kept']} | "
              f"{o['published']} | **{o['kept_per_gpu_min']}** (target >= {TARGET_PER_GPU_MIN:g}) | "
              f"**{o['yield']}** (target >= {TARGET_YIELD:g}) |", "",
              f"Published per composed candidate: {o['published_per_composed']}; checked in pass 1, not yet timed: "
              f"{o['checked_untimed']}.", "", "## Funnel", "",
              "| stage | in | kept | dropped |", "| --- | --- | --- | --- |"]
    for s in r["stages"]:
        top = sorted(((k, v) for k, v in s["dropped"].items() if v), key=lambda kv: -kv[1])
        dropped = ", ".join(f"{k} {v}" for k, v in top[:6]) + (f", {len(top) - 6} more reasons" if len(top) > 6 else "")
        lines.append(f"| {s['stage']} | {s['in']} | {s['kept']} | {dropped or '–'} |")
    lines += ["", "## Sources against CUDA-Agent-Ops-6K", "", "| data_source | here | share | paper (of 6,000) | paper share |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {k} | {v['here']} | {v['share']} | {v['paper']} | {v['paper_share']} |" for k, v in r["sources"].items()]
    lines += ["", f"K distribution (funnel): {r['k_distribution']}", "", "## Scales (filter decisions)", "",
              "| scale | filtered | kept | too_fast | too_slow | other drops |", "| --- | --- | --- | --- | --- | --- |"]
    for scale, c in r["by_scale"].items():
        other = c["filtered"] - c.get("kept", 0) - c.get("too_fast", 0) - c.get("too_slow", 0)
        lines.append(f"| {scale} | {c['filtered']} | {c.get('kept', 0)} | {c.get('too_fast', 0)} | {c.get('too_slow', 0)} | {other} |")
    sec = r["judge_seconds"]
    search = sec["scale_search"]
    lines += ["", f"Scale search: {search['candidates']} candidates, {search['probes']} probes"
              + "".join(f", {k} {v}" for k, v in sorted(search["reasons"].items())) + ".",
              "Filter judge seconds (sum / median over decisions): "
              + (", ".join(f"{k[:-2]} {v['sum']} / {v['median']}" for k, v in sec["filter"].items()) or "not recorded") + "."]
    if sec.get("memory_gib"):  # reserved of the memory budget against held at most (GPU decisions since session 28)
        lines.append("Filter GPU memory GiB (median / max over decisions): "
                     + ", ".join(f"{k[:-4]} {v['median']} / {v['max']}" for k, v in sec["memory_gib"].items()) + ".")
    if r.get("rounds"):  # one stage after another: sizing, then filtering, then the next round's composing
        lines += ["", "## Last rounds (the store's timestamps)", "",
                  "| round | candidates | filtered | kept | gap before s | sizing s | sized beside the last filter s "
                  "| stored to last decision s | first to last decision s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {t['round']} | {t['candidates']} | {t['filtered']} | {t['kept']} | {_or_dash(t['gap_s'])} | "
                  f"{_or_dash(t['size_s'])} | {_or_dash(t.get('overlap_s'))} | {_or_dash(t['filter_s'])} | "
                  f"{_or_dash(t.get('filtering_s'))} |" for t in r["rounds"]]
    g, e, st = r["re_executed_on_gpu"], r["kept_eager_ms"], r["state"]
    ms = {k: round(v, 3) if isinstance(v, float) else v for k, v in e.items()}
    lines += ["", f"Kept eager ms: n {ms['n']}, min {ms['min']}, median {ms['median']}, max {ms['max']}.",
              f"Re-executed: {g['eager_and_compiled_on_gpu']} of {g['rows']} published rows ran eager and under "
              f"torch.compile on a GPU; devices {g['devices']}.",
              f"State: build.duckdb {st['build_duckdb_bytes']:,} bytes"
              + (f", packed {st['packed_bytes']:,} bytes" if st.get("packed_bytes") else "")
              + (f" ({st['packed_per_1000_rows']:,} per 1,000 published rows)" if st.get("packed_per_1000_rows") else "")
              + ".", ""]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    """The build's progress over its calls: kept tasks against GPU-minutes (build wall x GPUs), one point per
    call, beside the target's rate; and each call's kept per GPU-minute, coloured by what it ran (its setup)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls, target = r["calls"], r["overall"]["targets"]["kept_per_gpu_min"]
    minutes, kept, total_min, total_kept = [0.0], [0], 0.0, 0
    for c in calls:
        total_min += c["wall_s"] * c["gpus"] / 60
        total_kept += c["kept"]
        minutes.append(total_min)
        kept.append(total_kept)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot(minutes, kept, marker="o", label=f"kept: {total_kept:,} in {total_min:.1f} GPU-min")
    left.plot([0, total_min], [0, target * total_min], "--", color="grey", label=f"target: {target:g} per GPU-min")
    left.set(xlabel="GPU-minutes (build wall x GPUs)", ylabel="kept tasks", title="kept over the calls")
    left.legend(loc="upper left")
    labels = [c.get("setup") or "(no setup recorded)" for c in calls]
    colours = plt.get_cmap("tab10")
    for i, setup in enumerate(dict.fromkeys(labels)):
        mine = [(c["call"], c["kept_per_gpu_min"] or 0) for c, label in zip(calls, labels) if label == setup]
        # setups differ in their last words (what a session changed): wrapped whole, never cut
        right.bar([n for n, _ in mine], [v for _, v in mine], color=colours(i % 10), label="\n".join(textwrap.wrap(setup, 70)))
    right.axhline(target, linestyle="--", color="grey")
    right.set_ylim(0, 1.15 * max([target] + [c["kept_per_gpu_min"] or 0 for c in calls]))
    right.set(xlabel="call", ylabel="kept per GPU-minute", title="each call, by setup")
    right.xaxis.set_major_locator(plt.MaxNLocator(integer=True))  # calls are numbered
    right.legend(loc="upper left", bbox_to_anchor=(0.0, -0.27), fontsize=7)  # below the bars
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", type=Path, help="the `cudagym dataset build` folder (--out)")
    ap.add_argument("--wall-s", type=float, default=None,
                    help="this call's build wall, seconds: records the call in BUILD/calls.jsonl (without: report only)")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--setup", default="", help="what this call ran (recorded with --wall-s), e.g. 'two passes; lock turnstile; H100'")
    ap.add_argument("--packed", type=Path, default=None, help="the packed resumable state, to report its size")
    ap.add_argument("--out", type=Path, default=None, help="folder for report.md and report.json (default BUILD)")
    args = ap.parse_args(argv)
    if not (args.build / "funnel.json").is_file():
        print(f"dataset_report: no funnel.json in {args.build} (the build wrote nothing yet)", file=sys.stderr)
        return 1
    out = args.out or args.build
    out.mkdir(parents=True, exist_ok=True)
    log = args.build / "calls.jsonl"
    if args.wall_s is not None:
        calls = record_call(args.build, args.wall_s, args.gpus, args.setup)
    elif log.exists():
        calls = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    else:
        print(f"dataset_report: no calls recorded in {log}: pass --wall-s", file=sys.stderr)
        return 1
    r = report(args.build, calls, args.packed)
    (out / "report.json").write_text(json.dumps(r, indent=2) + "\n")
    (out / "report.md").write_text(markdown(r))
    try:
        plot(r, out / "progress.png")
    except ImportError:  # a box without matplotlib (the GPU image): the tables say it all
        print("dataset_report: no matplotlib here: progress.png not drawn", file=sys.stderr)
    print(markdown(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
