"""Opening DuckDB files (cudagym.tasks.db): one place, one-line errors, for every store that opens one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cudagym.tasks.db import DatabaseError, DatabaseLocked, connect

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def held(tmp_path):
    """A DuckDB file another process holds open read-write, and that process's pid."""
    path = tmp_path / "held.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(path)!r});"
                               " print('open', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        yield path, holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_connect_creates_a_file_and_reopens_it(tmp_path):
    con = connect(tmp_path / "a.duckdb")
    con.execute("CREATE TABLE t (x INTEGER)")
    con.execute("INSERT INTO t VALUES (1)")
    con.close()
    con = connect(tmp_path / "a.duckdb", read_only=True)
    assert con.execute("SELECT x FROM t").fetchall() == [(1,)]
    con.close()


@pytest.mark.parametrize("make_path, message", [
    (lambda tmp: tmp / "no" / "such" / "a.duckdb", "does not exist"),
    (lambda tmp: tmp, "it is a directory"),
    (lambda tmp: _text_file(tmp / "notes.duckdb"), "not a valid DuckDB database file"),
])
def test_a_file_that_cannot_be_opened_is_one_line_naming_it(tmp_path, make_path, message):
    path = make_path(tmp_path)
    with pytest.raises(DatabaseError) as info:
        connect(path, "build store")
    text = str(info.value)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, DatabaseLocked)
    assert text.startswith(f"cannot open build store {path}: ") and message in text and "\n" not in text
    assert "IO Error" not in text  # duckdb's error kind is noise to a user


def test_a_file_another_process_holds_names_the_conflict_and_the_option_to_change(held):
    path, pid = held
    with pytest.raises(DatabaseLocked) as info:
        connect(path)
    assert str(info.value) == (f"another process (PID {pid}) holds {path} open (DuckDB allows one writer);"
                               " close it or use another --db")


def test_the_build_store_and_the_llm_cache_open_through_connect(held):
    from cudagym.synth.build import BuildStore
    from cudagym.synth.llm import ResponseCache

    path, pid = held
    with pytest.raises(DatabaseLocked, match=rf"^another process \(PID {pid}\) holds .* use another --out$"):
        BuildStore(path)
    with pytest.raises(DatabaseLocked, match=r"use another --llm-cache$"):
        ResponseCache(path)


def test_a_locked_build_folder_is_one_line_from_the_cli(held, capsys):
    from cudagym.cli import main

    path, _ = held
    out = path.parent / "build"
    out.mkdir()
    path.rename(out / "build.duckdb")  # the holder keeps the file open under its new name
    assert main(["dataset", "build", "--out", str(out), "--target", "1", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("cudagym: error: another process") and "--out" in err


def _text_file(path: Path) -> Path:
    path.write_text("this is not a database\n" * 100)
    return path


@pytest.mark.parametrize("name, text", [("results.jsonl", '{"a": 1}\n'), ("runs.csv", "a,b\n1,2\n"), ("notes.txt", "hello\n")])
def test_a_data_file_given_as_the_database_is_refused_not_opened_in_memory(tmp_path, name, text):
    """DuckDB opens an existing JSON or CSV file as an in-memory database (the file as a view): a run
    given `--db results.jsonl` would store every verdict in memory and lose it. Refused, file untouched."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DatabaseError, match="not a valid DuckDB database file") as e:
        connect(path, "database")
    assert len(str(e.value).splitlines()) == 1 and "--db" in str(e.value)
    assert path.read_text() == text
    real = tmp_path / "real.duckdb"
    connect(real).close()
    con = connect(real)  # an existing database opens
    con.execute("CREATE TABLE IF NOT EXISTS t (a INT)")
    con.close()
