"""Many problems at once: a submission's eval, the baselines, the degenerate-problem audit.

Judges run concurrently (`parallel` processes): building extensions and torch.compile use all CPU
cores, while the GPU readers-writer lock keeps timing exclusive. The calling thread is the only
DuckDB writer; every result is stored the moment it arrives, so a killed run resumes where it
stopped.
"""

from __future__ import annotations

import os
import re
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

from cudagym.eval.evaluate import EvalConfig, evaluate_candidate, run_reference_jobs, stop_live_judges
from cudagym.eval.store import BaselineKey, Store
from cudagym.eval.verdict import Status, Verdict
from cudagym.tasks import Task, TaskError

SUBMISSION_FILE = re.compile(r"^(\d+)(?:_.*)?\.py$")
NO_FILE = "no file for this problem in the submission"


def machine_env(device: str) -> dict:
    """What baselines depend on besides the problem: GPU model, torch and CUDA versions."""
    import torch

    if device.startswith("cuda"):
        return {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__.split("+")[0],
                "cuda": torch.version.cuda or ""}
    return {"gpu": "cpu", "torch": torch.__version__.split("+")[0], "cuda": ""}


def baseline_key(task: Task, env: dict, timing_mode: str) -> BaselineKey:
    # fp32 with TF32 off is the only precision regime the harness times in.
    return BaselineKey(task.sha256, env["gpu"], env["torch"], env["cuda"], "float32-notf32", timing_mode)


def submission_files(submission_dir: str | Path) -> dict[tuple[int, int], Path]:
    """(level, problem_id) -> file, from level{L}/{problem_id}_*.py or level{L}/{problem_id}.py."""
    root = Path(submission_dir)
    if not root.is_dir():
        raise TaskError(f"submission directory not found: {root}")
    files: dict[tuple[int, int], Path] = {}
    for level_dir in sorted(root.glob("level*")):
        level = level_dir.name[len("level"):]
        if not level_dir.is_dir() or not level.isdigit():
            continue
        for path in sorted(level_dir.glob("*.py")):
            match = SUBMISSION_FILE.match(path.name)
            if match:
                key = (int(level), int(match.group(1)))
                if key in files:
                    raise TaskError(f"two files for level {key[0]} problem {key[1]}: {files[key].name}, {path.name}")
                files[key] = path
    return files


def _batch_config(config: EvalConfig, parallel: int) -> EvalConfig:
    """Judges side by side: share the GPU through a lock file, and the CPU cores between them."""
    if parallel > 1 and not config.compile_threads:
        config = replace(config, compile_threads=max(1, (os.cpu_count() or 1) // parallel))
    if config.device.startswith("cuda") and not config.lock_path:
        lock_dir = Path(tempfile.gettempdir()) / "cudagym-locks"
        config = replace(config, lock_path=str(lock_dir / f"gpu-{config.device.replace(':', '')}.lock"))
    if config.lock_path:
        Path(config.lock_path).parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", ".turnstile", ".memory"):
            Path(config.lock_path + suffix).touch()
    return config


def _run_all(jobs: Iterable[tuple[object, Callable[[], object]]], parallel: int, on_result: Callable[[object, object], None],
             description: str, total: int) -> None:
    """Run job thunks on `parallel` threads (each drives a subprocess), reporting with a progress bar."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    # Progress on stderr: stdout carries results (--json).
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=False) as progress, ThreadPoolExecutor(max_workers=parallel) as pool:
        bar = progress.add_task(description, total=total)
        futures: dict[Future, object] = {pool.submit(thunk): key for key, thunk in jobs}
        try:
            for future in as_completed(futures):
                on_result(futures[future], future.result())
                progress.advance(bar)
        except BaseException:  # Ctrl-C or a timeout's SIGINT: stop at once; what is stored stays stored
            pool.shutdown(wait=False, cancel_futures=True)
            stop_live_judges()
            raise


def run_submission(submission_dir: str | Path, tasks: list[Task], store: Store, name: str, config: EvalConfig,
                   parallel: int = 1, levels: list[int] | None = None, kb_version: str | None = None) -> list[Verdict]:
    """Evaluate every task against the submission's file for it; missing files count as failed."""
    config = _batch_config(config, parallel)
    files = submission_files(submission_dir)
    store.add_submission(name, str(submission_dir), config.timing_mode, levels=levels, kb_version=kb_version)
    stored = {(v.get("kb_version"), v["level"], v["problem_id"]): v for v in store.verdicts(name)}
    env = machine_env(config.device)
    # Resume: skip what is stored, except problems stored as missing whose file exists now.
    todo = [t for t in tasks if (t.kb_version, t.level, t.problem_id) not in stored
            or (stored[(t.kb_version, t.level, t.problem_id)].get("reason") == NO_FILE and (t.level, t.problem_id) in files)]

    def job(task: Task) -> Verdict:
        path = files.get((task.level, task.problem_id))
        if path is None:
            verdict = Verdict(status=Status.RUNTIME_ERROR, level=task.level, problem_id=task.problem_id, name=task.name,
                              kb_version=task.kb_version, reason=NO_FILE,
                              timing_mode=config.timing_mode)
            return verdict.finish()
        cached = store.get_baseline(baseline_key(task, env, config.timing_mode))
        return evaluate_candidate(task.code, path.read_text(), config, task=task,
                                  t_compile_ms=cached["t_compile_ms"] if cached else None)

    def record(task: Task, verdict: Verdict) -> None:
        store.add_verdict(name, verdict.to_dict())
        if verdict.t_compile_ms and verdict.t_eager_ms and not store.get_baseline(baseline_key(task, env, config.timing_mode)):
            store.put_baseline(baseline_key(task, env, config.timing_mode),
                               {"t_eager_ms": verdict.t_eager_ms, "t_compile_ms": verdict.t_compile_ms, "source": "eval"})

    _run_all(((t, lambda t=t: job(t)) for t in todo), parallel, record, f"eval {name}", len(todo))
    wanted = {(t.kb_version, t.level, t.problem_id) for t in tasks}
    return [Verdict.from_dict(v) for v in store.verdicts(name) if (v.get("kb_version"), v["level"], v["problem_id"]) in wanted]


def run_baselines(tasks: list[Task], store: Store, config: EvalConfig, parallel: int = 1,
                  chunk: int = 4) -> dict[str, dict]:
    """Time eager and torch.compile for every task not cached yet; returns {task.id: record}."""
    config = _batch_config(config, parallel)
    env = machine_env(config.device)
    todo = [t for t in tasks if store.get_baseline(baseline_key(t, env, config.timing_mode)) is None]
    results: dict[str, dict] = {}

    def record(task: Task, result: dict) -> None:
        results[task.id] = result
        if result.get("t_eager_ms") is not None:
            store.put_baseline(baseline_key(task, env, config.timing_mode), result)

    # Phase 1 fills the inductor and Triton caches with every judge compiling at once (nothing is
    # timed, so they may share the GPU). Phase 2 times with the GPU held exclusively; its compiles
    # are cache hits, so a judge waiting to time never waits long behind a compile. Each judge
    # takes a few tasks, so process start-up and compiler initialisation are paid once for them.
    chunks = [todo[i:i + chunk] for i in range(0, len(todo), chunk)]
    warm = ((c, lambda c=c: run_reference_jobs(c, "warm", config)) for c in chunks)
    _run_all(warm, parallel, lambda c, r: None, f"compile, {chunk} problems per judge", len(chunks))

    def record_chunk(chunk_tasks: list[Task], chunk_results: list[dict]) -> None:
        for task, result in zip(chunk_tasks, chunk_results):
            record(task, result)

    jobs = ((c, lambda c=c: run_reference_jobs(c, "baseline", config)) for c in chunks)
    _run_all(jobs, parallel, record_chunk, f"time, {chunk} problems per judge", len(chunks))
    for task in tasks:
        results.setdefault(task.id, store.get_baseline(baseline_key(task, env, config.timing_mode)) or {})
    return results


def run_audit(tasks: list[Task], config: EvalConfig, parallel: int = 1, chunk: int = 4) -> list[dict]:
    """For every task, the degenerate probes its correctness check accepts (contract: `audit kernelbench`)."""
    config = _batch_config(config, parallel)
    rows: dict[str, dict] = {}

    def record(chunk_tasks: list[Task], results: list[dict]) -> None:
        for task, result in zip(chunk_tasks, results):
            row = {"level": task.level, "problem_id": task.problem_id, "name": task.name,
                   "accepts": result.get("accepts", [])}
            if "accepts" not in result:
                row["error"] = result.get("reason", "failed")
            rows[task.id] = row

    chunks = [tasks[i:i + chunk] for i in range(0, len(tasks), chunk)]
    _run_all(((c, lambda c=c: run_reference_jobs(c, "audit", config)) for c in chunks), parallel, record,
             f"audit, {chunk} problems per judge", len(chunks))
    return [rows[t.id] for t in tasks]
