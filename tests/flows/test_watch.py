"""The watched-folder logic without Prefect: which folders are submissions, which need a judge."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cudagym.eval.batch import NO_FILE
from cudagym.eval.evaluate import EvalConfig
from cudagym.eval.store import Store
from cudagym.eval.verdict import Status, Verdict
from cudagym.eval.watch import Selection, is_pending, pending_submissions, submission_dirs
from cudagym.tasks import TaskError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _verdict(task, status=Status.PASS, reason=None, timing_mode="strict") -> dict:
    return Verdict(status=status, level=task.level, problem_id=task.problem_id, name=task.name,
                   kb_version=task.kb_version, reason=reason, timing_mode=timing_mode).finish().to_dict()


def _submission(root: Path, name: str, files: list[str]) -> Path:
    for rel in files:
        (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(EXAMPLES / "submission_cpu" / rel, root / name / rel)
    return root / name


def test_selection_picks_problems_and_rejects_empty_ones():
    tasks = Selection(problems=str(EXAMPLES / "problems"), levels=(1,), ids=(2, 3)).tasks()
    assert [(t.level, t.problem_id) for t in tasks] == [(1, 2), (1, 3)]
    assert len(Selection(problems=str(EXAMPLES / "problems")).tasks()) == 6
    assert Selection(problems="x").store_kb_version is None and Selection().store_kb_version == "v0.1"
    with pytest.raises(TaskError, match="no problems selected"):
        Selection(problems=str(EXAMPLES / "problems"), ids=(99,)).tasks()
    with pytest.raises(ValueError, match="levels"):
        Selection(levels=(0,))


def test_submission_dirs_are_folders_with_level_files(tmp_path):
    _submission(tmp_path, "b", ["level1/2_ReLU_on_rand.py"])
    _submission(tmp_path, "a", ["level2/1_Linear_ReLU_scale.py"])
    (tmp_path / "empty" / "level1").mkdir(parents=True)  # no kernel file yet
    (tmp_path / "notes").mkdir()
    (tmp_path / "README.md").write_text("not a folder")
    assert [d.name for d in submission_dirs(tmp_path)] == ["a", "b"]
    with pytest.raises(TaskError, match="watched folder not found"):
        submission_dirs(tmp_path / "missing")


def test_pending_until_every_selected_problem_has_a_verdict_of_this_mode(tmp_path):
    tasks = Selection(problems=str(EXAMPLES / "problems"), ids=(1, 2), levels=(1,)).tasks()
    watch = tmp_path / "watch"
    mine = _submission(watch, "mine", ["level1/2_ReLU_on_rand.py"])  # no file for problem 1
    config = EvalConfig(device="cpu")
    with Store(tmp_path / "db.duckdb") as store:
        assert [d.name for d in pending_submissions(watch, tasks, store, config)] == ["mine"]
        store.add_verdict("mine", _verdict(tasks[1], Status.REJECTED, "returns its input"))
        assert is_pending(mine, tasks, store, config)  # problem 1 has no verdict yet
        store.add_verdict("mine", _verdict(tasks[0], Status.RUNTIME_ERROR, NO_FILE))
        assert pending_submissions(watch, tasks, store, config) == []  # done: the store has both
        assert is_pending(mine, tasks, store, EvalConfig(device="cpu", precision="kernelbench"))  # another run: not done
        _submission(watch, "mine", ["level1/1_Small_matmul.py"])  # the missing file arrives
        assert [d.name for d in pending_submissions(watch, tasks, store, config)] == ["mine"]
