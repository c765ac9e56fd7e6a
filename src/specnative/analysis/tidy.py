"""tidy.csv: one row per (cell, timed repeat) with the factor columns, for people who run their own
statistics (and for the factorial analysis, factorial.py). Built from traces.csv's per-repeat
columns (tps_repeats, speedup_repeats, e2e_tps_repeats); rows written before those were recorded
have no repeats and give no tidy rows.

Columns: run_id, cell_id, repeat (0-based, in the order measured), the factors quant_bits,
spec_decode, spec_method ("off", or the drafter and k of an on row: "model k=4"), concurrency,
ctx_len, prefix_cache, temperature, task; the measurements tps (steady-state decode tokens/s),
e2e_tps (the prefill included) and speedup (on rows: that repeat's paired tps_on / tps_off); and
verdict (the cell's lossless verdict; `fail` rows give no number to any analysis).
"""
from __future__ import annotations

import math

import pandas as pd

FACTORS = ("quant_bits", "spec_decode", "spec_method", "concurrency", "ctx_len", "prefix_cache", "temperature",
           "task")
COLUMNS = ("run_id", "cell_id", "repeat", *FACTORS, "tps", "e2e_tps", "speedup", "verdict")


def values_of(text) -> list[float]:
    """'41.2;40.9' -> [41.2, 40.9]; empty or missing -> []."""
    if text is None or (not isinstance(text, str) and pd.isna(text)) or not str(text).strip():
        return []
    return [float(v) for v in str(text).split(";") if v.strip()]


def spec_method(row) -> str:
    if row["spec_decode"] != "on":
        return "off"
    drafter = row.get("drafter")
    drafter = "model" if drafter is None or (not isinstance(drafter, str) and pd.isna(drafter)) else drafter
    k = row.get("k")
    return f"{drafter} k={int(k)}" if k is not None and not pd.isna(k) else str(drafter)


def verdict_of(row) -> str:
    verdict = row.get("verdict")
    if isinstance(verdict, str) and verdict:
        return verdict
    if row["spec_decode"] != "on":
        return "reference"
    ok = str(row.get("lossless_ok")).lower() in ("true", "1", "1.0")
    return "lossless" if ok else "fail"


def prefix_of(row) -> str:
    value = row.get("prefix_cache")
    return value if isinstance(value, str) and value else "on"  # runs before the axis shared the prefix


def tidy_rows(row) -> list[dict]:
    tps, e2e, speedup = (values_of(row.get(c)) for c in ("tps_repeats", "e2e_tps_repeats", "speedup_repeats"))
    common = {"run_id": row.get("run_id"), "cell_id": row.get("cell_id"), "quant_bits": row.get("quant_bits"),
              "spec_decode": row["spec_decode"], "spec_method": spec_method(row),
              "concurrency": row.get("concurrency"), "ctx_len": row.get("ctx_len"), "prefix_cache": prefix_of(row),
              "temperature": row.get("temperature"), "task": row.get("task"), "verdict": verdict_of(row)}
    return [{**common, "repeat": i, "tps": value,
             "e2e_tps": e2e[i] if i < len(e2e) else math.nan,
             "speedup": speedup[i] if i < len(speedup) else math.nan} for i, value in enumerate(tps)]


def tidy_frame(traces: pd.DataFrame) -> pd.DataFrame:
    """Every timed repeat of every measured cell (closed-loop rows; serve levels are not repeats)."""
    rows = [r for _, row in traces.iterrows() if pd.isna(row.get("request_rate")) for r in tidy_rows(row)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def write_tidy(traces: pd.DataFrame, path) -> pd.DataFrame:
    frame = tidy_frame(traces)
    frame.to_csv(path, index=False)
    return frame
