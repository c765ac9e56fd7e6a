"""The results database: an SQLite view of run folders, kept in step with them.

A run folder (traces.csv, provenance.json, requests.jsonl) stays the primary record; the database
is derived from it and can be rebuilt. It is never appended to blindly: `sync_run` reads a whole
folder and, in one transaction, deletes that run's rows and inserts them again. So a process
killed at any moment leaves either the run's previous state or its new one, a resumed run (which
keeps its run_id) never duplicates a row, and the database holds exactly the rows of traces.csv.
WAL mode and a busy timeout let shards in several processes sync into one file at once.

Tables: runs (one per run_id, from provenance.json), traces (one per traces.csv row, a column per
schema column; columns the schema does not know go into the json `extra`), requests (one per
requests.jsonl line), schema_version.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specnative.record.run_folder import (
    RunFolderError,
    RunRecord,
    base_cell,
    find_run_dirs,
    grid_of,
    grid_summary,
    host_of,
    kind_of,
    models_summary,
    read_run,
    row_verdict,
)
from specnative.record.schema import COLUMN_NAMES, COLUMNS, PANDAS_DTYPES

DEFAULT_DB = Path("runs") / "specnative.sqlite"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0  # a shard waits this long for another's transaction (a sync takes milliseconds)
RETRY_TIMEOUT_S = 0.5  # after one such wait ran out, a run's later syncs try this long only (sync_or_warn)
SQLITE_HEADER = b"SQLite format 3\x00"
COMPANION_SUFFIXES = ("-wal", "-shm", "-journal")  # SQLite's own files beside a database

# traces.csv's run_id is the invocation that wrote the row (a resumed or merged run mixes them);
# the table's run_id is the run's own, from provenance.json, so the file's column is renamed.
ROW_RUN_ID = "row_run_id"
SQL_TYPES = {"int": "INTEGER", "float": "REAL", "bool": "INTEGER", "str": "TEXT"}
TRACE_COLUMNS = {(ROW_RUN_ID if c.name == "run_id" else c.name): c for c in COLUMNS}
RUN_FIELDS = ("run_id", "run_dir", "date", "specnative_version", "specnative_commit", "llama_cpp_commit",
              "build_flags", "backend", "host", "cpu_count", "command", "preset", "kind", "completed",
              "models", "grid", "provenance")


class DatabaseError(Exception):
    """A database that cannot be read or written; the message is one line naming it."""


class DatabaseLocked(DatabaseError):
    """Another process held the write lock past the wait."""


@dataclass(frozen=True)
class SyncResult:
    run_id: str
    run_dir: Path
    rows: int
    requests: int
    torn_lines: int


# ---------------------------------------------------------------------------------------------
# Writing: whole runs, one transaction each call
# ---------------------------------------------------------------------------------------------
def sync_run(db_path, run_dir) -> SyncResult:
    """Makes the database hold exactly what `run_dir` holds now (called after every cell a sweep
    appends, at its end, and by `db import`)."""
    return _write(db_path, [read_run(run_dir)])[0]


_LOCKED: set[str] = set()  # databases whose wait for the write lock ran out in this process


def sync_or_warn(db_path, run_dir, final: bool = False) -> SyncResult | None:
    """sync_run for the sweep and serve runners: a database that cannot be written (locked past the
    timeout, a full disk, a damaged file) must not stop a measurement; the run folder is the record
    and `db import` catches up later. Warns on stderr instead, and returns None.

    A database another process keeps locked is waited for once (BUSY_TIMEOUT_S). Then the run says
    so once and goes on: each later sync tries briefly, and since a sync writes the whole run, the
    first that gets the lock brings in every row the earlier ones could not. `final` (the run's
    last sync) names the `db import` command if the database is still locked."""
    key = str(Path(db_path).resolve())
    waited = key in _LOCKED
    try:
        result = _write(db_path, [read_run(run_dir)], timeout=RETRY_TIMEOUT_S if waited else BUSY_TIMEOUT_S)[0]
    except DatabaseLocked:
        if not waited:
            _LOCKED.add(key)
            print(f"warning: the results database {db_path} is locked by another process (waited "
                  f"{BUSY_TIMEOUT_S:g} s); measuring goes on, and the run's rows go in at a later sync that "
                  f"finds it free, without waiting again", file=sys.stderr)
        if final:
            print(f"warning: the results database {db_path} stayed locked; the run folder is whole: "
                  f"`specnative db import {run_dir}` brings it in later", file=sys.stderr)
        return None
    except (DatabaseError, RunFolderError) as error:
        print(f"warning: the results database was not updated ({error}); the run folder is whole: "
              f"`specnative db import {run_dir}` brings it in later", file=sys.stderr)
        return None
    if waited:
        _LOCKED.discard(key)
        print(f"note: the results database {db_path} was free again: it holds run {result.run_id} whole",
              file=sys.stderr)
    return result


def import_runs(db_path, run_dirs) -> list[SyncResult]:
    """Syncs several folders; all are read (and any bad one refused) before anything is written."""
    return _write(db_path, [read_run(d) for d in run_dirs])


def rebuild(db_path, runs_root) -> list[SyncResult]:
    """Empties the database and imports every run folder under `runs_root`, in one transaction.
    A `runs_root` holding no run folder (a mistyped path) is refused: nothing is emptied."""
    found = find_run_dirs(runs_root)
    if not found:
        raise RunFolderError(f"{runs_root}: no run folder under it (none holds a provenance.json); "
                             f"{db_path} is left as it was")
    return _write(db_path, [read_run(d) for d in found], replace_all=True)


def is_database_file(path) -> bool:
    """A SQLite database, or one of SQLite's own files beside one (-wal, -shm, -journal)."""
    path = Path(path)
    if not path.is_file():
        return False
    for suffix in COMPANION_SUFFIXES:
        if path.name.endswith(suffix) and is_database_file(path.with_name(path.name[:-len(suffix)])):
            return True
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def _write(db_path, records: list[RunRecord], replace_all: bool = False,
           timeout: float = BUSY_TIMEOUT_S) -> list[SyncResult]:
    conn = _connect(db_path, create=True, timeout=timeout)
    try:
        conn.execute("BEGIN IMMEDIATE")  # the write lock first: concurrent shards queue here
        _ensure_schema(conn, db_path)
        if replace_all:
            for table in ("traces", "requests", "runs"):
                conn.execute(f"DELETE FROM {table}")
        results = [_replace_run(conn, record) for record in records]
        conn.execute("COMMIT")
        return results
    except sqlite3.Error as error:
        if isinstance(error, sqlite3.OperationalError) and "locked" in str(error):
            raise DatabaseLocked(f"{db_path}: cannot write ({error})") from None
        raise DatabaseError(f"{db_path}: cannot write ({error})") from None
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()


def _replace_run(conn: sqlite3.Connection, record: RunRecord) -> SyncResult:
    for table in ("traces", "requests", "runs"):
        conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (record.run_id,))
    conn.execute(f"INSERT INTO runs ({', '.join(RUN_FIELDS)}) VALUES ({', '.join('?' * len(RUN_FIELDS))})",
                 [_run_field(record, name) for name in RUN_FIELDS])
    frame = record.traces
    extra = [c for c in frame.columns if c not in COLUMN_NAMES]
    names = ["run_id", "row_index", *TRACE_COLUMNS, "extra"]
    rows = []
    for index, row in enumerate(frame.itertuples(index=False, name=None)):
        values = dict(zip(frame.columns, row))
        extras = {c: values[c] for c in extra if not pd.isna(values[c]) and values[c] != ""}
        rows.append([record.run_id, index, *(_sql(values.get("run_id" if n == ROW_RUN_ID else n))
                                             for n in TRACE_COLUMNS),
                     json.dumps(extras) if extras else None])
    conn.executemany(f"INSERT INTO traces ({', '.join(_q(n) for n in names)}) "
                     f"VALUES ({', '.join('?' * len(names))})", rows)
    conn.executemany("INSERT INTO requests (run_id, line_index, cell_id, json) VALUES (?, ?, ?, ?)",
                     [(record.run_id, *line) for line in record.requests])
    return SyncResult(record.run_id, record.run_dir, len(rows), len(record.requests), record.torn_lines)


def _run_field(record: RunRecord, name: str):
    p = record.provenance
    computed = {"run_id": record.run_id, "run_dir": str(record.run_dir.resolve()), "host": host_of(p),
                "kind": kind_of(p), "completed": None if p.get("completed") is None else int(bool(p["completed"])),
                "models": json.dumps(p.get("models") or []), "grid": json.dumps(grid_of(p)),
                "provenance": json.dumps(p, default=str)}
    value = computed[name] if name in computed else p.get(name)
    return value if value is None or isinstance(value, (int, float, str)) else json.dumps(value, default=str)


def _sql(value):
    """A DataFrame cell as SQLite stores it: missing -> NULL, numpy scalars -> Python."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):
        value = value.item()
    return int(value) if isinstance(value, bool) else value


def _run_type(name: str) -> str:
    return "INTEGER" if name in ("cpu_count", "completed") else "TEXT"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# ---------------------------------------------------------------------------------------------
# Connection and schema
# ---------------------------------------------------------------------------------------------
def _connect(db_path, create: bool, timeout: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    """A connection to a results database. Reading (create False) needs a specnative database; one
    written by an earlier specnative is migrated here (_ensure_schema), one of a newer schema
    version refused in the same line as by a write. Nothing else writes on opening, so a file that
    is not a results database (an empty one, another program's) is refused and left as it was."""
    path = Path(db_path)
    if not create and not path.is_file():
        raise DatabaseError(f"{path}: no results database there (a sweep writes one; or run "
                            f"`specnative db import RUN_DIR...`)")
    if not create and path.stat().st_size == 0:
        raise DatabaseError(f"{path}: an empty file, not a specnative results database (a sweep writes one; "
                            f"or run `specnative db import RUN_DIR...`)")
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                _create_complete(path, timeout)
        # isolation_level None: transactions are begun and ended here, explicitly
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    except (sqlite3.Error, OSError) as error:
        raise DatabaseError(f"{path}: not a readable SQLite database ({error})") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        if create:
            conn.execute("PRAGMA journal_mode = WAL")  # readers and one writer at once; persists in the file
        else:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"runs", "traces", "schema_version"} <= tables:
                raise DatabaseError(f"{path}: not a specnative results database"
                                    + (" (no tables: an empty database)" if not tables else ""))
            _check_version(conn, path)
            if _missing_schema(conn):  # written by an earlier specnative: migrated on opening
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    _ensure_schema(conn, path)
                    conn.execute("COMMIT")
                except sqlite3.Error as error:
                    raise DatabaseError(f"{path}: written by an earlier specnative, and its new columns cannot "
                                        f"be added here ({error}); rebuild it from the run folders with "
                                        f"`specnative db rebuild`") from None
        return conn
    except (sqlite3.Error, OSError, DatabaseError) as error:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()
        if isinstance(error, DatabaseError):
            raise
        raise DatabaseError(f"{path}: not a readable SQLite database ({error})") from None


def _create_complete(path: Path, timeout: float) -> None:
    """A new database appears whole or not at all: its schema is built in a hidden file beside it and
    linked into place. A writer killed while creating it then never leaves an empty file behind, which
    readers would refuse as not a results database."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}.new")
    conn = sqlite3.connect(scratch, timeout=timeout, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        _ensure_schema(conn, path)
        conn.execute("COMMIT")
    finally:
        conn.close()
    try:
        os.link(scratch, path)
    except FileExistsError:
        pass  # another writer created it first, just as complete
    except OSError:
        pass  # no hard links on this file system: the connection below creates it in place
    finally:
        for leftover in (scratch, *(scratch.with_name(scratch.name + s) for s in COMPANION_SUFFIXES)):
            leftover.unlink(missing_ok=True)


def _check_version(conn: sqlite3.Connection, path) -> int | None:
    """The database's schema version; a newer one than this code's is refused (every verb, reading
    or writing, says it in this line)."""
    found = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
    if found is not None and found > SCHEMA_VERSION:
        raise DatabaseError(f"{path}: database schema version {found} is newer than this specnative's "
                            f"({SCHEMA_VERSION}); upgrade specnative")
    return found


def _missing_schema(conn: sqlite3.Connection) -> bool:
    """Whether a table or column of this schema is missing (a database of an earlier specnative)."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not {"runs", "traces", "requests", "schema_version"} <= tables:
        return True
    have_runs = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    have_traces = {r[1] for r in conn.execute("PRAGMA table_info(traces)")}
    return not (set(RUN_FIELDS) <= have_runs and set(TRACE_COLUMNS) <= have_traces)


def _ensure_schema(conn: sqlite3.Connection, path="the database") -> None:
    """Creates what is missing and adds columns a newer schema has: the one migration, for writes and
    for a read of an earlier specnative's database (idempotent; run inside a write transaction, so
    shards creating one file at once do it one after the other)."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    found = _check_version(conn, path)
    if found is None:
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
    conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({RUN_FIELDS[0]} TEXT PRIMARY KEY, "
                 + ", ".join(f"{n} {_run_type(n)}" for n in RUN_FIELDS[1:]) + ")")
    have_runs = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    for name in RUN_FIELDS[1:]:
        if name not in have_runs:
            conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {_run_type(name)}")
    conn.execute("CREATE TABLE IF NOT EXISTS traces (run_id TEXT NOT NULL, row_index INTEGER NOT NULL, "
                 "extra TEXT, PRIMARY KEY (run_id, row_index))")
    have = {r[1] for r in conn.execute("PRAGMA table_info(traces)")}
    for name, column in TRACE_COLUMNS.items():
        if name not in have:
            conn.execute(f"ALTER TABLE traces ADD COLUMN {_q(name)} {SQL_TYPES[column.dtype]}")
    conn.execute("CREATE INDEX IF NOT EXISTS traces_cell ON traces (cell_id)")
    conn.execute("CREATE TABLE IF NOT EXISTS requests (run_id TEXT NOT NULL, line_index INTEGER NOT NULL, "
                 "cell_id TEXT, json TEXT NOT NULL, PRIMARY KEY (run_id, line_index))")


# ---------------------------------------------------------------------------------------------
# Reading the database
# ---------------------------------------------------------------------------------------------
def _query(db_path, sql: str, params=()) -> list[sqlite3.Row]:
    conn = _connect(db_path, create=False)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.Error as error:
        raise DatabaseError(f"{db_path}: cannot read ({error})") from None
    finally:
        conn.close()


def load_run(db_path, run_id: str) -> RunRecord:
    """A run as the database holds it: traces with the schema's types, as read_traces gives them."""
    runs = _query(db_path, "SELECT run_dir, provenance FROM runs WHERE run_id = ?", (run_id,))
    if not runs:
        raise DatabaseError(f"{db_path}: no run {run_id}")
    rows = _query(db_path, "SELECT * FROM traces WHERE run_id = ? ORDER BY row_index", (run_id,))
    records = []
    for row in rows:
        values = {("run_id" if k == ROW_RUN_ID else k): row[k] for k in TRACE_COLUMNS}
        values.update(json.loads(row["extra"]) if row["extra"] else {})
        records.append(values)
    frame = pd.DataFrame(records, columns=list(dict.fromkeys(
        [*COLUMN_NAMES, *(k for r in records for k in r)])))
    for name in frame.columns[len(COLUMN_NAMES):]:  # unknown to the schema: text, as read_traces leaves it
        frame[name] = frame[name].fillna("").astype(str)
    for column in COLUMNS:
        values = frame[column.name]
        frame[column.name] = (values.map(lambda v: None if v is None else bool(v)) if column.dtype == "bool"
                              else values).astype(PANDAS_DTYPES[column.dtype])
    return RunRecord(run_id, Path(runs[0]["run_dir"]), json.loads(runs[0]["provenance"]), frame, [])


def run_ids_with_prefix(db_path, prefix: str) -> list[str]:
    rows = _query(db_path, "SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\' ORDER BY run_id",
                  (prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",))
    return [r["run_id"] for r in rows]


def runs_of_commit(db_path, commit_prefix: str) -> list[dict]:
    """Runs whose specnative or llama.cpp commit starts with `commit_prefix`, newest first."""
    rows = _query(db_path, "SELECT run_id, date, kind, completed, specnative_commit, llama_cpp_commit FROM runs "
                           "ORDER BY date DESC, run_id DESC")
    prefix = commit_prefix.lower()
    return [dict(r) for r in rows
            if any((r[c] or "").lower().startswith(prefix) for c in ("specnative_commit", "llama_cpp_commit"))]


def list_runs(db_path) -> list[dict]:
    """One dict per run, newest first: id, date, commits, host, models, grid, cells, verdict counts."""
    runs = _query(db_path, "SELECT * FROM runs ORDER BY date DESC, run_id DESC")
    rows = _query(db_path, "SELECT run_id, cell_id, spec_decode, verdict, lossless_ok FROM traces")
    cells, verdicts = {}, {}
    for r in rows:
        cells.setdefault(r["run_id"], set()).add(base_cell(r["cell_id"] or ""))
        if r["spec_decode"] == "on":
            counts = verdicts.setdefault(r["run_id"], {})
            verdict = row_verdict(r["verdict"], r["lossless_ok"])
            counts[verdict] = counts.get(verdict, 0) + 1
    provenances = [json.loads(r["provenance"]) for r in runs]
    return [{"run_id": r["run_id"], "date": r["date"], "kind": r["kind"], "completed": r["completed"],
             "specnative_commit": r["specnative_commit"], "llama_cpp_commit": r["llama_cpp_commit"],
             "host": r["host"], "models": models_summary(p), "grid": grid_summary(p),
             "cells": len(cells.get(r["run_id"], ())), "verdicts": verdicts.get(r["run_id"], {}),
             "run_dir": r["run_dir"]} for r, p in zip(runs, provenances)]
