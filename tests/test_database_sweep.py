"""The results database of a real sweep: written cell by cell beside the run folder, exactly the rows
of traces.csv after a SIGKILL and a --resume (no row lost, none twice), listed by `specnative runs`,
and two runs of the same build compared without a decided change where nothing changed."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from conftest import TEST_NGL

from specnative import cli
from specnative.record import database
from specnative.record.run_folder import read_run
from specnative.record.schema import read_traces

BOUND_S = 120


def sweep_argv(pair, out, *extra) -> list[str]:
    return ["-m", str(pair[0]), "-md", str(pair[1]), "--ctx-len", "0", "-np", "1,2,3", "-k", "2", "-n", "8",
            "--warmup", "0", "-r", "2", "--max-repeats", "2", "-t", "1", "-ngl", str(TEST_NGL), "-o", str(out),
            "--no-report", *extra]


def db_rows(db, run_dir) -> list[tuple]:
    """The run's rows in the database; none when a kill came before its first commit."""
    run_id = read_run(run_dir).run_id
    if run_id not in {run["run_id"] for run in database.list_runs(db)}:
        return []
    record = database.load_run(db, run_id)
    return sorted(zip(record.traces["cell_id"], record.traces["spec_decode"]))


def traces_rows(run_dir) -> list[tuple]:
    traces = read_traces(run_dir / "traces.csv")
    return sorted(zip(traces["cell_id"], traces["spec_decode"]))


def test_a_killed_and_resumed_sweep_leaves_the_database_equal_to_traces_csv(noisy_pair, tmp_path):
    out, db = tmp_path / "runs" / "one", tmp_path / "runs" / "specnative.sqlite"
    argv = sweep_argv(noisy_pair, out)
    child = subprocess.Popen([sys.executable, "-m", "specnative.sweep", *argv], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + BOUND_S
    traces = out / "traces.csv"
    while time.monotonic() < deadline and child.poll() is None:
        if db.exists() and traces.exists() and traces.read_bytes().count(b"\n") >= 3:  # a cell synced, more to come
            break
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=BOUND_S)
    assert db.exists(), "the sweep writes its database beside the run folder by default"
    assert set(db_rows(db, out)) <= set(traces_rows(out))  # killed anywhere: never a row traces.csv lacks
    if child.returncode != -signal.SIGKILL:
        return  # finished before the kill (a fast machine): the resume below is then a no-op either way
    done = subprocess.run([sys.executable, "-m", "specnative.sweep", *argv, "--resume"], capture_output=True,
                          text=True, timeout=BOUND_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert db_rows(db, out) == traces_rows(out)
    assert len(traces_rows(out)) == 2 * 3  # every cell once: off and on, three concurrencies


def test_runs_lists_the_run_and_compare_finds_no_decided_change_against_itself(noisy_pair, tmp_path, capsys):
    out, db = tmp_path / "runs" / "one", tmp_path / "runs" / "specnative.sqlite"
    assert cli.main(["sweep", *sweep_argv(noisy_pair, out)]) == 0
    capsys.readouterr()
    assert cli.main(["runs", "--db", str(db)]) == 0
    listed = capsys.readouterr().out
    assert read_run(out).run_id in listed
    assert cli.main(["compare", str(out), str(out), "--fail-on-regression", "5"]) == 0
