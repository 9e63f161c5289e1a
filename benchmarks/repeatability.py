"""Repeatability of speedups between two eval runs of the same submission, from a cudagym DuckDB.

    python benchmarks/repeatability.py out/gpu.duckdb [--a reference-a] [--b reference-b] [--db-b other.duckdb]

--db-b reads run b from another store (two runs made side by side, one per GPU, each writing its
own DuckDB file, since a DuckDB file has one writer).

Prints, per run, how many problems passed and its wall time (first to last stored verdict), and
for problems that passed in both, the median and max relative difference of speedup_vs_eager and
speedup_vs_compile. Baseline count and time span too. Then, per run, every problem that did not
pass (status, flags, reason) and the median seconds a judge spent in each phase (load, waiting for
memory, checks, timing), the problems whose live eager time strayed more than 25% from the cached
baseline's, and whether the two runs agree on every problem's status and milestone reward.
With --by-measure, also per problem the speedup vs eager by the medians of the reps' parts (strict on
CUDA records, per verdict, the median call time and whole window of the candidate's and the live
eager's reps, and the share of reps whose host path outlasted the spin: judge.method_summary), and
the median difference between the runs.
"""

import argparse
import contextlib
import statistics

from cudagym.eval.store import Store

STRAY = 0.25  # a live eager time this far from the cached one is reported


def relative_differences(a: dict, b: dict, field: str) -> list[float]:
    common = [k for k in a if k in b and a[k].get(field) and b[k].get(field)]
    return [abs(a[k][field] / b[k][field] - 1) for k in common]


MEASURES = ("call", "host")  # host: the host's time to enqueue the call, what the old window mostly measured


def measure_speedups(v: dict) -> dict[str, float]:
    """Speedup vs the live eager by each measure the verdict's reps recorded."""
    timing = v.get("timing") or {}
    out = {}
    for m in MEASURES:
        mine, eager = timing.get(f"{m}_median_ms"), timing.get(f"eager_{m}_median_ms")
        if mine and eager:
            out[m] = eager / mine
    return out


def by_measure(a: dict, b: dict) -> None:
    """Per problem passed in both runs: each measure's speedup in run a and b; then the median difference."""
    diffs: dict[str, list[float]] = {m: [] for m in MEASURES}
    print("problem | " + " | ".join(f"{m} a / b" for m in MEASURES) + " | reward a / b | exposed reps a / b")
    for k in sorted(set(a) & set(b)):
        sa, sb = measure_speedups(a[k]), measure_speedups(b[k])
        cells = []
        for m in MEASURES:
            if m in sa and m in sb:
                diffs[m].append(abs(sa[m] / sb[m] - 1))
                cells.append(f"{sa[m]:.3f} / {sb[m]:.3f}")
            else:
                cells.append("-")
        exposed = [(v[k].get("timing") or {}).get("exposed_fraction") for v in (a, b)]
        print(f"L{k[0]}/{k[1]} {a[k].get('name', '')[:28]} | " + " | ".join(cells)
              + f" | {a[k].get('reward')} / {b[k].get('reward')} | exposed {exposed[0]} / {exposed[1]}")
    for m, d in diffs.items():
        if d:
            print(f"speedup_vs_eager by {m}: n={len(d)} median rel. diff {statistics.median(d):.4f} max {max(d):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("--a", default="reference-a")
    parser.add_argument("--b", default="reference-b")
    parser.add_argument("--db-b", default=None)
    parser.add_argument("--by-measure", action="store_true")
    args = parser.parse_args()
    with Store(args.db) as store, contextlib.ExitStack() as stack:
        store_b = stack.enter_context(Store(args.db_b)) if args.db_b else store
        runs = {}
        for name, source in ((args.a, store), (args.b, store_b)):
            verdicts = source.verdicts(name)
            runs[name] = {(v["level"], v["problem_id"]): v for v in verdicts if v["status"] == "pass"}
            print(f"{name}: {len(runs[name])} of {len(verdicts)} passed")
        for field in ("speedup_vs_eager", "speedup_vs_compile"):
            diffs = relative_differences(runs[args.a], runs[args.b], field)
            if diffs:
                print(f"{field}: n={len(diffs)} median rel. diff {statistics.median(diffs):.4f} max {max(diffs):.4f}")
        if args.by_measure:
            by_measure(runs[args.a], runs[args.b])
        rewards = [k for k in set(runs[args.a]) & set(runs[args.b]) if runs[args.a][k].get("reward") != runs[args.b][k].get("reward")]
        print(f"rewards agree on {len(set(runs[args.a]) & set(runs[args.b])) - len(rewards)} of "
              f"{len(set(runs[args.a]) & set(runs[args.b]))} problems passed in both" + (f"; differ on {sorted(rewards)}" if rewards else ""))
        for name, source in ((args.a, store), (args.b, store_b)):
            first, last = source.sql("select min(created), max(created) from verdicts where submission = ?", [name])[0]
            if first:
                print(f"{name}: verdicts stored from {first} to {last} ({(last - first).total_seconds():.0f} s)")
        n, first, last = store.sql("select count(*), min(created), max(created) from baselines")[0]
        if n:
            print(f"baselines: {n}, stored from {first} to {last} ({(last - first).total_seconds():.0f} s)")
        statuses = {}
        for name, source in ((args.a, store), (args.b, store_b)):
            verdicts = source.verdicts(name)
            statuses[name] = {(v["level"], v["problem_id"]): v["status"] for v in verdicts}
            phases: dict[str, list[float]] = {}
            for v in verdicts:
                for phase, seconds in (v.get("timing") or {}).get("info", {}).get("phase_s", {}).items():
                    phases.setdefault(phase, []).append(seconds)
            if phases:
                print(f"{name} judge phases, median s: " + ", ".join(f"{k} {statistics.median(x):.2f}" for k, x in phases.items()))
            for v in sorted(verdicts, key=lambda v: (v["level"], v["problem_id"])):
                if v["status"] != "pass":
                    print(f"  {name} L{v['level']}/{v['problem_id']} {v.get('name', '')}: {v['status']}"
                          f" {v.get('flags') or ''} {str(v.get('reason', ''))[:200]}")
                stray = (v.get("timing") or {}).get("eager_vs_baseline")
                if stray and abs(stray - 1) > STRAY:
                    print(f"  {name} L{v['level']}/{v['problem_id']} {v.get('name', '')}: live eager time "
                          f"{stray:.2f}x the cached baseline's (speedup_vs_compile off by as much)")
        both = set(statuses[args.a]) & set(statuses[args.b])
        differ = sorted(k for k in both if statuses[args.a][k] != statuses[args.b][k])
        print(f"statuses agree on {len(both) - len(differ)} of {len(both)} problems in both runs"
              + (f"; differ on {differ}" if differ else ""))


if __name__ == "__main__":
    main()
