"""The one Task type that flows through every stage, and its loaders.

A task is KernelBench-compatible Python source: `class Model(nn.Module)`, `get_inputs()` and
`get_init_inputs()`. A candidate is source defining `class ModelNew(nn.Module)` with the same
constructor signature. Untrusted code never runs here: see `cudagym.tasks.sandbox`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path


class TaskError(ValueError):
    """Bad task input (unreadable file, missing columns); the CLI prints it as one line."""


@dataclass(frozen=True)
class Task:
    id: str  # stable, human readable: "v0.1/L1/12" for KernelBench, row id or file stem otherwise
    name: str  # e.g. "12_Matmul_with_diagonal_matrices_"
    code: str
    level: int | None = None
    problem_id: int | None = None
    source: str = "local"  # "kernelbench:v0.1", "synth", a file path ...
    provenance: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def sha256(self) -> str:
        return sha256_text(self.code)

    @property
    def kb_version(self) -> str | None:
        return self.source.split(":", 1)[1] if self.source.startswith("kernelbench:") else None


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse_id_ranges(text: str) -> set[int]:
    """'1-10,12' -> {1..10, 12}; TaskError (one line) on anything else."""
    ids: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("-")
            ids.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise TaskError(f"problem ids must look like 1-10,12, got {text!r}") from None
    return ids


def task_from_file(path: str | Path) -> Task:
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"no such file: {path}")
    return Task(id=path.stem, name=path.stem, code=path.read_text(), source=str(path))


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a JSONL or parquet file, as dicts."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"no such file: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskError(f"{path}:{n}: not JSON ({e.msg})") from None
    return rows


def tasks_from_rows(rows: list[dict], source: str) -> list[Task]:
    """Tasks from rows with columns level, problem_id, name, code (a task set cudagym built, or KernelBench)."""
    tasks = []
    for n, row in enumerate(rows):
        missing = {"level", "problem_id", "name", "code"} - row.keys()
        if missing:
            raise TaskError(f"row {n} lacks columns {sorted(missing)}")
        level, pid = int(row["level"]), int(row["problem_id"])
        prefix = f"{source.split(':', 1)[1]}/" if source.startswith("kernelbench:") else ""
        tasks.append(Task(id=f"{prefix}L{level}/{pid}", name=row["name"], code=row["code"], level=level,
                          problem_id=pid, source=source))
    return tasks


def load_task_set(path: str | Path) -> list[Task]:
    """A task set: a JSONL or parquet file with level, problem_id, name, code, or a directory of
    `{level}_{problem_id}_{name}.py` files (how the bundled examples are kept)."""
    path = Path(path)
    if path.is_dir():
        rows = []
        for file in sorted(path.glob("*.py")):
            level, pid, *rest = file.stem.split("_", 2)
            if not (level.isdigit() and pid.isdigit()):
                raise TaskError(f"{file}: task files are named LEVEL_ID_NAME.py")
            rows.append({"level": int(level), "problem_id": int(pid), "name": f"{pid}_{rest[0] if rest else ''}",
                         "code": file.read_text()})
        if not rows:
            raise TaskError(f"no task files (LEVEL_ID_NAME.py) in {path}")
        return tasks_from_rows(rows, source=str(path))
    return tasks_from_rows(read_rows(path), source=str(path))
