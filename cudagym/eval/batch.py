"""Many problems at once: a submission's eval, the baselines, the degenerate-problem audit.

Judges run concurrently (`parallel` processes): building extensions and torch.compile use all CPU
cores, while the GPU readers-writer lock keeps timing exclusive. The calling thread is the only
DuckDB writer; every result is stored the moment it arrives, so a killed run resumes where it
stopped.

Where judges run is the runner's business (`open_pool`): `local` is threads on this
machine; `ray` is one worker per GPU of a Ray cluster (`cudagym.eval.ray_runner`). A job is a
picklable callable of the `Worker` it lands on (that worker's config and machine), so the same
jobs and the same recording serve both.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

from cudagym.eval.evaluate import EvalConfig, evaluate_candidate, clear_stop, run_reference_jobs, stop_live_judges
from cudagym.eval.gpulock import timing_cpu_split
from cudagym.eval.store import BaselineKey, Store
from cudagym.eval.verdict import Status, Verdict
from cudagym.tasks import Task, TaskError

SUBMISSION_FILE = re.compile(r"^(\d+)(?:_.*)?\.py$")
NO_FILE = "no file for this problem in the submission"
RUNNERS = ("local", "ray")
TIMING_JUDGES_PER_GPU = 4  # timing passes (baselines, GPU filter): enough judges to prepare while one holds the GPU
DRAIN_S = 30.0  # after a stop, how long to wait for the stopped judges' finished work


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


def _batch_config(config: EvalConfig, parallel: int, gpu_slot: tuple[int, int] | None = None) -> EvalConfig:
    """Judges side by side: share the GPU through a lock file, and the CPU cores between them.
    gpu_slot: (this GPU's index, GPUs on the host), where the device's own index does not say it
    (a Ray worker sees its GPU as cuda:0)."""
    if config.device.startswith("cuda") and config.timing_cpus is None:  # this GPU's timing cores (gpulock)
        if gpu_slot is None:
            import torch

            gpu_slot = (int(config.device.split(":")[1]), torch.cuda.device_count())
        timing, work = timing_cpu_split(*gpu_slot, os.sched_getaffinity(0))
        config = replace(config, timing_cpus=timing, work_cpus=work)
    if parallel > 1 and not config.compile_threads:
        config = replace(config, compile_threads=max(1, len(config.work_cpus or os.sched_getaffinity(0)) // parallel))
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
    clear_stop()
    with progress_bar(description, total) as advance, ThreadPoolExecutor(max_workers=parallel) as pool:
        futures: dict[Future, object] = {pool.submit(thunk): key for key, thunk in jobs}
        recorded: set[Future] = set()
        try:
            for future in as_completed(futures):
                on_result(futures[future], future.result())
                recorded.add(future)
                advance()
        except BaseException:  # Ctrl-C or a timeout's SIGINT: stop now, but keep what was finished
            pool.shutdown(wait=False, cancel_futures=True)
            stop_live_judges()
            # The stopped judges' threads return at once with what their judges had finished (a
            # chunk of tasks may be half done); store that before going.
            try:
                finished, _ = wait([f for f in futures if f not in recorded and not f.cancelled()], timeout=DRAIN_S)
                for future in finished:
                    if future.exception() is None:
                        on_result(futures[future], future.result())
            finally:
                clear_stop()
            raise


@contextlib.contextmanager
def progress_bar(description: str, total: int):
    """A progress bar on stderr (stdout carries results, --json); yields the function that advances it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=False) as progress:
        bar = progress.add_task(description, total=total)
        yield lambda: progress.advance(bar)


# -- runners: where jobs run ------------------------------------------------------------------------
@dataclass(frozen=True)
class Worker:
    """Where a job runs: the judge config for that worker's GPU (device, lock file, compile threads)
    and the machine its baselines belong to (`machine_env`)."""

    config: EvalConfig
    env: dict


Job = Callable[[Worker], object]  # for the ray runner picklable: a module-level function, or a partial of one


class LocalPool:
    """This machine: `parallel` threads, each driving a judge subprocess (the `local` runner)."""

    def __init__(self, config: EvalConfig, parallel: int = 1):
        self.parallel = parallel
        self.worker = Worker(_batch_config(config, parallel), machine_env(config.device))
        self.envs = [self.worker.env]
        self.n_workers = 1

    def run(self, jobs: Iterable[tuple[object, Job]], on_result: Callable[[object, object], None], description: str,
            total: int) -> None:
        _run_all(((key, partial(job, self.worker)) for key, job in jobs), self.parallel, on_result, description, total)

    def __enter__(self) -> "LocalPool":
        return self

    def __exit__(self, *exc) -> None:
        pass


def open_pool(config: EvalConfig, parallel: int = 1, runner: str = "local", address: str | None = None):
    """The workers jobs run on, as a context manager with `envs` (the machines of its workers) and
    `run(jobs, on_result, description, total)`: `parallel` threads here (local), or one worker per GPU
    of a Ray cluster with `parallel` judges each (ray: the cluster at `address`, else a local one), and
    `n_workers`, how many workers (GPUs) it has."""
    if runner not in RUNNERS:
        raise ValueError(f"unknown runner {runner!r} (choose from {', '.join(RUNNERS)})")
    if runner == "ray":
        from cudagym.eval.ray_runner import RayPool

        return RayPool(config, parallel, address=address)
    if address:
        raise ValueError("--address is for --runner ray")
    return LocalPool(config, parallel)


def _eval_job(task: Task, candidate_code: str, baselines: dict[BaselineKey, dict],
              worker: Worker) -> tuple[dict, Verdict]:
    """A candidate on a worker, with the torch.compile time cached for that worker's machine if any.
    The verdict's timing records the live eager time against the cached one (`eager_vs_baseline`):
    the compile time is not re-timed, so when the GPU ran this problem at another speed than when its
    baseline was cached (H200: 2.5x slower for a whole problem, once per run or so), speedup_vs_compile
    is off by as much, and this ratio shows it."""
    cached = baselines.get(baseline_key(task, worker.env, worker.config.timing_mode)) or {}
    verdict = evaluate_candidate(task.code, candidate_code, worker.config, task=task, t_compile_ms=cached.get("t_compile_ms"))
    if verdict.t_eager_ms and cached.get("t_eager_ms"):
        verdict.timing["eager_vs_baseline"] = float(f"{verdict.t_eager_ms / cached['t_eager_ms']:.4g}")
    return worker.env, verdict


def reference_job(tasks: list[Task], mode: str, skip: frozenset[BaselineKey], worker: Worker) -> tuple[dict, dict[str, dict]]:
    """Reference runs (mode baseline, warm, audit or filter) of a few tasks in one judge, leaving out tasks
    whose baseline the worker's machine has already; (machine, {task.id: result})."""
    todo = [t for t in tasks if baseline_key(t, worker.env, worker.config.timing_mode) not in skip]
    results = run_reference_jobs(todo, mode, worker.config) if todo else []
    return worker.env, {t.id: r for t, r in zip(todo, results) if r is not None}  # None: stopped before it ran


def chunks_of(tasks: list[Task], size: int) -> list[list[Task]]:
    return [tasks[i:i + size] for i in range(0, len(tasks), size)]


def strided(tasks: list[Task], n: int) -> list[list[Task]]:
    """At most n shares of the tasks, dealt out in turn: each share has its part of every level."""
    n = min(n, len(tasks))
    return [tasks[i::n] for i in range(n)]


def timing_shares(tasks: list[Task], pool, parallel: int) -> list[list[Task]]:
    """The tasks of a timing pass (baselines, the GPU filter), for a few long-lived judges per GPU:
    timing is serial on a GPU, so more judges only wait, and one judge per task would pay compiler
    start-up (~10 s, under the shared lock, holding up the judge waiting to time) per task."""
    return strided(tasks, pool.n_workers * min(parallel, TIMING_JUDGES_PER_GPU))


def dispatch_reference(tasks: list[Task], mode: str, on_result: Callable[[Task, dict, dict], None], config: EvalConfig,
                       parallel: int = 1, chunk: int = 4, runner: str = "local", address: str | None = None,
                       description: str = "") -> None:
    """Reference runs of every task in `mode` (audit, filter), `chunk` tasks per judge;
    on_result(task, machine env, result) runs in this thread once per task."""
    with open_pool(config, parallel, runner, address) as pool:
        run_references(pool, chunks_of(tasks, chunk), mode, on_result, description or f"{mode}, {chunk} tasks per judge")


def run_references(pool, shares: list[list[Task]], mode: str, on_result: Callable[[Task, dict, dict], None],
                   description: str) -> None:
    """On an open pool, one judge per share of tasks, each running its tasks in `mode`;
    on_result(task, machine env, result) runs in this thread once per finished task."""
    def record(share: list[Task], result: tuple[dict, dict[str, dict]]) -> None:
        env, by_id = result
        for task in share:
            if task.id in by_id:  # a stopped judge reports only what it finished
                on_result(task, env, by_id[task.id])

    pool.run(((s, partial(reference_job, s, mode, frozenset())) for s in shares), record, description, len(shares))


def run_submission(submission_dir: str | Path, tasks: list[Task], store: Store, name: str, config: EvalConfig,
                   parallel: int = 1, levels: list[int] | None = None, kb_version: str | None = None,
                   runner: str = "local", address: str | None = None) -> list[Verdict]:
    """Evaluate every task against the submission's file for it; missing files count as failed."""
    files = submission_files(submission_dir)
    store.add_submission(name, str(submission_dir), config.timing_mode, levels=levels, kb_version=kb_version)
    stored = {(v.get("kb_version"), v["level"], v["problem_id"]): v for v in store.verdicts(name)}
    # Resume: skip what is stored, except problems stored as missing whose file exists now.
    todo = [t for t in tasks if (t.kb_version, t.level, t.problem_id) not in stored
            or (stored[(t.kb_version, t.level, t.problem_id)].get("reason") == NO_FILE and (t.level, t.problem_id) in files)]
    for task in todo:
        if (task.level, task.problem_id) not in files:  # no judge needed
            store.add_verdict(name, Verdict(status=Status.RUNTIME_ERROR, level=task.level, problem_id=task.problem_id,
                                            name=task.name, kb_version=task.kb_version, reason=NO_FILE,
                                            timing_mode=config.timing_mode).finish().to_dict())
    todo = [t for t in todo if (t.level, t.problem_id) in files]

    def record(task: Task, result: tuple[dict, Verdict]) -> None:
        env, verdict = result
        store.add_verdict(name, verdict.to_dict())
        key = baseline_key(task, env, config.timing_mode)
        if verdict.t_compile_ms and verdict.t_eager_ms and not store.get_baseline(key):
            store.put_baseline(key, {"t_eager_ms": verdict.t_eager_ms, "t_compile_ms": verdict.t_compile_ms, "source": "eval"})

    def job(task: Task, envs: list[dict]) -> Job:
        keys = [baseline_key(task, env, config.timing_mode) for env in envs]
        cached = {key: found for key in keys if (found := store.get_baseline(key))}
        return partial(_eval_job, task, files[(task.level, task.problem_id)].read_text(), cached)

    if todo:  # a finished run starts no workers
        with open_pool(config, parallel, runner, address) as pool:
            pool.run(((t, job(t, pool.envs)) for t in todo), record, f"eval {name}", len(todo))
    wanted = {(t.kb_version, t.level, t.problem_id) for t in tasks}
    return [Verdict.from_dict(v) for v in store.verdicts(name) if (v.get("kb_version"), v["level"], v["problem_id"]) in wanted]


def run_baselines(tasks: list[Task], store: Store, config: EvalConfig, parallel: int = 1,
                  chunk: int = 4, runner: str = "local", address: str | None = None) -> dict[str, dict]:
    """Time eager and torch.compile for every task not cached yet for the workers' machines (a
    cluster of one GPU model times each task once); returns {task.id: record}."""
    results: dict[str, dict] = {}

    def record_chunk(chunk_tasks: list[Task], result: tuple[dict, dict[str, dict]]) -> None:
        env, by_id = result
        for task in chunk_tasks:
            if task.id in by_id:
                results[task.id] = by_id[task.id]
                if by_id[task.id].get("t_eager_ms") is not None:
                    store.put_baseline(baseline_key(task, env, config.timing_mode), by_id[task.id])

    with open_pool(config, parallel, runner, address) as pool:
        keys = {t.id: [baseline_key(t, env, config.timing_mode) for env in pool.envs] for t in tasks}
        cached = {key for t in tasks for key in keys[t.id] if store.get_baseline(key) is not None}
        todo = [t for t in tasks if not cached.issuperset(keys[t.id])]
        skip = partial(_cached_keys, keys=keys, cached=cached)
        # Phase 1 fills the inductor and Triton caches with every judge compiling at once (nothing is
        # timed, so they may share the GPU); a few tasks per judge balance the cores. Phase 2 times
        # with the GPU held exclusively, its compiles now cache hits, on a few long-lived judges per
        # GPU (`timing_shares`: one times while the others prepare, each with its part of every level).
        warm = chunks_of(todo, chunk)
        pool.run(((c, partial(reference_job, c, "warm", skip(c))) for c in warm), lambda c, r: None,
                 f"compile, {chunk} problems per judge", len(warm))
        timed = timing_shares(todo, pool, parallel)
        pool.run(((c, partial(reference_job, c, "baseline", skip(c))) for c in timed), record_chunk,
                 f"time, {len(timed)} judges", len(timed))
        env = pool.envs[0]
    for task in tasks:
        results.setdefault(task.id, store.get_baseline(baseline_key(task, env, config.timing_mode)) or {})
    return results


def _cached_keys(tasks: list[Task], keys: dict[str, list[BaselineKey]], cached: set[BaselineKey]) -> frozenset[BaselineKey]:
    return frozenset(key for t in tasks for key in keys[t.id] if key in cached)


def run_audit(tasks: list[Task], config: EvalConfig, parallel: int = 1, chunk: int = 4, runner: str = "local",
              address: str | None = None) -> list[dict]:
    """For every task, the degenerate probes its correctness check accepts (contract: `audit kernelbench`)."""
    rows: dict[str, dict] = {}

    def record(task: Task, env: dict, found: dict) -> None:
        row = {"level": task.level, "problem_id": task.problem_id, "name": task.name, "accepts": found.get("accepts", []),
               "stochastic": found.get("stochastic_ops", [])}
        if "accepts" not in found:
            row["error"] = found.get("reason", "failed")
        rows[task.id] = row

    dispatch_reference(tasks, "audit", record, config, parallel, chunk, runner, address,
                       f"audit, {chunk} problems per judge")
    return [rows[t.id] for t in tasks]
