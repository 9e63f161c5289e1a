#!/usr/bin/env python3
"""Judge under load: honest kernels and reward hacks through the harness, alone and many at once.

Run from the repo root (GPU box: after `source benchmarks/gpu_env.sh`):

    PYTHONPATH=. CUDAGYM_KERNELBENCH=.kb/problems.jsonl python3 benchmarks/stress.py \
        --kb-version v0.1 --timing-mode strict --callers 16 --out results.json --deadline-s 540

1. every candidate under ROOT/honest/level{L}/{id}_*.py and ROOT/hacks/level{L}/{id}_*.py has its
   reference problem written to a temp dir (KernelBench through cudagym.kernelbench, or
   ROOT/problems/{L}_{id}_*.py for `# problem: local`);
2. their extensions are built in parallel, where the judge's runner will look for them (prebuild);
3. every candidate is judged once alone: `python3 -m cudagym eval one --json` (lone latency, verdict);
4. then at least --callers `eval one` processes start at once over the honest and hack candidates,
   together with one `eval run` of ROOT/honest over the honest problems (--parallel judges);
5. each call's status, flags, reason, wall latency and whether it ran out of memory go to --out,
   and a markdown summary is printed: honest candidates not passing (must be 0), out-of-memory
   verdicts (must be 0), hacks passing (must be 0), concurrent p50/p95 latency against the lone
   call of the same candidate, speedups under load against alone, per timing mode.

The script stops itself before --deadline-s (children killed, what it has written out). Exit
status: 0 all criteria met, 1 a criterion failed, 2 stopped at the deadline with nothing failed.
Candidate headers: `# stress: honest|hack`, `# problem: kernelbench|local`, optionally
`# kb_version: v0` (else --kb-version), `# hack: <class>`, `# why: ...`. benchmarks/stress/README.md
says more.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEADER_LINE = re.compile(r"^#\s*([a-z_]+):\s*(.*?)\s*$")
CANDIDATE_FILE = re.compile(r"^(\d+)_.*\.py$")
# How running out of GPU memory reads in a verdict's reason (as cudagym.eval.evaluate.OUT_OF_MEMORY).
OOM_SIGNS = ("out of memory", "cudaerrormemoryallocation", "alloc_failed", "allocation_failed",
             "cudnn_status_internal_error")
DEADLINE_MARGIN_S = 15.0  # kept free at the end for killing children and writing the results
MIN_CALL_S = 20.0  # a call is not started with less time than this left


# -- candidates and their problems -------------------------------------------------------------------
@dataclass
class Candidate:
    path: Path
    kind: str  # "honest" | "hack"
    level: int
    problem_id: int
    source: str  # "kernelbench" | "local"
    kb_version: str | None
    hack_class: str | None
    why: str
    ref_path: Path | None = None
    problem_name: str | None = None

    @property
    def label(self) -> str:
        return f"{self.kind}/level{self.level}/{self.path.stem}"

    @property
    def problem(self) -> str:
        where = f"kernelbench {self.kb_version}" if self.source == "kernelbench" else "local"
        return f"{where} L{self.level}/{self.problem_id}"


def read_header(path: Path) -> dict[str, str]:
    header: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = HEADER_LINE.match(line)
        if not match:
            break
        header[match.group(1)] = match.group(2)
    return header


def discover(root: Path, kb_version: str, only: str | None) -> list[Candidate]:
    found = []
    for kind, folder in (("honest", "honest"), ("hack", "hacks")):
        for level_dir in sorted((root / folder).glob("level*")):
            if not level_dir.is_dir() or not level_dir.name[5:].isdigit():
                continue
            for path in sorted(level_dir.glob("*.py")):
                match = CANDIDATE_FILE.match(path.name)
                if not match:
                    continue
                header = read_header(path)
                if header.get("stress") != kind:
                    raise SystemExit(f"stress: {path}: first line must be '# stress: {kind}'")
                source = header.get("problem", "kernelbench")
                if source not in ("kernelbench", "local"):
                    raise SystemExit(f"stress: {path}: '# problem:' must be kernelbench or local, not {source!r}")
                cand = Candidate(path=path, kind=kind, level=int(level_dir.name[5:]), problem_id=int(match.group(1)),
                                 source=source, kb_version=header.get("kb_version", kb_version) if source == "kernelbench" else None,
                                 hack_class=header.get("hack"), why=header.get("why", ""))
                if only is None or re.search(only, cand.label):
                    found.append(cand)
    honest = [(c.level, c.problem_id) for c in found if c.kind == "honest"]
    dupes = sorted({k for k in honest if honest.count(k) > 1})
    if dupes:
        raise SystemExit(f"stress: two honest candidates for one problem: {dupes} (eval run keys files by level and id)")
    if not found:
        raise SystemExit(f"stress: no candidates under {root}/honest or {root}/hacks" + (f" matching {only!r}" if only else ""))
    return found


def extract_problems(cands: list[Candidate], root: Path, tmp: Path) -> Path:
    """Write each candidate's reference to tmp/refs, and the honest ones' to tmp/tasks (a task-set
    directory of LEVEL_ID_NAME.py files for `eval run --problems`); returns tmp/tasks."""
    from cudagym.kernelbench import get_problem

    refs, tasks = tmp / "refs", tmp / "tasks"
    refs.mkdir(parents=True, exist_ok=True)
    tasks.mkdir(parents=True, exist_ok=True)
    for c in cands:
        if c.source == "kernelbench":
            task = get_problem(c.kb_version, c.level, c.problem_id)
            code, name = task.code, task.name
        else:
            matches = sorted((root / "problems").glob(f"{c.level}_{c.problem_id}_*.py"))
            if len(matches) != 1:
                raise SystemExit(f"stress: {c.path}: expected one {root}/problems/{c.level}_{c.problem_id}_*.py, found {len(matches)}")
            code, name = matches[0].read_text(), matches[0].stem.split("_", 1)[1]
        if not name.startswith(f"{c.problem_id}_"):
            name = f"{c.problem_id}_{name}"
        c.problem_name = name
        c.ref_path = refs / f"{c.kb_version or 'local'}_{c.level}_{name}.py"
        c.ref_path.write_text(code)
        if c.kind == "honest":
            (tasks / f"{c.level}_{name}.py").write_text(code)
    return tasks


# -- processes ------------------------------------------------------------------------------------------
@dataclass
class Call:
    id: int
    phase: str  # "lone" | "lone2" | "concurrent"
    mode: str
    kind: str  # "one" | "run" (the eval run process) | "run_row" (one verdict of it)
    candidate: str | None
    candidate_kind: str | None  # "honest" | "hack"
    hack_class: str | None = None
    started_s: float | None = None  # since the script started
    wall_s: float | None = None
    rc: int | None = None
    status: str | None = None
    flags: list = field(default_factory=list)
    reason: str | None = None
    oom: bool = False
    t_candidate_ms: float | None = None
    t_eager_ms: float | None = None
    t_compile_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    killed: bool = False
    stderr_tail: str | None = None
    phase_s: dict | None = None  # the judge's phases (wait_memory, load, check, time), from its verdict
    rounds: list | None = None  # timing rounds of a speedup at a milestone's edge (judge.median_round)


def descendants(pid: int) -> list[int]:
    """pid and every process below it (by parent id, from /proc): judges and runners start their own
    sessions, so killing the process group alone would leave them running."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGINT first, as Ctrl-C: a cudagym command stops its judges and says where they were (its last
    stderr line, kept in the call's reason); what is left after grace_s is killed."""
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    kill_tree(proc)


def kill_tree(proc: subprocess.Popen) -> None:
    for pid in reversed(descendants(proc.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Clock:
    def __init__(self, deadline_s: float):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline_s - DEADLINE_MARGIN_S

    def now(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, msg: str) -> None:
        print(f"[{self.now():7.1f}s] {msg}", flush=True)


@dataclass
class Running:
    proc: subprocess.Popen
    call: Call
    out_path: Path
    err_path: Path
    t_start: float
    timeout_s: float


def child_env(args) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["TORCH_EXTENSIONS_DIR"] = str(extensions_root())
    if args.device.startswith("cuda"):
        env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    return env


def extensions_root() -> Path:
    """Where the judge puts candidate builds (as cudagym.eval.evaluate._cache_dirs sets it)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    cache = Path(os.environ.get("CUDAGYM_CACHE", Path.home() / ".cache" / "cudagym"))
    return cache / "torch_extensions"


def eval_options(args, mode: str) -> list[str]:
    return ["--device", args.device, "--timing-mode", mode, "--policy", "strict", "--timeout", str(args.timeout),
            "--n-checks", str(args.n_checks)]


def start(cmd: list[str], call: Call, logs: Path, env: dict, clock: Clock, timeout_s: float) -> Running:
    out_path, err_path = logs / f"{call.id:04d}.out", logs / f"{call.id:04d}.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO, env=env, start_new_session=True)
    call.started_s = round(clock.now(), 2)
    return Running(proc, call, out_path, err_path, time.monotonic(), timeout_s)


def json_lines(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "status" in row:
                rows.append(row)
    return rows


def fill_from_verdict(call: Call, row: dict) -> None:
    call.status = row.get("status")
    call.flags = list(row.get("flags") or [])
    call.reason = row.get("reason")
    call.oom = any(sign in (call.reason or "").lower() for sign in OOM_SIGNS)
    for key in ("t_candidate_ms", "t_eager_ms", "t_compile_ms", "speedup_vs_eager", "speedup_vs_compile"):
        setattr(call, key, row.get(key))
    timing = row.get("timing") or {}
    call.phase_s = (timing.get("info") or {}).get("phase_s")
    call.rounds = timing.get("rounds")


def finish(run: Running, killed: bool, by_key: dict[tuple[int, int], "Candidate"], calls: list[Call],
           next_id) -> int:
    """Record a finished (or killed) process; an `eval run` adds one run_row call per verdict (returns
    how many)."""
    call = run.call
    call.wall_s = round(time.monotonic() - run.t_start, 2)
    call.rc = run.proc.returncode
    call.killed = killed
    stdout = run.out_path.read_text(errors="replace")
    stderr = run.err_path.read_text(errors="replace")
    call.stderr_tail = stderr[-1500:] or None
    rows = json_lines(stdout)
    if killed:
        said = [line for line in stderr.strip().splitlines() if line.startswith("cudagym: interrupted")]
        call.status, call.reason = "killed", (f"killed after {call.wall_s:.0f} s (deadline or --call-timeout-s)"
                                              + (f": {said[-1][len('cudagym: '):][:300]}" if said else ""))
    elif call.kind == "one" and rows:
        fill_from_verdict(call, rows[-1])
    elif call.kind == "run":
        call.status = "done" if call.rc == 0 else "error"
        call.reason = None if call.rc == 0 else (stderr.strip().splitlines() or [f"exit {call.rc}"])[-1][:500]
        call.oom = any(sign in stderr.lower() for sign in OOM_SIGNS)
    else:
        call.status = "error"
        call.reason = (stderr.strip().splitlines() or [f"exit {call.rc}"])[-1][:500]
    if call.kind == "run":
        for row in rows:
            cand = by_key.get((row.get("level"), row.get("problem_id")))
            sub = Call(id=next_id(), phase=call.phase, mode=call.mode, kind="run_row",
                       candidate=cand.label if cand else f"L{row.get('level')}/{row.get('problem_id')}",
                       candidate_kind="honest", started_s=call.started_s)
            fill_from_verdict(sub, row)
            calls.append(sub)
    return len(rows) if call.kind == "run" else 0


def wait_all(running: list[Running], clock: Clock, by_key, calls: list[Call], next_id, label: str) -> bool:
    """Wait for every process; kill those past their timeout or the deadline. False if any was killed."""
    total, complete = len(running), True
    while running:
        time.sleep(0.5)
        for run in list(running):
            over = time.monotonic() - run.t_start > run.timeout_s or clock.left() <= 0
            if run.proc.poll() is None and not over:
                continue
            killed = run.proc.poll() is None
            if killed:
                stop(run.proc)
                complete = False
            running.remove(run)
            rows = finish(run, killed, by_key, calls, next_id)
            c = run.call
            extra = f" ({rows} verdicts)" if c.kind == "run" else f" flags={c.flags}" if c.flags else ""
            count = f" {total - len(running)}/{total}" if total > 1 else ""
            clock.log(f"{label}{count}: {c.candidate or 'eval run'} -> {c.status} "
                      f"in {c.wall_s:.1f}s{extra}" + (f" [{(c.reason or '')[:120]}]" if c.status not in ("pass", "done") else ""))
    return complete


# -- phases -----------------------------------------------------------------------------------------------
def prebuild(cands: list[Candidate], args, env: dict, clock: Clock, logs: Path) -> dict:
    """Build the candidates' extensions before the timed phases, so they measure judging, not compilers."""
    return build_extensions({c.label: c.path for c in cands}, args.build_parallel, args.python, env, clock, logs)


def build_extensions(files: dict[str, Path], parallel: int, python: str, env: dict, clock: Clock, logs: Path) -> dict:
    """Build each file's extension (files: label -> candidate) where its judge's runner will load it
    from (TORCH_EXTENSIONS_DIR/candidate-<sha256 of the code>: a candidate without kernels/ files
    beside it), `parallel` at once; label -> {ok, rc, s} (rc None: not started before the deadline). Runs the files outside the sandbox (trusted
    files). Each build holds its folder as a judge's load does (gpulock.build_folder_lock, which clears
    the torch build lock a killed build left); a folder a judge is building in now is tried again later."""
    from cudagym.eval.gpulock import build_folder_lock

    todo = [(label, path) for label, path in files.items() if "load_inline" in path.read_text()]
    clock.log(f"prebuild: {len(todo)} extensions, {parallel} at a time")
    results, pending = {}, list(todo)
    running: dict[subprocess.Popen, tuple[str, float, contextlib.ExitStack]] = {}
    snippet = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='candidate_prebuild')"
    while pending or running:
        if pending and clock.left() <= MIN_CALL_S:
            clock.log(f"prebuild: deadline near, {len(pending)} extensions not built")
            results.update({label: {"ok": False, "rc": None, "s": 0.0} for label, _ in pending})
            pending = []
        while pending and len(running) < parallel:
            label, path = pending.pop(0)
            code = path.read_text()
            ext_dir = extensions_root() / ("candidate-" + hashlib.sha256(code.encode()).hexdigest()[:16])
            ext_dir.mkdir(parents=True, exist_ok=True)
            held = contextlib.ExitStack()
            try:
                held.enter_context(build_folder_lock(str(ext_dir), timeout_s=0))
            except TimeoutError:
                pending.append((label, path))
                break
            log = open(logs / f"build-{label.replace('/', '-')}.log", "wb")
            proc = subprocess.Popen([python, "-c", snippet, str(path)], stdout=log, stderr=subprocess.STDOUT,
                                    cwd=REPO, env=dict(env, TORCH_EXTENSIONS_DIR=str(ext_dir)), start_new_session=True)
            log.close()
            running[proc] = (label, time.monotonic(), held)
        time.sleep(0.5)
        for proc, (label, t0, held) in list(running.items()):
            if proc.poll() is None and clock.left() > 0:
                continue
            if proc.poll() is None:
                kill_tree(proc)
            held.close()
            del running[proc]
            ok = proc.returncode == 0
            results[label] = {"ok": ok, "rc": proc.returncode, "s": round(time.monotonic() - t0, 1)}
            clock.log(f"prebuild {label}: {'built' if ok else f'FAILED (rc {proc.returncode}, see build log)'} "
                      f"in {results[label]['s']:.0f}s")
    return results


def lone_phase(cands: list[Candidate], mode: str, phase: str, args, env, clock, logs, by_key, calls, next_id) -> bool:
    """Each candidate alone, one after another."""
    complete = True
    for n, c in enumerate(cands, 1):
        if clock.left() < MIN_CALL_S:
            clock.log(f"{phase} {mode}: deadline near, {len(cands) - n + 1} candidates not run")
            return False
        call = Call(id=next_id(), phase=phase, mode=mode, kind="one", candidate=c.label, candidate_kind=c.kind,
                    hack_class=c.hack_class)
        calls.append(call)
        cmd = [args.python, "-m", "cudagym", "eval", "one", "--ref", str(c.ref_path), "--candidate", str(c.path),
               "--json"] + eval_options(args, mode)
        run = start(cmd, call, logs, env, clock, min(args.call_timeout_s, clock.left()))
        complete &= wait_all([run], clock, by_key, calls, next_id, f"{phase} {mode} {n}/{len(cands)}")
    return complete


def concurrent_phase(cands: list[Candidate], tasks_dir: Path, mode: str, args, env, clock, logs, tmp, by_key, calls,
                     next_id) -> bool:
    """At least --callers `eval one` processes and one `eval run`, all started at once."""
    if clock.left() < MIN_CALL_S:
        clock.log(f"concurrent {mode}: deadline near, not started")
        return False
    picks = list(cands)
    cycle = itertools.cycle(cands)
    while len(picks) < args.callers:
        picks.append(next(cycle))
    running = []
    for c in picks:
        call = Call(id=next_id(), phase="concurrent", mode=mode, kind="one", candidate=c.label, candidate_kind=c.kind,
                    hack_class=c.hack_class)
        calls.append(call)
        cmd = [args.python, "-m", "cudagym", "eval", "one", "--ref", str(c.ref_path), "--candidate", str(c.path),
               "--json"] + eval_options(args, mode)
        running.append(start(cmd, call, logs, env, clock, min(args.call_timeout_s, clock.left())))
    honest = [c for c in cands if c.kind == "honest" and (args.run_only is None or re.search(args.run_only, c.label))]
    if honest and not args.no_eval_run:
        call = Call(id=next_id(), phase="concurrent", mode=mode, kind="run", candidate=None, candidate_kind=None)
        calls.append(call)
        db = tmp / f"stress-{mode}-{call.id}.duckdb"  # a fresh store: nothing resumed from an earlier run
        cmd = [args.python, "-m", "cudagym", "eval", "run", str(args.root / "honest"), "--problems", str(tasks_dir),
               "--name", f"stress-{mode}", "--db", str(db),
               "--ids", ",".join(str(i) for i in sorted({c.problem_id for c in honest})),
               "--levels", ",".join(str(lv) for lv in sorted({c.level for c in honest})),
               "--parallel", str(args.run_parallel), "--json"] + eval_options(args, mode)
        running.append(start(cmd, call, logs, env, clock, clock.left()))
    clock.log(f"concurrent {mode}: {len(picks)} eval one + {0 if args.no_eval_run or not honest else 1} eval run started")
    return wait_all(running, clock, by_key, calls, next_id, f"concurrent {mode}")


# -- summary ------------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def rel_diff(a: float | None, b: float | None) -> float | None:
    return abs(a - b) / a if a and b else None


def summarise(calls: list[Call], modes: list[str]) -> dict:
    out = {}
    for mode in modes:
        mc = [c for c in calls if c.mode == mode and c.kind in ("one", "run_row") and c.status != "killed"]
        honest = [c for c in mc if c.candidate_kind == "honest"]
        hacks = [c for c in mc if c.candidate_kind == "hack"]
        lone = {c.candidate: c for c in mc if c.phase == "lone" and c.kind == "one"}
        lone2 = {c.candidate: c for c in mc if c.phase == "lone2" and c.kind == "one"}
        conc = [c for c in mc if c.phase == "concurrent" and c.kind == "one"]
        per = []
        for name in sorted({c.candidate for c in mc if c.kind == "one"}):
            mine = [c for c in conc if c.candidate == name]
            walls = [c.wall_s for c in mine if c.wall_s is not None]
            l = lone.get(name)
            speed = [c.speedup_vs_eager for c in mine if c.speedup_vs_eager]
            conc_speed = statistics.median(speed) if speed else None
            row_speed = [c.speedup_vs_eager for c in mc if c.kind == "run_row" and c.candidate == name and c.speedup_vs_eager]
            per.append({
                "candidate": name, "kind": next(c.candidate_kind for c in mc if c.candidate == name),
                "lone_status": l.status if l else None, "lone_s": l.wall_s if l else None,
                "concurrent_n": len(mine), "concurrent_status": sorted({c.status for c in mine}),
                "concurrent_p50_s": pct(walls, 0.5), "concurrent_p95_s": pct(walls, 0.95),
                "p50_over_lone": (pct(walls, 0.5) / l.wall_s) if walls and l and l.wall_s else None,
                "lone_speedup": l.speedup_vs_eager if l else None, "concurrent_speedup_median": conc_speed,
                "run_speedup": row_speed[0] if row_speed else None,
                "speedup_rel_diff_load": rel_diff(l.speedup_vs_eager if l else None, conc_speed),
                "lone2_speedup": lone2[name].speedup_vs_eager if name in lone2 else None,
                "speedup_rel_diff_lone_runs": rel_diff(l.speedup_vs_eager if l else None,
                                                       lone2[name].speedup_vs_eager if name in lone2 else None),
            })
        honest_diffs = [p["speedup_rel_diff_load"] for p in per if p["kind"] == "honest" and p["speedup_rel_diff_load"] is not None]
        lone_diffs = [p["speedup_rel_diff_lone_runs"] for p in per if p["kind"] == "honest"
                      and p["speedup_rel_diff_lone_runs"] is not None]
        lone_walls = [c.wall_s for c in lone.values() if c.wall_s is not None]
        conc_walls = [c.wall_s for c in conc if c.wall_s is not None]
        out[mode] = {
            "honest_calls": len(honest),
            "honest_not_passed": len([c for c in honest if c.status != "pass"]),
            "honest_not_passed_calls": [f"{c.phase}:{c.candidate}:{c.status}:{(c.reason or '')[:160]}" for c in honest
                                        if c.status != "pass"],
            "hack_calls": len(hacks),
            "hacks_passed": len([c for c in hacks if c.status == "pass"]),
            "hacks_passed_calls": [f"{c.phase}:{c.candidate}" for c in hacks if c.status == "pass"],
            "oom": len([c for c in mc if c.oom]) + len([c for c in calls if c.mode == mode and c.kind == "run" and c.oom]),
            "killed": len([c for c in calls if c.mode == mode and c.status == "killed"]),
            "lone_p50_s": pct(lone_walls, 0.5), "concurrent_p50_s": pct(conc_walls, 0.5),
            "concurrent_p95_s": pct(conc_walls, 0.95),
            "median_speedup_rel_diff_under_load": statistics.median(honest_diffs) if honest_diffs else None,
            "median_speedup_rel_diff_two_lone_runs": statistics.median(lone_diffs) if lone_diffs else None,
            "eval_run_s": next((c.wall_s for c in calls if c.mode == mode and c.kind == "run"), None),
            "per_candidate": per,
        }
    return out


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list):
        return ",".join(map(str, v)) or "-"
    return str(v)


def markdown(summary: dict) -> str:
    lines = ["| mode | honest calls | honest not passed (must be 0) | OOM (must be 0) | hack calls | hacks passed (must be 0) "
             "| killed | lone p50 s | concurrent p50 s | concurrent p95 s | eval run s | median speedup diff, load vs alone "
             "| median speedup diff, two lone runs |",
             "|" + "---|" * 13]
    for mode, s in summary.items():
        lines.append(f"| {mode} | {s['honest_calls']} | {s['honest_not_passed']} | {s['oom']} | {s['hack_calls']} | "
                     f"{s['hacks_passed']} | {s['killed']} | {fmt(s['lone_p50_s'])} | {fmt(s['concurrent_p50_s'])} | "
                     f"{fmt(s['concurrent_p95_s'])} | {fmt(s['eval_run_s'])} | "
                     f"{fmt(s['median_speedup_rel_diff_under_load'])} | {fmt(s['median_speedup_rel_diff_two_lone_runs'])} |")
    for mode, s in summary.items():
        lines += ["", f"**{mode}** per candidate", "",
                  "| candidate | lone | lone s | concurrent (n) | conc p50 s | conc p95 s | p50 / lone | speedup alone "
                  "| speedup under load (median) | speedup in eval run |",
                  "|" + "---|" * 10]
        for p in s["per_candidate"]:
            lines.append(f"| {p['candidate']} | {fmt(p['lone_status'])} | {fmt(p['lone_s'])} | "
                         f"{fmt(p['concurrent_status'])} ({p['concurrent_n']}) | {fmt(p['concurrent_p50_s'])} | "
                         f"{fmt(p['concurrent_p95_s'])} | {fmt(p['p50_over_lone'])} | {fmt(p['lone_speedup'])} | "
                         f"{fmt(p['concurrent_speedup_median'])} | {fmt(p['run_speedup'])} |")
        for what in ("honest_not_passed_calls", "hacks_passed_calls"):
            if s[what]:
                lines += ["", f"{what}:"] + [f"- {x}" for x in s[what]]
    return "\n".join(lines)


def write_results(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(path)


def environment(device: str) -> dict:
    env = {"python": sys.version.split()[0], "host_cpus": os.cpu_count()}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        if device.startswith("cuda") and torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
    except Exception as e:  # the children report their own failures; this is only context
        env["torch"] = f"unavailable: {type(e).__name__}"
    return env


# -- main -----------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=REPO / "benchmarks" / "stress",
                   help="folder with honest/, hacks/ (level{L}/{id}_*.py) and problems/ (default benchmarks/stress;"
                        " benchmarks/stress/cpu for a CPU run)")
    p.add_argument("--kb-version", default="v0.1", help="KernelBench version of candidates that pin none (default v0.1)")
    p.add_argument("--timing-mode", default="strict", help="strict, paper, or both as strict,paper")
    p.add_argument("--callers", type=int, default=16, help="eval one processes at once in the concurrent phase (at least"
                                                          " one per candidate; default 16)")
    p.add_argument("--out", type=Path, default=Path("results.json"))
    p.add_argument("--deadline-s", type=float, default=540.0, help="stop (children killed, results written) before this")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--run-parallel", type=int, default=4, help="--parallel of the concurrent eval run (default 4)")
    p.add_argument("--timeout", type=float, default=60.0, help="cudagym --timeout: seconds one candidate call may take")
    p.add_argument("--n-checks", type=int, default=5)
    p.add_argument("--call-timeout-s", type=float, default=1800.0, help="kill one eval one process after this long")
    p.add_argument("--lone-runs", type=int, default=1, choices=(1, 2),
                   help="2: judge every candidate alone twice (speedup repeatability between two runs)")
    p.add_argument("--phases", default="prebuild,lone,concurrent", help="any of prebuild,lone,concurrent")
    p.add_argument("--lone-from", type=Path, default=None,
                   help="reuse the lone calls of an earlier results.json (run the lone phase in one call, the rest later)")
    p.add_argument("--build-parallel", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    p.add_argument("--only", default=None, help="regex on candidate labels (e.g. 'level1/(19|23)_')")
    p.add_argument("--lone-only", default=None,
                   help="regex on candidate labels: only these run alone (the lone latency and the two-run repeatability"
                        " come from them); every candidate still runs in the concurrent phase")
    p.add_argument("--run-only", default=None,
                   help="regex on honest candidate labels: only these go into the concurrent eval run (leave the"
                        " multi-GB problems to the eval one calls, where one at a time fits the GPU anyway)")
    p.add_argument("--no-eval-run", action="store_true", help="leave the eval run out of the concurrent phase")
    p.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (references, logs, DuckDB)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the children (default: this one)")
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.timing_mode.split(",") if m.strip()]
    if not args.modes or set(args.modes) - {"strict", "paper"}:
        p.error("--timing-mode: strict, paper or strict,paper")
    if args.device == "cpu" and "paper" in args.modes:
        p.error("the paper timing mode needs a GPU")
    args.phases = {x.strip() for x in args.phases.split(",") if x.strip()}
    if args.phases - {"prebuild", "lone", "concurrent"}:
        p.error("--phases: any of prebuild,lone,concurrent")
    args.root = args.root.resolve()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    clock = Clock(args.deadline_s)
    sys.path.insert(0, str(REPO))
    tmp = Path(tempfile.mkdtemp(prefix="cudagym-stress-"))
    logs = tmp / "logs"
    logs.mkdir()
    cands = discover(args.root, args.kb_version, args.only)
    tasks_dir = extract_problems(cands, args.root, tmp)
    by_key = {(c.level, c.problem_id): c for c in cands if c.kind == "honest"}
    clock.log(f"{len(cands)} candidates ({sum(c.kind == 'honest' for c in cands)} honest, "
              f"{sum(c.kind == 'hack' for c in cands)} hacks) from {args.root}; modes {args.modes}; temp {tmp}")
    lone_cands = [c for c in cands if args.lone_only is None or re.search(args.lone_only, c.label)]
    env = child_env(args)
    calls: list[Call] = []
    counter = itertools.count(1)
    next_id = lambda: next(counter)  # noqa: E731
    payload = {"config": {k: (str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, set) else v)
                          for k, v in vars(args).items()},
               "env": environment(args.device), "tmp": str(tmp),
               "candidates": [{"label": c.label, "kind": c.kind, "problem": c.problem, "problem_name": c.problem_name,
                               "hack_class": c.hack_class, "why": c.why} for c in cands],
               "prebuild": {}, "calls": calls, "complete": True}

    def save() -> None:
        payload["calls"] = [asdict(c) for c in calls]
        payload["summary"] = summarise(calls, args.modes)
        payload["elapsed_s"] = round(clock.now(), 1)
        write_results(args.out, payload)

    complete = True
    try:
        if "prebuild" in args.phases:
            payload["prebuild"] = prebuild(cands, args, env, clock, logs)
        if args.lone_from:
            earlier = json.loads(args.lone_from.read_text())
            kept = [Call(**c) for c in earlier.get("calls", []) if c.get("phase") in ("lone", "lone2")
                    and c.get("mode") in args.modes and c.get("candidate") in {x.label for x in cands}]
            for c in kept:
                c.id = next_id()
            calls.extend(kept)
            clock.log(f"reused {len(kept)} lone calls from {args.lone_from}")
        for mode in args.modes:
            if "lone" in args.phases:
                complete &= lone_phase(lone_cands, mode, "lone", args, env, clock, logs, by_key, calls, next_id)
                save()
                if args.lone_runs == 2:
                    complete &= lone_phase(lone_cands, mode, "lone2", args, env, clock, logs, by_key, calls, next_id)
                    save()
            if "concurrent" in args.phases:
                complete &= concurrent_phase(cands, tasks_dir, mode, args, env, clock, logs, tmp, by_key, calls, next_id)
                save()
    except KeyboardInterrupt:
        complete = False
        clock.log("interrupted: writing what was measured")
    finally:
        payload["complete"] = complete
        save()
    summary = payload["summary"]
    print()
    print(markdown(summary))
    print(f"\nwrote {args.out} ({len(calls)} calls, {clock.now():.0f} s{'' if complete else ', INCOMPLETE'})")
    if not args.keep_tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = any(s["honest_not_passed"] or s["oom"] or s["hacks_passed"] for s in summary.values())
    return 1 if failed else (0 if complete else 2)


if __name__ == "__main__":
    sys.exit(main())
