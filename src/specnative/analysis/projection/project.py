"""A measured run's speedup projected to other hardware [projected].

Per regime (an on row of the run's traces.csv): the tokens per round tau come from the run's
measured acceptance (accept_len_hist: rounds that accepted 0..k drafts; accept_at_pos: alpha by
position), with a bootstrap interval over rounds; the costs come from the cost model (cost.py) for
the run's target and draft files (each checked against the sha256 the run recorded) on each device,
for what the row drafted: a chain of k, a block drafter's one decode of k + 1 (DFlash, DSpark), or a
draft tree (its draft_shape and nodes_per_round; cost.step_costs). speedup = tau / (1 + c), and its
interval widens tau's interval by the device's cost error (the validation's error of 1 + c,
`cost_error` in the devices table), 1 + c never below 1. A serve run is refused. Nothing here
writes a file: report/projection_output.py writes projection.csv, projection.md and the figure.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specnative.analysis.projection import cost
from specnative.analysis.projection.device import Device
from specnative.analysis.projection.shape import ModelShape, from_gguf

BOOTSTRAP = 2000
DEFAULT_COST_ERROR = 0.25  # relative error of 1 + c where a device names none
BLOCK_DRAFTERS = ("dflash", "dspark")  # one draft decode of a block of k + 1 positions per round


class ProjectionError(ValueError):
    """A run or hardware a projection cannot be made for (one line)."""


def _floats(text) -> list:
    if text is None or (isinstance(text, float) and math.isnan(text)) or str(text).strip() == "":
        return []
    return [float(v) if v != "" else math.nan for v in str(text).split(";")]


def _text(value) -> str:
    import pandas as pd

    return "" if value is None or (not isinstance(value, str) and pd.isna(value)) else str(value)


def _number(value, default: float = 0.0) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(v) else v


def tau_interval(hist, level: float = 0.95, seed: int = 0) -> tuple:
    """Tokens per sequence-round (accepted + 1) and a bootstrap interval over rounds."""
    hist = np.asarray(hist, dtype=float)
    rounds = hist.sum()
    if rounds <= 0:
        return math.nan, math.nan, math.nan
    tokens = np.arange(len(hist)) + 1.0
    tau = float(hist @ tokens / rounds)
    draws = np.random.default_rng(seed).multinomial(int(rounds), hist / rounds, size=BOOTSTRAP)
    taus = draws @ tokens / rounds
    lo, hi = np.quantile(taus, [(1 - level) / 2, (1 + level) / 2])
    return tau, float(lo), float(hi)


def acceptance_rows(traces):
    """The on rows that carry alpha by position, and why any others were left out."""
    from specnative.record import schema

    if "spec_decode" not in traces or "accept_len_hist" not in traces:
        raise ProjectionError("the run records no acceptance by position (no accept_len_hist column): nothing to project")
    on = traces[traces["spec_decode"].astype(str) == "on"]
    notes = []
    synthetic = schema.synthetic_rows(on).index
    if len(synthetic):
        notes.append(f"{len(synthetic)} synthetic-acceptance row(s) left out: their acceptance is set, not measured")
        on = on.drop(index=synthetic)
    if "lossless_ok" in on:
        bad = on["lossless_ok"].astype(str).str.lower().isin(["false", "0"])
        if bad.any():
            notes.append(f"{int(bad.sum())} row(s) that failed the lossless check left out")
            on = on[~bad]
    if "drafter" in on:
        mtp = on["drafter"].astype(str) == "mtp"
        if mtp.any():
            notes.append(f"{int(mtp.sum())} MTP row(s) left out: the target's nextn head has no file of its own "
                         "for the cost model to take a shape from")
            on = on[~mtp]
    has = on["accept_len_hist"].map(lambda v: sum(_floats(_text(v))) > 0)
    on = on[has]
    if on.empty:
        raise ProjectionError("the run has no spec-on row with acceptance by position (accept_len_hist): nothing to project")
    return on, notes


_SHA256: dict = {}  # by (path, size, mtime): each file hashed once per process


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _SHA256:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _SHA256[key] = digest.hexdigest()
    return _SHA256[key]


def _candidates(name: str, provenance: dict, search: list):
    """Files named `name`: the path the run recorded, then under each of `search` (each once)."""
    seen = set()
    for m in provenance.get("models", []):
        if m.get("name") == name and m.get("path"):
            seen_path = Path(m["path"]).expanduser()
            if seen_path.is_file() and seen_path.resolve() not in seen:
                seen.add(seen_path.resolve())
                yield seen_path
    for root in search:
        root = Path(root).expanduser()
        found = [root / name] if (root / name).is_file() else []
        if root.is_dir():
            found += sorted(root.rglob(name))
        for p in found:
            if p.is_file() and p.resolve() not in seen:
                seen.add(p.resolve())
                yield p


def recorded_sha256(name: str, on, provenance: dict) -> set:
    """The sha256 the run recorded for a model file name: its rows' target_sha256 / draft_sha256 and
    its provenance's models."""
    hashes = set()
    for model_col, sha_col in (("target_model", "target_sha256"), ("draft_model", "draft_sha256")):
        if model_col in on and sha_col in on:
            values = on.loc[on[model_col].astype(str) == name, sha_col]
            hashes |= {_text(v).strip().lower() for v in values if _text(v).strip()}
    hashes |= {str(m["sha256"]).strip().lower() for m in provenance.get("models", [])
               if m.get("name") == name and m.get("sha256")}
    return hashes


def resolve_model(name: str, provenance: dict, search: list, sha256: str | None = None) -> Path | None:
    """A model file by name: the path the run recorded, else a file of that name under `search`;
    with `sha256`, the first of them with that hash (a ProjectionError naming both hashes where
    files of that name exist but none has it)."""
    first = None
    for path in _candidates(name, provenance, search):
        if sha256 is None:
            return path
        if _sha256(path) == sha256:
            return path
        first = first or path
    if first is not None:
        raise ProjectionError(f"model file {first} has sha256 {_sha256(first)}, but the run measured {name} with "
                              f"sha256 {sha256}: give --models DIR holding the file the run measured")
    return None


@dataclass
class Projected:
    device: Device
    row: dict
    costs: cost.StepCosts
    tau: tuple
    cost_error: float

    @property
    def speedup(self) -> float:
        return cost.speedup(self.tau[0], self.costs)

    @property
    def interval(self) -> tuple:
        """tau's interval over 1 + c widened by the cost error, 1 + c never below 1: a round costs at
        least the one step its verify is."""
        one_c = max(1.0 + self.costs.c, 1.0)
        return (self.tau[1] / max(one_c * (1 + self.cost_error), 1.0),
                self.tau[2] / max(one_c * (1 - self.cost_error), 1.0))


def draft_shape_of(row):
    """The row's draft tree (engine.draft_shape.DraftShape), or None for a chain or block."""
    from specnative.engine.draft_shape import parse

    spelling = _text(row.get("draft_shape")).strip()
    if not spelling or spelling == "chain":
        return None
    try:
        return parse(spelling)
    except ValueError as error:
        raise ProjectionError(f"row {_text(row.get('cell_id')) or '?'}: {error}") from None


def shapes_for(on, provenance: dict, search: list) -> tuple:
    """The shape of every model file the rows price, each checked against the hash the run recorded
    for it; and notes on files the run records no hash for."""
    names = set(on["target_model"].dropna().astype(str))
    if "draft_model" in on:
        ngram = on["drafter"].astype(str).str.startswith("ngram") if "drafter" in on else False
        names |= {n for n in on.loc[~ngram, "draft_model"].dropna().astype(str) if n}
    shapes, notes = {}, []
    for n in sorted(names):
        hashes = recorded_sha256(n, on, provenance)
        if len(hashes) > 1:
            raise ProjectionError(f"the run records {len(hashes)} different sha256 for {n} "
                                  f"({', '.join(sorted(hashes))}): project its rows of one model file at a time")
        sha256 = next(iter(hashes), None)
        path = resolve_model(n, provenance, search, sha256)
        if path is None:
            raise ProjectionError(f"model file {n} not found (not at the run's recorded path nor under "
                                  f"{', '.join(map(str, search))}): give --models DIR")
        if sha256 is None:
            notes.append(f"{n}: the run records no sha256, {path} was taken by its name alone")
        shapes[n] = from_gguf(path)
    return shapes, notes


def project_run(run_dir: Path, devices: list, search: list) -> tuple:
    """(projections, notes) for every measured regime of the run on every device."""
    from specnative.analysis.advisor import load_traces
    from specnative.record import schema
    from specnative.record.schema import TracesError

    run_dir = Path(run_dir)
    traces_path = run_dir / "traces.csv"
    if not traces_path.is_file():
        raise ProjectionError(f"{run_dir} has no traces.csv: not a run folder")
    try:
        traces = load_traces(traces_path, synthetic=True)  # to say which synthetic rows are left out
    except TracesError as error:
        raise ProjectionError(str(error)) from None
    if schema.is_serve_run(traces):
        raise ProjectionError(f"{run_dir} is a serve run (requests arriving over time, admitted into slots): project "
                              "prices a sweep's closed batches of N sequences; project a sweep of the same models")
    on, notes = acceptance_rows(traces)
    prov_path = run_dir / "provenance.json"
    provenance = json.loads(prov_path.read_text()) if prov_path.is_file() else {}
    shapes, model_notes = shapes_for(on, provenance, search)
    notes += model_notes
    notes += switch_notes(shapes, on, devices)
    out = []
    for _, row in on.iterrows():
        hist = _floats(row["accept_len_hist"])
        k = int(row["k"])
        drafter = _text(row.get("drafter")) or "model"
        draft_name = _text(row.get("draft_model"))
        draft: ModelShape | None = None
        if not drafter.startswith("ngram") and draft_name:
            draft = shapes[draft_name]
        own = int(_number(row.get("n_predict"))) + 32  # each sequence's own cells: prompt tail + output
        tree = draft_shape_of(row)
        nodes = _number(row.get("nodes_per_round"), math.nan)
        for device in devices:
            costs = cost.step_costs(shapes[str(row["target_model"])], device, k, int(row["concurrency"]),
                                    int(row["ctx_len"]), own, draft, draft_shape=tree, nodes=nodes,
                                    block=tree is None and drafter in BLOCK_DRAFTERS)
            out.append(Projected(device, dict(row), costs, tau_interval(hist),
                                 float(device.extra.get("cost_error", DEFAULT_COST_ERROR))))
    return out, notes


def verify_rows(row, tree, nodes: float) -> float:
    """Rows of the row's verify per sequence: k + 1 for a chain or block, nodes + 1 for a tree."""
    if tree is None:
        return int(row["k"]) + 1
    return (tree.budget if not math.isfinite(nodes) or nodes <= 0 else nodes) + 1


def switch_notes(shapes: dict, on, devices: list) -> list:
    """Per GPU device (CUDA, Metal) and target file: the verify's row count at which llama.cpp's kernel
    for the target's main layer type switches (cuda.next_switch, metal.next_switch), the largest chain
    k and tree budget below it at each concurrency the run measured, and how many rows verify past
    it (there the curve, not alpha, sets the cost)."""
    from specnative.analysis.projection import cuda, metal
    from specnative.analysis.projection.bench import main_type

    def row_length(shape, layer_type):  # Metal's small-batch kernels need rows of a multiple of 128
        return next((w.row_length for w in shape.weights if w.role == "layer" and w.type_name == layer_type), 0) or None

    def kernel_at(device, shape, layer_type, rows):
        if device.backend == "metal":
            return metal.select(layer_type, rows, row_length(shape, layer_type))
        return cuda.select(layer_type, rows, device.cc, device.cuda_kernels)

    def switch_of(device, shape, layer_type):
        if device.backend == "metal":
            return metal.next_switch(layer_type, row_length=row_length(shape, layer_type))
        return cuda.next_switch(layer_type, device.cc, kernel_set=device.cuda_kernels)

    notes = []
    targets = sorted(set(on["target_model"].astype(str)))
    concurrencies = sorted({int(c) for c in on["concurrency"]})
    for device in (d for d in devices if d.backend in ("cuda", "metal")):
        for name in targets:
            layer_type = main_type(shapes[name])
            switch = switch_of(device, shapes[name], layer_type)
            if switch is None:
                continue
            below = switch - 1
            first, then = (kernel_at(device, shapes[name], layer_type, n) for n in (below, switch))
            per_n = ", ".join(f"N={n}: k <= {below // n - 1}" for n in concurrencies if below // n - 1 >= 1)
            past = 0
            for _, row in on[on["target_model"].astype(str) == name].iterrows():
                rows = verify_rows(row, draft_shape_of(row), _number(row.get("nodes_per_round"), math.nan))
                past += int(rows * int(row["concurrency"]) > below)
            notes.append(f"{device.label}, {layer_type} ({name}): a verify of more than {below} rows leaves "
                         f"{first.upper()} for {then.upper()}: the largest k (and tree budget) below it is "
                         f"{below - 1} at one sequence" + (f" ({per_n})" if per_n else "") +
                         (f"; {past} measured regime(s) verify past it, where the cost curve, not alpha, "
                          "decides" if past else ""))
    return notes


COLUMNS = ["label", "device", "backend", "target_model", "quant_bits", "drafter", "draft_shape", "k", "nodes_per_round",
           "temperature", "concurrency", "ctx_len", "accept_at_pos", "tau", "tau_lo", "tau_hi", "step_ms", "verify_ms",
           "draft_ms", "draft_round_ms", "c", "c_draft",
           "speedup", "speedup_lo", "speedup_hi", "cost_error", "measured_step_ms_here", "measured_c_here",
           "measured_speedup_here"]


def table(projections: list):
    import pandas as pd

    rows = []
    for p in projections:
        lo, hi = p.interval
        rows.append({"label": cost.LABEL, "device": p.device.name, "backend": p.device.backend,
                     "target_model": p.row.get("target_model"), "quant_bits": p.row.get("quant_bits"),
                     "drafter": _text(p.row.get("drafter")) or "model", "draft_shape": p.costs.shape,
                     "k": int(p.row["k"]), "nodes_per_round": p.row.get("nodes_per_round"),
                     "temperature": p.row.get("temperature"), "concurrency": int(p.row["concurrency"]),
                     "ctx_len": int(p.row["ctx_len"]), "accept_at_pos": p.row.get("accept_at_pos"),
                     "tau": p.tau[0], "tau_lo": p.tau[1], "tau_hi": p.tau[2], "step_ms": p.costs.step_s * 1e3,
                     "verify_ms": p.costs.verify_s * 1e3, "draft_ms": p.costs.draft_s * 1e3,
                     "draft_round_ms": p.costs.draft_round_s * 1e3, "c": p.costs.c,
                     "c_draft": p.costs.c_draft, "speedup": p.speedup, "speedup_lo": lo, "speedup_hi": hi,
                     "cost_error": p.cost_error, "measured_step_ms_here": p.row.get("step_ms"),
                     "measured_c_here": p.row.get("verify_cost_c"), "measured_speedup_here": p.row.get("speedup")})
    return pd.DataFrame(rows, columns=COLUMNS)


def shape_label(shape: str, k) -> str:
    """What a row drafts, as its outputs name it: 'chain k=4', 'block k=4' or a tree's spelling."""
    return f"{shape} k={k}" if shape in ("chain", "block") else str(shape)
