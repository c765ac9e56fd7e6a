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
import io
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specnative.lossless.noise_summary import record_noise
from specnative.record.provenance import ProvenanceError, read_provenance
from specnative.record.schema import COLUMN_NAMES

# provenance.json keys that change from one invocation to the next without changing what a row
# means (who ran it when, what it found so far). Every other key the new run's record holds before
# it measures anything must match the recorded one; keys a run adds while it measures (results
# such as the models' records or a noise control) are not settings and are not compared.
VOLATILE_KEYS = ("date", "run_id", "command", "models", "notes", "refused_cells", "completed", "workload",
                 "invocations", "noise_control", "sweep_timing", "cells_planned",
                 "levels_planned")
INVOCATION_KEYS = ("run_id", "date", "command")  # one sweep invocation on the run directory


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


LOCK_NAME = ".sweep.lock"  # only where a directory cannot be locked itself (e.g. some NFS mounts)


@contextlib.contextmanager
def locked(out: Path):
    """Creates `out`, proves it writable, and holds an exclusive lock on it until the block ends:
    a second sweep on the same directory fails at once instead of writing every cell twice.
    The lock is the kernel's (flock on the directory itself), so a killed sweep never leaves a
    stale one, and taking it writes nothing (a refused run leaves the directory as it was).
    Where a file system cannot lock a directory, an empty .sweep.lock file inside is locked."""
    out = Path(out)
    problem = output_problem(out)
    if problem:
        raise SystemExit(f"error: {problem}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
        handle = _lock(out)
    except OSError as error:
        raise SystemExit(f"error: --out {out} is not writable ({error.strerror})") from None
    try:
        yield out
    finally:
        os.close(handle)


def _lock(out: Path) -> int:
    """A file descriptor holding the run directory's exclusive lock, or SystemExit if another
    sweep holds it."""
    handle = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return handle
    except BlockingIOError:
        os.close(handle)
        raise SystemExit(f"error: another sweep is writing to {out} (it holds a lock on the directory); "
                         f"wait for it to finish or choose another --out") from None
    except OSError:  # a directory this file system cannot flock: a lock file instead
        os.close(handle)
    handle = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(handle)
        raise SystemExit(f"error: another sweep is writing to {out} (it holds {out / LOCK_NAME}); "
                         f"wait for it to finish or choose another --out") from None
    return handle


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


def check_resume(out: Path, provenance: dict) -> dict:
    """Refuses a resume whose settings differ from those the run directory was started with;
    returns the recorded provenance."""
    try:
        recorded = read_provenance(out)
    except ProvenanceError as error:
        raise SystemExit(f"error: cannot resume {out}: unreadable: {error}; start a new --out") from None
    if recorded is None:
        raise SystemExit(f"error: cannot resume {out}: provenance.json is missing, so its settings cannot be "
                         f"checked; start a new --out")
    current = comparable(provenance)
    diffs = differences({k: v for k, v in comparable(recorded).items() if k in current}, current)
    if diffs:
        raise SystemExit(f"error: cannot resume {out}: its settings differ from this run's, and rows of both "
                         f"would mix in one traces.csv:\n  " + "\n  ".join(diffs) +
                         "\nrun with the recorded settings, or choose another --out")
    return recorded


def continued_provenance(recorded: dict, current: dict, kept_rows: list[dict]) -> dict:
    """This invocation's provenance continuing the recorded one: the run's first run id, date and
    command stay; "invocations" lists every invocation in order (rows carry their own run_id);
    the models, notes and workload of earlier invocations are kept, and the noise-control summary
    is rebuilt from the rows kept (so it matches traces.csv even after a crash). Refused cells
    are found again by this invocation (same settings, same refusals)."""
    record = dict(current)
    record.update({key: recorded.get(key) for key in INVOCATION_KEYS})
    earlier = recorded.get("invocations") or [{key: recorded.get(key) for key in INVOCATION_KEYS}]
    record["invocations"] = list(earlier) + [{key: current.get(key) for key in INVOCATION_KEYS}]
    record["models"] = list(recorded.get("models") or [])
    record["notes"] = list(dict.fromkeys(list(recorded.get("notes") or []) + list(current.get("notes") or [])))
    if recorded.get("workload"):
        record["workload"] = recorded["workload"]
    record["noise_control"] = noise_control_of(kept_rows)
    return record


def noise_control_of(rows: list[dict]) -> dict:
    """The noise-control summary of traces.csv rows (as strings), folded the way the sweep folds
    it cell by cell (record_noise)."""
    summary: dict = {}
    for row in rows:
        if row.get("spec_decode") == "on":
            values = {k: (v if v != "" else None) for k, v in row.items()}
            record_noise(summary, row["target_model"], row["backend"], [values])
    return summary


# ---------------------------------------------------------------------------------------------
# --resume: traces.csv whole, cells complete. Read and judged first (plan_resume, which changes
# nothing and refuses with SystemExit), repaired only once every check of the run has passed
# (apply_resume): a refused resume leaves every file as it was.
# ---------------------------------------------------------------------------------------------
@dataclass
class ResumePlan:
    traces: Path
    done: set = field(default_factory=set)     # cells whose rows are all there
    size: int = 0                              # the file's size when judged
    keep_bytes: int | None = None              # cut to this (a torn last row); None: nothing to cut
    drop_cell_ids: set = field(default_factory=set)  # rows of cells that are not complete
    header: list = field(default_factory=list)
    rows: list = field(default_factory=list)   # complete rows (lists of strings), in file order

    def kept_rows(self) -> list[dict]:
        """The rows a resume keeps, as {column: string}."""
        at = self.header.index("cell_id") if self.header else 0
        return [dict(zip(self.header, row)) for row in self.rows if row[at] not in self.drop_cell_ids]


COLUMN_NAMES_LINE = (",".join(COLUMN_NAMES) + "\r\n").encode()  # as csv.writer writes the header


def _refuse(traces: Path, why: str) -> SystemExit:
    return SystemExit(f"error: cannot resume: {traces} {why}; nothing was changed. Choose another --out")


def header_problem(header: list) -> str | None:
    """How a traces.csv header differs from this specnative's schema, or None."""
    if tuple(header) == COLUMN_NAMES:
        return None
    missing = [c for c in COLUMN_NAMES if c not in header]
    extra = [c for c in header if c not in COLUMN_NAMES]
    parts = ([f"lacks {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"] if missing else []) + \
            ([f"has {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''} too"] if extra else [])
    return ("has another header than this specnative's traces.csv schema (" +
            ("; ".join(parts) or "the same columns in another order") +
            "): written by another version, or edited")


def _torn_tail(data: bytes, n_fields: int) -> int:
    """Where the complete rows end: before a last row without its line end, or with another
    field count than the file's own header (a crash while writing it)."""
    keep = len(data) if data.endswith(b"\n") else data.rfind(b"\n") + 1
    lines = data[:keep].splitlines(keepends=True)
    if len(lines) > 1:
        try:
            fields = next(csv.reader([lines[-1].decode("utf-8")]))
        except (UnicodeDecodeError, csv.Error, StopIteration):
            fields = []
        if len(fields) != n_fields:
            keep -= len(lines[-1])
    return keep


def plan_resume(traces: Path, cell_keys: dict) -> ResumePlan:
    """What a resume keeps of traces.csv: the cells of `cell_keys` ({cell: [the cell_id of each
    of its rows]}) whose rows are all there, a torn last row to cut, and the rows of cells that
    are not complete (a crash between them) to drop so they are measured again. Reads only; a
    file that cannot be continued (another header, a damaged row before the last) is refused."""
    traces = Path(traces)
    plan = ResumePlan(traces)
    if not traces.exists() or traces.stat().st_size == 0:
        return plan
    data = traces.read_bytes()
    plan.size = len(data)
    if b"\n" not in data:  # no complete line: a header torn while it was written, or garbage
        if COLUMN_NAMES_LINE.startswith(data):
            plan.keep_bytes = 0
            return plan
        raise _refuse(traces, "holds no header line (not a traces.csv)")
    try:
        header = next(csv.reader([data[:data.index(b"\n")].decode("utf-8")]))
    except (UnicodeDecodeError, csv.Error) as error:
        raise _refuse(traces, f"has an unreadable header ({error})") from None
    if problem := header_problem(header):  # before any repair: a repair counts fields against it
        raise _refuse(traces, problem)
    keep = _torn_tail(data, len(header))
    plan.keep_bytes = keep if keep < len(data) else None
    plan.header, plan.rows = header, _complete_rows(traces, data[:keep], len(header))
    at = header.index("cell_id")
    present = {row[at] for row in plan.rows}
    for cell, keys in cell_keys.items():
        have = [k for k in keys if k in present]
        if len(have) == len(keys):
            plan.done.add(cell)
        elif have:
            plan.drop_cell_ids.update(have)
    return plan


def _complete_rows(traces: Path, data: bytes, n_fields: int) -> list[list[str]]:
    """Data rows of the complete part; a damaged row before the last is refused."""
    try:
        reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
        rows = [row for row in reader if row]
    except (UnicodeDecodeError, csv.Error) as error:
        raise _refuse(traces, f"is damaged ({error})") from None
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != n_fields:
            raise _refuse(traces, f"has a damaged row: line {line} has {len(row)} fields, the header {n_fields}")
    return rows[1:]


def apply_resume(plan: ResumePlan) -> None:
    """Cuts the torn last row and drops the rows of incomplete cells (with a warning each)."""
    traces = plan.traces
    if plan.keep_bytes is not None:
        if traces.stat().st_size != plan.size:
            raise SystemExit(f"error: {traces} changed while the resume was being checked; run it again")
        with open(traces, "r+b") as f:
            f.truncate(plan.keep_bytes)
            os.fsync(f.fileno())
        print(f"warning: {traces}: removed a half-written last row ({plan.size - plan.keep_bytes} bytes, a sweep "
              f"that crashed while writing); its cell is measured again", file=sys.stderr)
    if plan.drop_cell_ids:
        _rewrite_without(traces, plan.header, plan.rows, plan.drop_cell_ids, plan.header.index("cell_id"))
        dropped = sum(row[plan.header.index("cell_id")] in plan.drop_cell_ids for row in plan.rows)
        print(f"warning: {traces}: removed {dropped} row(s) of cells that were not complete; "
              f"they are measured again", file=sys.stderr)


def _rewrite_without(traces: Path, header: list, rows: list, cell_ids: set, at: int) -> None:
    """traces.csv without the rows of `cell_ids`, replaced atomically (a crash keeps the old file)."""
    tmp = traces.with_name(f"{traces.name}.{os.getpid()}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(row for row in rows if row[at] not in cell_ids)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(traces)
