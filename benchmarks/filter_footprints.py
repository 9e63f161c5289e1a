"""What the GPU memory budget charges the dataset filter's judges, against what they keep, on any machine.

A judge is admitted to the GPU only once its share of the memory budget (`judge.footprint_bytes`) fits 85%
of the card beside the shares already in (`gpulock.memory_reservation`). For a build's candidates (its
build.duckdb, `--since-round` on), on meta tensors (no GPU, no memory): each one's share in the check pass
(what its eager forward allocates, `judge.filter_footprint_bytes`, and, beside it, an evaluation's 14x the
inputs and 4x the weights plus 2 GiB of contexts, which the filter's checks were charged before session 29)
and as a probe, how many judges of the median share fit the budget at once, the tasks a round holds over
half of it (each of which, having waited `gpulock.FAIR_AFTER_S`, lets nobody after it in until it fits),
what a check judge keeps alive itself (two input sets, four output sets, the weights: `_check_task`), and,
where the build ran on a GPU, the most each task's judge allocated there (`peak_gib`) against its share.

    python benchmarks/filter_footprints.py BUILD/build.duckdb [--since-round R] [--gpu-mib 81559]

Session 28 (the H100's 81,559 MiB, rounds 14-18 of the 1,031-row build): checks charged a median 11.6 GiB
at an evaluation's factors (five judges of sixteen at once), 6.8 GiB from their forwards (nine), and kept
alive a median 2.3 GiB. Session 29 (rounds 19-21, run on the H100): the peaks measured there were a median
4.8 GiB, and 5 of 94 above their share less the context. benchmarks/NOTES.md has the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import duckdb  # noqa: E402
import torch  # noqa: E402

from cudagym.eval.judge import FILTER_CONTEXT_BYTES, footprint_bytes, load_reference, make_inputs, nbytes  # noqa: E402

GIB = 2**30


def measure(code: str) -> dict | None:
    """One candidate's shares (check, probe) and what a check judge keeps alive, in bytes; None if it does not load."""
    try:
        ref = load_reference(code)
        init = list(ref.get_init_inputs())
        with torch.device("meta"), torch.no_grad():
            model = ref.Model(*init)
            inputs = make_inputs(ref, 0, "meta")
            out = model(*inputs)
    except Exception:
        return None
    weights, in_bytes = nbytes(list(model.parameters())), nbytes(inputs)
    out_bytes = nbytes(list(out) if isinstance(out, (list, tuple)) else [out])
    return {"check": footprint_bytes(ref, init, "filter-check"), "probe": footprint_bytes(ref, init, "filter-probe"),
            "check_factors": footprint_bytes(ref, init, "eval"),  # what checks were charged before session 29
            "kept": 2 * in_bytes + 4 * out_bytes + weights, "out_per_in": out_bytes / in_bytes if in_bytes else None}


def quantiles(values: list[float]) -> str:
    v = sorted(values)
    q = lambda p: v[int(p * (len(v) - 1))]  # noqa: E731
    return f"median {q(.5):.1f}, quartiles {q(.25):.1f} and {q(.75):.1f}, p90 {q(.9):.1f}, max {v[-1]:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db", help="a build's build.duckdb")
    parser.add_argument("--since-round", type=int, default=0, help="candidates of this round on (default: all)")
    parser.add_argument("--gpu-mib", type=float, default=81559.0, help="the card's memory (default: an H100's)")
    parser.add_argument("--judges", type=int, default=16, help="judges at once (default 16)")
    args = parser.parse_args(argv)
    if not os.path.exists(args.db):
        print(f"filter_footprints: no such build store: {args.db}", file=sys.stderr)
        return 1
    db = duckdb.connect(args.db, read_only=True)
    try:
        rows = db.execute("SELECT c.round, c.code, f.phases FROM filtered f JOIN candidates c ON c.sha256 = f.sha256 "
                          "WHERE c.round >= ? ORDER BY c.round", [args.since_round]).fetchall()
    finally:
        db.close()
    budget = 0.85 * args.gpu_mib * 2**20  # judge.memory_budget_bytes
    by_round: dict[int, list[dict]] = defaultdict(list)
    for round_, code, phases in rows:
        found = measure(code)
        if found:
            # what its judge's allocator held at most on the GPU, where the build ran there (judge.task_memory)
            found["peak"] = (json.loads(phases) if phases else {}).get("peak_gib")
            by_round[round_].append(found)
    found = [m for ms in by_round.values() for m in ms]
    if not found:
        print("filter_footprints: no filtered candidate loads", file=sys.stderr)
        return 1
    median_check = statistics.median(m["check"] for m in found)
    print(f"{len(found)} filtered candidates, rounds {min(by_round)}-{max(by_round)}; budget {budget / GIB:.0f} GiB")
    print(f"check share GiB: {quantiles([m['check'] / GIB for m in found])}; "
          f"judges at once at the median: {int(budget // median_check)} of {args.judges}")
    print(f"check share GiB at an evaluation's factors (before session 29): "
          f"{quantiles([m['check_factors'] / GIB for m in found])}; judges at once at the median: "
          f"{int(budget // statistics.median(m['check_factors'] for m in found))} of {args.judges}")
    print(f"probe share GiB: {quantiles([m['probe'] / GIB for m in found])}; "
          f"judges at once at the median: {int(budget // statistics.median(m['probe'] for m in found))} of {args.judges}")
    print(f"a check judge keeps (2 input sets, 4 output sets, weights) GiB: {quantiles([m['kept'] / GIB for m in found])}")
    peaks = [m for m in found if isinstance(m["peak"], (int, float)) and m["peak"] > 0]
    if peaks:  # the share counts FILTER_CONTEXT_BYTES for the context, which the allocator's peak leaves out
        over = [m for m in peaks if m["peak"] * GIB > m["check"] - FILTER_CONTEXT_BYTES]
        print(f"measured on the GPU, {len(peaks)} tasks: peak GiB {quantiles([m['peak'] for m in peaks])}; "
              f"check share less contexts over peak: {quantiles([(m['check'] - FILTER_CONTEXT_BYTES) / GIB / m['peak'] for m in peaks])}; "
              f"peak above it: {len(over)}")
    ratios = [m["out_per_in"] for m in found if m["out_per_in"] is not None]
    print(f"outputs per input byte: {quantiles(ratios)}")
    for round_, ms in sorted(by_round.items()):
        shares = [m["check"] for m in ms]
        print(f"round {round_}: {len(ms)} tasks, check shares sum {sum(shares) / GIB:.0f} GiB, "
              f"over half the budget {sum(s > budget / 2 for s in shares)}, over a quarter {sum(s > budget / 4 for s in shares)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
