"""The results database: submissions, their verdicts, and cached baseline timings, in one DuckDB file.

DuckDB lets one process open a file read-write, so a process holds one `Store`. Every method runs on
its own cursor, so threads may share that Store. Every write commits at once: a killed run loses
nothing it had stored, and a rerun skips what `done_keys` returns.

Tables (a primary key on the columns marked *):
- submissions(name*, path, timing_mode, levels, kb_version, created)
- verdicts(submission*, kb_version*, level*, problem_id*, name, status, correct, t_*_ms, speedup_vs_*,
  reward, timing_mode, verdict (the full verdict JSON), created); kb_version '' stands for none
  (a task set that is not KernelBench), since key columns cannot be NULL
- baselines(problem_sha256*, gpu*, torch*, cuda*, dtype*, timing_mode*, t_eager_ms, t_compile_ms,
  record (JSON), created)
"""

from __future__ import annotations

import json
import threading
from dataclasses import astuple, dataclass
from pathlib import Path

import duckdb

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS submissions (
        name VARCHAR PRIMARY KEY, path VARCHAR, timing_mode VARCHAR, levels INTEGER[], kb_version VARCHAR,
        created TIMESTAMP)""",
    """CREATE TABLE IF NOT EXISTS verdicts (
        submission VARCHAR, kb_version VARCHAR, level INTEGER, problem_id INTEGER, name VARCHAR,
        status VARCHAR, correct BOOLEAN, t_candidate_ms DOUBLE, t_eager_ms DOUBLE, t_compile_ms DOUBLE,
        speedup_vs_eager DOUBLE, speedup_vs_compile DOUBLE, reward INTEGER, timing_mode VARCHAR,
        verdict VARCHAR, created TIMESTAMP,
        PRIMARY KEY (submission, kb_version, level, problem_id))""",
    """CREATE TABLE IF NOT EXISTS baselines (
        problem_sha256 VARCHAR, gpu VARCHAR, torch VARCHAR, cuda VARCHAR, dtype VARCHAR, timing_mode VARCHAR,
        t_eager_ms DOUBLE, t_compile_ms DOUBLE, record VARCHAR, created TIMESTAMP,
        PRIMARY KEY (problem_sha256, gpu, torch, cuda, dtype, timing_mode))""",
)
# Verdict fields copied into their own columns (for SQL); the full verdict is kept as JSON too.
_VERDICT_COLUMNS = ("name", "status", "correct", "t_candidate_ms", "t_eager_ms", "t_compile_ms",
                    "speedup_vs_eager", "speedup_vs_compile", "reward", "timing_mode")


class StoreError(ValueError):
    """The database cannot be opened or refuses a write; the message is one line for the CLI."""


@dataclass(frozen=True)
class BaselineKey:
    """What a baseline timing depends on: the problem's code, the machine and the timing method."""

    problem_sha256: str
    gpu: str
    torch: str
    cuda: str
    dtype: str
    timing_mode: str


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise StoreError(f"cannot open database {self.path}: directory {self.path.parent} does not exist")
        if self.path.is_dir():
            raise StoreError(f"cannot open database {self.path}: it is a directory")
        try:
            self._con = duckdb.connect(str(self.path))
        except duckdb.Error as e:
            raise StoreError(f"cannot open database {self.path}: {_first_line(e)}") from None
        self._lock = threading.Lock()
        for statement in _SCHEMA:
            self._con.execute(statement)

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            return self._con.cursor()

    def sql(self, query: str, params: list | None = None) -> list[tuple]:
        """Rows of a read query, for reports that want more than the methods below."""
        return self._cursor().execute(query, params or []).fetchall()

    # submissions

    def add_submission(self, name: str, path: str, timing_mode: str, *, levels: list[int] | None = None,
                       kb_version: str | None = None) -> None:
        """Record a submission; again with the same name, update its path and add to its levels.

        A submission has one timing mode (the leaderboard never mixes modes): re-adding it with
        another raises StoreError. A new kb_version replaces the old one and its levels.
        """
        with self._cursor() as cur:
            cur.execute("INSERT INTO submissions VALUES (?, ?, ?, ?, ?, current_timestamp) ON CONFLICT DO NOTHING",
                        [name, str(path), timing_mode, _sorted_levels(levels), kb_version])
            old_mode, old_levels, old_version = cur.execute(
                "SELECT timing_mode, levels, kb_version FROM submissions WHERE name = ?", [name]).fetchone()
            if old_mode != timing_mode:
                raise StoreError(f"submission {name!r} was run in timing mode {old_mode!r}, not {timing_mode!r};"
                                 " give this run another name")
            if kb_version is None or kb_version == old_version:
                levels = (old_levels or []) + (levels or [])
            cur.execute("UPDATE submissions SET path = ?, levels = ?, kb_version = ? WHERE name = ?",
                        [str(path), _sorted_levels(levels), kb_version or old_version, name])

    def submissions(self) -> list[dict]:
        """Every submission: name, path, timing_mode, levels (list or None), kb_version, created (ISO text)."""
        with self._cursor() as cur:
            rows = cur.execute("SELECT name, path, timing_mode, levels, kb_version, created FROM submissions"
                               " ORDER BY created, name").fetchall()
        keys = ("name", "path", "timing_mode", "levels", "kb_version", "created")
        return [dict(zip(keys, row[:5] + (row[5].isoformat(timespec="seconds"),))) for row in rows]

    # verdicts

    def add_verdict(self, submission: str, verdict: dict) -> None:
        """Store a verdict (contract schema), replacing one for the same problem."""
        level, problem_id = verdict.get("level"), verdict.get("problem_id")
        if level is None or problem_id is None:
            raise StoreError("cannot store a verdict without level and problem_id")
        columns = ("submission", "kb_version", "level", "problem_id") + _VERDICT_COLUMNS + ("verdict", "created")
        values = [submission, verdict.get("kb_version") or "", int(level), int(problem_id)]
        values += [verdict.get(column) for column in _VERDICT_COLUMNS] + [json.dumps(verdict)]
        marks = ", ".join("?" * len(values))
        with self._cursor() as cur:
            cur.execute(f"INSERT OR REPLACE INTO verdicts ({', '.join(columns)}) VALUES ({marks}, current_timestamp)",
                        values)

    def done_keys(self, submission: str) -> set[tuple[str | None, int, int]]:
        """(kb_version, level, problem_id) of the submission's stored verdicts; kb_version None for a task set."""
        with self._cursor() as cur:
            rows = cur.execute("SELECT kb_version, level, problem_id FROM verdicts WHERE submission = ?",
                               [submission]).fetchall()
        return {(kb_version or None, level, problem_id) for kb_version, level, problem_id in rows}

    def verdicts(self, submission: str | None = None) -> list[dict]:
        """Stored verdicts (as they were added), of one submission or of all, by problem."""
        where, params = ("WHERE submission = ?", [submission]) if submission is not None else ("", [])
        with self._cursor() as cur:
            rows = cur.execute(f"SELECT verdict FROM verdicts {where}"
                               " ORDER BY submission, kb_version, level, problem_id", params).fetchall()
        return [json.loads(row[0]) for row in rows]

    # baselines

    def get_baseline(self, key: BaselineKey) -> dict | None:
        """The cached record for this key, or None."""
        with self._cursor() as cur:
            row = cur.execute("SELECT record FROM baselines WHERE problem_sha256 = ? AND gpu = ? AND torch = ?"
                              " AND cuda = ? AND dtype = ? AND timing_mode = ?", list(astuple(key))).fetchone()
        return json.loads(row[0]) if row else None

    def put_baseline(self, key: BaselineKey, record: dict) -> None:
        """Cache a baseline record (t_eager_ms, t_compile_ms and their stats), replacing an older one."""
        values = list(astuple(key)) + [record.get("t_eager_ms"), record.get("t_compile_ms"), json.dumps(record)]
        with self._cursor() as cur:
            cur.execute("INSERT OR REPLACE INTO baselines VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, current_timestamp)",
                        values)


def _sorted_levels(levels: list[int] | None) -> list[int] | None:
    return sorted({int(level) for level in levels}) if levels else None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
