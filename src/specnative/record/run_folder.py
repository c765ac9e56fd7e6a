"""A run folder read whole: provenance.json, traces.csv (a torn last line skipped: the writer was
killed mid-row) and requests.jsonl; and what a run is, in words (its kind, host, grid, models).

The folder is the primary record of a run; the results database (database.py) and compare both
read runs through here.
"""
from __future__ import annotations

import json
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specnative.record.provenance import ProvenanceError, read_provenance
from specnative.record.schema import COLUMNS, PANDAS_DTYPES, TracesError, read_traces


class RunFolderError(Exception):
    """A run folder that cannot be read; the message is one line naming the folder or file."""


@dataclass
class RunRecord:
    """One run as read from its folder (or from the database: requests then stay empty)."""
    run_id: str
    run_dir: Path
    provenance: dict
    traces: pd.DataFrame
    requests: list          # (line_index, cell_id, the line's JSON text)
    torn_lines: int = 0     # half-written last lines skipped (a run killed while writing)


def read_run(run_dir) -> RunRecord:
    """A run folder's provenance, traces (a torn last line skipped) and request lines."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: no such run folder")
    provenance = _read_provenance(run_dir)
    traces, torn = _read_traces_whole(run_dir / "traces.csv")
    requests, torn_requests = _read_requests(run_dir / "requests.jsonl")
    run_id = provenance.get("run_id")
    if not run_id:  # a record without one: the rows' own, if they agree
        ids = set(traces["run_id"].dropna()) if len(traces) else set()
        if len(ids) != 1:
            raise RunFolderError(f"{run_dir}/provenance.json has no run_id, and traces.csv does not name one run")
        run_id = ids.pop()
    return RunRecord(str(run_id), run_dir, provenance, traces, requests, torn + torn_requests)


def _read_provenance(run_dir: Path) -> dict:
    try:
        record = read_provenance(run_dir)
    except ProvenanceError as error:
        raise RunFolderError(f"unreadable: {error}") from None
    if record is None:
        raise RunFolderError(f"{run_dir}: not a run folder (no provenance.json)")
    return record


def _read_traces_whole(path: Path) -> tuple[pd.DataFrame, int]:
    """traces.csv without a last line that lost its line end (the writer was killed mid-row);
    any other damage is an error. A missing file is a run that has measured nothing yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _empty_traces(), 0
    except OSError as error:
        raise RunFolderError(f"{path}: cannot read it ({error.strerror})") from None
    if data.endswith(b"\n") or not data:
        return _traces_or_error(path, path), 0
    whole = data[:data.rfind(b"\n") + 1]
    if not whole:  # not even the header is complete
        return _empty_traces(), 1
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "traces.csv"
        copy.write_bytes(whole)
        return _traces_or_error(copy, path), 1


def _traces_or_error(path: Path, shown: Path) -> pd.DataFrame:
    if path.stat().st_size == 0:
        return _empty_traces()
    try:
        return read_traces(path)
    except TracesError as error:
        raise RunFolderError(str(error).replace(str(path), str(shown))) from None


def _empty_traces() -> pd.DataFrame:
    return pd.DataFrame({c.name: pd.Series(dtype=PANDAS_DTYPES[c.dtype]) for c in COLUMNS})


def _read_requests(path: Path) -> tuple[list, int]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], 0
    except (OSError, UnicodeDecodeError) as error:
        raise RunFolderError(f"{path}: unreadable ({error})") from None
    lines, out, torn = text.splitlines(keepends=True), [], 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not line.endswith("\n"):
                torn = 1  # the last request line, half written
                continue
            raise RunFolderError(f"{path}:{number}: not a JSON line") from None
        cell_id = value.get("cell_id") if isinstance(value, dict) else None
        out.append((len(out), cell_id, line.strip()))
    return out, torn


def find_run_dirs(root) -> list[Path]:
    """Every folder under `root` holding a provenance.json: the run folders."""
    root = Path(root)
    if not root.is_dir():
        raise RunFolderError(f"{root}: no such folder")
    return sorted(p.parent for p in root.rglob("provenance.json"))


# ---------------------------------------------------------------------------------------------
# What a run is, in words (the runs table and compare's header use the same)
# ---------------------------------------------------------------------------------------------
def kind_of(provenance: dict) -> str:
    return "serve" if provenance.get("mode") == "serve" else "sweep"


def host_of(provenance: dict) -> str | None:
    gpu = provenance.get("gpu")
    if isinstance(gpu, dict) and gpu.get("name"):
        return gpu["name"]
    return gpu if isinstance(gpu, str) and gpu else provenance.get("cpu_model")


def grid_of(provenance: dict) -> dict:
    return (provenance.get("serve") if kind_of(provenance) == "serve" else provenance.get("grid")) or {}


GRID_NAMES = (("ctx_len", "ctx"), ("concurrency", "c"), ("request_rate", "rate"), ("max_concurrency", "np"),
              ("k", "k"), ("temperature", "T"), ("task", "task"), ("drafter", "drafter"),
              ("draft_p_min", "pmin"), ("draft_shape", "shape"), ("synthetic_acceptance", "synthetic"))


def grid_summary(provenance: dict) -> str:
    grid = grid_of(provenance)
    parts = []
    for key, short in GRID_NAMES:
        if key in grid and grid[key] not in (None, [], ""):
            values = grid[key] if isinstance(grid[key], list) else [grid[key]]
            texts = [f"{v:g}" if isinstance(v, float) else str(v) for v in values]
            # a draft tree's spelling has commas of its own: such values apart by spaces
            parts.append(f"{short} " + (" " if any("," in t for t in texts) else ",").join(texts))
    return " × ".join(parts)


def models_summary(provenance: dict) -> str:
    """'target Q4_0 07ed55d3, Q8_0 667de07c; draft Q8_0 c86b3827': role, file type, sha256 prefix."""
    by_role: dict = {}
    for model in provenance.get("models") or []:
        if isinstance(model, dict):
            by_role.setdefault(model.get("role", "?"), []).append(
                f"{model.get('type', '?')} {str(model.get('sha256') or '')[:8]}".strip())
    return "; ".join(f"{role} {', '.join(files)}" for role, files in by_role.items())


def base_cell(cell_id: str) -> str:
    """The measured cell a row belongs to: sweep on rows end in |k<k> (a synthetic row's in
    |k<k>|synthetic=<profile>) or a draft tree's |shape=<spelling>, serve rows in /on or /off."""
    if cell_id.startswith("serve/"):
        return cell_id.rsplit("/", 1)[0]
    return re.sub(r"(\|k\d+|\|shape=[^|]*)(\|synthetic=[^|]*)?$", "", cell_id)


def row_verdict(verdict, lossless_ok) -> str:
    """An on row's lossless verdict; a run from before the verdict column has only lossless_ok."""
    if isinstance(verdict, str) and verdict:
        return verdict
    if lossless_ok is None or lossless_ok is pd.NA or (isinstance(lossless_ok, float) and math.isnan(lossless_ok)):
        return "unrecorded"
    return "lossless" if bool(lossless_ok) else "fail"
