"""Where a fast kernel's strict time goes, and which way of timing it repeats: from the traces of two runs.

    CUDAGYM_TIMING_TRACE=a.jsonl cudagym eval run SUB ...   # then the same with b.jsonl
    python benchmarks/fast_timing_report.py a.jsonl b.jsonl [--names problems.json] [--out-md report.md]

A traced rep (cudagym.eval.timing.Timer._time_traced) holds the strict window (what the judge uses),
the GPU time to an event right after the call (`stream`), the host's time in the call and in the
synchronisation, and the same call timed behind an unsynchronised flush (`busy`: the launch path
hidden, as triton's do_bench). Per problem and run: medians of the candidate's and eager's parts, and
speedup vs eager by the window, by busy and by span (a third call's GPU activity from CUPTI, first
record to last over every stream: no host time in it); then each speedup's relative difference between
the two runs and the median over problems (issue 12: within 3% at the median for kernels under 0.2 ms).
Traces from before span existed (2026-12-02, session 11) have none: its columns stay empty.
--names: {problem hash: name} (the hash is the first 12 hex of sha256 of the reference code).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

PARTS = ("window_ms", "stream_ms", "busy_ms", "span_ms", "active_ms", "host_call_us", "host_sync_us")
KINDS = ("window", "busy", "span")  # the ways of timing a rep whose speedups are compared


def load(path: Path) -> dict:
    """{problem: {role: {part: [values]}}} from one run's trace (eval mode only: the judge's live eager and the
    runner's candidate reps, interleaved; baseline jobs' reps are left out, and so are an eval judge's own
    reference reps, role reference_eager / compile, timed beside torch.compile's). Traces written before
    that role existed (2026-12-02) call those reps `eager`: an `eager` rep that does not follow a
    candidate rep of the same judge is one of them."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    last_role: dict = {}
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a run stopped mid-write
            continue
        if rec.get("mode") != "eval":
            continue
        judge = (rec.get("problem"), rec.get("pid"))
        previous, last_role[judge] = last_role.get(judge), rec.get("role")
        if rec.get("role") == "eager" and previous != "candidate":
            continue
        for part in PARTS:
            if isinstance(rec.get(part), (int, float)):
                out[rec["problem"]][rec["role"]][part].append(rec[part])
    return out


def summary(run: dict) -> dict:
    """{problem: medians of each role's parts, and speedups vs eager by window and by busy}."""
    rows = {}
    for problem, roles in run.items():
        if "candidate" not in roles or "eager" not in roles:
            continue
        row = {"reps": len(roles["candidate"]["window_ms"])}
        for role in ("candidate", "eager"):
            for part in PARTS:
                values = roles[role][part]
                row[f"{role}_{part}"] = statistics.median(values) if values else None
        for kind in KINDS:
            eager, cand = row[f"eager_{kind}_ms"], row[f"candidate_{kind}_ms"]
            row[f"speedup_{kind}"] = eager / cand if eager and cand else None
        rows[problem] = row
    return rows


def compare(a: dict, b: dict, fast_ms: float = 0.2) -> dict:
    """Relative differences of each speedup between runs a and b over problems both timed, the
    candidate's window under fast_ms in both."""
    common = sorted(p for p in a if p in b and max(a[p]["candidate_window_ms"], b[p]["candidate_window_ms"]) < fast_ms)
    out = {"problems": common}
    for kind in KINDS:
        timed = [p for p in common if a[p][f"speedup_{kind}"] and b[p][f"speedup_{kind}"]]
        diffs = [abs(a[p][f"speedup_{kind}"] / b[p][f"speedup_{kind}"] - 1) for p in timed]
        out[kind] = {"median_rel_diff": statistics.median(diffs) if diffs else None,
                     "max_rel_diff": max(diffs) if diffs else None, "per_problem": dict(zip(timed, diffs))}
    return out


def markdown(a: dict, b: dict, result: dict, names: dict) -> str:
    def us(v):
        return f"{v * 1e3:.1f}" if v is not None else "-"

    def x(v):
        return f"{v:.3f}" if v is not None else "-"

    lines = ["| problem | cand window a / b us | cand busy a / b us | cand span a / b us | host call us |"
             " eager window / busy / span us | speedup window a / b | speedup busy a / b | speedup span a / b |",
             "|---" * 9 + "|"]
    for p in result["problems"]:
        ra, rb = a[p], b[p]
        lines.append(f"| {names.get(p, p)} | {us(ra['candidate_window_ms'])} / {us(rb['candidate_window_ms'])}"
                     f" | {us(ra['candidate_busy_ms'])} / {us(rb['candidate_busy_ms'])}"
                     f" | {us(ra['candidate_span_ms'])} / {us(rb['candidate_span_ms'])}"
                     f" | {ra['candidate_host_call_us']:.1f}"
                     f" | {us(ra['eager_window_ms'])} / {us(ra['eager_busy_ms'])} / {us(ra['eager_span_ms'])}"
                     + "".join(f" | {x(ra[f'speedup_{k}'])} / {x(rb[f'speedup_{k}'])}" for k in KINDS) + " |")
    for kind in KINDS:
        r = result[kind]
        if r["median_rel_diff"] is not None:
            lines.append(f"\n{kind}: {len(result['problems'])} problems, median relative difference of the speedup between"
                         f" runs {r['median_rel_diff']:.4f}, max {r['max_rel_diff']:.4f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--names", type=Path, default=None)
    parser.add_argument("--fast-ms", type=float, default=0.2)
    parser.add_argument("--out-md", type=Path, default=None)
    parser.add_argument("--out-json", type=Path, default=None)
    args = parser.parse_args(argv)
    for path in (args.a, args.b):
        if not path.is_file():
            parser.exit(2, f"error: no trace at {path}\n")
    a, b = summary(load(args.a)), summary(load(args.b))
    result = compare(a, b, args.fast_ms)
    names = json.loads(args.names.read_text()) if args.names else {}
    text = markdown(a, b, result, names)
    print(text)
    if args.out_md:
        args.out_md.write_text(text + "\n")
    if args.out_json:
        args.out_json.write_text(json.dumps({"a": a, "b": b, "compare": result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
