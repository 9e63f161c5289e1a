"""A watched folder of submissions: which ones the store has not fully evaluated, and evaluating them.

The folder holds one SUBMISSION_DIR per submission, as `cudagym eval run` takes it
(`level{L}/{problem_id}_*.py`); the sub-folder's name is the submission's name in the store. A
submission is pending while a selected problem has no verdict of the run's timing mode and precision,
or only a "no file" verdict while its file exists now. Evaluating one is `batch.run_submission`,
which resumes from the store: a stopped refresh loses nothing, and a rerun evaluates only what is
missing. A file changed after its verdict was stored is not evaluated again (drop it in under a new
folder name to evaluate it afresh).

The Prefect flow `refresh_leaderboard` sequences these functions; they need no Prefect.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cudagym.eval.batch import NO_FILE, run_submission, submission_files
from cudagym.eval.evaluate import EvalConfig
from cudagym.eval.store import Store
from cudagym.tasks import Task, TaskError


@dataclass(frozen=True)
class Selection:
    """The problems every watched submission is evaluated on: a task set (`problems`, a JSONL/parquet
    file or a folder of LEVEL_ID_NAME.py files) or KernelBench at `kb_version`; `levels` and `ids`
    narrow either (None: all)."""

    problems: str | None = None
    kb_version: str = "v0.1"
    levels: tuple[int, ...] | None = None
    ids: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.levels is not None and (not self.levels or any(lv < 1 for lv in self.levels)):
            raise ValueError(f"levels must be positive integers, got {list(self.levels)}")
        if self.ids is not None and not self.ids:
            raise ValueError("ids must name at least one problem (None selects all)")

    def tasks(self) -> list[Task]:
        from cudagym.kernelbench import load_problems
        from cudagym.tasks import load_task_set

        if self.problems:
            tasks = load_task_set(self.problems)
            tasks = [t for t in tasks if self.levels is None or t.level in self.levels]
        else:
            tasks = load_problems(self.kb_version, self.levels or (1, 2, 3))
        tasks = [t for t in tasks if self.ids is None or t.problem_id in self.ids]
        if not tasks:
            raise TaskError("no problems selected")
        return tasks

    @property
    def store_kb_version(self) -> str | None:
        """The KernelBench version the store records for these runs (None for a task set)."""
        return None if self.problems else self.kb_version


def submission_dirs(folder: str | Path) -> list[Path]:
    """The folder's sub-folders that hold a submission (a level{L}/ folder with a .py file), by name."""
    root = Path(folder)
    if not root.is_dir():
        raise TaskError(f"watched folder not found: {root}")
    return [d for d in sorted(root.iterdir())
            if d.is_dir() and any(p.is_file() for p in d.glob("level*/*.py"))]


def is_pending(submission_dir: Path, tasks: list[Task], store: Store, config: EvalConfig) -> bool:
    """Whether a selected problem lacks a verdict of this timing mode and precision (or has a "no
    file" one while the file exists now): what `run_submission` would evaluate."""
    stored = {(v.get("kb_version"), v["level"], v["problem_id"]): v
              for v in store.verdicts(submission_dir.name, timing_mode=config.timing_mode, precision=config.precision)}
    files = submission_files(submission_dir)
    for task in tasks:
        verdict = stored.get((task.kb_version, task.level, task.problem_id))
        if verdict is None or (verdict.get("reason") == NO_FILE and (task.level, task.problem_id) in files):
            return True
    return False


def pending_submissions(folder: str | Path, tasks: list[Task], store: Store, config: EvalConfig) -> list[Path]:
    """The watched submissions that still need a judge, by name."""
    return [d for d in submission_dirs(folder) if is_pending(d, tasks, store, config)]


def evaluate_submission(submission_dir: str | Path, selection: Selection, tasks: list[Task], store: Store,
                        config: EvalConfig, parallel: int = 1) -> dict:
    """Evaluate one watched submission (resuming from the store) under its folder's name; a summary:
    {name, path, n, correct, rewards {reward: count}}."""
    path = Path(submission_dir)
    verdicts = run_submission(path, tasks, store, path.name, config, parallel=parallel,
                              levels=sorted({t.level for t in tasks}), kb_version=selection.store_kb_version)
    rewards: dict[str, int] = {}
    for v in verdicts:
        rewards[str(v.reward)] = rewards.get(str(v.reward), 0) + 1
    return {"name": path.name, "path": str(path), "n": len(verdicts), "correct": sum(bool(v.correct) for v in verdicts),
            "rewards": dict(sorted(rewards.items()))}
