"""`specnative merge OUT SHARD_DIR...`: join the run directories of a sweep's shards
(`--shard i/N`, shards.py) into one run directory, as if one sweep had measured the whole grid.

Refused, naming the directories and what differs, unless:
  - every directory is a finished shard of the same split (same N, same grid size), each shard
    given once and none missing, their cells disjoint and together the whole grid;
  - build, models (sha256), settings and grid are the same (the provenance.json keys a --resume
    compares, rundir.py), and so is the hardware (--allow-hardware-differences: recorded instead);
  - every shard's traces.csv is whole (no torn or damaged row) and holds exactly the rows of the
    cells its provenance.json lists as its own and not refused: each once, none missing.
traces.csv keeps the shards' rows byte for byte, in grid order; provenance.json is the shards'
record with the per-run parts (models, refused cells, notes, noise control) joined, and the
shards listed under "merged_from". Then the report is written, as after a sweep.
"""
from __future__ import annotations

import argparse
import csv
import io
import shlex
import time
import uuid
from pathlib import Path

from specnative.engine import TREE_DRAFTERS
from specnative.record import rundir, schema
from specnative.record.provenance import ProvenanceError, now_iso, read_provenance, write_json
from specnative.record.run_folder import base_cell

# Hardware a shard ran on: the same on "identical machines"; compared unless allowed to differ
# (placement too: each array task may have its own rpc-server hosts).
HARDWARE_KEYS = ("cpu_model", "cpu_count", "memory_gb", "gpu", "os", "placement")
# Keys each shard fills in for its own share (joined below), beside rundir's volatile ones.
PER_SHARD_KEYS = ("shard", "noise_control")


class MergeError(Exception):
    """A set of shard directories that cannot be joined; the message says why."""


def load_shard(run_dir: Path) -> dict:
    try:
        record = read_provenance(run_dir)
    except ProvenanceError as error:
        raise MergeError(f"unreadable: {error}") from None
    if record is None:
        raise MergeError(f"{run_dir}: no provenance.json (not a sweep's run directory)")
    if not isinstance(record.get("shard"), dict):
        raise MergeError(f"{run_dir}: not a shard (its sweep ran without --shard i/N)")
    if record.get("completed") is not True:
        shard = record["shard"]
        raise MergeError(f"{run_dir}: shard {shard.get('index')}/{shard.get('count')} did not finish; "
                         f"continue it with the same command plus --resume, then merge")
    return record


def settings_of(record: dict, allow_hardware: bool) -> dict:
    settings = rundir.comparable({k: v for k, v in record.items() if k not in PER_SHARD_KEYS})
    if allow_hardware:
        for key in HARDWARE_KEYS:
            settings.pop(key, None)
    return settings


def check_same_settings(dirs: list[Path], records: list[dict], allow_hardware: bool) -> None:
    reference = settings_of(records[0], allow_hardware)
    for run_dir, record in zip(dirs[1:], records[1:]):
        diffs = rundir.differences(reference, settings_of(record, allow_hardware))
        if diffs:
            hint = ("; shards must run on identical machines (or pass --allow-hardware-differences)"
                    if any(d.split(":")[0] in HARDWARE_KEYS for d in diffs) else "")
            raise MergeError(f"{run_dir} differs from {dirs[0]} (build, models, settings or grid){hint}:\n  "
                             + "\n  ".join(d.replace(": recorded ", f": {dirs[0].name} has ", 1)
                                           .replace(", now ", f", {run_dir.name} has ", 1) for d in diffs))


def check_split(dirs: list[Path], records: list[dict]) -> dict:
    """The shards are one split, each once, none missing, their cells the whole grid;
    returns {cell key without k: grid index}."""
    first = records[0]["shard"]
    count, grid_cells = first["count"], first["grid_cells"]
    seen: dict = {}
    for run_dir, record in zip(dirs, records):
        shard = record["shard"]
        if (shard["count"], shard["grid_cells"]) != (count, grid_cells):
            raise MergeError(f"{run_dir} is shard {shard['index']}/{shard['count']} of a {shard['grid_cells']}-cell "
                             f"grid, {dirs[0]} one of {count} shards of a {grid_cells}-cell grid")
        if shard["index"] in seen:
            raise MergeError(f"shard {shard['index']}/{count} given twice: {seen[shard['index']]} and {run_dir}")
        seen[shard["index"]] = run_dir
    missing = [f"{i}/{count}" for i in range(count) if i not in seen]
    if missing:
        raise MergeError(f"missing shard(s) {', '.join(missing)}: the merged run would lack their cells")
    grid_index = {}
    for run_dir, record in zip(dirs, records):
        shard = record["shard"]
        for index, key in shard["cells"]:
            if index % count != shard["index"] or index in grid_index.values():
                raise MergeError(f"{run_dir}: cell {index} ({key}) is not shard {shard['index']}/{count}'s "
                                 f"or is in two shards")
            grid_index[key] = index
    if sorted(grid_index.values()) != list(range(grid_cells)):
        raise MergeError(f"the shards' cells do not make up the {grid_cells}-cell grid")
    return grid_index


def base_key(row: dict) -> str:
    """A row's cell key without what its on row adds (|k<k> or a draft tree's |shape=<spelling>, a
    synthetic row's |synthetic=<profile> after it: Cell.key)."""
    return base_cell(row["cell_id"]) if row["spec_decode"] == "on" else row["cell_id"]


def on_kinds_of(key: str, grid: dict) -> list[str]:
    """The on rows' suffixes a cell of this key has (sweep.config.on_kinds): |k<k> for every k of
    the chain, |shape=<spelling> for every draft tree (the draft model and an EAGLE-3 head only);
    without "chain" among the draft shapes only the trees."""
    drafter = key.split("|drafter=", 1)[1].split("|", 1)[0] if "|drafter=" in key else "model"
    shapes = grid.get("draft_shape") or ["chain"]
    trees = [s for s in shapes if s != "chain"] if drafter in TREE_DRAFTERS else []
    chains = (grid.get("k") or []) if "chain" in shapes or not trees else []
    return [f"|k{k}" for k in chains] + [f"|shape={tree}" for tree in trees]


def refused_keys(record: dict, own: set) -> set:
    """The shard's cells the sweep refused (no rows): by the key recorded with each refusal, or
    for a run that did not record it, by context length and concurrency."""
    keys = set()
    for refused in record.get("refused_cells") or []:
        if refused.get("cell"):
            keys.add(refused["cell"])
        else:
            keys |= {key for key in own if f"|ctx{refused.get('ctx_len')}|c{refused.get('concurrency')}|" in key}
    return keys


def expected_rows(record: dict) -> dict:
    """{cell_id: its cell key} of every row the shard must hold: for each of its cells that was
    not refused, the off row and an on row per k of the grid and per draft tree."""
    own = {key for _, key in record["shard"]["cells"]}
    grid = record.get("grid") or {}
    rows = {}
    for key in own - refused_keys(record, own):
        rows[key] = key
        rows.update({key + kind: key for kind in on_kinds_of(key, grid)})
    return rows


def read_rows(path: Path) -> list[tuple[int, dict]]:
    """(line, row) of a shard's traces.csv, strings as written; a torn or damaged row, another
    header, or no header is a MergeError."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        raise MergeError(f"{path} ends in a torn row (no line end: the shard's sweep died while writing it); "
                         f"continue that shard with --resume, which repairs it, then merge")
    try:
        reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
        lines = [(reader.line_num, row) for row in reader if row]
    except (UnicodeDecodeError, csv.Error) as error:
        raise MergeError(f"{path} is damaged ({error})") from None
    if not lines or tuple(lines[0][1]) != schema.COLUMN_NAMES:
        raise MergeError(f"{path} has another header than this specnative's traces.csv schema"
                         if lines else f"{path} is empty (not even a header)")
    header = lines[0][1]
    for line, row in lines[1:]:
        if len(row) != len(header):
            raise MergeError(f"{path}:{line} has {len(row)} fields, the header {len(header)}: a torn or damaged row")
    return [(line, dict(zip(header, row))) for line, row in lines[1:]]


def shard_rows(run_dir: Path, record: dict) -> list[dict]:
    """traces.csv rows as written (strings): exactly the rows of the cells its provenance says
    were measured, each once (a missing, duplicated or foreign row is a MergeError)."""
    path = Path(run_dir) / "traces.csv"
    expected = expected_rows(record)
    if not path.exists():
        if expected:
            raise MergeError(f"{path} is missing, but its provenance.json says {len(set(expected.values()))} "
                             f"cell(s) were measured")
        return []  # a shard whose cells were all refused
    rows = read_rows(path)
    own = {key for _, key in record["shard"]["cells"]}
    seen: dict = {}
    for line, row in rows:
        if base_key(row) not in own:
            raise MergeError(f"{path}:{line}: cell {row['cell_id']} is not one of this shard's cells")
        if row["cell_id"] in seen:
            raise MergeError(f"{path}:{line}: row {row['cell_id']} is there twice (lines {seen[row['cell_id']]} "
                             f"and {line})")
        seen[row["cell_id"]] = line
    missing = sorted(set(expected) - set(seen))
    if missing:
        raise MergeError(f"{path} lacks {len(missing)} row(s) of cells its provenance.json says were measured, "
                         f"e.g. {missing[0]}; continue that shard with --resume, then merge")
    return [row for _, row in rows]


def joined_noise_control(rows: list[dict]) -> dict:
    """The noise-control summary of the merged rows, folded the way the sweep folds it."""
    return rundir.noise_control_of(rows)


def unique(items: list) -> list:
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def unique_models(models: list[dict]) -> list[dict]:
    """One record per (role, sha256): the same file may sit at another path on each machine."""
    seen, out = set(), []
    for model in models:
        if (model.get("role"), model.get("sha256")) not in seen:
            seen.add((model.get("role"), model.get("sha256")))
            out.append(model)
    return out


def merged_provenance(dirs: list[Path], records: list[dict], rows: list[dict], command: str,
                      allow_hardware: bool) -> dict:
    merged = {k: v for k, v in records[0].items() if k != "shard"}
    merged.update(run_id=time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6], date=now_iso(),
                  command=command, completed=True,
                  models=unique_models([m for r in records for m in r.get("models", [])]),
                  refused_cells=[c for r in records for c in r.get("refused_cells", [])],
                  notes=unique([n for r in records for n in r.get("notes", [])]),
                  workload=next((r["workload"] for r in records if r.get("workload")), None),
                  noise_control=joined_noise_control(rows))
    if allow_hardware:
        for key in HARDWARE_KEYS:
            if len(unique([r.get(key) for r in records])) > 1:
                merged[key] = "mixed: see merged_from"
    merged["merged_from"] = [{"dir": str(d), "shard": f"{r['shard']['index']}/{r['shard']['count']}",
                              "run_id": r.get("run_id"), "date": r.get("date"), "command": r.get("command"),
                              "invocations": r.get("invocations"),
                              **{key: r.get(key) for key in HARDWARE_KEYS}}
                             for d, r in zip(dirs, records)]
    return merged


def merge(out: Path, shard_dirs: list[Path], command: str = "", allow_hardware: bool = False) -> Path:
    """Joins the shard directories into `out` (new or empty); returns its traces.csv."""
    out, dirs = Path(out), [Path(d) for d in shard_dirs]
    if not dirs:
        raise MergeError("no shard directories given")
    if out.exists() and any(out.iterdir()):
        raise MergeError(f"{out} exists and is not empty; merge into a new directory")
    records = [load_shard(d) for d in dirs]
    order = sorted(range(len(dirs)), key=lambda i: records[i]["shard"].get("index", 0))
    dirs, records = [dirs[i] for i in order], [records[i] for i in order]
    check_same_settings(dirs, records, allow_hardware)
    grid_index = check_split(dirs, records)
    rows = [row for d, r in zip(dirs, records) for row in shard_rows(d, r)]
    rows.sort(key=lambda row: grid_index[base_key(row)])  # stable: a cell's off row stays before its on rows
    out.mkdir(parents=True, exist_ok=True)
    traces = out / "traces.csv"
    with open(traces, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=schema.COLUMN_NAMES)
        writer.writeheader()
        writer.writerows(rows)
    write_json(out / "provenance.json", merged_provenance(dirs, records, rows, command, allow_hardware))
    return traces


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, help="the merged run directory (new or empty)")
    p.add_argument("shard_dirs", type=Path, nargs="+", metavar="SHARD_DIR", help="one run directory per shard")
    p.add_argument("--allow-hardware-differences", action="store_true",
                   help="join shards measured on different hardware (recorded per shard in provenance.json)")
    p.add_argument("--no-report", action="store_true", help="do not write the report")


def run(args: argparse.Namespace, argv: list[str]) -> Path:
    """Merges the shards; returns the merged traces.csv. A refused merge is one line, no file changed."""
    command = "specnative merge " + " ".join(shlex.quote(a) for a in argv)
    try:
        return merge(args.out, args.shard_dirs, command, args.allow_hardware_differences)
    except MergeError as error:
        raise SystemExit(f"error: {error}") from None
