"""The results database: a view of run folders that a kill, a resume or several shards at once
leave with exactly the rows of each traces.csv."""
from __future__ import annotations

import json
import multiprocessing
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import db_workers
import pandas as pd
import pytest
import synthetic_runs

from specnative import cli
from specnative.record import database
from specnative.record.run_folder import RunFolderError
from specnative.record.schema import read_traces

HERE = Path(__file__).resolve().parent


def table(db, sql, params=()):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


def cell_ids(db, run_id):
    return [r[0] for r in table(db, "SELECT cell_id FROM traces WHERE run_id = ? ORDER BY row_index", (run_id,))]


def file_cell_ids(run_dir):
    return list(read_traces(Path(run_dir) / "traces.csv")["cell_id"])


@pytest.fixture
def run(tmp_path):
    return synthetic_runs.write_run(tmp_path / "run", "run-1", synthetic_runs.sweep_rows("run-1", 1))


def test_sync_holds_the_rows_of_traces_csv_and_twice_changes_nothing(tmp_path, run):
    db = tmp_path / "db.sqlite"
    first = database.sync_run(db, run)
    before = table(db, "SELECT * FROM traces ORDER BY run_id, row_index")
    second = database.sync_run(db, run)
    assert first.rows == second.rows == 12
    assert table(db, "SELECT * FROM traces ORDER BY run_id, row_index") == before
    assert cell_ids(db, "run-1") == file_cell_ids(run)
    assert table(db, "SELECT COUNT(*) FROM runs") == [(1,)]


def test_a_run_reads_back_as_read_traces_reads_the_file(tmp_path, run):
    db = tmp_path / "db.sqlite"
    database.sync_run(db, run)
    from_file = read_traces(run / "traces.csv")
    from_db = database.load_run(db, "run-1").traces
    pd.testing.assert_frame_equal(from_db[list(from_file.columns)], from_file)


def test_columns_the_schema_does_not_know_are_kept_in_extra(tmp_path, run):
    text = (run / "traces.csv").read_text().splitlines()
    text = [text[0] + ",future_column"] + [line + f",value{i}" for i, line in enumerate(text[1:])]
    (run / "traces.csv").write_text("\n".join(text) + "\n")
    db = tmp_path / "db.sqlite"
    database.sync_run(db, run)
    extra = json.loads(table(db, "SELECT extra FROM traces WHERE row_index = 3")[0][0])
    assert extra["future_column"] == "value3"
    assert list(database.load_run(db, "run-1").traces["future_column"])[3] == "value3"


def test_a_torn_last_line_is_skipped(tmp_path, run):
    with open(run / "traces.csv", "a") as f:
        f.write("4,on,0.5,0.3,1,0,12")  # a row cut short by a kill: no line end
    result = database.sync_run(tmp_path / "db.sqlite", run)
    assert (result.rows, result.torn_lines) == (12, 1)


def test_a_damaged_row_before_the_last_is_an_error_naming_the_line(tmp_path, run):
    lines = (run / "traces.csv").read_text().splitlines(keepends=True)
    lines[3] = "4,on,garbage\n"
    (run / "traces.csv").write_text("".join(lines))
    with pytest.raises(RunFolderError, match=r"traces\.csv:4: 3 fields"):
        database.sync_run(tmp_path / "db.sqlite", run)
    assert not (tmp_path / "db.sqlite").exists()


def test_requests_are_stored_per_line_and_a_torn_last_line_is_skipped(tmp_path, run):
    lines = [json.dumps({"cell_id": "serve/x/on", "request": i}) for i in range(3)]
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n" + '{"cell_id": "serve/x/on", "requ')
    result = database.sync_run(tmp_path / "db.sqlite", run)
    assert (result.requests, result.torn_lines) == (3, 1)
    assert table(tmp_path / "db.sqlite", "SELECT cell_id FROM requests WHERE line_index = 2") == [("serve/x/on",)]


def test_a_resumed_run_keeps_its_run_id_and_is_never_duplicated(tmp_path):
    run_dir = synthetic_runs.write_run(tmp_path / "run", "run-1",
                                       synthetic_runs.sweep_rows("run-1", 1, regimes=[(0, 1), (0, 4)]))
    db = tmp_path / "db.sqlite"
    database.sync_run(db, run_dir)
    # the resumed invocation's rows carry its own run id; provenance.json keeps the run's first
    more = synthetic_runs.sweep_rows("run-1-resumed", 2, regimes=[(0, 8)])
    synthetic_runs.write_traces(run_dir / "traces.csv", more, mode="a")
    database.sync_run(db, run_dir)
    database.sync_run(db, run_dir)
    assert cell_ids(db, "run-1") == file_cell_ids(run_dir)
    assert table(db, "SELECT DISTINCT row_run_id FROM traces ORDER BY 1") == [("run-1",), ("run-1-resumed",)]


def test_a_failure_inside_the_transaction_leaves_the_previous_state(tmp_path, run, monkeypatch):
    db = tmp_path / "db.sqlite"
    database.sync_run(db, run)
    before = table(db, "SELECT * FROM traces ORDER BY row_index")
    synthetic_runs.write_traces(run / "traces.csv", synthetic_runs.sweep_rows("run-1", 9, regimes=[(4, 4)]), mode="a")
    original = database._replace_run

    def dies_after_deleting(conn, record):
        conn.execute("DELETE FROM traces WHERE run_id = ?", (record.run_id,))
        raise KeyboardInterrupt("interrupted mid-transaction")  # as a signal would, half way through

    monkeypatch.setattr(database, "_replace_run", dies_after_deleting)
    with pytest.raises(KeyboardInterrupt, match="interrupted mid-transaction"):
        database.sync_run(db, run)
    assert table(db, "SELECT * FROM traces ORDER BY row_index") == before
    monkeypatch.setattr(database, "_replace_run", original)
    assert database.sync_run(db, run).rows == 14


def wait_for_rows(db, rows, timeout=60.0):
    """Until the database holds `rows` trace rows (another process is writing it)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if db.exists() and table(db, "SELECT COUNT(*) FROM traces")[0][0] >= rows:
                return
        except sqlite3.OperationalError:  # its tables are not there yet
            pass
        time.sleep(0.02)
    raise AssertionError(f"the worker did not write {rows} rows in {timeout} s")


def _worker(name, *args):
    return subprocess.Popen([sys.executable, str(HERE / "db_workers.py"), name, *map(str, args)])


def test_sigkill_during_a_sweep_then_a_resume_leaves_exactly_the_rows_of_traces_csv(tmp_path):
    db, run_dir = tmp_path / "db.sqlite", synthetic_runs.write_run(tmp_path / "run", "run-1", [])
    (run_dir / "traces.csv").unlink()
    worker = _worker("sweep_forever", db, run_dir, "run-1")
    wait_for_rows(db, 8)
    time.sleep(0.013)  # lands anywhere: between cells, in a half-written row, inside a sync
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    assert table(db, "PRAGMA integrity_check") == [("ok",)]
    # the resumed sweep: cut a torn last row (as --resume does), continue, sync after each cell
    data = (run_dir / "traces.csv").read_bytes()
    (run_dir / "traces.csv").write_bytes(data[:data.rfind(b"\n") + 1])
    database.sync_run(db, run_dir)
    assert cell_ids(db, "run-1") == file_cell_ids(run_dir)
    for index in range(100, 103):
        synthetic_runs.write_traces(run_dir / "traces.csv",
                                    synthetic_runs.sweep_rows("run-1", index, regimes=[(index, 1)]), mode="a")
        database.sync_run(db, run_dir)
    ids = cell_ids(db, "run-1")
    assert ids == file_cell_ids(run_dir) and len(ids) == len(set(ids))


def test_sigkill_inside_a_sync_leaves_the_old_or_the_new_state_whole(tmp_path):
    db = tmp_path / "db.sqlite"
    small = synthetic_runs.write_run(tmp_path / "small", "run-1", synthetic_runs.sweep_rows("run-1", 1) * 50)
    big = synthetic_runs.write_run(tmp_path / "big", "run-1", synthetic_runs.sweep_rows("run-1", 2) * 300)
    size = {str(small.resolve()): 600, str(big.resolve()): 3600}
    for delay in (0.05, 0.2, 0.45):
        worker = _worker("sync_forever", db, small, big)
        wait_for_rows(db, 1)
        time.sleep(delay)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert table(db, "PRAGMA integrity_check") == [("ok",)]
        (run_dir,), = table(db, "SELECT run_dir FROM runs")  # written in the same transaction as the rows
        assert table(db, "SELECT COUNT(*) FROM traces") == [(size[run_dir],)]


def test_four_shards_syncing_at_once_lose_nothing(tmp_path):
    db = tmp_path / "db.sqlite"
    context = multiprocessing.get_context("fork")  # the children inherit the imports: no second start-up
    shards = [context.Process(target=db_workers.shard, args=(str(db), str(tmp_path / f"shard{i}"), f"shard-{i}",
                                                           100 * i, 6)) for i in range(4)]
    for process in shards:
        process.start()
    for process in shards:
        process.join(120)
    assert [p.exitcode for p in shards] == [0, 0, 0, 0]
    for i in range(4):
        assert cell_ids(db, f"shard-{i}") == file_cell_ids(tmp_path / f"shard{i}")
        assert len(cell_ids(db, f"shard-{i}")) == 12
    assert table(db, "PRAGMA journal_mode") == [("wal",)]


def test_a_database_from_an_older_schema_gains_the_new_columns(tmp_path, run):
    db = tmp_path / "db.sqlite"
    database.sync_run(db, run)
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE traces DROP COLUMN kv_cells_left")
    database.sync_run(db, run)
    assert "kv_cells_left" in {r[1] for r in table(db, "PRAGMA table_info(traces)")}


def test_a_database_of_a_newer_schema_is_refused(tmp_path, run):
    db = tmp_path / "db.sqlite"
    database.sync_run(db, run)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(database.DatabaseError, match="schema version 99 is newer"):
        database.sync_run(db, run)


def test_import_refuses_a_folder_that_is_not_a_run_and_writes_nothing(tmp_path, run):
    (tmp_path / "notes").mkdir()
    db = tmp_path / "runs" / "specnative.sqlite"
    with pytest.raises(SystemExit, match=r"^error: .*notes: not a run folder \(no provenance\.json\)$"):
        cli.main(["db", "import", str(run), str(tmp_path / "notes"), "--db", str(db)])
    assert not db.exists()
    with pytest.raises(SystemExit, match=r"^error: .*missing: no such run folder$"):
        cli.main(["db", "import", str(tmp_path / "missing"), "--db", str(db)])


def test_an_unreadable_database_is_one_error_line_and_stays_as_it_was(tmp_path, run):
    db = tmp_path / "garbage.sqlite"
    db.write_bytes(b"not a database at all" * 100)
    for argv in (["db", "import", str(run)], ["runs"], ["compare", "some-run", "other-run"]):
        with pytest.raises(SystemExit, match=r"^error: .*garbage\.sqlite: not a"):
            cli.main([*argv, "--db", str(db)])
    assert db.read_bytes() == b"not a database at all" * 100


def test_import_of_a_runs_folder_glob_skips_the_database_files(tmp_path, capsys):
    runs = tmp_path / "runs"
    for i in range(2):
        synthetic_runs.write_run(runs / f"r{i}", f"run-{i}", synthetic_runs.sweep_rows(f"run-{i}", i))
    db = runs / "specnative.sqlite"
    database.sync_run(db, runs / "r0")
    assert cli.main(["db", "import", *map(str, sorted(runs.iterdir())), "--db", str(db)]) == 0
    assert "synced run-1" in capsys.readouterr().out
    assert table(db, "SELECT run_id FROM runs ORDER BY 1") == [("run-0",), ("run-1",)]


def test_rebuild_drops_runs_whose_folder_is_gone(tmp_path):
    runs = tmp_path / "runs"
    for i in range(3):
        synthetic_runs.write_run(runs / f"r{i}", f"run-{i}", synthetic_runs.sweep_rows(f"run-{i}", i))
    db = tmp_path / "db.sqlite"
    database.import_runs(db, sorted(runs.iterdir()))
    shutil.rmtree(runs / "r1")
    assert cli.main(["db", "rebuild", str(runs), "--db", str(db)]) == 0
    assert table(db, "SELECT run_id FROM runs ORDER BY 1") == [("run-0",), ("run-2",)]
    assert table(db, "SELECT COUNT(*) FROM traces") == [(24,)]


def test_runs_lists_each_run_with_its_cells_and_verdicts(tmp_path, capsys):
    rows = synthetic_runs.sweep_rows("run-1", 1, changes={(0, 4): {"verdict": "fail"}})
    run_dir = synthetic_runs.write_run(tmp_path / "r", "run-1", rows, llama_cpp_commit="feedbeef" * 5)
    db = tmp_path / "db.sqlite"
    database.sync_run(db, run_dir)
    assert cli.main(["runs", "--db", str(db)]) == 0
    line = [text for text in capsys.readouterr().out.splitlines() if "run-1" in text][0]
    for expected in ("feedbeef", "Synthetic CPU", "target Q4_0 abababab", "ctx 0,8192 × c 1,4,8 × k 4", "| 6 |",
                     "exact 5, fail 1"):
        assert expected in line
