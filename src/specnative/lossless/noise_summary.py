"""The noise control's summary per target and backend in provenance.json, folded from the on rows
of every measured cell."""
from __future__ import annotations

import math

from specnative.lossless.noise import SAFETY
from specnative.lossless.verdicts import VERDICTS


def record_noise(summary: dict, target_name: str, backend: str, on_rows: list[dict]) -> None:
    """Folds one cell's noise controls (traces.csv on-row columns) into the sweep's provenance
    summary per target model and backend: the largest noise seen, positions and flips summed."""
    entry = summary.setdefault(f"{target_name} [{backend}]", {
        "max_abs_delta": 0.0, "max_spread": 0.0, "positions": 0, "flips": 0, "cells": 0,
        "verdicts": {v: 0 for v in VERDICTS}, "safety": SAFETY,
        "what": "teacher-forced target logits, baseline 1-token steps vs k+1-token verify batches, same "
                "tokens, each cell's prompts and concurrency"})
    for row in on_rows:
        if row.get("noise_positions") is None:
            continue
        entry["max_abs_delta"] = max(entry["max_abs_delta"], float(row["noise_max_abs_delta"]))
        entry["max_spread"] = max(entry["max_spread"], float(row["noise_max_spread"]))
        entry["positions"] += int(row["noise_positions"])
        entry["flips"] += int(row["noise_flips"])
        entry["cells"] += 1
        entry["verdicts"][row["verdict"]] = entry["verdicts"].get(row["verdict"], 0) + 1
        used = float(row.get("noise_tolerance") or 0.0)  # a verdict's own, floored (noise.float_floor)
        if math.isfinite(used):
            entry["max_verdict_tolerance"] = max(entry.get("max_verdict_tolerance", 0.0), used)
    # never shown below what a verdict used: a control of 0 leaves the float floor, not 0
    entry["tolerance"] = max(SAFETY * entry["max_spread"], entry.get("max_verdict_tolerance", 0.0))
