"""The KernelBench problem source: every KernelBench problem as a `Task`.

Where problems come from, first match wins:
1. an explicit `path`: a JSONL or parquet file with columns version, level, problem_id, name, code
   (and optionally sha256, verified against code, and commit, kept as provenance);
2. the file named by the env var `CUDAGYM_KERNELBENCH` (same format; the offline default);
3. the Hugging Face dataset `ScalingIntelligence/KernelBench` (splits level_1..level_4), which holds
   only the newest problems, exposed as version "latest".

Task ids are "<version>/L<level>/<problem_id>", e.g. "v0.1/L1/12"; `source` is "kernelbench:<version>".
Parsed files are cached per (path, mtime, size) for the life of the process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable
from pathlib import Path

from cudagym.tasks import Task, TaskError, read_rows, tasks_from_rows

DEFAULT_VERSION = "v0.1"
DEFAULT_LEVELS = (1, 2, 3)
ENV_VAR = "CUDAGYM_KERNELBENCH"
HF_DATASET = "ScalingIntelligence/KernelBench"
HF_VERSION = "latest"  # the only version the Hugging Face dataset holds

# version -> {(level, problem_id): Task}
Catalog = dict[str, dict[tuple[int, int], Task]]


def load_problems(version: str = DEFAULT_VERSION, levels: int | str | Iterable[int] = DEFAULT_LEVELS,
                  path: str | os.PathLike | None = None) -> list[Task]:
    """The problems of one KernelBench version at the given levels, sorted by (level, problem_id)."""
    catalog = _catalog(path)
    problems = _version(catalog, version)
    wanted = _levels(levels)
    tasks = [t for key, t in sorted(problems.items()) if key[0] in wanted]
    if not tasks:
        raise TaskError(f"no KernelBench problems at version {version} levels {sorted(wanted)}; "
                        f"available: {_describe(catalog)}")
    return tasks


def get_problem(version: str, level: int, problem_id: int, path: str | os.PathLike | None = None) -> Task:
    """One KernelBench problem."""
    problems = _version(_catalog(path), version)
    task = problems.get((int(level), int(problem_id)))
    if task is None:
        ids = sorted(pid for lvl, pid in problems if lvl == int(level))
        have = f"level {level} has problem ids {ids[0]}-{ids[-1]}" if ids else \
            f"levels there: {sorted({lvl for lvl, _ in problems})}"
        raise TaskError(f"unknown problem: KernelBench {version} level {level} problem {problem_id} ({have})")
    return task


def available_versions(path: str | os.PathLike | None = None) -> list[str]:
    """The versions the problem source holds, e.g. ["latest", "v0", "v0.1"]."""
    return sorted(_catalog(path))


def source_path(path: str | os.PathLike | None = None) -> Path | None:
    """The file problems come from (explicit path, else $CUDAGYM_KERNELBENCH), or None for the Hub."""
    if path is not None and str(path):
        return Path(path)
    env = os.environ.get(ENV_VAR, "").strip()
    return Path(env) if env else None


def _catalog(path: str | os.PathLike | None) -> Catalog:
    file = source_path(path)
    if file is None:
        return _hub_catalog()
    if not file.is_file():
        where = "" if path is not None else f" (from ${ENV_VAR})"
        raise TaskError(f"no such KernelBench file: {file}{where}")
    st = file.stat()
    return _file_catalog(str(file.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _file_catalog(path: str, mtime_ns: int, size: int) -> Catalog:
    return _build_catalog(read_rows(path), where=path)


@functools.lru_cache(maxsize=1)
def _hub_catalog() -> Catalog:
    unreachable = f"no KernelBench file: set {ENV_VAR} to a JSONL or parquet file of problems"
    try:
        import datasets
    except ImportError:
        raise TaskError(f"{unreachable} (the datasets package, needed for {HF_DATASET}, is not installed)") from None
    try:
        splits = datasets.load_dataset(HF_DATASET)
    except Exception as e:  # offline, hub down, not cached: all mean "use a file"
        raise TaskError(f"{unreachable} ({HF_DATASET} unavailable: {type(e).__name__})") from None
    rows = [{"version": HF_VERSION, "level": row["level"], "problem_id": row["problem_id"],
             "name": row["name"], "code": row["code"]}
            for split in sorted(splits) if split.startswith("level_") for row in splits[split]]
    return _build_catalog(rows, where=HF_DATASET)


def _build_catalog(rows: list[dict], where: str) -> Catalog:
    by_version: dict[str, list[dict]] = {}
    for n, row in enumerate(rows):
        if "version" not in row:
            raise TaskError(f"{where}: row {n} lacks column 'version'")
        by_version.setdefault(str(row["version"]), []).append(row)
    catalog: Catalog = {}
    for version, vrows in by_version.items():
        problems = catalog[version] = {}
        for row, task in zip(vrows, tasks_from_rows(vrows, source=f"kernelbench:{version}")):
            expected = row.get("sha256")
            if expected and expected != task.sha256:
                raise TaskError(f"{where}: {task.id}: sha256 mismatch (file says {expected[:12]}..., "
                                f"code hashes to {task.sha256[:12]}...)")
            key = (task.level, task.problem_id)
            if key in problems:
                raise TaskError(f"{where}: {task.id} appears twice")
            if row.get("commit"):
                task = dataclasses.replace(task, provenance={"commit": row["commit"]})
            problems[key] = task
    return catalog


def _version(catalog: Catalog, version: str) -> dict[tuple[int, int], Task]:
    if version not in catalog:
        raise TaskError(f"unknown KernelBench version {version!r}; available: {_describe(catalog)}")
    return catalog[version]


def _levels(levels: int | str | Iterable[int]) -> set[int]:
    if isinstance(levels, int):
        return {levels}
    if isinstance(levels, str):  # "1,2,3", as typed on a command line
        levels = [part for part in levels.split(",") if part.strip()]
    try:
        return {int(level) for level in levels}
    except (TypeError, ValueError):
        raise TaskError(f"levels must be integers, got {levels!r}") from None


def _describe(catalog: Catalog) -> str:
    parts = []
    for version in sorted(catalog):
        lvls = sorted({lvl for lvl, _ in catalog[version]})
        parts.append(f"{version} (levels {','.join(map(str, lvls))})")
    return ", ".join(parts) or "none"


__all__ = ["DEFAULT_VERSION", "DEFAULT_LEVELS", "ENV_VAR", "HF_DATASET", "available_versions",
           "get_problem", "load_problems", "source_path"]
