"""Processes the database tests start: shards syncing at once, a sweep killed mid-run, a sync killed
mid-transaction. Module-level functions, so that a spawned process can import them."""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]  # synthetic_runs beside this file, in a spawned process

import synthetic_runs  # noqa: E402

from specnative.record import database  # noqa: E402


def shard(db_path: str, run_dir: str, run_id: str, seed: int, cells: int) -> None:
    """A shard's sweep: append one regime's rows, sync, again, as the sweep will after every cell."""
    run_dir = Path(run_dir)
    synthetic_runs.write_run(run_dir, run_id, [])
    for index in range(cells):
        rows = synthetic_runs.sweep_rows(run_id, seed + index, regimes=[(index, 1)])
        synthetic_runs.write_traces(run_dir / "traces.csv", rows, mode="a")
        database.sync_run(db_path, run_dir)


def sweep_forever(db_path: str, run_dir: str, run_id: str) -> None:
    """A sweep that never ends (the test kills it): cells appended one by one, each synced; every
    second cell's last row is written in two halves with a pause between, so a kill may tear it."""
    run_dir = Path(run_dir)
    traces = run_dir / "traces.csv"
    index = 0
    while True:
        rows = synthetic_runs.sweep_rows(run_id, index, regimes=[(index, 1)])
        synthetic_runs.write_traces(traces, rows[:-1], mode="a")
        text = _csv_line(rows[-1])
        with open(traces, "a", encoding="utf-8", newline="") as f:
            f.write(text[: len(text) // 2])
            f.flush()
            if index % 2:
                time.sleep(0.01)
            f.write(text[len(text) // 2:])
        database.sync_run(db_path, run_dir)
        index += 1


def _csv_line(row: dict) -> str:
    import csv
    import io
    buffer = io.StringIO()
    header = synthetic_runs.COLUMN_NAMES + synthetic_runs.REPEAT_COLUMNS
    csv.DictWriter(buffer, fieldnames=header, restval="").writerow(row)
    return buffer.getvalue()


def sync_forever(db_path: str, run_dirs: list[str]) -> None:
    """Syncs folders of one run (its states) in turn, for ever: a kill lands inside a transaction."""
    while True:
        for run_dir in run_dirs:
            database.sync_run(db_path, run_dir)


if __name__ == "__main__":
    {"sweep_forever": sweep_forever, "sync_forever": sync_forever}[sys.argv[1]](sys.argv[2], *(
        [sys.argv[3], sys.argv[4]] if sys.argv[1] == "sweep_forever" else [sys.argv[3:]]))
