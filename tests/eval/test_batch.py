"""Many problems at once: submission layout, several tasks per judge, a judge that dies mid-batch."""

from __future__ import annotations

import pytest

from cudagym.eval.batch import submission_files
from cudagym.eval.evaluate import EvalConfig, run_reference_jobs
from cudagym.tasks import Task, TaskError

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return {body}

def get_inputs():
    return [torch.{gen}(8, 16)]

def get_init_inputs():
    return []
"""
CRASHING = TASK.format(body="__import__('os').kill(__import__('os').getpid(), 11)", gen="randn")


def task(i: int, body: str = "torch.relu(x)", gen: str = "rand", code: str | None = None) -> Task:
    return Task(id=f"t{i}", name=f"{i}_t", code=code or TASK.format(body=body, gen=gen), level=1, problem_id=i)


def test_submission_files_follow_the_contract_naming(tmp_path):
    (tmp_path / "level1").mkdir()
    (tmp_path / "level2").mkdir()
    (tmp_path / "level1" / "3_Some_name.py").write_text("")
    (tmp_path / "level1" / "12.py").write_text("")
    (tmp_path / "level1" / "notes.py").write_text("")  # no problem id: ignored
    (tmp_path / "level2" / "7_x.py").write_text("")
    assert sorted(submission_files(tmp_path)) == [(1, 3), (1, 12), (2, 7)]
    (tmp_path / "level1" / "3_again.py").write_text("")
    with pytest.raises(TaskError, match="two files for level 1 problem 3"):
        submission_files(tmp_path)
    with pytest.raises(TaskError, match="not found"):
        submission_files(tmp_path / "absent")


def test_several_tasks_in_one_judge_each_get_their_own_result_even_if_one_kills_the_judge():
    tasks = [task(1), task(2, code=CRASHING), task(3, body="torch.tanh(x)", gen="randn")]
    results = run_reference_jobs(tasks, "audit", EvalConfig(device="cpu", n_checks=2, timeout_s=30))
    assert "passthrough" in results[0]["accepts"]  # ReLU of torch.rand is the identity there
    assert "accepts" not in results[1] and "SIGSEGV" in results[1]["reason"]
    assert results[2]["accepts"] == []  # tanh of randn: nothing trivial passes
