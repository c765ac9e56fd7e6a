"""A comparison as markdown (for a reader: a new lossless fail first, then what differs between the
runs, the decided changes, every regime), CSV (one row per regime, for a spreadsheet) or JSON (for
a program)."""
from __future__ import annotations

import csv
import io
import json
import math

from specnative.analysis.compare import IMPROVEMENT, NO_CHANGE, REGRESSION, UNDECIDED, CellResult, Comparison
from specnative.analysis.compare_regimes import LATENCIES, LEVEL, PAIRED, RECORDED, SEEDS

CSV_FIELDS = ("regime", "cell_id_a", "cell_id_b", "status", "tps_off_a", "tps_off_b", "tps_off_ratio",
              "tps_off_ratio_low", "tps_off_ratio_high", "tps_off_status", "speedup_a", "speedup_b", "speedup_ratio",
              "speedup_ratio_low", "speedup_ratio_high", "interval_from", "tps_off_recorded_a", "tps_off_recorded_b",
              "speedup_recorded_a", "speedup_recorded_b", "alpha_a", "alpha_b", "c_a", "c_b",
              "verdict_a", "verdict_b", "became_fail",
              *(f"{m}_{part}" for m in LATENCIES for part in ("ratio", "ratio_low", "ratio_high")))


def _f(value: float, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _ratio(iv, marker: str = "") -> str:
    if not math.isfinite(iv.estimate):
        return "–"
    spread = f" [{iv.low:.3f}, {iv.high:.3f}]" if math.isfinite(iv.low) else " (no interval)"
    return f"{iv.estimate:.3f}{spread}{marker}"


def rule_text(threshold: float) -> str:
    low, half_low = 1 - threshold, 1 - threshold / 2
    return (f"Status of the speedup ratio B/A (95 % Welch interval on the log scale, threshold {threshold * 100:g} %): "
            f"{REGRESSION}: below {low:.4g} with the interval's upper end below {half_low:.4g}; "
            f"{IMPROVEMENT}: above {1 + threshold:.4g} with the lower end above {1 + threshold / 2:.4g}; "
            f"{NO_CHANGE}: the whole interval within [{low:.4g}, {1 + threshold:.4g}]; "
            f"{UNDECIDED}: too wide to say (more repeats would tell).")


def _summary(c: Comparison) -> str:
    counts = [f"{c.count(s)} {s}" for s in (REGRESSION, IMPROVEMENT, NO_CHANGE, UNDECIDED)]
    slower = sum(r.tps_off_status == REGRESSION for r in c.cells)
    faster = sum(r.tps_off_status == IMPROVEMENT for r in c.cells)
    return (f"{len(c.cells)} regime(s) in both runs: " + ", ".join(counts) +
            f"; {len(c.only_a)} only in A, {len(c.only_b)} only in B. Spec-off tokens/s decided slower in "
            f"{slower}, faster in {faster} (--fail-on-slowdown gates on it).")


def to_markdown(c: Comparison) -> str:
    out = [f"# specnative compare: {c.label_a} (A) → {c.label_b} (B)", "",
           f"- A: run {c.run_a.run_id}, {c.run_a.provenance.get('date', 'date unrecorded')}, {c.run_a.run_dir}",
           f"- B: run {c.run_b.run_id}, {c.run_b.provenance.get('date', 'date unrecorded')}, {c.run_b.run_dir}", ""]
    out += [f"**Note: {note}.**" for note in c.notes] + ([""] if c.notes else [])
    fails = [(r.a.label, r.a.verdict, r.b) for r in c.became_fail] + [(r.label, "not in A", r) for r in c.new_fails]
    if fails:  # a lossless failure outweighs every speed number: it comes first
        out += [f"## LOSSLESS VERDICT BECAME FAIL in {len(fails)} regime(s)", ""]
        out += [f"- **FAIL: {label}**: {before} → {b.verdict}" + (f" ({b.verdict_reason})" if b.verdict_reason else "")
                for label, before, b in fails] + [""]
    out += ["## What differs between the runs", ""]
    if c.differences:
        out += ["| | A | B |", "|---|---|---|"] + [f"| {w} | {_cell(a)} | {_cell(b)} |" for w, a, b in c.differences]
    else:
        out.append("Same build, host and models (specnative version and commit, llama.cpp commit, build flags, "
                   "backend, host, CPUs, model files).")
    if c.across:
        out += ["", f"Regimes matched across {'models and settings' if c.across == 'all' else c.across} "
                    f"(--match-across {c.across})."]
    out += ["", "## Result", "", _summary(c), ""]
    for title, status in (("Decided regressions", REGRESSION), ("Decided improvements", IMPROVEMENT)):
        found = [r for r in c.cells if r.status == status]
        if found:
            out += [f"{title} (speedup B/A):", ""] + [f"- {r.a.label}: {_ratio(r.speedup_ratio)}" for r in found] + [""]
    out += [rule_text(c.threshold), "", "## Per regime", "",
            "tok/s off and speedup: geometric means of each run's repeats (of the paired on/off ratios for the "
            "speedup), the centers of its intervals; a noisy cell's pooled traces.csv columns can differ "
            "(-o csv/json: *_recorded).", ""] + _table(c)
    if any(RECORDED in r.sources for r in c.cells):
        out += ["", "†: the interval was derived from the run's recorded interval (speedup_ci_low/high, "
                    "tps_ci_low/high and repeats_used: a run without per-repeat values), not from its repeats."]
    if any(PAIRED in r.sources for r in c.cells):
        out += ["", "Serve levels: each ratio is paired over the traces both runs replayed (same trace_sha256), "
                    "so what a trace's arrivals did to both cancels."]
    if any(SEEDS in r.sources for r in c.cells):
        out += ["", "Serve levels whose traces differ between the runs: Welch intervals over the seeds."]
    for side, regimes in (("A", c.only_a), ("B", c.only_b)):
        if regimes:
            out += ["", f"## Only in {side} ({len(regimes)})", ""] + [f"- {r.label}" for r in regimes]
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _table(c: Comparison) -> list[str]:
    serve = c.kind == "serve"
    head = ["regime", "tok/s off A", "tok/s off B", "off B/A [95 %]", "speedup A", "speedup B",
            "speedup B/A [95 %]", "α A", "α B", "c A", "c B", "verdict A → B", "status"]
    if serve:
        head[7:7] = [f"{m.removesuffix('_ms').replace('_', ' ')} on B/A" for m in LATENCIES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in c.cells:
        mark = "†" if RECORDED in r.sources else ""
        off_mark = {REGRESSION: " slower", IMPROVEMENT: " faster"}.get(r.tps_off_status, "")
        verdict = f"{r.a.verdict} → {r.b.verdict}" + (" **FAIL**" if r.became_fail else "")
        label = r.a.label if r.b.label == r.a.label else f"{r.a.label} ↔ {r.b.label}"  # matched across
        cells = [_cell(label), _f(r.a.tps_off, 4), _f(r.b.tps_off, 4), _ratio(r.tps_off_ratio, off_mark),
                 _f(r.a.speedup), _f(r.b.speedup), _ratio(r.speedup_ratio, mark), _f(r.a.alpha), _f(r.b.alpha),
                 _f(r.a.c), _f(r.b.c), verdict, f"**{r.status}**" if r.status == REGRESSION else r.status]
        if serve:
            cells[7:7] = [_ratio(r.latency_ratios[m]) if m in r.latency_ratios else "–" for m in LATENCIES]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _number(value):
    return value if value is not None and math.isfinite(value) else None


def cell_record(r: CellResult) -> dict:
    record = {"regime": r.a.label, "cell_id_a": r.a.key, "cell_id_b": r.b.key, "status": r.status,
              "tps_off_a": r.a.tps_off, "tps_off_b": r.b.tps_off, "tps_off_ratio": r.tps_off_ratio.estimate,
              "tps_off_ratio_low": r.tps_off_ratio.low, "tps_off_ratio_high": r.tps_off_ratio.high,
              "tps_off_status": r.tps_off_status, "speedup_a": r.a.speedup, "speedup_b": r.b.speedup,
              "tps_off_recorded_a": r.a.tps_off_recorded, "tps_off_recorded_b": r.b.tps_off_recorded,
              "speedup_recorded_a": r.a.speedup_recorded, "speedup_recorded_b": r.b.speedup_recorded,
              "speedup_ratio": r.speedup_ratio.estimate, "speedup_ratio_low": r.speedup_ratio.low,
              "speedup_ratio_high": r.speedup_ratio.high, "interval_from": r.sources, "alpha_a": r.a.alpha,
              "alpha_b": r.b.alpha, "c_a": r.a.c, "c_b": r.b.c, "verdict_a": r.a.verdict, "verdict_b": r.b.verdict,
              "became_fail": r.became_fail}
    for m, iv in r.latency_ratios.items():
        record.update({f"{m}_ratio": iv.estimate, f"{m}_ratio_low": iv.low, f"{m}_ratio_high": iv.high})
    return {k: _number(v) if isinstance(v, float) else v for k, v in record.items()}


def to_csv(c: Comparison) -> str:
    """Matched regimes, then those only in one run (status 'only in A' / 'only in B', numbers empty)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, restval="", lineterminator="\n")
    writer.writeheader()
    for r in c.cells:
        writer.writerow({k: "" if v is None else v for k, v in cell_record(r).items()})
    for side, regimes in (("A", c.only_a), ("B", c.only_b)):
        for r in regimes:
            writer.writerow({"regime": r.label, f"cell_id_{side.lower()}": r.key, "status": f"only in {side}"})
    return buffer.getvalue()


def to_json(c: Comparison) -> str:
    def run(record, label):
        return {"label": label, "run_id": record.run_id, "run_dir": str(record.run_dir),
                "date": record.provenance.get("date")}
    return json.dumps({
        "a": run(c.run_a, c.label_a), "b": run(c.run_b, c.label_b), "kind": c.kind,
        "threshold": c.threshold, "level": LEVEL, "match_across": c.across, "notes": c.notes,
        "differences": [{"what": w, "a": a, "b": b} for w, a, b in c.differences],
        "summary": {s: c.count(s) for s in (REGRESSION, IMPROVEMENT, NO_CHANGE, UNDECIDED)},
        "became_fail": [r.a.label for r in c.became_fail], "new_fails": [r.label for r in c.new_fails],
        "gate_failed": c.gate_failed,
        "cells": [cell_record(r) for r in c.cells],
        "only_in_a": [r.label for r in c.only_a], "only_in_b": [r.label for r in c.only_b],
    }, indent=2) + "\n"


FORMATS = {"md": to_markdown, "csv": to_csv, "json": to_json}
