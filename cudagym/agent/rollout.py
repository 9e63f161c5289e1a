"""Batches of rollouts: every (task, sample) of a selection, resumable, with a submission folder.

`run_rollouts(RolloutConfig)` runs, in one asyncio event loop, up to `parallel` rollouts at once.
A rollout is: a fresh workdir and `KernelEnv` (OUT/workdirs/<rollout_id>), the ReAct loop
(`loop.Agent`) against the endpoint, then the judge's `final_verdict()` of the final model_new.py,
whose milestone reward is the rollout's reward. The environment's blocking calls run in threads;
the client's requests share one semaphore (`client_concurrency`). Everything is written to
OUT/trajectories.duckdb as it happens (`store.TrajectoryStore`).

Resuming: a rollout whose row is `finished` is never run again; any other (`running`: the batch
was killed; `failed`: our side raised) restarts from scratch, with a fresh workdir and its partial
rows replaced. Ctrl-C (SIGINT) kills the judges in flight and ends the batch within seconds, its finished
rollouts stored. A model, endpoint or server that crashes, hangs or fails is a recorded result
(stop_reason `client_error`, `wall_time`, ...), and the judge still scores what the workdir holds;
an exception of our own in one rollout marks it `failed` and the batch goes on.

The submission folder OUT/submission/level{L}/{problem_id}_{name}.py holds, per problem, the final
candidate of its best correct rollout (highest reward, then speedup over torch.compile), with its
kernels/ files in the folder level{L}/{problem_id}_{name}/ beside it when it has any:
`cudagym eval run OUT/submission --problems ...` judges it as it is (the same files as KernelEnv sends).
Beside them, OUT/submission/trajectories/level{L}_{id}.html shows the best rollout of every problem,
correct or not (cudagym.agent.pages); the leaderboard's HTML links each problem to its page.

`run_agent_eval` is `run_rollouts` plus the leaderboard's metrics over the best rollout per problem
(every selected problem counts; one without a correct rollout counts as failed).

With `--model scripted:POLICY` and no base URL, an in-process scripted server (cudagym.agent.scripted)
answers: `make demo` needs no key and no server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import stat
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cudagym.agent.client import ChatClient, ClientConfig, Sampling
from cudagym.agent.loop import TOOL_FORMATS, Agent, LoopConfig
from cudagym.agent.pages import write_trajectory_pages
from cudagym.agent.store import RolloutRecorder, TrajectoryStore, settings_of
from cudagym.eval.evaluate import clear_stop, stop_live_judges
from cudagym.tasks import Task, TaskError, load_task_set, parse_id_ranges

DB_NAME = "trajectories.duckdb"
SUBMISSION_DIR = "submission"
WORKDIRS_DIR = "workdirs"


@dataclass(frozen=True)
class RolloutConfig:
    tasks: str  # "kernelbench" or a path (task set: JSONL/parquet/dir, cudagym.tasks.load_task_set)
    out: str  # OUT dir: OUT/trajectories.duckdb, OUT/submission/level{L}/{id}_*.py, OUT/workdirs/
    model: str
    base_url: str | None = None  # None: only for scripted:* models (an in-process server)
    api_key: str | None = None  # None: $OPENAI_API_KEY, else a placeholder (local servers need none)
    levels: tuple[int, ...] | None = None
    ids: str | None = None  # e.g. "1-10,12"
    kb_version: str = "v0.1"
    n_samples: int = 1
    parallel: int = 4  # rollouts at once
    max_turns: int = 150  # 150 for rollout (training), 200 for `agent eval`
    device: str = "cuda"
    # sampling, per turn (None: the server's default)
    temperature: float | None = 0.7
    top_p: float | None = None
    max_tokens: int | None = 4096
    # loop budgets
    context_tokens: int = 32_768
    wall_s: float = 3600.0
    max_invalid_calls: int = 5
    tool_format: str = "auto"  # auto | native | text (loop.py)
    # client
    client_timeout_s: float = 600.0
    max_retries: int = 4
    client_concurrency: int | None = None  # requests in flight; None: parallel
    # environment (cudagym.agent.environment.EnvConfig)
    policy: str = "strict"
    timing_mode: str = "strict"
    precision: str = "strict"
    bash_timeout_s: float = 180.0
    judge_timeout_s: float | None = None
    max_output_chars: int = 16_000
    run_name: str | None = None  # default: the OUT folder's name
    replay: str | None = None  # a submission folder: the kernels the `scripted:replay` policy writes

    def __post_init__(self):
        if not self.tasks:
            raise ValueError("no tasks: pass --tasks kernelbench or a task-set path")
        if not self.model:
            raise ValueError("no model: pass --model")
        if self.n_samples < 1:
            raise ValueError(f"--n-samples must be >= 1, got {self.n_samples}")
        if self.parallel < 1:
            raise ValueError(f"--parallel must be >= 1, got {self.parallel}")
        if self.base_url is not None:
            self.client_config(self.base_url)  # its own checks (URL, timeout, retries)
        else:
            if not self.model.startswith("scripted:"):
                raise ValueError("no endpoint: pass --base-url (only scripted:* models run without one)")
            from cudagym.agent.scripted import parse_model

            parse_model(self.model)  # one line on an unknown policy
        if self.replay is not None and not Path(self.replay).is_dir():
            raise ValueError(f"--replay: no submission folder at {self.replay}")
        if self.ids is not None:
            parse_id_ranges(self.ids)
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool format must be one of {', '.join(TOOL_FORMATS)}, got {self.tool_format!r}")
        self.loop_config()  # its own checks (max_turns, budgets)
        self.sampling()

    def loop_config(self) -> LoopConfig:
        return LoopConfig(max_turns=self.max_turns, context_tokens=self.context_tokens, wall_s=self.wall_s,
                          max_invalid_calls=self.max_invalid_calls, tool_format=self.tool_format)

    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens)

    def client_config(self, base_url: str) -> ClientConfig:
        return ClientConfig(model=self.model, base_url=base_url, api_key=self.api_key, timeout_s=self.client_timeout_s,
                            max_retries=self.max_retries, concurrency=self.client_concurrency or self.parallel)

    def env_config(self):
        from cudagym.agent.environment import EnvConfig

        return EnvConfig(device=self.device, policy=self.policy, timing_mode=self.timing_mode, precision=self.precision,
                         max_output_chars=self.max_output_chars, bash_timeout_s=self.bash_timeout_s,
                         judge_timeout_s=self.judge_timeout_s)

    @property
    def run(self) -> str:
        return self.run_name or Path(self.out).resolve().name


def select_tasks(config: RolloutConfig) -> list[Task]:
    """The tasks of the config: KernelBench at kb_version/levels, or a task set; filtered by ids."""
    if config.tasks == "kernelbench":
        from cudagym.kernelbench import load_problems

        tasks = load_problems(config.kb_version, config.levels or (1, 2, 3))
    else:
        tasks = load_task_set(config.tasks)
        if config.levels:
            tasks = [t for t in tasks if t.level in config.levels]
    if config.ids:
        wanted = parse_id_ranges(config.ids)
        tasks = [t for t in tasks if t.problem_id in wanted]
    if not tasks:
        raise TaskError("no tasks selected")
    return tasks


def rollout_id(task: Task, sample: int) -> str:
    """Stable across runs (resume finds it again); also the workdir's name."""
    safe = re.sub(r"[^A-Za-z0-9.]+", "-", task.id).strip("-")
    return f"{safe}-{task.sha256[:8]}-s{sample}"


def _remove_tree(path: Path) -> None:
    """rmtree that also removes files a previous attempt made read-only."""
    def on_error(func, name, _exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), stat.S_IRWXU)
            os.chmod(name, stat.S_IRWXU)
        func(name)

    if path.exists():
        shutil.rmtree(path, onerror=on_error)


class _Batch:
    """One run_rollouts call: the store, the client, and the rollouts to run."""

    def __init__(self, config: RolloutConfig, store: TrajectoryStore, base_url: str, progress: Callable[[str], None]):
        self.config, self.store, self.base_url, self.progress = config, store, base_url, progress
        self.loop_config, self.sampling = config.loop_config(), config.sampling()
        self.env_config = config.env_config()
        self.done = 0
        self.total = 0

    async def run(self, todo: list[tuple[Task, int]]) -> None:
        self.total = len(todo)
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=2 * self.config.parallel + 4, thread_name_prefix="agent-env"))
        self.client = ChatClient(self.config.client_config(self.base_url))
        semaphore = asyncio.Semaphore(self.config.parallel)

        async def bounded(task: Task, sample: int) -> None:
            async with semaphore:
                await self.one(task, sample)

        try:
            await asyncio.gather(*(bounded(task, sample) for task, sample in todo))
        except asyncio.CancelledError:
            # Ctrl-C (asyncio.run cancels this task): the cancel ends the rollouts' coroutines, but not the
            # threads they wait on, and the loop waits for those threads before it ends. A verify whose
            # judge builds its extension would hold it for minutes: kill the judges, so those threads
            # return at once. The rollouts stay `running`, and a re-run starts them over.
            stop_live_judges()
            raise
        finally:
            await self.client.close()

    async def one(self, task: Task, sample: int) -> None:
        from cudagym.agent.environment import KernelEnv

        cfg = self.config
        rid = rollout_id(task, sample)
        workdir = Path(cfg.out) / WORKDIRS_DIR / rid
        self.store.begin({"rollout_id": rid, "run": cfg.run, "task_sha256": task.sha256, "task_id": task.id,
                          "task_name": task.name, "level": task.level, "problem_id": task.problem_id, "sample": sample,
                          "model": cfg.model, "base_url": self.base_url, "sampling": self.sampling.to_dict(),
                          "settings": settings_of(self.loop_config, self.env_config), "workdir": str(workdir)})
        start = time.monotonic()
        env, result, verdict, status, detail = None, None, None, "finished", None
        try:
            await asyncio.to_thread(_remove_tree, workdir)
            env = await asyncio.to_thread(KernelEnv, task, workdir, self.env_config)
            agent = Agent(env, self.client, self.sampling, self.loop_config, RolloutRecorder(self.store, rid))
            result = await agent.run()
            verdict = (await asyncio.to_thread(env.final_verdict)).to_dict()
            verdict["level"] = verdict.get("level") if verdict.get("level") is not None else task.level
            verdict["problem_id"] = verdict.get("problem_id") if verdict.get("problem_id") is not None else task.problem_id
        except Exception as e:  # our side failed (environment, judge, store): recorded, the batch goes on
            status, detail = "failed", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
        finally:
            if env is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(env.close)
        candidate, files = await asyncio.to_thread(candidate_of, workdir)
        self.store.finish(rid, status=status, stop_reason=result.stop_reason if result else None,
                          detail=detail if detail else (result.detail if result else None),
                          turns=result.turns if result else 0, prompt_tokens=result.prompt_tokens if result else 0,
                          completion_tokens=result.completion_tokens if result else 0, verdict=verdict,
                          candidate_code=candidate, candidate_files=files, wall_s=time.monotonic() - start)
        self.done += 1
        what = (f"{result.stop_reason} after {result.turns} turns, reward {verdict['reward']}" if status == "finished"
                else f"FAILED ({detail.splitlines()[0][:160]})")
        self.progress(f"[{self.done}/{self.total}] {rid}: {what} ({time.monotonic() - start:.1f} s)")


def candidate_of(workdir: Path) -> tuple[str | None, dict[str, str] | None]:
    """What the judge scored: model_new.py and the kernels/ files sent with it (None, None if unreadable)."""
    from cudagym.agent.workdir import WorkdirError, candidate_sources

    try:
        code, files, _left_out = candidate_sources(workdir)
    except (WorkdirError, OSError):
        return None, None
    return code, files


def best_rollouts(rows: list[dict]) -> dict[tuple[int, int], dict]:
    """Per (level, problem_id), the finished rollout with the highest reward, then speedup vs compile."""
    best: dict[tuple[int, int], dict] = {}

    def rank(row: dict) -> tuple:
        verdict = row.get("verdict") or {}
        return (row.get("reward") if row.get("reward") is not None else -2,
                verdict.get("speedup_vs_compile") or 0.0, -(row.get("sample") or 0))

    for row in rows:
        if row["status"] != "finished" or row.get("level") is None or row.get("problem_id") is None:
            continue
        key = (row["level"], row["problem_id"])
        if key not in best or rank(row) > rank(best[key]):
            best[key] = row
    return best


def write_submission(rows: list[dict], folder: Path) -> int:
    """OUT/submission/level{L}/{problem_id}_{name}.py for every problem with a correct rollout, and beside
    it the folder {problem_id}_{name}/ with its kernels/ files when it has any (`eval run` sends them to
    the judge, as KernelEnv does: cudagym.eval.batch.candidate_files); the count."""
    _remove_tree(folder)
    folder.mkdir(parents=True)
    n = 0
    for (level, pid), row in sorted(best_rollouts(rows).items()):
        verdict = row.get("verdict") or {}
        if not verdict.get("correct") or not row.get("candidate_code"):
            continue
        name = re.sub(r"[^A-Za-z0-9]+", "_", (row.get("task_name") or "").split("_", 1)[-1]).strip("_")
        path = folder / f"level{level}" / (f"{pid}_{name}.py" if name else f"{pid}.py")
        path.parent.mkdir(exist_ok=True)
        path.write_text(row["candidate_code"])
        for rel, text in (row.get("candidate_files") or {}).items():
            side = path.with_suffix("") / rel
            side.parent.mkdir(parents=True, exist_ok=True)
            side.write_text(text)
        n += 1
    return n


@contextlib.contextmanager
def endpoint(config: RolloutConfig, tasks: list[Task]):
    """The base URL to use: the config's, or an in-process scripted server's for scripted:* models
    (with `config.replay`, holding the submission's kernels for `tasks`)."""
    if config.base_url:
        yield config.base_url
        return
    from cudagym.agent.scripted import ScriptedServer

    replay = replay_kernels(tasks, config.replay) if config.replay else None
    with ScriptedServer(probe_dir=Path(config.out).resolve() / "probe", replay=replay) as server:
        yield server.base_url


def replay_kernels(tasks: list[Task], submission: str | Path) -> dict[str, tuple[str, dict[str, str]]]:
    """For the `replay` scripted policy: task code -> (the submission's file for it, its kernels/ files),
    read as `eval run` reads a submission (level{L}/{id}_*.py and the folder beside it)."""
    from cudagym.eval.batch import candidate_files, submission_files

    files = submission_files(submission)
    return {t.code: (files[(t.level, t.problem_id)].read_text(), candidate_files(files[(t.level, t.problem_id)]))
            for t in tasks if (t.level, t.problem_id) in files}


def run_rollouts(config: RolloutConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Run every unfinished (task, sample) rollout; write the store and the submission folder.

    Returns {"run", "rollouts" (selected), "ran" (this call), "finished", "failed", "rewards" {"-1": n, ...},
    "mean_reward" (finished rollouts; None if none), "stop_reasons" {reason: n}, "submission" (path),
    "n_submitted", "db" (path)}. `progress` gets one line per finished rollout (and a first line).
    """
    progress = progress or (lambda line: None)
    tasks = select_tasks(config)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    db = out / DB_NAME
    with TrajectoryStore(db) as store:
        existing = {row["rollout_id"]: row for row in store.rollouts()}
        others = {row["model"] for row in existing.values()} - {config.model}
        if others:
            raise ValueError(f"{db} holds rollouts of another model ({', '.join(sorted(others))}); use another --out")
        todo = [(t, s) for t in tasks for s in range(config.n_samples)
                if (existing.get(rollout_id(t, s)) or {}).get("status") != "finished"]
        progress(f"{len(tasks) * config.n_samples} rollouts ({len(tasks)} tasks x {config.n_samples} samples): "
                 f"{len(tasks) * config.n_samples - len(todo)} finished before, {len(todo)} to run, {config.parallel} at once")
        if todo:
            try:
                with endpoint(config, tasks) as base_url:
                    asyncio.run(_Batch(config, store, base_url, progress).run(todo))
            except BaseException:
                clear_stop()  # the stopped judges' threads have ended (asyncio.run waited): later judges are not stopped
                raise
        wanted = {rollout_id(t, s) for t in tasks for s in range(config.n_samples)}
        rows = [row for row in store.rollouts() if row["rollout_id"] in wanted]
        n_submitted = write_submission(rows, out / SUBMISSION_DIR)  # empties the folder: the pages come after
        write_trajectory_pages(store, best_rollouts(rows), out / SUBMISSION_DIR)  # the leaderboard links to them
    finished = [r for r in rows if r["status"] == "finished"]
    rewards: dict[str, int] = {}
    stops: dict[str, int] = {}
    for row in finished:
        rewards[str(row["reward"])] = rewards.get(str(row["reward"]), 0) + 1
        stops[row["stop_reason"]] = stops.get(row["stop_reason"], 0) + 1
    return {"run": config.run, "rollouts": len(rows), "ran": len(todo), "finished": len(finished),
            "failed": sum(r["status"] == "failed" for r in rows), "rewards": rewards,
            "mean_reward": sum(r["reward"] for r in finished) / len(finished) if finished else None,
            "stop_reasons": stops, "submission": str(out / SUBMISSION_DIR), "n_submitted": n_submitted, "db": str(db)}


def run_agent_eval(config: RolloutConfig, progress: Callable[[str], None] | None = None) -> dict:
    """run_rollouts, then the leaderboard's metrics per level and overall (best rollout per problem)."""
    from cudagym.eval.metrics import compute_metrics

    summary = run_rollouts(config, progress)
    tasks = select_tasks(config)
    with TrajectoryStore(summary["db"], read_only=True) as store:
        wanted = {rollout_id(t, s) for t in tasks for s in range(config.n_samples)}
        rows = [row for row in store.rollouts() if row["rollout_id"] in wanted]
    verdicts = [row["verdict"] for row in best_rollouts(rows).values() if row.get("verdict")]
    summary["metrics"] = compute_metrics(verdicts, expected=[(t.level, t.problem_id) for t in tasks])
    return summary


def eval_config(**kwargs) -> RolloutConfig:
    """A RolloutConfig for `agent eval`: KernelBench levels 1-3, 200 turns, unless given."""
    kwargs.setdefault("tasks", "kernelbench")
    kwargs.setdefault("levels", (1, 2, 3))
    kwargs.setdefault("max_turns", 200)
    return RolloutConfig(**kwargs)

