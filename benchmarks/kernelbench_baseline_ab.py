"""Issue 16, acceptance 2: KernelBench's own baseline loop against `cudagym baseline run`, same problems.

Three steps (benchmarks/baseline_gpu.sh `ab` runs them in one device call):

  checkout MIRROR [--dest .kbsrc]
      From a KernelBench git directory (`fetch github:ScalingIntelligence/KernelBench` gives one), the
      files their timing needs at the pinned KB_COMMIT into .kbsrc/ (git-ignored, ~90 KB; carry it):
      src/kernelbench/{timing,eval,dataset}.py unchanged, LICENSE, and an __init__.py of our own (theirs
      only imports utils, which registers torch.rand_mix and needs openai/litellm/dotenv).
  theirs --kbsrc .kbsrc --out theirs.jsonl [--kb-version v0.1 --levels 1,2,3 --ids 1-5] [--device cuda:0]
      Per problem, their `kernelbench.timing.measure_ref_program_time` as scripts/generate_baseline_time.py
      calls it: eager, then torch.compile (inductor, mode "default"); cuda_event timing, 5 warm-ups, 100
      trials (+1 discarded), L2 flushed per trial, fp32 (their function's default) and torch's TF32 flags
      as they are (theirs sets none; recorded per row). One JSON line per problem, appended as it is
      timed: a stopped run keeps every problem done and a rerun does only the rest.
  compare --theirs theirs.jsonl --db cudagym.duckdb --ours-wall-s S [--precision kernelbench] [--out ab.json]
      Reads cudagym's stored baselines of the same problems and prints the table: eager ms theirs /
      ours and their relative difference (ours is a median; theirs the median of their own trials, see
      `capture_trials`, beside their mean), compile likewise, and the wall time of each whole loop with
      the speed ratio. Eager medians are compared only where both sides computed with the same
      precision flags.

Their function needs CUDA; on a CPU it reports its error and returns None, which the row records
(tests/test_kernelbench_baseline_ab.py runs that path and the comparison on CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KB_REPO = "ScalingIntelligence/KernelBench"
KB_COMMIT = "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"  # main on 2026-12-03: timing.measure_ref_program_time
KB_FILES = ("src/kernelbench/timing.py", "src/kernelbench/eval.py", "src/kernelbench/dataset.py", "LICENSE")
KB_INIT = ('"""KernelBench at {commit}: only the files its reference timing needs (see\n'
           'benchmarks/kernelbench_baseline_ab.py). Their own __init__ imports utils (torch.rand_mix, LLM clients),\n'
           'which the timing does not use."""\n')
WITHIN = 0.03  # the acceptance: eager medians within 3% where the precision settings match


# --- checkout -----------------------------------------------------------------------------------

def checkout(mirror: str, dest: Path, commit: str = KB_COMMIT) -> int:
    """Write the pinned files from the git directory `mirror` into dest; returns their total bytes."""
    total = 0
    for path in KB_FILES:
        data = subprocess.run(["git", "--git-dir", mirror, "show", f"{commit}:{path}"], check=True,
                              capture_output=True).stdout
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes(data)
        total += len(data)
    init = dest / "src" / "kernelbench" / "__init__.py"
    init.write_text(KB_INIT.format(commit=commit))
    (dest / "COMMIT").write_text(f"{KB_REPO} {commit}\n")
    return total + init.stat().st_size


# --- theirs -------------------------------------------------------------------------------------

def import_kernelbench(kbsrc: Path) -> tuple[types.ModuleType, list[str]]:
    """Their timing module from the carried checkout, and the third-party imports stood in for.
    eval.py imports requests (unused) and pydantic (a result class the timing does not use) at the
    top; a box with torch only may lack them, so an empty stand-in replaces what is missing."""
    commit = (kbsrc / "COMMIT").read_text().split()[-1]
    if commit != KB_COMMIT:
        raise SystemExit(f"{kbsrc} holds KernelBench {commit}, not the pinned {KB_COMMIT}: run `checkout` again")
    stood_in = []
    for name in ("requests", "pydantic"):
        try:
            __import__(name)
        except ImportError:
            stand_in = types.ModuleType(name)
            stand_in.BaseModel = type("BaseModel", (), {})
            sys.modules[name] = stand_in
            stood_in.append(name)
    sys.path.insert(0, str(kbsrc / "src"))
    from kernelbench import timing

    return timing, stood_in


def capture_trials(timing: types.ModuleType) -> list:
    """Their stats are mean/std/min/max of the trials; cudagym stores medians. Their loop calls the
    module's get_timing_stats with the raw trials, so we wrap it to keep them (then call theirs):
    their loop itself runs unchanged. Returns the list each call's trials are appended to."""
    seen: list[list[float]] = []
    original = timing.get_timing_stats

    def get_timing_stats(elapsed_times, device=None):
        seen.append(list(elapsed_times))
        return original(elapsed_times, device=device)

    timing.get_timing_stats = get_timing_stats
    return seen


def precision_flags() -> dict:
    """torch's fp32 settings in this process now (what TF32 each side computed with)."""
    import torch

    return {"matmul_tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def time_one(timing, seen: list, task, device: str, precision: str, compile_: bool) -> dict:
    """One problem through their function: eager, then (compile_) inductor default, as their script."""
    row = {"id": task.id, "level": task.level, "problem_id": task.problem_id, "name": task.name,
           "sha256": task.sha256, "precision": precision, "flags": precision_flags()}
    modes = [("eager", {"use_torch_compile": False})]
    if compile_:
        modes.append(("compile", {"use_torch_compile": True, "torch_compile_backend": "inductor",
                                  "torch_compile_options": "default"}))
    for mode, options in modes:
        printed = io.StringIO()
        n = len(seen)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(printed):  # their per-call prints; kept only on failure
            stats = timing.measure_ref_program_time(task.name, task.code, device=device, verbose=False,
                                                    precision=precision, **options)
        row[f"{mode}_wall_s"] = round(time.perf_counter() - t0, 3)
        if stats is None:
            row[f"{mode}_error"] = printed.getvalue()[-400:]
        else:
            row[mode] = dict(stats, median=statistics.median(seen[-1]) if len(seen) > n else None)
    return row


def done_ids(out: Path) -> set[str]:
    if not out.exists():
        return set()
    return {row["id"] for line in out.read_text().splitlines() if line.strip()
            for row in [json.loads(line)] if "id" in row}


def across_levels(tasks: list) -> list:
    """Problem by problem across the levels (L1/1, L2/1, L3/1, L1/2, ...): a loop stopped at its deadline
    has done a like share of each level, so its seconds per problem stand for the whole selection."""
    return sorted(tasks, key=lambda t: (t.problem_id, t.level))


def cmd_theirs(args) -> int:
    t0 = time.perf_counter()
    tasks = select_tasks(args)
    out = Path(args.out)
    todo = across_levels([t for t in tasks if t.id not in done_ids(out)])
    timing, stood_in = import_kernelbench(Path(args.kbsrc))
    seen = capture_trials(timing)
    import torch

    meta = {"meta": {"kb_commit": KB_COMMIT, "device": args.device, "precision": args.precision,
                     "compile": not args.no_compile, "torch": torch.__version__.split("+")[0],
                     "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
                     "stood_in": stood_in, "selected": len(tasks), "todo": len(todo)}}
    with out.open("a") as f:
        meta["meta"]["setup_s"] = round(time.perf_counter() - t0, 3)  # imports: part of their loop's wall
        f.write(json.dumps(meta) + "\n")
        f.flush()
        for i, task in enumerate(todo):
            if args.deadline_s is not None and time.perf_counter() - t0 > args.deadline_s:
                print(f"theirs: deadline after {i}/{len(todo)}", file=sys.stderr)
                return 3
            row = time_one(timing, seen, task, args.device, args.precision, not args.no_compile)
            f.write(json.dumps(row) + "\n")
            f.flush()  # each problem is kept the moment it is timed
            eager = (row.get("eager") or {}).get("median")
            print(f"theirs: {i + 1}/{len(todo)} {task.id} eager {eager} ms, {row['eager_wall_s']}"
                  f"+{row.get('compile_wall_s', 0)} s", file=sys.stderr, flush=True)
    return 0


# --- compare ------------------------------------------------------------------------------------

def read_theirs(path: Path) -> tuple[list[dict], list[dict]]:
    """(meta lines, problem rows: the latest row per problem)."""
    metas, rows = [], {}
    for line in path.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            if "meta" in item:
                metas.append(item["meta"])
            else:
                rows[item["id"]] = item
    return metas, list(rows.values())


def ours_flags(precision: str) -> dict:
    """The flags a cudagym judge computes with at `precision`: its own setter, applied here, read back."""
    from cudagym.eval.runner import set_fp32_precision

    set_fp32_precision(precision)
    return precision_flags()


def rel(theirs: float | None, ours: float | None) -> float | None:
    return None if not theirs or not ours else round(ours / theirs - 1, 4)


def compare(theirs_path: Path, db: Path, ours_wall_s: float, precision: str, timing_mode: str = "strict") -> dict:
    """The side-by-side from their rows and cudagym's store (the same problems, by code hash)."""
    from cudagym.eval.batch import PRECISION_DTYPES, baseline_method
    from cudagym.eval.store import Store

    metas, rows = read_theirs(theirs_path)
    gpu = metas[-1]["gpu"] if metas else None
    flags = ours_flags(precision)
    with Store(db) as store:
        stored = store.sql("SELECT problem_sha256, gpu, t_eager_ms, t_compile_ms FROM baselines"
                           " WHERE dtype = ? AND timing_mode = ?",  # on the H200 its column says strict-queued
                           [PRECISION_DTYPES[precision], baseline_method(timing_mode, gpu or "cpu")])
    ours = {sha: (eager, comp) for sha, g, eager, comp in stored if gpu is None or g == gpu}
    table = []
    for row in sorted(rows, key=lambda r: (r["level"] or 0, r["problem_id"] or 0)):
        eager, comp = ours.get(row["sha256"], (None, None))
        same = row["precision"] == "fp32" and row["flags"] == flags
        t_eager = (row.get("eager") or {}).get("median")
        d_eager = rel(t_eager, eager)
        table.append({"id": row["id"], "name": row["name"], "theirs_eager_ms": t_eager,
                      "theirs_eager_mean_ms": (row.get("eager") or {}).get("mean"), "ours_eager_ms": eager,
                      "eager_rel": d_eager, "precision_match": same,
                      "eager_within": None if d_eager is None or not same else abs(d_eager) <= WITHIN,
                      "theirs_compile_ms": (row.get("compile") or {}).get("median"), "ours_compile_ms": comp,
                      "compile_rel": rel((row.get("compile") or {}).get("median"), comp),
                      "theirs_wall_s": row.get("eager_wall_s", 0) + row.get("compile_wall_s", 0)})
    n_ours = sum(1 for r in table if r["ours_eager_ms"] is not None)
    theirs_wall = sum(m.get("setup_s", 0) for m in metas) + sum(r["theirs_wall_s"] for r in table)
    selected = metas[0]["selected"] if metas else len(table)
    complete = len(table) == selected
    # A stopped loop of theirs did fewer problems: compare seconds per problem then, and say so.
    ratio = (theirs_wall / ours_wall_s if complete else
             (theirs_wall / max(len(table), 1)) / (ours_wall_s / selected)) if ours_wall_s else None
    compared = [r for r in table if r["eager_within"] is not None]
    return {"kb_commit": KB_COMMIT, "gpu": gpu, "problems": selected, "theirs_done": len(table), "ours_stored": n_ours,
            "precision": {"theirs": sorted({r["precision"] for r in rows}), "theirs_flags": rows[0]["flags"] if rows else None,
                          "ours": precision, "ours_flags": flags},
            "wall_s": {"theirs": round(theirs_wall, 1), "ours": round(ours_wall_s, 1)},
            "speed_ratio": round(ratio, 2) if ratio else None, "theirs_complete": complete,
            "eager_compared": len(compared), "eager_within_3pct": sum(r["eager_within"] for r in compared),
            "eager_rel_median": round(statistics.median(r["eager_rel"] for r in compared), 4) if compared else None,
            "rows": table}


def render(result: dict) -> str:
    def ms(v):
        return "-" if v is None else f"{v:.4g}"

    def pct(v):
        return "-" if v is None else f"{v * 100:+.1f}%"

    lines = [f"{'id':<14} {'eager theirs':>12} {'ours':>9} {'diff':>7} {'ok':>3}  {'compile theirs':>14} {'ours':>9} {'diff':>7}"]
    for r in result["rows"]:
        ok = "-" if r["eager_within"] is None else "yes" if r["eager_within"] else "NO"
        lines.append(f"{r['id']:<14} {ms(r['theirs_eager_ms']):>12} {ms(r['ours_eager_ms']):>9} {pct(r['eager_rel']):>7}"
                     f" {ok:>3}  {ms(r['theirs_compile_ms']):>14} {ms(r['ours_compile_ms']):>9} {pct(r['compile_rel']):>7}")
    w = result["wall_s"]
    lines.append(f"wall: theirs {w['theirs']} s ({result['theirs_done']}/{result['problems']} problems), ours {w['ours']} s"
                 f" ({result['ours_stored']} stored): {result['speed_ratio']}x"
                 f"{'' if result['theirs_complete'] else ' (per problem: theirs stopped early)'}")
    lines.append(f"eager within 3%: {result['eager_within_3pct']}/{result['eager_compared']} compared"
                 f" (median diff {pct(result['eager_rel_median'])}); precision theirs {result['precision']['theirs']}"
                 f" {result['precision']['theirs_flags']}, ours {result['precision']['ours']} {result['precision']['ours_flags']}")
    return "\n".join(lines)


def cmd_compare(args) -> int:
    result = compare(Path(args.theirs), Path(args.db), args.ours_wall_s, args.precision, args.timing_mode)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(render(result))
    return 0


# --- cli ----------------------------------------------------------------------------------------

def select_tasks(args) -> list:
    """The problems, chosen as `cudagym baseline run` chooses them (its own selection options)."""
    from cudagym.cli import _tasks

    args.levels_given = args.levels is not None
    args.levels = args.levels or [1, 2, 3]
    args.kb_version = args.kb_version or "v0.1"
    return _tasks(args)


def main(argv: list[str] | None = None) -> int:
    from cudagym.cli import _add_selection

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    co = sub.add_parser("checkout", help="the pinned KernelBench files from a git directory")
    co.add_argument("mirror")
    co.add_argument("--dest", default=str(REPO / ".kbsrc"))
    th = sub.add_parser("theirs", help="KernelBench's baseline loop on the selected problems")
    _add_selection(th)
    th.add_argument("--kbsrc", default=str(REPO / ".kbsrc"))
    th.add_argument("--out", required=True, help="JSON lines, appended (resumable)")
    th.add_argument("--device", default="cuda:0")
    th.add_argument("--precision", default="fp32", help="theirs: fp32 (their default), bf16 or fp16")
    th.add_argument("--no-compile", action="store_true", help="eager only")
    th.add_argument("--deadline-s", type=float, default=None, help="start no problem after this many seconds")
    cm = sub.add_parser("compare", help="their rows against cudagym's stored baselines")
    cm.add_argument("--theirs", required=True)
    cm.add_argument("--db", required=True)
    cm.add_argument("--ours-wall-s", type=float, required=True, help="wall time of the `cudagym baseline run`")
    cm.add_argument("--precision", default="kernelbench", help="the cudagym run's --precision")
    cm.add_argument("--timing-mode", default="strict", help="the cudagym run's --timing-mode")
    cm.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.cmd == "checkout":
        size = checkout(args.mirror, Path(args.dest))
        print(f"{args.dest}: KernelBench {KB_COMMIT[:10]}, {len(KB_FILES) + 1} files, {size / 1e3:.0f} KB")
        return 0
    return cmd_theirs(args) if args.cmd == "theirs" else cmd_compare(args)


if __name__ == "__main__":
    sys.exit(main())
