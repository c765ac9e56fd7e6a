"""The cells a report shows, selected and ordered from traces.csv: lossless ones for the curves,
failed ones listed apart, the dimensions that vary, labels, the step parts of a row, the theory
table and the slope of speedup against concurrency."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specnative.analysis import theory
from specnative.analysis.advisor import REGIME_KEYS, as_float
from specnative.report.text import floats

CURVE_DIMS = ("quant_bits", "k", "temperature", "accept_rule", "draft_model", "task", "drafter",
              "draft_p_min")  # split lines if varied


ON_STEPS = ("prefill_target_ms", "prefill_draft_ms", "draft_ms", "draft_ingest_ms", "verify_ms", "resample_ms")


OFF_STEPS = ("prefill_target_ms", "decode_ms")


def lossless_cells(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["lossless_ok"].fillna(False).astype(bool)]


def failed_cells(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[~cells["lossless_ok"].fillna(True).astype(bool)]


def varied(cells: pd.DataFrame, dims=CURVE_DIMS) -> list[str]:
    return [d for d in dims if d in cells and cells[d].nunique(dropna=False) > 1]


def key_text(key: str, value) -> str:
    if value is None or pd.isna(value):
        return f"{key} n/a"
    names = {"quant_bits": "q{}", "ctx_len": "ctx {}", "concurrency": "×{}", "k": "k={}",
             "temperature": "T={:g}", "accept_rule": "{}", "draft_model": "draft {}", "task": "{}",
             "drafter": "{}"}
    if key == "draft_p_min":
        return "fixed k" if float(value) == 0 else f"p_min={float(value):g}"
    fmt = names.get(key, key + " {}")
    return fmt.format(float(value) if key == "temperature" else value)


def label(row, keys) -> str:
    return ", ".join(key_text(k, row[k]) for k in keys)


ORDER_KEYS = ["quant_bits", "ctx_len", "concurrency", "temperature", "task", "_on", "k", "accept_rule"]


def ordered(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows by regime, each off row first and its on rows after it."""
    rows = rows.assign(_on=(rows["spec_decode"] == "on").astype(int))
    return rows.sort_values(ORDER_KEYS, kind="stable").drop(columns="_on").reset_index(drop=True)


def step_parts(row) -> dict:
    """Step times of one run (ms) by step, plus what the timers leave of total_ms."""
    steps = ON_STEPS if row["spec_decode"] == "on" else OFF_STEPS
    parts = {s: np.nan_to_num(as_float(row.get(s, np.nan))) for s in steps}  # older traces lack draft_ingest_ms
    parts["other_ms"] = as_float(row["total_ms"]) - sum(parts.values())
    return parts


def theory_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per lossless cell: the closed forms of theory.py with the measured alpha, k and c, beside
    the measured speedup and tau; also with the per-token alpha from the histogram."""
    rows = []
    for _, cell in lossless_cells(cells).iterrows():
        alpha, alpha_tok = as_float(cell["draft_accept_rate"]), as_float(cell["token_accept_rate"])
        k, c = as_float(cell["k"]), as_float(cell["verify_cost_c"])
        k = int(k) if math.isfinite(k) else 0
        reach = floats(cell.get("draft_reach"))
        drafter = cell.get("drafter")
        if reach and drafter is not None and not pd.isna(drafter) and drafter != "model":
            # an n-gram lookup drafts 0..k tokens: the closed form over the measured length mix
            # E[tokens/round] = 1 + sum_j alpha^j P(L >= j) (theory.py), not the fixed-k one
            rows.append({**{key: cell[key] for key in REGIME_KEYS},
                         "alpha": alpha, "alpha_token": alpha_tok, "c": c, "speedup": cell["speedup"],
                         "predicted": theory.predicted_speedup_lengths(alpha, reach, c),
                         "predicted_token": theory.predicted_speedup_lengths(alpha_tok, reach, c),
                         "tau": as_float(cell["mean_accept_len"]),
                         "tau_expected": theory.expected_tokens_per_round_lengths(alpha, reach),
                         "tau_expected_token": theory.expected_tokens_per_round_lengths(alpha_tok, reach)})
            continue
        rows.append({**{key: cell[key] for key in REGIME_KEYS},
                     "alpha": alpha, "alpha_token": alpha_tok, "c": c,
                     "speedup": cell["speedup"],
                     "predicted": theory.predicted_speedup(alpha, k, c),
                     "predicted_token": theory.predicted_speedup(alpha_tok, k, c),
                     "tau": as_float(cell["mean_accept_len"]),
                     "tau_expected": theory.expected_tokens_per_round(alpha, k),
                     "tau_expected_token": theory.expected_tokens_per_round(alpha_tok, k)})
    return pd.DataFrame(rows)


def conditional_acceptance(accept_at_pos) -> list[float]:
    """accept_at_pos[i] counts rounds that accepted position i+1, so it includes every earlier
    rejection; the chance of accepting position i+1 once reached is the ratio to position i.
    Approximate where the last rounds drafted fewer than k (the rates then have different
    denominators; a ratio can even pass 1)."""
    reached = [1.0] + floats(accept_at_pos)
    return [a / r if r > 0 else math.nan for r, a in zip(reached, reached[1:])]


def speedup_slope(cells: pd.DataFrame, min_concurrency: int = 4) -> list[dict]:
    """linregress(concurrency, speedup) over lossless cells with concurrency >= min_concurrency,
    per curve (ctx_len and varied dims) and pooled; needs >= 3 distinct concurrencies."""
    cells = lossless_cells(cells)
    cells = cells[(cells["concurrency"] >= min_concurrency) & cells["speedup"].notna()]
    keys = ["ctx_len"] + varied(cells)
    groups = [(label(g.iloc[0], keys), g) for _, g in cells.groupby(keys, dropna=False)]
    return [_slope(name, g) for name, g in groups + [("all cells pooled", cells)]]


def _slope(name: str, cells: pd.DataFrame) -> dict:
    distinct = cells["concurrency"].nunique()
    result = {"series": name, "n": len(cells), "concurrencies": distinct,
              "slope": math.nan, "p_value": math.nan, "note": ""}
    if distinct < 3:
        result["note"] = f"not enough points ({distinct} distinct concurrencies >= 4; need 3)"
        return result
    try:
        from scipy import stats  # only this test needs scipy (pyproject lists it under [test])
    except ImportError:
        result["note"] = "scipy not installed: no slope test"
        return result
    fit = stats.linregress(cells["concurrency"].astype(float), cells["speedup"].astype(float))
    result.update(slope=fit.slope, p_value=fit.pvalue,
                  note="falls with concurrency" if fit.slope < 0 and fit.pvalue < 0.05 else
                  "no significant trend (p >= 0.05)" if fit.pvalue >= 0.05 else "rises with concurrency")
    return result


ENGINE_OWN_GOAL = 0.01  # the engine's own share of a round (or step) at most 1 %
