"""The `ray` runner: batch jobs on every GPU of a Ray cluster, one worker per GPU; the driver records.

`RayPool` (what `batch.open_pool(runner="ray")` returns) starts one `GpuWorker` actor per free GPU
of the cluster at `address` (or of a local cluster it starts for the run). Ray sets each actor's
CUDA_VISIBLE_DEVICES, so its judges use cuda:0, which is that GPU. An actor runs `parallel` jobs at
once on threads, each driving a sandboxed judge exactly as on one machine; a lock file per physical
GPU keeps timing exclusive while the other judges build and compile on that host's cores
(`gpulock`). Jobs are the batch module's (`Job`, in `cudagym.eval.pool`: a picklable callable of the
`Worker`); this module imports `pool`, never `batch`.

The calling thread stays the only DuckDB writer: it hands each job to the least busy worker and
records each result as it arrives. A job whose worker died (process killed, host lost) goes to
another worker, up to `attempts` times in all; the dead worker gets jobs again once Ray has
restarted it and it answers. A result is recorded once: a job lost with its worker returns nothing,
so only the attempt that finished counts. Jobs that used up their attempts are reported after all
the others are recorded, and stay unrecorded for a re-run to resume. A worker Ray restarts on a GPU
first kills the judges its dead predecessor left running there.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

from cudagym.eval.evaluate import EvalConfig, stop_live_judges
from cudagym.eval.gpulock import alive
from cudagym.eval.pool import DRAIN_S, Job, Worker, batch_config, compile_threads, machine_env, progress_bar
from cudagym.tasks.sandbox import kill_tree

ATTEMPTS = 3  # runs of one job, over all workers, before it is given up
MAX_RESTARTS = 3  # restarts of one worker
START_TIMEOUT_S = 600.0  # for the workers to start (a torch import each)
REVIVE_TIMEOUT_S = 900.0  # with jobs left and every worker down, how long to wait for a restart
RELEASE_TIMEOUT_S = 30.0  # after the pool closes, for Ray to free its GPUs
OWNER = "CUDAGYM_GPU_WORKER"  # in a judge's environment: "pid:tag" of the worker that started it (tag: its GPU)
JUDGES = {b"cudagym.eval.judge", b"cudagym.eval.runner"}  # the modules judges and their runners run as


class RunnerError(ValueError):
    """The cluster cannot run the batch (no Ray, no GPU, every worker lost); the message is one line."""


def import_ray():
    try:
        import ray
    except ImportError:
        raise RunnerError("--runner ray needs Ray: pip install 'cudagym[ray]'") from None
    return ray


class GpuWorker:
    """A Ray actor: one GPU (or, on a cluster without GPUs and with --device cpu, one CPU slot) and
    the judges on it."""

    def __init__(self, config: EvalConfig, parallel: int):
        import ray

        gpu_ids = ray.get_gpu_ids()
        self.gpu = str(gpu_ids[0]) if gpu_ids else None
        self.node_id = ray.get_runtime_context().get_node_id()
        device = "cuda:0" if config.device.startswith("cuda") else "cpu"
        lock_path = config.lock_path
        if self.gpu is not None:
            # A real GPU's judges take the machine-wide lock of that GPU (by UUID, gpulock.lock_dir), shared
            # with every other cudagym process on the host; a fake GPU (tests: --device cpu) gets a file of
            # its own. The tag names this GPU's judges, so a restarted worker finds its predecessor's.
            tag = f"gpu-{'cuda' if device != 'cpu' else 'fake'}{self.gpu}"
            if device == "cpu":
                lock_path = str(Path(tempfile.gettempdir()) / "cudagym-locks" / f"{tag}.lock")
            kill_orphaned_judges(tag)
            os.environ[OWNER] = f"{os.getpid()}:{tag}"  # inherited by this worker's judges
        slots = _slots_on_node(self.node_id, "GPU" if self.gpu is not None else "CPU")
        threads = config.compile_threads or compile_threads(os.cpu_count() or 1, slots * parallel)
        config = replace(config, device=device, lock_path=lock_path, compile_threads=threads)
        gpu_slot = (int(self.gpu) % slots, slots) if self.gpu is not None else None  # among the node's GPUs
        self.worker = Worker(batch_config(config, parallel, gpu_slot), machine_env(device))

    def info(self) -> dict:
        return {"gpu": self.gpu, "node_id": self.node_id, "pid": os.getpid(), "env": self.worker.env,
                "config": self.worker.config}

    def run(self, job: Job) -> object:
        return job(self.worker)

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        stop_live_judges()


def kill_orphaned_judges(tag: str) -> int:
    """Kill the judges (and their runners) a dead worker left on this GPU: they run in their own
    sessions, so they outlive it, holding GPU memory and the lock. They are the processes whose
    environment names this GPU's tag and a worker that is gone (OWNER). Returns how many."""
    killed = 0
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or not JUDGES.intersection((proc / "cmdline").read_bytes().split(b"\0")):
                continue
            env = dict(item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item)
        except OSError:
            continue
        owner, _, path = env.get(OWNER.encode(), b"").decode(errors="replace").partition(":")
        if path == tag and owner.isdigit() and not alive(int(owner)):
            kill_tree(int(proc.name))
            killed += 1
    return killed


def _slots_on_node(node_id: str, resource: str) -> int:
    import ray

    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return max(1, int(node["Resources"].get(resource, 1)))
    return 1


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


class RayPool:
    """One `GpuWorker` per free GPU of the cluster; a context manager (closing stops the workers and
    a Ray it started). `workers` holds each worker's info (gpu, node_id, pid, env, config), `envs`
    the distinct machines among them."""

    in_process = False  # jobs run in Ray workers: a job's tasks come back when it returns

    def __init__(self, config: EvalConfig, parallel: int = 1, address: str | None = None, attempts: int = ATTEMPTS):
        ray = import_ray()
        self._ray, self.parallel, self.attempts = ray, max(1, parallel), attempts
        self._owned = not ray.is_initialized()  # a caller's Ray (tests, a Prefect flow) is left running
        self._actors: list = []
        if self._owned:
            _init(ray, address)
        try:
            free = ray.available_resources()
            gpus, cpus = int(free.get("GPU", 0)), int(free.get("CPU", 0))
            if gpus:
                options, n = {"num_gpus": 1, "num_cpus": 0}, gpus
            elif config.device == "cpu" and cpus:
                options, n = {"num_cpus": 1}, cpus
            else:
                raise RunnerError(f"no free GPU in the Ray cluster{' at ' + address if address else ''}")
            self._held = options.get("num_gpus", 0) * n
            # One thread more than jobs per worker, so ping and stop are answered while it is busy.
            actor = ray.remote(GpuWorker).options(max_restarts=MAX_RESTARTS, max_task_retries=0,
                                                  max_concurrency=self.parallel + 1, **options)
            self._actors = [actor.remote(config, self.parallel) for _ in range(n)]
            self.workers = self._start()
        except BaseException:
            self.close()
            raise
        self._ready = set(self.workers)
        self.n_workers = len(self.workers)
        self.envs = list({tuple(sorted(w["env"].items())): w["env"] for w in self.workers.values()}.values())

    def _start(self) -> dict[int, dict]:
        """Info of every worker that started; the others are stopped."""
        ray = self._ray
        refs = {actor.info.remote(): i for i, actor in enumerate(self._actors)}
        done, late = ray.wait(list(refs), num_returns=len(refs), timeout=START_TIMEOUT_S)
        workers, error = {}, None
        for ref in done:
            try:
                workers[refs[ref]] = ray.get(ref)
            except ray.exceptions.RayError as e:  # its __init__ failed
                error = e
        for ref in late:
            ray.kill(self._actors[refs[ref]])
        if not workers:
            raise RunnerError(f"no Ray worker started: {_first_line(error) if error else 'none within the timeout'}")
        return workers

    def run(self, jobs: Iterable[tuple[object, Job]], on_result: Callable[[object, object], None], description: str,
            total: int | None = None) -> None:
        """Run every job; on_result(key, result) in this thread, once per job, as results arrive."""
        ray = self._ray
        from ray.exceptions import (ActorUnavailableError, NodeDiedError, ObjectLostError, OutOfMemoryError, RayActorError,
                                    WorkerCrashedError)

        lost_errors = (RayActorError, WorkerCrashedError, NodeDiedError, OutOfMemoryError, ObjectLostError)
        queue = deque((key, job, 1) for key, job in jobs)
        busy = {i: 0 for i in self.workers}
        running: dict = {}  # ref -> (key, job, attempt, worker)
        probes: dict = {}  # ref -> worker (down: given no jobs until it answers)
        given_up: list[tuple[object, BaseException]] = []
        n_jobs, down_since = len(queue), None

        def suspect(i: int) -> None:
            if i in self._ready:
                self._ready.discard(i)
                probes[self._actors[i].ping.remote()] = i

        with progress_bar(description, total if total is not None else n_jobs) as advance:
            try:
                while queue or running:
                    while queue and (idle := [i for i in self._ready if busy[i] < self.parallel]):
                        i = min(idle, key=busy.__getitem__)
                        key, job, attempt = queue.popleft()
                        running[self._actors[i].run.remote(job)] = (key, job, attempt, i)
                        busy[i] += 1
                    if not running and not probes:
                        raise RunnerError(f"every Ray worker is gone with {len(queue)} jobs left; what finished is"
                                          " stored, re-run to resume")
                    done, _ = ray.wait(list(running) + list(probes), num_returns=1, timeout=30)
                    if not done:
                        down_since = down_since or time.monotonic()
                        if not running and time.monotonic() - down_since > REVIVE_TIMEOUT_S:
                            raise RunnerError(f"no Ray worker came back in {REVIVE_TIMEOUT_S:.0f} s with {len(queue)} jobs"
                                              " left; what finished is stored, re-run to resume")
                        continue
                    down_since = None
                    for ref in done:
                        if ref in probes:
                            i = probes.pop(ref)
                            try:
                                ray.get(ref)
                                self._ready.add(i)
                            except ActorUnavailableError:  # still restarting: ask again
                                time.sleep(1)
                                probes[self._actors[i].ping.remote()] = i
                            except RayActorError:  # dead for good
                                logging.getLogger(__name__).warning("Ray worker %d is gone", i)
                            continue
                        key, job, attempt, i = running.pop(ref)
                        busy[i] -= 1
                        try:
                            result = ray.get(ref)
                        except lost_errors as e:  # the worker died under the job: another one runs it
                            suspect(i)
                            if attempt < self.attempts:
                                queue.appendleft((key, job, attempt + 1))
                            else:
                                given_up.append((key, e))
                            continue
                        on_result(key, result)
                        advance()
            except KeyboardInterrupt:  # stopped: keep what the stopped judges had finished
                self._drain(running, on_result)
                raise
        if given_up:
            raise RunnerError(f"{len(given_up)} of {n_jobs} jobs lost their worker {self.attempts} times (last:"
                              f" {_first_line(given_up[-1][1])}); the others are stored, re-run to retry these")

    def _drain(self, running: dict, on_result: Callable[[object, object], None]) -> None:
        """Stop every judge, then record the results its job returns with (a multi-task judge's
        finished tasks), waiting at most DRAIN_S; jobs of killed candidates return nothing."""
        ray = self._ray
        try:
            ray.get([actor.stop.remote() for actor in self._actors], timeout=30)
            finished, _ = ray.wait(list(running), num_returns=len(running), timeout=DRAIN_S)
        except Exception:  # noqa: BLE001 - the cluster is going; what is stored stays stored
            return
        for ref in finished:
            try:
                result = ray.get(ref)
            except Exception:  # noqa: BLE001 - an interrupted judge, or a lost worker
                continue
            on_result(running[ref][0], result)

    def close(self, stop_judges: bool = False) -> None:
        ray = self._ray
        if stop_judges and self._actors:  # an interrupted run: the judges go too (they run in their own sessions)
            try:
                ray.get([actor.stop.remote() for actor in self._actors], timeout=30)
            except Exception:
                pass
        for actor in self._actors:
            ray.kill(actor)
        if self._owned:
            ray.shutdown()
        elif self._actors:  # a caller's Ray: wait until the next pool can have these GPUs
            gone = [actor.ping.remote() for actor in self._actors]  # each fails once its actor is dead
            ray.wait(gone, num_returns=len(gone), timeout=RELEASE_TIMEOUT_S)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and ray.available_resources().get("GPU", 0) < min(
                    self._held, ray.cluster_resources().get("GPU", 0)):
                time.sleep(0.1)
        self._actors = []

    def __enter__(self) -> "RayPool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(stop_judges=exc_type is not None)


def _init(ray, address: str | None) -> None:
    """Join the cluster at `address` or $RAY_ADDRESS (shipping this cudagym to its workers), or start a
    local one."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    options: dict = {"include_dashboard": False} if address is None else {
        "runtime_env": {"py_modules": [str(Path(__file__).resolve().parents[1])]}}
    if address is None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a cluster of our own reports nowhere
    elif "://" not in address and address.rpartition(":")[2].isdigit():  # host:port: Ray would retry for minutes
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except OSError as e:
            raise RunnerError(f"cannot reach the Ray cluster at {address}: {e}") from None
    try:
        # "local": without an address, a cluster of our own, as the help says, even where another runs on
        # this machine (Ray would join that one; `--address auto` does that on purpose)
        ray.init(address=address or "local", log_to_driver=False, logging_level=logging.WARNING, **options)
    except (ConnectionError, RuntimeError, ValueError) as e:
        what = f"reach the Ray cluster at {address}" if address else "start Ray"
        raise RunnerError(f"cannot {what}: {_first_line(e)}") from None
