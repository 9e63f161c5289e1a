"""cudagym.tasks: the Task type and its loaders (read_rows, tasks_from_rows, task_from_file, load_task_set)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from cudagym.tasks import Task, TaskError, load_task_set, read_rows, sha256_text, task_from_file, tasks_from_rows

CODE = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(4, 4)]

def get_init_inputs():
    return []
"""

ROWS = [
    {"level": 1, "problem_id": 19, "name": "19_ReLU", "code": CODE},
    {"level": 2, "problem_id": 3, "name": "3_Sigmoid", "code": CODE.replace("relu", "sigmoid"), "extra": [1, 2]},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_read_rows_jsonl(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n   \n" + json.dumps(ROWS[1]) + "\n")  # blank lines skipped
    assert read_rows(path) == ROWS


def test_read_rows_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    rows = read_rows(path)
    assert [{k: r[k] for k in ("level", "problem_id", "name", "code")} for r in rows] == \
        [{k: r[k] for k in ("level", "problem_id", "name", "code")} for r in ROWS]
    assert all(isinstance(r["level"], int) and isinstance(r["code"], str) for r in rows)
    assert tasks_from_rows(rows, "x") == tasks_from_rows(read_rows(write_jsonl(tmp_path / "t.jsonl", ROWS)), "x")


def test_read_rows_bad_json_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + '{"level": 1, "name": \n' + json.dumps(ROWS[1]) + "\n")
    with pytest.raises(TaskError, match=r"bad\.jsonl:2: not JSON") as e:
        read_rows(path)
    assert "\n" not in str(e.value)


def test_read_rows_missing_file(tmp_path):
    with pytest.raises(TaskError, match=r"no such file"):
        read_rows(tmp_path / "absent.jsonl")


def test_tasks_from_rows_missing_columns():
    with pytest.raises(TaskError, match=r"row 1 lacks columns \['code', 'problem_id'\]"):
        tasks_from_rows([ROWS[0], {"level": 1, "name": "x"}], source="synth")


def test_tasks_from_rows_ids_and_types():
    rows = [dict(ROWS[0], level="1", problem_id="19")]  # strings, as some writers leave them
    (task,) = tasks_from_rows(rows, source="synth")
    assert (task.id, task.level, task.problem_id, task.source) == ("L1/19", 1, 19, "synth")
    assert task.kb_version is None
    (kb,) = tasks_from_rows(ROWS[:1], source="kernelbench:v0.1")
    assert kb.id == "v0.1/L1/19" and kb.kb_version == "v0.1"


def test_load_task_set(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", ROWS)
    tasks = load_task_set(path)
    assert [t.id for t in tasks] == ["L1/19", "L2/3"]
    assert all(t.source == str(path) for t in tasks)


def test_task_from_file(tmp_path):
    path = tmp_path / "19_ReLU.py"
    path.write_text(CODE)
    task = task_from_file(path)
    assert (task.id, task.name, task.code, task.source) == ("19_ReLU", "19_ReLU", CODE, str(path))
    with pytest.raises(TaskError, match=r"no such file"):
        task_from_file(tmp_path / "absent.py")


def test_sha256_is_stable():
    task = Task(id="a", name="a", code=CODE)
    assert task.sha256 == hashlib.sha256(CODE.encode()).hexdigest() == sha256_text(CODE)
    assert sha256_text("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    # depends on the code only
    assert dataclasses.replace(task, id="b", name="b", source="synth", provenance={"x": 1}).sha256 == task.sha256
    assert Task(id="a", name="a", code=CODE + " ").sha256 != task.sha256


def test_task_is_frozen_and_provenance_not_compared():
    task = Task(id="a", name="a", code=CODE, provenance={"seed": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.code = "x"
    assert task == Task(id="a", name="a", code=CODE, provenance={"seed": 2})
    assert hash(task) == hash(Task(id="a", name="a", code=CODE))
