"""The driver side of evaluation: validate, check statically, run a judge process, build a Verdict.

`evaluate_candidate` is the one entry point the CLI, the dataset filter, the agent's reward and
the leaderboard call. It never runs task or candidate code itself: a judge subprocess does
(`cudagym.eval.judge`), and the judge runs the candidate in a further sandboxed process. Whatever
those processes do (crash, hang, blow memory), this returns a Verdict.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from cudagym.eval.gpulock import TRACE_ENV as LOCK_TRACE_ENV, claim_task, lock_dir, prepare_lock_dir, task_claimant
from cudagym.eval.timing import TIMING_MODES, TRACE_ENV
from cudagym.eval.verdict import EDGE_BAND, Status, Verdict
from cudagym.tasks import Task
from cudagym.tasks.sandbox import describe_exit, kill_tree

POLICIES = ("strict", "permissive")
PRECISIONS = ("strict", "kernelbench")
# The judges this process started and still runs, each with the stop scope of the batch that started it
# (they run in their own sessions, so a stop must kill them by name).
_LIVE_JUDGES: dict[subprocess.Popen, StopScope] = {}
_LIVE_LOCK = threading.Lock()


class Interrupted(Exception):
    """A judge was stopped with its batch; `results` holds what a multi-task judge had finished."""

    def __init__(self, results: list | None = None):
        super().__init__("stopped with its batch")
        self.results = results or []


class StopScope:
    """The judges of one batch (a pool's run, a feed), so that its stop kills its own judges and not those
    of another batch beside it in the same process: an overlapped dataset build filters one round while
    the next round's scale search probes, and a filter that stops (or fails) must not end the search's
    probes, which would then wait for answers that never come. A thread runs its judges in the scope
    `enter_scope` gave it (the batch's worker threads), else in the process's default scope."""

    def __init__(self):
        self.stopping = threading.Event()  # set by a stop: a judge that ends now was killed, not finished
        # Stops so far. A stop's clear can come before one of its killed judges is reaped (a drain that
        # gave up after DRAIN_S): a judge that dies with no result was stopped, not failed, if any stop
        # came while it ran.
        self.stops = 0


_DEFAULT_SCOPE = StopScope()  # judges started outside any batch (an agent's verify, a single evaluation)
_SCOPES: "weakref.WeakSet[StopScope]" = weakref.WeakSet()  # every scope a batch made, for a stop of them all
_SCOPES.add(_DEFAULT_SCOPE)
_THREAD = threading.local()


def new_scope() -> StopScope:
    """A fresh scope for a batch: its threads enter it (`enter_scope`, a pool's initializer)."""
    scope = StopScope()
    with _LIVE_LOCK:
        _SCOPES.add(scope)
    return scope


def enter_scope(scope: StopScope) -> None:
    """This thread's judges belong to `scope` from now on."""
    _THREAD.scope = scope


def current_scope() -> StopScope:
    return getattr(_THREAD, "scope", _DEFAULT_SCOPE)


def stop_live_judges(scope: StopScope | None = None) -> None:
    """Kill the judges of `scope` that are still running (and, with each, its runner), or with no scope
    every judge this process started (Ctrl-C, a Ray worker's stop); the threads waiting on them raise
    Interrupted, carrying what was finished."""
    with _LIVE_LOCK:
        scopes = [scope] if scope is not None else list(_SCOPES)
        for each in scopes:
            each.stopping.set()
            each.stops += 1
        for proc, owner in list(_LIVE_JUDGES.items()):
            if owner in scopes:
                kill_tree(proc.pid)


def clear_stop(scope: StopScope | None = None) -> None:
    """After a stop of `scope` (default: every scope), its finished work collected: judges of the scope
    that end from now on finished, they were not stopped."""
    with _LIVE_LOCK:
        for each in [scope] if scope is not None else list(_SCOPES):
            each.stopping.clear()


# Environment variables a judge (and the candidate's process under it) never gets: the candidate could
# read one and hand it back in an exception's text, i.e. in the verdict's reason, which reaches an
# agent's transcript and the stores (an API key of the run that evaluates it, a Hub token, ...).
SECRET_ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


def without_secrets(environ) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not SECRET_ENV_NAME.search(k)}


class CandidateError(ValueError):
    """The candidate file is not a candidate (syntax error, no ModelNew, wrong signature)."""


@dataclass(frozen=True)
class EvalConfig:
    device: str = "cuda"
    policy: str = "strict"  # op policy: "strict" (CUDA Agent's: custom kernels, cuBLAS/cuDNN from C++) | "permissive"
    timing_mode: str = "strict"  # "strict" | "paper"
    precision: str = "strict"  # "strict": fp32 with TF32 off for every party | "kernelbench": torch's defaults (cuDNN TF32 on)
    n_checks: int = 5
    atol: float = 1e-2
    rtol: float = 1e-2
    time_candidate: bool = True
    compile_baseline: bool = True  # time torch.compile live when no cached baseline is given
    static_checks: bool = True
    timeout_s: float = 60.0  # per call of the candidate
    build_timeout_s: float = 900.0  # import of the candidate, its extension build included
    memory_limit_gb: float = 32.0
    lock_path: str | None = None  # an explicit lock file; None: the machine's lock for the device (gpulock.lock_dir)
    compile_threads: int | None = None  # inductor compile workers per judge (1 when judges run in parallel)
    seed: int | None = None  # None: a fresh secret per run (tests may fix it)
    min_reps: int = 10
    max_reps: int = 100
    max_timing_s: float = 10.0
    task_timeout_s: float | None = None  # bound on one task's whole judge run; None: derived from the above
    timing_cpus: tuple[int, ...] | None = None  # cores the exclusive lock's holder times on (gpulock); None: unset
    work_cpus: tuple[int, ...] | None = None  # cores judges work on otherwise; () for either: no pinning
    slow_call_s: float | None = None  # the dataset filter: a first and a warm eager call slower than this drop the task
    fast_ms: float | None = None  # the scale search's probes: a time under this, timed shared, needs no timing turn
    edge_band: float = EDGE_BAND  # a speedup this close to a milestone is timed in verdict.EDGE_ROUNDS rounds; 0: once

    def __post_init__(self):
        if self.device == "cuda":  # torch.cuda.set_device needs an index
            object.__setattr__(self, "device", "cuda:0")
        if self.device != "cpu" and not self.device.startswith("cuda:"):
            raise ValueError(f"unknown device {self.device!r} (cpu, cuda or cuda:N)")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r} (choose from {', '.join(POLICIES)})")
        if self.timing_mode not in TIMING_MODES:
            raise ValueError(f"unknown timing mode {self.timing_mode!r} (choose from {', '.join(TIMING_MODES)})")
        if self.timing_mode == "paper" and self.device == "cpu":
            raise ValueError("the paper timing mode sums CUDA kernel times: it needs --device cuda")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r} (choose from {', '.join(PRECISIONS)})")
        if self.n_checks < 2:
            raise ValueError("n_checks must be at least 2 (input-independence needs two input sets)")

    @property
    def judge_timeout_s(self) -> float:
        """Upper bound on a whole judge run: build, checks (some doubled), timing, baselines."""
        if self.task_timeout_s:
            return self.task_timeout_s
        return self.build_timeout_s + (3 * self.n_checks + 10) * self.timeout_s + 4 * self.max_timing_s + 600


# -- cheap validation, before any process is started -------------------------------------------------
def _init_arity(tree: ast.Module, class_name: str) -> tuple[int, int, bool] | None:
    """(required, total, takes *args) positional parameters of class_name.__init__, None if no class."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args
                    params = args.posonlyargs + args.args
                    total = len(params) - 1  # self
                    return total - len(args.defaults), total, args.vararg is not None
            return 0, 0, True  # inherits __init__: accepts what its base accepts (as if *args); no verdict here
    return None


def validate_candidate(ref_code: str, candidate_code: str) -> None:
    """Raise CandidateError with one line if the candidate cannot be a ModelNew for this reference."""
    try:
        tree = ast.parse(candidate_code)
    except SyntaxError as e:
        raise CandidateError(f"syntax error at line {e.lineno}: {e.msg}") from None
    arity = _init_arity(tree, "ModelNew")
    if arity is None:
        raise CandidateError("candidate defines no class ModelNew")
    ref_required, ref_total, ref_varargs = _init_arity(ast.parse(ref_code), "Model") or (0, 0, True)
    required, total, varargs = arity
    # An explicit zero-argument __init__ on either side is a real signature, not "unknown".
    if not (varargs or ref_varargs) and (required > ref_total or total < ref_required or (total and ref_total > total)):
        raise CandidateError(f"ModelNew.__init__ takes {required}..{total} arguments but Model's takes {ref_total}")


# Extra files a candidate may bring (an agent's kernels/): C++/CUDA sources and headers, nothing the
# static checks cannot read (a Python helper module would be an unchecked second candidate).
CANDIDATE_FILE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".inl")


def validate_candidate_files(files: dict[str, str]) -> None:
    """Raise CandidateError with one line for a file name the runner must not write or a kind of file
    the static checks cannot read."""
    for name, text in files.items():
        parts = name.replace("\\", "/").split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise CandidateError(f"candidate file {name!r}: a relative path without '..' is expected")
        if not name.endswith(CANDIDATE_FILE_SUFFIXES) or name == "candidate.py":
            raise CandidateError(f"candidate file {name!r}: only C++/CUDA sources and headers "
                                 f"({' '.join(CANDIDATE_FILE_SUFFIXES)}) may come with a candidate")
        if not isinstance(text, str):
            raise CandidateError(f"candidate file {name!r}: text expected")


def static_flags(ref_code: str, candidate_code: str, policy: str, files: dict[str, str] | None = None) -> list[str]:
    from cudagym.eval.static import reference_dtypes, static_flags as flags_of

    try:
        task_dtypes = reference_dtypes(ref_code)
    except SyntaxError:  # the judge reports a broken reference; here it only means no half types
        task_dtypes = set()
    return flags_of(candidate_code, policy=policy, task_dtypes=task_dtypes | {"float32"},
                    extra_cuda_sources=list((files or {}).values()))


def cache_root() -> Path:
    """cudagym's cache folder (CUDAGYM_CACHE, else ~/.cache/cudagym): build caches, crawls."""
    return Path(os.environ.get("CUDAGYM_CACHE", Path.home() / ".cache" / "cudagym"))


def _cache_dirs() -> list[str]:
    """Build caches the sandboxed processes may write (and share across runs)."""
    root = cache_root()
    defaults = {"TORCH_EXTENSIONS_DIR": root / "torch_extensions", "TORCHINDUCTOR_CACHE_DIR": root / "inductor",
                "TRITON_CACHE_DIR": root / "triton"}
    dirs = []
    for var, default in defaults.items():
        path = os.environ.setdefault(var, str(default))
        Path(path).mkdir(parents=True, exist_ok=True)
        dirs.append(path)
    return dirs


def run_judge(request: dict, config: EvalConfig, stall_s: float | None = None,
              on_line: Callable[[int, dict], None] | None = None) -> dict:
    """Run a judge; if it ran out of GPU memory beside other judges, run it again holding the GPU alone.
    stall_s (a judge of several tasks): kill it as soon as no task has finished for that long.
    on_line(i, result) (a judge of several tasks): called in this thread with each task's result
    within a second of the judge writing it, while the judge goes on with the next."""
    result = _run_judge_once(request, config, stall_s, on_line)
    if config.device.startswith("cuda") and out_of_memory(result):
        result = _run_judge_once(dict(request, exclusive=True), config, stall_s, on_line)
    return result


# How running out of GPU memory reads: PyTorch's allocator, the CUDA runtime (a context or kernel
# launch), and cuDNN / cuBLAS failing to get a workspace (cuDNN often says only INTERNAL_ERROR).
OUT_OF_MEMORY = ("out of memory", "cudaerrormemoryallocation", "alloc_failed", "allocation_failed",
                 "cudnn_status_internal_error")


def out_of_memory(result: dict) -> bool:
    """A judge's result (its `reason`), or a filter measurement (its `error`), that ran out of GPU memory."""
    reason = f"{result.get('reason', '')} {result.get('error', '')}".lower()
    return any(sign in reason for sign in OUT_OF_MEMORY)


def _wait_for_judge(proc: subprocess.Popen, timeout_s: float, lines_path: str,
                    stall_s: float | None, on_line: Callable[[int, dict], None] | None = None,
                    busy: Callable[[], bool] | None = None) -> tuple[str, bool] | None:
    """Wait for the judge to end; None if it did, else (why it was killed, whether it stalled): it
    ran past timeout_s, or (stall_s given) no task of its several finished for stall_s. A judge of n
    tasks has n task budgets in all, so without the stall check one hung task would hold it that long.
    Each new line of its results (a task finished) goes to on_line as it appears (checked every second).
    busy (a fed judge, which waits idle for tasks): the stall clock runs only while busy() says it has one."""
    deadline = time.monotonic() + timeout_s
    finished, progress_at = 0, time.monotonic()
    polled = stall_s or on_line
    while True:
        try:
            proc.wait(timeout=max(0.0, min(deadline - time.monotonic(), 1.0 if polled else timeout_s)))
            _report_lines(lines_path, finished, on_line)
            return None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if polled:
            lines = _report_lines(lines_path, finished, on_line)
            if lines != finished or (busy is not None and not busy()):
                finished, progress_at = lines, now
            if stall_s and now - progress_at > stall_s:
                killed = (f"task {finished + 1} of the judge finished nothing in {stall_s:.0f} s", True)
                break
        if now >= deadline:
            killed = (f"evaluation exceeded {timeout_s:.0f} s", False)
            break
    kill_tree(proc.pid)
    proc.wait()
    _report_lines(lines_path, finished, on_line)
    return killed


PHASE_FILE = "phase.json"  # in a judge's workdir: what it does now and since when (judge.mark_phase writes it)


def judge_phase(workdir: str) -> str:
    """What a judge was doing and for how long, from the note it keeps in its workdir (judge.mark_phase)."""
    try:
        note = json.loads(Path(workdir, PHASE_FILE).read_text())
        return f"{note['phase']} for {max(0.0, time.time() - float(note['since'])):.0f} s"
    except (OSError, ValueError, KeyError, TypeError):
        return "starting (imports, the reference)"


def _report_lines(lines_path: str, reported: int, on_line: Callable[[int, dict], None] | None) -> int:
    """How many whole lines the judge's results file has; those after the first `reported` go to on_line."""
    data = Path(lines_path).read_bytes() if os.path.exists(lines_path) else b""
    lines = data.split(b"\n")[:-1]  # the last piece is empty or a line still being written
    if on_line:
        for i in range(reported, len(lines)):
            on_line(i, json.loads(lines[i]))
    return len(lines)


def judges_lock_dir(config: EvalConfig) -> str:
    """The lock folder a judge of this config takes its device's lock, memory ledger and queues from (and may write)."""
    return str(Path(config.lock_path).parent) if config.lock_path else prepare_lock_dir(lock_dir())


def _run_judge_once(request: dict, config: EvalConfig, stall_s: float | None = None,
                    on_line: Callable[[int, dict], None] | None = None, timeout_s: float | None = None,
                    busy: Callable[[], bool] | None = None) -> dict:
    """Run `python -m cudagym.eval.judge` on a request; its result dict, or a failure dict.
    timeout_s: the whole judge's bound (default: the config's for one run); busy: see _wait_for_judge."""
    scope = current_scope()
    if scope.stopping.is_set():  # a job that got a thread as its batch was being stopped
        raise Interrupted()
    timeout_s = timeout_s or config.judge_timeout_s
    workdir = tempfile.mkdtemp(prefix="cudagym-judge-")
    # The judge writes its workdir, the build caches and (for the shared memory ledger) the lock folder.
    locks = judges_lock_dir(config)
    # a benchmark's timing trace (timing.write_trace) and GPU lock trace (gpulock.trace_hold) go beside the caches
    traces = [os.environ.get(TRACE_ENV), os.environ.get(LOCK_TRACE_ENV)]
    writable = _cache_dirs() + [locks] + [str(Path(trace).resolve().parent) for trace in traces if trace]
    request = dict(request, workdir=workdir, lock_dir=locks, writable=writable)
    request_path = os.path.join(workdir, "request.json")
    with open(request_path, "w") as f:
        json.dump(request, f)
    log_path = os.path.join(workdir, "judge.log")
    lines_path = os.path.join(workdir, "results.jsonl")  # a judge of several tasks: a line per finished task
    env = dict(without_secrets(os.environ), PYTHONDONTWRITEBYTECODE="1", CUDAGYM_EVAL_PID=str(os.getpid()))
    if config.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # judge and runner alternate on the CPU; spinning thread pools would time each other
    if config.compile_threads:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(config.compile_threads)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "cudagym.eval.judge", request_path], stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
            with _LIVE_LOCK:
                _LIVE_JUDGES[proc] = scope
                stops = scope.stops
                if scope.stopping.is_set():  # the batch was stopped after the check above: this judge was started too late
                    kill_tree(proc.pid)
            try:
                killed = _wait_for_judge(proc, timeout_s, lines_path, stall_s, on_line, busy)
            except KeyboardInterrupt:  # Ctrl-C, or a caller's deadline: the judge goes too, and says where it was
                where = judge_phase(workdir)
                kill_tree(proc.pid)
                proc.wait()
                raise KeyboardInterrupt(f"its judge was {where}") from None
            finally:
                with _LIVE_LOCK:
                    _LIVE_JUDGES.pop(proc, None)
        result_path = os.path.join(workdir, "result.json")
        done = [json.loads(line) for line in Path(lines_path).read_text().splitlines()] if os.path.exists(lines_path) else None
        if killed:
            reason, stalled = killed
            return {"status": "timeout", "reason": f"{reason} (the judge was {judge_phase(workdir)})", "stalled": stalled,
                    **({"results": done} if done is not None else {})}
        if not os.path.exists(result_path) and (scope.stopping.is_set() or scope.stops != stops):
            raise Interrupted(done)
        if not os.path.exists(result_path):
            tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-1:] if os.path.exists(log_path) else []
            return {"status": "runtime_error", "judge_error": True,
                    "reason": f"judge {describe_exit(proc.returncode)}{': ' + tail[0][:300] if tail else ''}",
                    **({"results": done} if done is not None else {})}
        with open(result_path) as f:
            return dict(json.load(f), **({"results": done} if done is not None else {}))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def evaluate_candidate(ref_code: str, candidate_code: str, config: EvalConfig = EvalConfig(),
                       task: Task | None = None, t_compile_ms: float | None = None,
                       files: dict[str, str] | None = None) -> Verdict:
    """Judge one candidate against one reference; always returns a Verdict.
    files: extra C++/CUDA files (relative path -> text) the runner writes beside the candidate's
    module before importing it, so `os.path.dirname(__file__)` finds them (an agent's kernels/)."""
    meta = {"level": task.level, "problem_id": task.problem_id, "name": task.name, "kb_version": task.kb_version} if task else {}
    verdict = Verdict(status=Status.PASS, timing_mode=config.timing_mode, precision=config.precision, **meta)
    try:
        validate_candidate(ref_code, candidate_code)
        validate_candidate_files(files or {})
    except CandidateError as e:
        verdict.status, verdict.reason = Status.COMPILE_ERROR, str(e)
        return verdict.finish()
    if config.static_checks:
        flags = static_flags(ref_code, candidate_code, config.policy, files)
        if flags:
            verdict.status, verdict.flags = Status.REJECTED, flags
            verdict.reason = "static checks fired: " + ", ".join(flags)
            return verdict.finish()
    config = with_timing_cpus(config)
    request = {"mode": "eval", "ref_code": ref_code, "candidate_code": candidate_code, "candidate_files": files or None,
               "device": config.device,
               "policy": config.policy, "n_checks": config.n_checks, "atol": config.atol, "rtol": config.rtol,
               "timing_mode": config.timing_mode, "precision": config.precision, "time_candidate": config.time_candidate,
               "call_timeout_s": config.timeout_s, "init_timeout_s": config.build_timeout_s,
               "runner_memory_bytes": int(config.memory_limit_gb * 2**30), "lock_path": config.lock_path,
               "timing_cpus": config.timing_cpus or (), "work_cpus": config.work_cpus or (),
               "seed": config.seed, "min_reps": config.min_reps, "max_reps": config.max_reps,
               "max_timing_s": config.max_timing_s, "compile_baseline": config.time_candidate and config.compile_baseline
               and t_compile_ms is None, "known_compile_ms": t_compile_ms,
               "edge_band": config.edge_band}
    result = run_judge(request, config)
    return verdict_from_result(result, verdict, t_compile_ms)


def with_timing_cpus(config: EvalConfig, gpu_slot: tuple[int, int] | None = None) -> EvalConfig:
    """On a GPU, the cores every judge of the machine shares out the same way (gpulock.timing_cpu_split):
    a lone `eval one` times on its GPU's timing cores and works on the others, like a batch's judges.
    gpu_slot: (this GPU's index, GPUs on the host), where the device's own index does not say it
    (a Ray worker sees its GPU as cuda:0)."""
    if config.timing_cpus is not None or not config.device.startswith("cuda"):
        return config
    from cudagym.eval.gpulock import timing_cpu_split

    if gpu_slot is None:
        import torch

        gpu_slot = (int(config.device.split(":")[1]), torch.cuda.device_count())
    timing, work = timing_cpu_split(*gpu_slot, os.sched_getaffinity(0))
    return replace(config, timing_cpus=timing, work_cpus=work)


def verdict_from_result(result: dict, verdict: Verdict, t_compile_ms: float | None = None) -> Verdict:
    if result.get("trace") and os.environ.get("CUDAGYM_DEBUG"):
        print(result["trace"], file=sys.stderr)
    verdict.status = Status(result.get("status", "runtime_error"))
    verdict.reason = result.get("reason")
    verdict.flags = list(result.get("flags", []))
    verdict.env = {k: v for k, v in result.get("env", {}).items() if v is not None}
    verdict.timing = dict(result.get("timing", {}), **({"flag_details": result["flag_details"]} if result.get("flag_details") else {}))
    if result.get("info"):
        verdict.timing["info"] = result["info"]
    if verdict.status is Status.PASS:
        verdict.t_candidate_ms = result.get("t_candidate_ms")
        verdict.t_eager_ms = result.get("t_eager_ms")
        verdict.t_compile_ms = result.get("t_compile_ms", t_compile_ms)
    return verdict.finish()


def reference_request(ref_code: str, mode: str, config: EvalConfig, compile_baseline: bool) -> dict:
    """A judge's request for a reference mode (baseline, warm, audit, the filter's) of one problem's code."""
    return {"mode": mode, "ref_code": ref_code, "device": config.device, "n_checks": config.n_checks,
            "atol": config.atol, "rtol": config.rtol, "timing_mode": config.timing_mode, "precision": config.precision,
            "compile_baseline": compile_baseline, "lock_path": config.lock_path, "seed": config.seed,
            "timing_cpus": config.timing_cpus or (), "work_cpus": config.work_cpus or (),
            "min_reps": config.min_reps, "max_reps": config.max_reps, "max_timing_s": config.max_timing_s,
            "call_timeout_s": config.timeout_s, "slow_call_s": config.slow_call_s,
            "fast_ms": config.fast_ms}


def run_reference_job(task: Task, mode: str, config: EvalConfig, compile_baseline: bool = True) -> dict:
    """Baseline times (mode "baseline"), a cache-filling compile ("warm") or accepted degenerate
    probes ("audit") for one task."""
    return run_judge(reference_request(task.code, mode, config, compile_baseline), config)


# A baseline or compile judge's task with a large memory share that waits this long for admission is
# deferred to the end of the judge's list (judge.Request.defer_memory_s): below gpulock.FAIR_AFTER_S, so
# its wait never holds back the judges that came after it.
DEFER_MEMORY_S = 10.0


def queue_key(task: Task) -> str:
    """A task's name in a queue folder: its id (the results of a pass are keyed by it)."""
    return hashlib.sha256(task.id.encode()).hexdigest()[:32]


def ended_task_result(judged: dict) -> dict:
    """The result of the task a judge of several was on when it ended early (`_run_judge_once`'s failure
    dict): a timeout if it stalled on that task, else how the judge ended, without the tasks it finished."""
    if judged.get("stalled"):
        return {"status": "timeout", "reason": judged["reason"]}
    return {k: v for k, v in judged.items() if k != "results"}


def run_queued_jobs(tasks: list[Task], mode: str, config: EvalConfig, queue: str,
                    on_result: Callable[[int, dict], None] | None = None) -> list[dict | None]:
    """One of the judges of a pass that share `tasks` as one queue (`gpulock.task_queue`): it runs the
    tasks it claims first, in list order; the results of those (None for the tasks other judges took, and
    for those not finished when the batch was stopped). As run_reference_jobs: on_result(i, result) as each
    is known; a task that hung or killed its judge is that task's result, and the rest of the list goes
    to one new judge; a task that ran out of memory beside other judges runs again alone. Other judges
    may still be at work when this returns: each task is reported by the judge that claimed it."""
    results: list[dict | None] = [None] * len(tasks)
    keys = [queue_key(t) for t in tasks]
    token = uuid.uuid4().hex

    def report(i: int, result: dict) -> None:
        if result.get("claimed_elsewhere") or results[i] is not None:
            return
        results[i] = result
        if on_result and not out_of_memory(result):  # else reported after its run alone, below
            on_result(i, result)

    request = dict(reference_request(tasks[0].code, mode, config, True), ref_codes=[t.code for t in tasks],
                   queue=queue, claim_keys=keys, claim_token=token)
    chunk_config = replace(config, build_timeout_s=config.build_timeout_s * len(tasks),
                           task_timeout_s=config.task_timeout_s and config.task_timeout_s * len(tasks))
    try:  # not run_judge: its rerun of a judge that ran out of memory would find every claim taken
        judged = _run_judge_once(request, chunk_config, config.judge_timeout_s, report)
    except Interrupted as stopped:  # what the judge finished before it was stopped counts; nothing else
        for i, result in enumerate(stopped.results or []):
            report(i, result)
        return [None if r is not None and out_of_memory(r) else r for r in results]
    done = judged.get("results") or []
    for i, result in enumerate(done):
        report(i, result)
    rest = after = len(done)  # the tasks this judge ended; where a new judge takes up the list
    if rest < len(tasks):  # it ended early: it hung, died, or its CUDA context broke
        ended = ended_task_result(judged)
        if task_claimant(queue, keys[rest]) == token:  # it was on this task: that is the task's result
            report(rest, ended)
            rest = after = rest + 1
        elif not done:  # it died before taking a task (its start failed): not a new judge for the same list,
            # which could fail the same way forever, but the next task nobody has, alone (as the chunked path
            # runs each task of a dead judge), then the rest
            mine = next((j for j in range(rest, len(tasks)) if claim_task(queue, keys[j], token)), None)
            if mine is None:
                return results
            results[mine] = run_reference_job(tasks[mine], mode, config)  # run_judge's own rerun if out of memory
            if on_result:
                on_result(mine, results[mine])
            after = mine + 1
    for i in range(rest):  # this judge's tasks that ran out of memory beside others (not the new judge's below)
        if results[i] is not None and out_of_memory(results[i]):
            results[i] = run_reference_job(tasks[i], mode, config)
            if on_result:
                on_result(i, results[i])
    if after < len(tasks):  # the rest of the list, in one new judge
        later = run_queued_jobs(tasks[after:], mode, config, queue,
                                on_result=(lambda j, r: on_result(after + j, r)) if on_result else None)
        results[after:] = later
    return results


def run_reference_jobs(tasks: list[Task], mode: str, config: EvalConfig, compile_baseline: bool = True,
                       on_result: Callable[[int, dict], None] | None = None) -> list[dict]:
    """The same for several tasks in one judge process, so torch, CUDA and inductor start once.
    A task that does not finish within one task's budget times out there (its judge is killed then,
    not after the n budgets of its n tasks), and the tasks after it run in one new judge. The tasks
    of a judge that died, and those that ran out of memory beside other judges, are run again one per
    process (compile-ahead `warm` judges: the tasks after the one it ended on, in one new judge). If the batch
    is stopped, the tasks the judge had not finished are None. on_result(i, result) is called (in
    this thread) once with each task's final result the moment it is known, while the judge runs on."""
    reported: set[int] = set()

    def report(i: int, result: dict) -> None:
        if on_result and i not in reported and i < len(tasks) and not again(result):  # else run again below
            reported.add(i)
            on_result(i, result)

    def again(result: dict | None) -> bool:
        """Run again, alone, after the judge's list: ran out of memory beside others, or a timing judge's
        task was deferred (a compile judge's deferred task is left to the timing judge that times it)."""
        return result is None or out_of_memory(result) or (mode != "warm" and bool(result.get("deferred")))

    request = dict(reference_request(tasks[0].code, mode, config, compile_baseline), ref_codes=[t.code for t in tasks],
                   defer_memory_s=DEFER_MEMORY_S if mode in ("baseline", "warm") else None)
    chunk_config = replace(config, build_timeout_s=config.build_timeout_s * len(tasks),
                           task_timeout_s=config.task_timeout_s and config.task_timeout_s * len(tasks))
    try:
        judged = run_judge(request, chunk_config, stall_s=config.judge_timeout_s, on_line=report)
    except Interrupted as stopped:  # what the judge finished before it was stopped counts; nothing else
        # A task it would have run again (deferred, out of memory) is not finished: on the H200 (session
        # 19) a stop during a warm run reported a deferred 130 GiB problem as failed.
        finished = [None if again(result) else result for result in stopped.results]
        return (finished + [None] * len(tasks))[:len(tasks)]
    done = judged.get("results") or []
    if mode == "warm" and len(done) + 1 < len(tasks):
        # A compile-ahead judge walks a whole baseline run's queue: the problems after the one it ended on
        # go to one new judge, not one process each (hundreds of process starts, for compiles that a
        # timing judge would do anyway). The one it ended on is its result: nothing waits on a warm compile.
        ended = ended_task_result(judged)
        report(len(done), ended)
        later = run_reference_jobs(tasks[len(done) + 1:], mode, config, compile_baseline,
                                   on_result=(lambda i, result: report(len(done) + 1 + i, result)) if on_result else None)
        return done + [ended] + later
    results = []
    for i, task in enumerate(tasks):
        result = done[i] if i < len(done) else None
        if i == len(done) and judged.get("stalled"):  # the task it hung on used its whole budget: not run again
            result = {"status": "timeout", "reason": judged["reason"]}
            report(i, result)
            # The tasks after it go to one new judge, not a process each: the culprit is known, and on the
            # H200 a scale-search probe that hung a judge of ten left nine process starts in a row.
            later = run_reference_jobs(tasks[i + 1:], mode, config, compile_baseline,
                                       on_result=(lambda j, r: report(i + 1 + j, r)) if on_result else None
                                       ) if i + 1 < len(tasks) else []
            return results + [result] + later
        if again(result):
            result = run_reference_job(task, mode, config, compile_baseline)
        report(i, result)
        results.append(result)
    return results
