"""Where batch jobs run: the `Worker` a job lands on, the `local` pool of threads on this machine,
and what every pool shares (a judge config for side-by-side judges, the machine a worker's
baselines belong to, the progress bar).

`cudagym.eval.batch` (what runs: eval, baselines, audit) and `cudagym.eval.ray_runner` (the `ray`
pool) both import this module, and it imports neither: the import graph has no cycle
(tests/eval/test_pool.py keeps it so).
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

from cudagym.eval.evaluate import EvalConfig, enter_scope, new_scope, stop_live_judges, with_timing_cpus

DRAIN_S = 30.0  # after a stop, how long to wait for the stopped judges' finished work


def machine_env(device: str) -> dict:
    """What baselines depend on besides the problem: GPU model, torch and CUDA versions."""
    import torch

    if device.startswith("cuda"):
        return {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__.split("+")[0],
                "cuda": torch.version.cuda or ""}
    return {"gpu": "cpu", "torch": torch.__version__.split("+")[0], "cuda": ""}


def compile_threads(cores: int, judges: int) -> int:
    """Inductor's compile workers per judge when judges run side by side: torch's own
    TORCHINDUCTOR_COMPILE_THREADS where the user set it, else the cores shared out among the judges,
    but at least a quarter of the cores, up to 4. A judge's workers are busy only while inductor
    compiles its kernels, a burst at the end of each compile, so a few workers each seldom contend; a
    network's compile, which has hundreds of kernels, is the tail of a baseline run (ResNet101 under
    load on the H200, session 18: 45.7 s with one worker, 36.0 s with four)."""
    mine = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "").strip()
    if mine.isdigit() and int(mine) > 0:
        return int(mine)
    return max(1, cores // judges, min(4, cores // 4))


def batch_config(config: EvalConfig, parallel: int, gpu_slot: tuple[int, int] | None = None) -> EvalConfig:
    """Judges side by side: share the GPU through a lock file, and the CPU cores between them.
    gpu_slot: (this GPU's index, GPUs on the host), where the device's own index does not say it
    (a Ray worker sees its GPU as cuda:0)."""
    config = with_timing_cpus(config, gpu_slot)  # this GPU's timing cores (gpulock)
    if parallel > 1 and not config.compile_threads:
        config = replace(config, compile_threads=compile_threads(len(config.work_cpus or os.sched_getaffinity(0)), parallel))
    # Without an explicit lock file, every judge takes its device's machine-wide lock (gpulock.lock_dir):
    # judges of this batch, of other cudagym processes and of Ray workers on the host share it.
    if config.lock_path:
        Path(config.lock_path).parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", ".turnstile", ".memory"):
            Path(config.lock_path + suffix).touch()
    return config


def run_all(jobs: Iterable[tuple[object, Callable[[], object]]], parallel: int, on_result: Callable[[object, object], None],
            description: str, total: int) -> None:
    """Run job thunks on `parallel` threads (each drives a subprocess), reporting with a progress bar.
    The threads' judges are this run's own (`evaluate.StopScope`): stopping it stops none of another
    batch's beside it in this process."""
    scope = new_scope()
    with progress_bar(description, total) as advance, \
            ThreadPoolExecutor(max_workers=parallel, initializer=enter_scope, initargs=(scope,)) as pool:
        futures: dict[Future, object] = {pool.submit(thunk): key for key, thunk in jobs}
        recorded: set[Future] = set()
        try:
            for future in as_completed(futures):
                on_result(futures[future], future.result())
                recorded.add(future)
                advance()
        except BaseException:  # Ctrl-C or a timeout's SIGINT: stop now, but keep what was finished
            pool.shutdown(wait=False, cancel_futures=True)
            stop_live_judges(scope)
            # The stopped judges' threads return at once with what their judges had finished (a
            # chunk of tasks may be half done); store that before going. The scope stays stopped: it
            # ends with this run.
            finished, _ = wait([f for f in futures if f not in recorded and not f.cancelled()], timeout=DRAIN_S)
            for future in finished:
                if future.exception() is None:
                    on_result(futures[future], future.result())
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


@dataclass(frozen=True)
class Worker:
    """Where a job runs: the judge config for that worker's GPU (device, lock file, compile threads)
    and the machine its baselines belong to (`machine_env`)."""

    config: EvalConfig
    env: dict


Job = Callable[[Worker], object]  # for the ray runner picklable: a module-level function, or a partial of one


class LocalPool:
    """This machine: `parallel` threads, each driving a judge subprocess (the `local` runner)."""

    in_process = True  # jobs run in threads of this process: they may report each task as it finishes

    def __init__(self, config: EvalConfig, parallel: int = 1):
        self.parallel = parallel
        self.worker = Worker(batch_config(config, parallel), machine_env(config.device))
        self.envs = [self.worker.env]
        self.n_workers = 1

    def run(self, jobs: Iterable[tuple[object, Job]], on_result: Callable[[object, object], None], description: str,
            total: int) -> None:
        run_all(((key, partial(job, self.worker)) for key, job in jobs), self.parallel, on_result, description, total)

    def __enter__(self) -> "LocalPool":
        return self

    def __exit__(self, *exc) -> None:
        pass
