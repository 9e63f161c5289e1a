"""Opening a DuckDB file: the one place cudagym does it (results store, build store, LLM answer cache).

DuckDB lets one process hold a file read-write (a lock on the file); a second process that opens it
fails. `connect` turns that and every other failure to open into one line for the CLI
(`DatabaseError`, a ValueError; `DatabaseLocked` for the lock conflict).
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

_LOCK = re.compile(r"Could not set lock on file(?:.*?\(PID (\d+)\))?", re.S)
_KIND = re.compile(r"^[A-Z][A-Za-z ]* Error: ")  # duckdb's "IO Error: ", "Serialization Error: ", ...


class DatabaseError(ValueError):
    """A DuckDB file cannot be opened or refuses a write; the message is one line."""


class DatabaseLocked(DatabaseError):
    """Another process holds the file open (DuckDB allows one writer)."""


def connect(path: str | Path, what: str = "database", *, option: str = "--db",
            read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A connection to the DuckDB file at `path` (created if absent; its directory must exist).
    `what` names the file in errors ("database", "build store", "LLM cache"); `option`, the flag
    that chooses another file."""
    path = Path(path)
    if not path.parent.is_dir():
        raise DatabaseError(f"cannot open {what} {path}: directory {path.parent} does not exist")
    if path.is_dir():
        raise DatabaseError(f"cannot open {what} {path}: it is a directory")
    if not is_duckdb_file(path):
        # DuckDB itself would open a JSON, CSV or Parquet file as an in-memory database with the file as a
        # view: every result written there would be lost when the run ends, without a word.
        raise DatabaseError(f"cannot open {what} {path}: it is not a valid DuckDB database file (pass another {option})")
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as e:
        raise error_of(e, path, what, option) from None


def is_duckdb_file(path: Path) -> bool:
    """Whether `path` may be handed to DuckDB: absent (DuckDB creates it), starting with DuckDB's header
    (an 8-byte checksum, then the magic bytes DUCK), or empty or unreadable (DuckDB's own error says why,
    through error_of)."""
    try:
        with path.open("rb") as f:
            head = f.read(12)
    except OSError:  # absent or unreadable
        return True
    return len(head) == 0 or head[8:12] == b"DUCK"


def error_of(error: Exception, path: str | Path, what: str = "database", option: str = "--db") -> DatabaseError:
    """The one-line DatabaseError for a duckdb error about the file at `path`."""
    text = str(error).strip()
    lock = _LOCK.search(text)
    if lock:
        pid = f" (PID {lock.group(1)})" if lock.group(1) else ""
        return DatabaseLocked(f"another process{pid} holds {path} open (DuckDB allows one writer); close it"
                              f" or use another {option}")
    line = _KIND.sub("", (text.splitlines() or [type(error).__name__])[0])
    return DatabaseError(f"cannot open {what} {path}: {line}")


def interrupted(error: BaseException) -> bool:
    """Whether `error` is Ctrl-C: a KeyboardInterrupt, or the error DuckDB raises in its place when the
    signal lands while it runs a statement (it rolls that statement back; what was committed stays)."""
    if isinstance(error, KeyboardInterrupt):
        return True
    return isinstance(error, (RuntimeError, duckdb.Error)) and str(error).startswith("Query interrupted")
