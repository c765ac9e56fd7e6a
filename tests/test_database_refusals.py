"""The results database refuses early and in one line, and a refused command changes no file: a
database of an earlier specnative is migrated on opening, one of a newer schema refused by every
verb alike; a rebuild from a folder without runs, an empty file given as the database and a glob
that names database files leave every file as it was; a database another process keeps locked is
waited for once."""
from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
import synthetic_runs

from specnative import cli
from specnative.record import database


def hashes(root: Path) -> dict:
    """sha256 of every file under root: a refused command must leave each byte as it was."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def sql(db, statement, params=()):
    with contextlib.closing(sqlite3.connect(db)) as conn:  # closed: nothing left for a later checkpoint
        with conn:
            return conn.execute(statement, params).fetchall()


def two_runs(tmp_path, db):
    runs = tmp_path / "runs"
    for name, seed in (("run-a", 1), ("run-b", 2)):
        synthetic_runs.write_run(runs / name, name, synthetic_runs.sweep_rows(name, seed),
                                 specnative_commit=("aaaa" if name == "run-a" else "bbbb") * 10)
    database.import_runs(db, [runs / "run-a", runs / "run-b"])
    return runs


def test_compare_and_runs_read_a_database_written_by_an_earlier_specnative(tmp_path, capsys):
    db = tmp_path / "db.sqlite"
    two_runs(tmp_path, db)
    for column in ("kv_cells_left", "speedup_repeats", "tps_repeats", "verdict"):  # columns added later
        sql(db, f'ALTER TABLE traces DROP COLUMN "{column}"')
    sql(db, "ALTER TABLE runs DROP COLUMN grid")
    assert cli.main(["compare", "run-a", "run-b", "--db", str(db), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"]
    assert cli.main(["compare", "-b", "aaaa", "-c", "bbbb", "--db", str(db), "-o", "json"]) == 0
    assert cli.main(["runs", "--db", str(db)]) == 0
    have = {r[1] for r in sql(db, "PRAGMA table_info(traces)")}
    assert {"kv_cells_left", "speedup_repeats", "verdict"} <= have  # migrated on opening, once


def test_a_newer_schema_is_refused_in_the_same_line_by_every_verb_and_changes_nothing(tmp_path):
    db = tmp_path / "db.sqlite"
    runs = two_runs(tmp_path, db)
    sql(db, "UPDATE schema_version SET version = 99")
    before = hashes(tmp_path)
    expected = (f"error: {db}: database schema version 99 is newer than this specnative's "
                f"({database.SCHEMA_VERSION}); upgrade specnative")
    for argv in (["runs"], ["runs", "-o", "json"], ["compare", "run-a", "run-b"], ["compare", "-b", "aaaa", "-c", "bbbb"],
                 ["db", "import", str(runs / "run-a")], ["db", "rebuild", str(runs)]):
        with pytest.raises(SystemExit) as refused:
            cli.main([*argv, "--db", str(db)])
        assert str(refused.value.code) == expected, argv
        assert hashes(tmp_path) == before, argv


def test_rebuild_from_a_folder_without_runs_is_refused_and_the_database_stays_byte_identical(tmp_path):
    db = tmp_path / "db.sqlite"
    two_runs(tmp_path, db)
    (tmp_path / "typo").mkdir()
    before = hashes(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: .*typo: no run folder under it .*db\.sqlite is left as it was$"):
        cli.main(["db", "rebuild", str(tmp_path / "typo"), "--db", str(db)])
    assert hashes(tmp_path) == before
    assert sql(db, "SELECT COUNT(*) FROM runs") == [(2,)]


def test_the_default_database_of_rebuild_is_the_one_the_docs_name(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    synthetic_runs.write_run(runs / "r0", "run-0", synthetic_runs.sweep_rows("run-0", 0))
    monkeypatch.chdir(tmp_path / "runs" / "r0")  # anywhere: the default follows RUNS_DIR, not the working folder
    assert cli.main(["db", "rebuild", str(runs)]) == 0
    assert (runs / "specnative.sqlite").is_file()
    docs = " ".join((Path(__file__).resolve().parents[1] / "docs" / "compare.md").read_text(encoding="utf-8").split())
    assert "`db rebuild RUNS_DIR` writes to `RUNS_DIR/specnative.sqlite` unless given `--db`" in docs


def test_import_into_another_database_skips_the_database_files_the_glob_names(tmp_path, capsys):
    runs = tmp_path / "runs"
    for i in range(2):
        synthetic_runs.write_run(runs / f"r{i}", f"run-{i}", synthetic_runs.sweep_rows(f"run-{i}", i))
    database.sync_run(runs / "specnative.sqlite", runs / "r0")  # runs/ holds its default database
    before = hashes(runs)
    ci = tmp_path / "ci.sqlite"
    assert cli.main(["db", "import", "--db", str(ci), *map(str, sorted(runs.iterdir()))]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("skipped")] == [
        f"skipped 1 database file(s), not run folders: {runs / 'specnative.sqlite'}"]
    assert sql(ci, "SELECT run_id FROM runs ORDER BY 1") == [("run-0",), ("run-1",)]
    assert hashes(runs) == before


@pytest.mark.parametrize("content", [b"", None], ids=["empty-file", "sqlite-without-tables"])
def test_runs_and_compare_refuse_an_empty_file_and_leave_it_as_it_was(tmp_path, content):
    db = tmp_path / "empty.sqlite"
    if content is None:  # a SQLite file with no table (another program's, or a writer killed before committing)
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("PRAGMA journal_mode = WAL")
    else:
        db.write_bytes(content)
    before = hashes(tmp_path)
    for argv in (["runs"], ["compare", "x", "y"]):
        with pytest.raises(SystemExit, match=r"^error: .*empty\.sqlite: (an empty file, )?not a specnative results"):
            cli.main([*argv, "--db", str(db)])
        assert hashes(tmp_path) == before


def test_a_database_locked_by_another_process_is_waited_for_once(tmp_path, monkeypatch, capsys):
    run = synthetic_runs.write_run(tmp_path / "run", "run-1", synthetic_runs.sweep_rows("run-1", 1))
    db = tmp_path / "db.sqlite"
    database.sync_run(db, run)
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(database, "RETRY_TIMEOUT_S", 0.01)
    monkeypatch.setattr(database, "_LOCKED", set())
    waits = []
    connect = database._connect
    monkeypatch.setattr(database, "_connect", lambda path, create, timeout=database.BUSY_TIMEOUT_S:
                        waits.append(timeout) or connect(path, create, timeout))
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write transaction
    try:
        for _ in range(3):  # three cells while the lock is held
            assert database.sync_or_warn(db, run) is None
        assert database.sync_or_warn(db, run, final=True) is None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert waits == [0.2, 0.01, 0.01, 0.01]  # the full wait once, then a brief try per sync
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if "is locked by another process" in line]) == 1
    assert len([line for line in err if "stayed locked" in line and "db import" in line]) == 1
    assert database.sync_or_warn(db, run) is not None  # free again: the run goes in whole
    assert "was free again" in capsys.readouterr().err
