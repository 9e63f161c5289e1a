"""Many problems at once: a submission's eval, the baselines, the degenerate-problem audit.

Judges run concurrently (`parallel` processes): building extensions and torch.compile use all CPU
cores, while the GPU readers-writer lock keeps timing exclusive. Every result is stored the moment
it arrives, so a killed run resumes where it stopped: by the calling thread, except a baseline run's
(`run_baselines`), whose judges' threads store each baseline as their judge writes it (one Store,
each write on its own cursor).

Where judges run is the runner's business (`open_pool`): `local` is threads on this
machine (`cudagym.eval.pool`); `ray` is one worker per GPU of a Ray cluster
(`cudagym.eval.ray_runner`). A job is a picklable callable of the `Worker` it lands on (that
worker's config and machine), so the same jobs and the same recording serve both.

Every selection is keyed by its precision as well as its timing mode (`EvalConfig.precision`):
baselines by `baseline_key`'s dtype, verdicts and audits by their own column, so a run never
resumes from, or times against, another precision's results. An eval run audits its problems first
(`audit_rows`, stored in the `audits` table and reused) and marks each verdict of a problem whose
check cannot tell a real kernel from a trivial one (`degenerate`, with the problem's `cost`).
"""

from __future__ import annotations

import datetime
import re
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Callable

from cudagym.eval.checks import Tolerance, degenerate_reason
from cudagym.eval.evaluate import (CANDIDATE_FILE_SUFFIXES, EvalConfig, evaluate_candidate, judges_lock_dir,
                                   run_queued_jobs, run_reference_jobs)
from cudagym.eval.gpulock import task_queue
from cudagym.eval.pool import (DRAIN_S, Job, LocalPool, Worker, batch_config, machine_env,  # noqa: F401 - re-exported
                               progress_bar, run_all)
from cudagym.eval.store import AuditKey, BaselineKey, Store
from cudagym.eval.verdict import Status, Verdict
from cudagym.tasks import Task, TaskError

SUBMISSION_FILE = re.compile(r"^(\d+)(?:_.*)?\.py$")
NO_FILE = "no file for this problem in the submission"
RUNNERS = ("local", "ray")
TIMING_JUDGES_PER_GPU = 4  # a baseline run's timing judges: enough to prepare while one holds the GPU, beside its compile judges
AUDIT_CHUNK = 4  # problems per audit judge
# A baseline's dtype names its precision regime, so the cache never mixes them (EvalConfig.precision).
PRECISION_DTYPES = {"strict": "float32-notf32", "kernelbench": "float32-kernelbench"}


def baseline_key(task: Task, env: dict, timing_mode: str, precision: str = "strict") -> BaselineKey:
    """The cache key of a task's baseline on a machine: fp32 with TF32 off (precision strict) or
    torch's defaults (kernelbench) are different dtypes. Strict on a GPU names its method (launches
    queued behind a spin, timing.Timer), so a store timed by the earlier event window is never mixed with it."""
    return BaselineKey(task.sha256, env["gpu"], env["torch"], env["cuda"], PRECISION_DTYPES[precision],
                       baseline_method(timing_mode, env["gpu"]))


def baseline_method(timing_mode: str, gpu: str) -> str:
    """The baselines table's timing_mode column: strict on a GPU is `strict-queued` (see baseline_key)."""
    return f"{timing_mode}-queued" if timing_mode == "strict" and gpu != "cpu" else timing_mode


def audit_key(task: Task, env: dict, config: EvalConfig) -> AuditKey:
    """The store key of a task's audit: its code, the tolerance, the device kind ("cpu" or the GPU's
    name) and the precision."""
    return AuditKey(task.sha256, config.atol, config.rtol, env["gpu"], config.precision)


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


def candidate_files(path: str | Path) -> dict[str, str]:
    """The extra C++/CUDA files of a submission's candidate: level{L}/{id}_name.py may come with a folder
    level{L}/{id}_name/ (e.g. an agent's kernels/); its sources and headers go to the judge beside the
    candidate, under their paths relative to that folder (`evaluate_candidate(files=)`)."""
    folder = Path(path).with_suffix("")
    if not folder.is_dir():
        return {}
    return {str(f.relative_to(folder)): f.read_text() for f in sorted(folder.rglob("*"))
            if f.is_file() and f.name.endswith(CANDIDATE_FILE_SUFFIXES)}


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
              worker: Worker, files: dict[str, str] | None = None) -> tuple[dict, Verdict]:
    """A candidate on a worker, with the torch.compile time cached for that worker's machine if any.
    The verdict's timing records the live eager time against the cached one (`eager_vs_baseline`):
    the compile time is not re-timed, so when the GPU ran this problem at another speed than when its
    baseline was cached (H200: 2.5x slower for a whole problem, once per run or so), speedup_vs_compile
    is off by as much, and this ratio shows it."""
    cached = baselines.get(baseline_key(task, worker.env, worker.config.timing_mode, worker.config.precision)) or {}
    verdict = evaluate_candidate(task.code, candidate_code, worker.config, task=task, t_compile_ms=cached.get("t_compile_ms"),
                                 files=files or None)
    if verdict.t_eager_ms and cached.get("t_eager_ms"):
        verdict.timing["eager_vs_baseline"] = float(f"{verdict.t_eager_ms / cached['t_eager_ms']:.4g}")
    return worker.env, verdict


def reference_job(tasks: list[Task], mode: str, skip: frozenset[BaselineKey], worker: Worker,
                  on_task: Callable[[Task, dict, dict], None] | None = None) -> tuple[dict, dict[str, dict]]:
    """Reference runs (mode baseline, warm, audit or filter) of a few tasks in one judge, leaving out tasks
    whose baseline the worker's machine has already; (machine, {task.id: result}). on_task(task, machine,
    result): each task as its judge finishes it (local pools only: it runs in the job's thread)."""
    todo = [t for t in tasks
            if baseline_key(t, worker.env, worker.config.timing_mode, worker.config.precision) not in skip]
    streamed = (lambda i, result: on_task(todo[i], worker.env, result)) if on_task else None
    results = run_reference_jobs(todo, mode, worker.config, on_result=streamed) if todo else []
    return worker.env, {t.id: r for t, r in zip(todo, results) if r is not None}  # None: stopped before it ran


def chunks_of(tasks: list[Task], size: int) -> list[list[Task]]:
    return [tasks[i:i + size] for i in range(0, len(tasks), size)]


def strided(tasks: list[Task], n: int) -> list[list[Task]]:
    """At most n shares of the tasks, dealt out in turn: each share has its part of every level."""
    n = min(n, len(tasks))
    return [tasks[i::n] for i in range(n)]


def longest_compiles_first(tasks: list[Task]) -> list[Task]:
    """The compile judges' queue, by an estimate of each problem's torch.compile time, longest first
    (the makespan rule for jobs of unequal length: a long job started last is the run's tail). The
    estimate is what is known before anything runs: KernelBench's level (one operator, a fusion, a
    network) and then the length of the source. On the H200's cold run (session 18) levels 1 and 2
    compiled in 2-13 s each under load and level 3 in up to 163 s; among level 3, the source length
    ranked compile times with Spearman 0.71, above the module count of a built model (0.60). In order,
    level 3 was compiled last, and the run waited ~2 min for its networks (ResNet101 began at 27 s of a
    36-problem run and ended it)."""
    return sorted(tasks, key=lambda t: (t.level or 0, len(t.code)), reverse=True)


def baseline_timers(parallel: int) -> int:
    """Timing judges per GPU in a baseline run: at most TIMING_JUDGES_PER_GPU and half the judges,
    the rest compiling ahead of them (one judge: it compiles and times in turn)."""
    return max(1, min(TIMING_JUDGES_PER_GPU, parallel // 2))


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
    pool.run(((s, partial(reference_job, s, mode, frozenset())) for s in shares),
             lambda share, result: report_finished(share, result, on_result), description, len(shares))


def report_finished(tasks: list[Task], result: tuple[dict, dict[str, dict]],
                    on_result: Callable[[Task, dict, dict], None]) -> None:
    """A judge's job ended: on_result(task, machine env, result) for each of its tasks that it finished
    (a stopped judge reports only those, a judge of a queue only those it took)."""
    env, by_id = result
    for task in tasks:
        if task.id in by_id:
            on_result(task, env, by_id[task.id])


def queued_job(tasks: list[Task], mode: str, queue: str, worker: Worker) -> tuple[dict, dict[str, dict]]:
    """One judge of a pass sharing `tasks` as one queue (`run_queue`): (machine, {task.id: result}) of
    the tasks it ran."""
    results = run_queued_jobs(tasks, mode, worker.config, queue)
    return worker.env, {t.id: r for t, r in zip(tasks, results) if r is not None}


def run_queue(pool, tasks: list[Task], mode: str, judges: int, chunk: int,
              on_result: Callable[[Task, dict, dict], None], description: str) -> None:
    """On an open pool, `judges` judges share the tasks as one queue, each taking the next task no judge
    has taken (judge.Request.queue), so a pass ends when its tasks are done, not with the judge whose
    fixed share held the slow ones: on the H100 (session 25) half of a filter pass's 87 tasks were done
    at 70 s and the last at 113 s, in shares of 6. on_result(task, machine env, result) runs in this
    thread once per finished task. A Ray pool's judges run on other machines, which see no queue
    folder of this one: they get shares of `chunk` tasks (run_references)."""
    if not tasks:
        return
    if not getattr(pool, "in_process", False):
        run_references(pool, chunks_of(tasks, chunk), mode, on_result, description)
        return
    judges = max(1, min(judges, len(tasks)))
    with task_queue(judges_lock_dir(pool.worker.config)) as queue:
        pool.run(((i, partial(queued_job, tasks, mode, queue)) for i in range(judges)),
                 lambda _, result: report_finished(tasks, result, on_result), description, judges)


def run_submission(submission_dir: str | Path, tasks: list[Task], store: Store, name: str, config: EvalConfig,
                   parallel: int = 1, levels: list[int] | None = None, kb_version: str | None = None,
                   runner: str = "local", address: str | None = None) -> list[Verdict]:
    """Evaluate every task against the submission's file for it; missing files count as failed.

    The run is the submission's in the config's timing mode and precision: it resumes from, and
    returns, verdicts of that mode and precision only (the name's other runs stay as they are).
    The problems to evaluate are audited first (`audit_rows`), and each new verdict carries its
    problem's `degenerate` reason and `cost` from the audit (an audit that failed marks nothing)."""
    files = submission_files(submission_dir)
    run = {"timing_mode": config.timing_mode, "precision": config.precision}
    store.add_submission(name, str(submission_dir), config.timing_mode, levels=levels, kb_version=kb_version,
                         precision=config.precision)
    stored = {(v.get("kb_version"), v["level"], v["problem_id"]): v for v in store.verdicts(name, **run)}
    # Resume: skip what is stored, except problems stored as missing whose file exists now.
    todo = [t for t in tasks if (t.kb_version, t.level, t.problem_id) not in stored
            or (stored[(t.kb_version, t.level, t.problem_id)].get("reason") == NO_FILE and (t.level, t.problem_id) in files)]
    audits: dict[str, dict] = {}

    def add(verdict: Verdict, task: Task) -> None:
        row = audits.get(task.id) or {}
        if row and "error" not in row:
            verdict.degenerate, verdict.cost = row.get("degenerate"), row.get("cost")
        store.add_verdict(name, verdict.to_dict())

    def record(task: Task, result: tuple[dict, Verdict]) -> None:
        env, verdict = result
        add(verdict, task)
        key = baseline_key(task, env, config.timing_mode, config.precision)
        if verdict.t_compile_ms and verdict.t_eager_ms and not store.get_baseline(key):
            store.put_baseline(key, {"t_eager_ms": verdict.t_eager_ms, "t_compile_ms": verdict.t_compile_ms, "source": "eval"})

    def job(task: Task, envs: list[dict]) -> Job:
        keys = [baseline_key(task, env, config.timing_mode, config.precision) for env in envs]
        cached = {key: found for key in keys if (found := store.get_baseline(key))}
        path = files[(task.level, task.problem_id)]
        return partial(_eval_job, task, path.read_text(), cached, files=candidate_files(path))

    if todo:  # a finished run starts no workers
        with open_pool(config, parallel, runner, address) as pool:
            audits.update(audit_rows(todo, store, pool, config))
            for task in todo:
                if (task.level, task.problem_id) not in files:  # no judge needed
                    add(Verdict(status=Status.RUNTIME_ERROR, level=task.level, problem_id=task.problem_id,
                                name=task.name, kb_version=task.kb_version, reason=NO_FILE,
                                timing_mode=config.timing_mode, precision=config.precision).finish(), task)
            todo = [t for t in todo if (t.level, t.problem_id) in files]
            if todo:
                pool.run(((t, job(t, pool.envs)) for t in todo), record, f"eval {name}", len(todo))
    wanted = {(t.kb_version, t.level, t.problem_id) for t in tasks}
    return [Verdict.from_dict(v) for v in store.verdicts(name, **run)
            if (v.get("kb_version"), v["level"], v["problem_id"]) in wanted]


def run_baselines(tasks: list[Task], store: Store, config: EvalConfig, parallel: int = 1,
                  runner: str = "local", address: str | None = None,
                  progress: "BaselineProgress | None" = None) -> dict[str, dict]:
    """Time eager and torch.compile for every task not cached yet for the workers' machines (a
    cluster of one GPU model times each task once); returns {task.id: record}.

    One pipeline: a few long-lived timing judges per GPU (`baseline_timers`, each with its strided
    share of every level, `strided`) build, compile and time their tasks in order, the GPU held alone
    while they time; the other judges, long-lived too, compile the tasks after each timing judge's first,
    longest first (`longest_compiles_first`), as one queue (`judge.reference_compile_claim`), so the
    timing judges find the long compiles in the inductor and Triton caches, and wait for a compile under
    way rather than compiling the same graph beside it. (Level 3 first stored fewer in session 16, when
    a giant's memory share waited behind the long compiles and every later judge behind it; such a
    share is deferred now.) Timing starts with the first compiled problem and runs while the rest
    compile.
    Each baseline is stored the moment its judge writes it (local runner; with Ray, when its judge's
    job returns), so a stopped run keeps every baseline already timed and a rerun times only the
    rest. `progress` (default: lines on stderr) hears of every compile and timing."""
    results: dict[str, dict] = {}
    warmed: set[str] = set()
    lock = threading.Lock()

    with open_pool(config, parallel, runner, address) as pool:
        keys = {t.id: [baseline_key(t, env, config.timing_mode, config.precision) for env in pool.envs] for t in tasks}
        cached = {key for t in tasks for key in keys[t.id] if store.get_baseline(key) is not None}
        todo = [t for t in tasks if not cached.issuperset(keys[t.id])]
        skip = partial(_cached_keys, keys=keys, cached=cached)
        meter = progress or BaselineProgress()
        meter.start(len(todo), len(tasks) - len(todo))

        def timed(task: Task, env: dict, result: dict) -> None:
            with lock:  # judges' threads report at once; the Store is shared by threads, each on its cursor
                if task.id in results:
                    return
                results[task.id] = result
                stored = result.get("t_eager_ms") is not None
                if stored:
                    store.put_baseline(baseline_key(task, env, config.timing_mode, config.precision), result)
                meter.timed(task, result, stored)

        def compiled(task: Task, env: dict, result: dict) -> None:
            with lock:
                if result.get("compiled_elsewhere") or result.get("deferred"):  # another judge compiles it (or
                    return  # compiled it; a deferred one its timing judge does) and reports it
                if task.id not in warmed:  # a job's end repeats what its judge reported
                    warmed.add(task.id)
                    meter.compiled(task, result)

        def record(job: tuple[str, list[Task]], result: tuple[dict, dict[str, dict]]) -> None:
            """A job's end: its tasks not reported yet (a Ray job's, or all when streaming is off)."""
            (stage, share), (env, by_id) = job, result
            for task in share:
                if task.id in by_id:
                    (timed if stage == "time" else compiled)(task, env, by_id[task.id])

        in_process = getattr(pool, "in_process", False)  # jobs run in threads here: they may report each task
        timers = baseline_timers(parallel)
        shares = strided(todo, pool.n_workers * timers)
        # Each timing judge compiles its own first task; the compile judges take the rest, longest first.
        ahead = longest_compiles_first(todo[len(shares):])
        jobs = [(("time", c), partial(reference_job, c, "baseline", skip(c), on_task=timed if in_process else None))
                for c in shares]
        # The compile judges: each walks the whole list, taking the next problem nobody has compiled or
        # claimed (judge.reference_compile_claim), so together they work through it as one queue. The
        # timing judges meanwhile compile their short level-1 and 2 problems themselves where no compile
        # judge has reached them; a task whose memory share cannot be admitted beside the long compiles
        # is deferred (judge.Evaluation.reservation), not left to hold every later judge back.
        jobs += [(("compile", ahead), partial(reference_job, ahead, "warm", skip(ahead),
                                              on_task=compiled if in_process else None))
                 for _ in range(pool.n_workers * (parallel - timers) if ahead else 0)]
        try:
            if jobs:
                pool.run(jobs, record, f"baselines: {len(shares)} timing, {len(ahead)} compile jobs", len(jobs))
        finally:  # stopped too: the last line says how far it got
            meter.finish()
        env = pool.envs[0]
    for task in tasks:
        results.setdefault(task.id, store.get_baseline(baseline_key(task, env, config.timing_mode, config.precision)) or {})
    return results


class BaselineProgress:
    """A baseline run's progress, a line on stderr per event: problems compiled, timed, stored (and
    failed) out of those to do, and an ETA from the timing rate so far. Subclass to show it elsewhere."""

    def __init__(self, stream=None):
        self.stream = stream
        self.total = self.cached = 0
        self.compiled_ids: set[str] = set()
        self.timed_ids: set[str] = set()
        self.n_stored = self.n_failed = 0
        self.t0 = time.monotonic()

    def start(self, total: int, cached: int) -> None:
        self.total, self.cached, self.t0 = total, cached, time.monotonic()
        self.emit(f"{total} to time, {cached} cached")

    def compiled(self, task: Task, result: dict) -> None:
        self.compiled_ids.add(task.id)
        self.emit(f"{task.id} compiled{_phases(result)}" if "compile_s" in result
                  else f"{task.id} not compiled: {result.get('reason', '')}"[:200])

    def timed(self, task: Task, result: dict, stored: bool) -> None:
        self.compiled_ids.add(task.id)
        self.timed_ids.add(task.id)
        self.n_stored += stored
        self.n_failed += not stored
        self.emit(f"{task.id} stored{_phases(result)}" if stored else f"{task.id} failed: {result.get('reason', '')}"[:200])

    def finish(self) -> None:
        self.emit("done" if len(self.timed_ids) == self.total else "stopped")

    def eta(self) -> str:
        done, elapsed = len(self.timed_ids), time.monotonic() - self.t0
        if done == self.total:
            return "0:00:00"
        if not done:
            return "?"
        return str(datetime.timedelta(seconds=round(elapsed / done * (self.total - done))))

    def line(self) -> str:
        n = self.total
        return (f"compiled {len(self.compiled_ids)}/{n} · timed {len(self.timed_ids)}/{n} · stored {self.n_stored}/{n}"
                f" · failed {self.n_failed} · ETA {self.eta()}")

    def emit(self, event: str) -> None:
        print(f"baselines: {self.line()} · {event}", file=self.stream or sys.stderr, flush=True)


def _phases(result: dict) -> str:
    """` (memory 40.1, inputs 2.0, compile 0.1, turn 3.2, timing 0.3 s)`: where the judge's time went."""
    phases = result.get("phase_s") or {}
    return " (" + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()) + " s)" if phases else ""


def _cached_keys(tasks: list[Task], keys: dict[str, list[BaselineKey]], cached: set[BaselineKey]) -> frozenset[BaselineKey]:
    return frozenset(key for t in tasks for key in keys[t.id] if key in cached)


def run_audit(tasks: list[Task], config: EvalConfig, parallel: int = 1, chunk: int = AUDIT_CHUNK, runner: str = "local",
              address: str | None = None, store: Store | None = None) -> list[dict]:
    """For every task, the degenerate probes its correctness check accepts (contract: `audit kernelbench`),
    one row per task (`audit_row`). With a store, rows stored for these tasks are reused and new ones
    stored as they arrive, so a stopped audit resumes."""
    with open_pool(config, parallel, runner, address) as pool:
        rows = audit_rows(tasks, store, pool, config, chunk)
    return [rows[t.id] for t in tasks]


def audit_row(task: Task, found: dict, config: EvalConfig) -> dict:
    """An audit row from the judge's audit result: level, problem_id, name, accepts (the probes the
    check accepts), stochastic (the random ops the reference runs), near (probes within rtol in
    relative L2 on every input set), input_sensitivity, cost ({flops, bytes}), degenerate (why the
    check cannot tell a real kernel from a trivial one, `checks.degenerate_reason`; None if it can),
    and error where the problem could not be audited (such a row marks nothing degenerate)."""
    row = {"level": task.level, "problem_id": task.problem_id, "name": task.name, "accepts": found.get("accepts", []),
           "stochastic": found.get("stochastic_ops", []), "near": found.get("near", []),
           "input_sensitivity": found.get("input_sensitivity"), "cost": found.get("cost"), "degenerate": None}
    if "accepts" not in found:
        row["error"] = found.get("reason", "failed")
    else:
        row["degenerate"] = degenerate_reason(row, Tolerance(config.atol, config.rtol))
    return row


def audit_rows(tasks: list[Task], store: Store | None, pool, config: EvalConfig, chunk: int = AUDIT_CHUNK) -> dict[str, dict]:
    """{task.id: audit row} on an open pool: a row the store holds for the task's code, this tolerance
    and precision and one of the pool's devices is reused; the other tasks are audited (mode audit,
    `chunk` per judge) and their rows stored as they arrive. A row with an error is stored but not
    reused: the next run audits that task again (the failure may have been the machine's)."""
    rows: dict[str, dict] = {}
    for task in tasks if store is not None else []:
        for env in pool.envs:
            found = store.get_audit(audit_key(task, env, config))
            if found is not None and "error" not in found:  # same code: this task's names, the stored findings
                rows[task.id] = dict(found, level=task.level, problem_id=task.problem_id, name=task.name)
                break

    def record(task: Task, env: dict, found: dict) -> None:
        rows[task.id] = audit_row(task, found, config)
        if store is not None:
            store.put_audit(audit_key(task, env, config), rows[task.id])

    todo = [t for t in tasks if t.id not in rows]
    if todo:
        run_references(pool, chunks_of(todo, chunk), "audit", record, f"audit, {chunk} problems per judge")
    return rows
