"""The results database: submissions, their verdicts, cached baseline timings and problem audits, in
one DuckDB file (opened by `cudagym.tasks.db.connect`).

DuckDB lets one process open a file read-write, so a process holds one `Store`. Every method runs on
its own cursor, so threads may share that Store. Every write commits at once: a killed run loses
nothing it had stored, and a rerun skips what `done_keys` returns.

A submission is a name; it may be run in several timing modes (`strict`, `paper`) and precisions
(`strict`, `kernelbench`), and each run's verdicts are its own rows: a run skips only verdicts of
its own mode and precision, and readers group `verdicts(name)` by (timing_mode, precision), which
never mix in one metric. The submission row keeps the path, levels and kb_version of all its runs
and the mode and precision of the latest; `submissions()` lists the (timing_mode, precision) pairs
it has verdicts for (`runs`).

Tables (a primary key on the columns marked *):
- submissions(name*, path, timing_mode, levels, kb_version, created, precision): timing_mode and
  precision of its latest run
- verdicts(submission*, timing_mode*, precision*, kb_version*, level*, problem_id*, name, status,
  correct, t_*_ms, speedup_vs_*, reward, verdict (the full verdict JSON), created); kb_version ''
  stands for none (a task set that is not KernelBench), since key columns cannot be NULL
- baselines(problem_sha256*, gpu*, torch*, cuda*, dtype*, timing_mode*, t_eager_ms, t_compile_ms,
  record (JSON), created); dtype names the precision regime ("float32-notf32", "float32-kernelbench")
- audits(problem_sha256*, atol*, rtol*, device*, precision*, level, problem_id, name, row (the
  `audit kernelbench` row as JSON), created); device is "cpu" or the GPU's name

Files of the first schema (verdicts keyed by (submission, kb_version, level, problem_id), one
timing mode per submission, no precision) are migrated in place when opened, in one transaction:
their verdicts keep their rows and are the `strict` precision's.
"""

from __future__ import annotations

import json
import threading
from dataclasses import astuple, dataclass
from pathlib import Path

import duckdb

from cudagym.tasks.db import DatabaseError, connect, error_of

_VERDICTS = """CREATE TABLE IF NOT EXISTS {table} (
        submission VARCHAR, timing_mode VARCHAR, precision VARCHAR, kb_version VARCHAR, level INTEGER,
        problem_id INTEGER, name VARCHAR, status VARCHAR, correct BOOLEAN, t_candidate_ms DOUBLE, t_eager_ms DOUBLE,
        t_compile_ms DOUBLE, speedup_vs_eager DOUBLE, speedup_vs_compile DOUBLE, reward INTEGER, verdict VARCHAR,
        created TIMESTAMP,
        PRIMARY KEY (submission, timing_mode, precision, kb_version, level, problem_id))"""
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS submissions (
        name VARCHAR PRIMARY KEY, path VARCHAR, timing_mode VARCHAR, levels INTEGER[], kb_version VARCHAR,
        created TIMESTAMP, precision VARCHAR)""",
    _VERDICTS.format(table="verdicts"),
    """CREATE TABLE IF NOT EXISTS baselines (
        problem_sha256 VARCHAR, gpu VARCHAR, torch VARCHAR, cuda VARCHAR, dtype VARCHAR, timing_mode VARCHAR,
        t_eager_ms DOUBLE, t_compile_ms DOUBLE, record VARCHAR, created TIMESTAMP,
        PRIMARY KEY (problem_sha256, gpu, torch, cuda, dtype, timing_mode))""",
    """CREATE TABLE IF NOT EXISTS audits (
        problem_sha256 VARCHAR, atol DOUBLE, rtol DOUBLE, device VARCHAR, precision VARCHAR, level INTEGER,
        problem_id INTEGER, name VARCHAR, row VARCHAR, created TIMESTAMP,
        PRIMARY KEY (problem_sha256, atol, rtol, device, precision))""",
)
# Verdict fields copied into their own columns (for SQL); the full verdict is kept as JSON too.
_VERDICT_COLUMNS = ("name", "status", "correct", "t_candidate_ms", "t_eager_ms", "t_compile_ms",
                    "speedup_vs_eager", "speedup_vs_compile", "reward")
_KEY_COLUMNS = ("submission", "timing_mode", "precision", "kb_version", "level", "problem_id")

StoreError = DatabaseError  # the database cannot be opened or refuses a write; the message is one line


@dataclass(frozen=True)
class BaselineKey:
    """What a baseline timing depends on: the problem's code, the machine and the timing method."""

    problem_sha256: str
    gpu: str
    torch: str
    cuda: str
    dtype: str
    timing_mode: str


@dataclass(frozen=True)
class AuditKey:
    """What a problem's audit depends on: its code, the tolerance, the device kind and the precision."""

    problem_sha256: str
    atol: float
    rtol: float
    device: str  # "cpu" or the GPU's name (machine_env's "gpu")
    precision: str


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._con = connect(self.path, "database")
        self._lock = threading.Lock()
        try:
            for statement in _SCHEMA:
                self._con.execute(statement)
            _migrate(self._con)
        except duckdb.Error as e:
            self._con.close()
            raise error_of(e, self.path) from None

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
                       kb_version: str | None = None, precision: str = "strict") -> None:
        """Record a submission; again with the same name, update its path, latest timing mode and
        precision, and add to its levels. A new kb_version replaces the old one and its levels."""
        with self._cursor() as cur:
            cur.execute("INSERT INTO submissions (name, path, timing_mode, levels, kb_version, created, precision)"
                        " VALUES (?, ?, ?, ?, ?, current_timestamp, ?) ON CONFLICT DO NOTHING",
                        [name, str(path), timing_mode, _sorted_levels(levels), kb_version, precision])
            old_levels, old_version = cur.execute(
                "SELECT levels, kb_version FROM submissions WHERE name = ?", [name]).fetchone()
            if kb_version is None or kb_version == old_version:
                levels = (old_levels or []) + (levels or [])
            cur.execute("UPDATE submissions SET path = ?, timing_mode = ?, precision = ?, levels = ?, kb_version = ?"
                        " WHERE name = ?",
                        [str(path), timing_mode, precision, _sorted_levels(levels), kb_version or old_version, name])

    def submissions(self) -> list[dict]:
        """Every submission: name, path, timing_mode and precision (of its latest run), levels (list or
        None), kb_version, created (ISO text) and runs: [{timing_mode, precision, n}] of its verdicts."""
        with self._cursor() as cur:
            rows = cur.execute("SELECT name, path, timing_mode, precision, levels, kb_version, created FROM submissions"
                               " ORDER BY created, name").fetchall()
            runs = cur.execute("SELECT submission, timing_mode, precision, count(*) FROM verdicts"
                               " GROUP BY submission, timing_mode, precision").fetchall()
        by_name: dict[str, list[dict]] = {}
        for name, mode, precision, n in sorted(runs, key=lambda r: (r[0], _mode_order(r[1], r[2]))):
            by_name.setdefault(name, []).append({"timing_mode": mode, "precision": precision, "n": n})
        keys = ("name", "path", "timing_mode", "precision", "levels", "kb_version", "created")
        return [dict(zip(keys, row[:6] + (row[6].isoformat(timespec="seconds"),)), runs=by_name.get(row[0], []))
                for row in rows]

    # verdicts

    def add_verdict(self, submission: str, verdict: dict) -> None:
        """Store a verdict (contract schema), replacing one for the same problem, timing mode and precision."""
        level, problem_id = verdict.get("level"), verdict.get("problem_id")
        if level is None or problem_id is None:
            raise StoreError("cannot store a verdict without level and problem_id")
        columns = _KEY_COLUMNS + _VERDICT_COLUMNS + ("verdict", "created")
        values = [submission, verdict.get("timing_mode") or "strict", verdict.get("precision") or "strict",
                  verdict.get("kb_version") or "", int(level), int(problem_id)]
        values += [verdict.get(column) for column in _VERDICT_COLUMNS] + [json.dumps(verdict)]
        marks = ", ".join("?" * len(values))
        with self._cursor() as cur:
            cur.execute(f"INSERT OR REPLACE INTO verdicts ({', '.join(columns)}) VALUES ({marks}, current_timestamp)",
                        values)

    def done_keys(self, submission: str, timing_mode: str | None = None,
                  precision: str | None = None) -> set[tuple[str | None, int, int]]:
        """(kb_version, level, problem_id) of the submission's stored verdicts (of this timing mode and
        precision, where given); kb_version None for a task set."""
        where, params = _where(submission, timing_mode, precision)
        with self._cursor() as cur:
            rows = cur.execute(f"SELECT kb_version, level, problem_id FROM verdicts {where}", params).fetchall()
        return {(kb_version or None, level, problem_id) for kb_version, level, problem_id in rows}

    def verdicts(self, submission: str | None = None, *, timing_mode: str | None = None,
                 precision: str | None = None) -> list[dict]:
        """Stored verdicts (as they were added, with timing_mode and precision always set), of one
        submission or of all, of every timing mode and precision unless given; by (submission,
        timing_mode, precision, problem)."""
        where, params = _where(submission, timing_mode, precision)
        with self._cursor() as cur:
            rows = cur.execute(f"SELECT verdict, timing_mode, precision FROM verdicts {where}"
                               " ORDER BY submission, timing_mode <> 'strict', timing_mode, precision <> 'strict',"
                               " precision, kb_version, level, problem_id", params).fetchall()
        out = []
        for text, mode, prec in rows:
            verdict = json.loads(text)
            verdict.setdefault("timing_mode", mode)
            verdict.setdefault("precision", prec)  # verdicts stored before precision was recorded: strict
            out.append(verdict)
        return out

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
            cur.execute("INSERT OR REPLACE INTO baselines (problem_sha256, gpu, torch, cuda, dtype, timing_mode,"
                        " t_eager_ms, t_compile_ms, record, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?,"
                        " current_timestamp)", values)

    # audits

    def get_audit(self, key: AuditKey) -> dict | None:
        """The stored audit row for this key, or None."""
        with self._cursor() as cur:
            row = cur.execute("SELECT row FROM audits WHERE problem_sha256 = ? AND atol = ? AND rtol = ? AND device = ?"
                              " AND precision = ?", list(astuple(key))).fetchone()
        return json.loads(row[0]) if row else None

    def put_audit(self, key: AuditKey, row: dict) -> None:
        """Store a problem's audit row (level, problem_id, name, accepts, ...), replacing an older one."""
        values = list(astuple(key)) + [row.get("level"), row.get("problem_id"), row.get("name"), json.dumps(row)]
        with self._cursor() as cur:
            cur.execute("INSERT OR REPLACE INTO audits (problem_sha256, atol, rtol, device, precision, level, problem_id,"
                        " name, row, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, current_timestamp)", values)


def _mode_order(timing_mode: str, precision: str) -> tuple:
    """strict first, then the others by name."""
    return timing_mode != "strict", timing_mode, precision != "strict", precision


def _where(submission: str | None, timing_mode: str | None, precision: str | None) -> tuple[str, list]:
    given = [(c, v) for c, v in (("submission", submission), ("timing_mode", timing_mode), ("precision", precision))
             if v is not None]
    return ("WHERE " + " AND ".join(f"{c} = ?" for c, _ in given) if given else ""), [v for _, v in given]


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    return {row[0] for row in con.execute(f"SELECT name FROM pragma_table_info('{table}')").fetchall()}


def _migrate(con: duckdb.DuckDBPyConnection) -> None:
    """Bring a file of the first schema to this one, in place, in one transaction (a killed migration
    leaves the old schema, which the next open migrates)."""
    old_submissions = "precision" not in _columns(con, "submissions")
    old_verdicts = "precision" not in _columns(con, "verdicts")
    if not (old_submissions or old_verdicts):
        return
    con.execute("BEGIN TRANSACTION")
    try:
        if old_submissions:
            con.execute("ALTER TABLE submissions ADD COLUMN precision VARCHAR")
            con.execute("UPDATE submissions SET precision = 'strict'")
        if old_verdicts:  # the primary key grows (timing_mode, precision): DuckDB cannot alter a key, so copy
            copied = _KEY_COLUMNS + _VERDICT_COLUMNS + ("verdict", "created")
            source = ["v.submission", "coalesce(v.timing_mode, s.timing_mode, 'strict')", "'strict'"]
            source += [f"v.{c}" for c in copied[3:]]
            con.execute(_VERDICTS.format(table="verdicts_v2"))
            con.execute(f"INSERT INTO verdicts_v2 ({', '.join(copied)}) SELECT {', '.join(source)}"
                        " FROM verdicts v LEFT JOIN submissions s ON s.name = v.submission")
            con.execute("DROP TABLE verdicts")
            con.execute("ALTER TABLE verdicts_v2 RENAME TO verdicts")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _sorted_levels(levels: list[int] | None) -> list[int] | None:
    return sorted({int(level) for level in levels}) if levels else None
