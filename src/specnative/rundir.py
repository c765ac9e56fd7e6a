"""A sweep's run directory kept whole: one sweep writes it at a time, a resume continues it only
with the same settings, and traces.csv never gets a row appended to a torn one or a cell counted
as done with rows missing.

Every problem found here is a SystemExit("error: ...") naming the directory or file, raised
before any model is loaded.
"""
from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path

from specnative.schema import COLUMN_NAMES

LOCK_NAME = ".sweep.lock"
# provenance.json keys that change from one invocation to the next without changing what a row
# means (who ran it when, what it found so far). Every other key the new run's record holds before
# it measures anything must match the recorded one; keys a run adds while it measures (results
# such as the models' records or a noise control) are not settings and are not compared.
VOLATILE_KEYS = ("date", "run_id", "command", "models", "notes", "refused_cells", "completed", "workload")


def output_problem(out: Path) -> str | None:
    """Why `out` cannot become a run directory (a file, under a file, not writable), or None.
    Checked with the other flags; `locked` checks again by writing."""
    out = Path(out)
    if out.exists():
        return None if out.is_dir() else f"--out {out} is a file, not a directory"
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out}: {parent} is a file, not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--out {out}: cannot create it, {parent} is not writable"
    return None


@contextlib.contextmanager
def locked(out: Path):
    """Creates `out`, proves it writable, and holds an exclusive lock on it until the block ends:
    a second sweep on the same directory fails at once instead of writing every cell twice.
    The lock is the kernel's (flock), so a killed sweep never leaves a stale one."""
    out = Path(out)
    problem = output_problem(out)
    if problem:
        raise SystemExit(f"error: {problem}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
        handle = open(out / LOCK_NAME, "a+")
    except OSError as error:
        raise SystemExit(f"error: --out {out} is not writable ({error.strerror})") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"error: another sweep is writing to {out} (it holds {out / LOCK_NAME}); "
                             f"wait for it to finish or choose another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")  # who holds it, for a person looking
        handle.flush()
        yield out


# ---------------------------------------------------------------------------------------------
# --resume: the same settings
# ---------------------------------------------------------------------------------------------
def comparable(provenance: dict) -> dict:
    """The settings part of a provenance record, as JSON would store it."""
    settings = {k: v for k, v in provenance.items() if k not in VOLATILE_KEYS}
    return json.loads(json.dumps(settings, default=str))


def differences(recorded: dict, current: dict, prefix: str = "") -> list[str]:
    """'key: recorded X, now Y' for every setting that differs (nested dicts key by key)."""
    out = []
    for key in sorted(set(recorded) | set(current)):
        before, now = recorded.get(key, "absent"), current.get(key, "absent")
        if isinstance(before, dict) and isinstance(now, dict):
            out += differences(before, now, f"{prefix}{key}.")
        elif before != now:
            out.append(f"{prefix}{key}: recorded {before!r}, now {now!r}")
    return out


def check_resume(out: Path, provenance: dict) -> None:
    """Refuses a resume whose settings differ from those the run directory was started with."""
    path = Path(out) / "provenance.json"
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"error: cannot resume {out}: {path.name} is missing, so its settings cannot be "
                         f"checked; start a new --out") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SystemExit(f"error: cannot resume {out}: {path} is unreadable ({error}); start a new --out") from None
    if not isinstance(recorded, dict):
        raise SystemExit(f"error: cannot resume {out}: {path} is not a JSON object; start a new --out")
    current = comparable(provenance)
    diffs = differences({k: v for k, v in comparable(recorded).items() if k in current}, current)
    if diffs:
        raise SystemExit(f"error: cannot resume {out}: its settings differ from this run's, and rows of both "
                         f"would mix in one traces.csv:\n  " + "\n  ".join(diffs) +
                         "\nrun with the recorded settings, or choose another --out")


# ---------------------------------------------------------------------------------------------
# --resume: traces.csv whole, cells complete
# ---------------------------------------------------------------------------------------------
def repair_torn_tail(traces: Path) -> int:
    """Cuts a last row that a crash left half-written (no line end, or fewer fields than the
    header) back to the last complete row; returns the bytes removed (with a warning)."""
    data = Path(traces).read_bytes()
    keep = len(data) if data.endswith(b"\n") else data.rfind(b"\n") + 1
    lines = data[:keep].splitlines(keepends=True)
    if len(lines) > 1:
        try:
            fields = next(csv.reader([lines[-1].decode("utf-8")]))
        except (UnicodeDecodeError, csv.Error, StopIteration):
            fields = []
        if len(fields) != len(COLUMN_NAMES):
            keep -= len(lines[-1])
    if keep == len(data):
        return 0
    with open(traces, "r+b") as f:
        f.truncate(keep)
        os.fsync(f.fileno())
    print(f"warning: {traces}: removed a half-written last row ({len(data) - keep} bytes, a sweep that "
          f"crashed while writing); its cell is measured again", file=sys.stderr)
    return len(data) - keep


def _read_rows(traces: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows; a damaged row before the last (which repair_torn_tail handles) is refused."""
    try:
        with open(traces, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            rows = []
            for row in reader:
                if row and rows and len(row) != len(rows[0]):
                    raise SystemExit(f"error: cannot resume: {traces}:{reader.line_num} has {len(row)} fields, "
                                     f"the header {len(rows[0])}: a damaged row; choose another --out")
                if row:
                    rows.append(row)
    except (UnicodeDecodeError, csv.Error) as error:
        raise SystemExit(f"error: cannot resume: {traces} is damaged ({error}); choose another --out") from None
    return (rows[0], rows[1:]) if rows else ([], [])


def finished_cells(traces: Path, cell_keys: dict) -> set:
    """The cells of `cell_keys` ({cell: [the cell_id of each of its rows]}) whose rows are all in
    traces.csv. A cell with only some of its rows (a crash between them) has those removed, so
    that it is measured again from scratch. The file is first repaired (torn last row) and its
    header checked against this schema."""
    traces = Path(traces)
    if not traces.exists() or traces.stat().st_size == 0:
        return set()
    repair_torn_tail(traces)
    if traces.stat().st_size == 0:  # only a torn header was there
        return set()
    header, rows = _read_rows(traces)
    if tuple(header) != COLUMN_NAMES:
        raise SystemExit(f"error: cannot resume: {traces} has another header than this specnative's "
                         f"traces.csv schema (written by another version); choose another --out")
    at = COLUMN_NAMES.index("cell_id")
    present = {row[at] for row in rows}
    done, partial = set(), set()
    for cell, keys in cell_keys.items():
        have = [k for k in keys if k in present]
        if len(have) == len(keys):
            done.add(cell)
        elif have:
            partial.update(have)
    if partial:
        _rewrite_without(traces, header, rows, partial, at)
        print(f"warning: {traces}: removed {len(partial)} row(s) of cells that were not complete; "
              f"they are measured again", file=sys.stderr)
    return done


def _rewrite_without(traces: Path, header: list, rows: list, cell_ids: set, at: int) -> None:
    """traces.csv without the rows of `cell_ids`, replaced atomically (a crash keeps the old file)."""
    tmp = traces.with_name(traces.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(row for row in rows if row[at] not in cell_ids)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(traces)
