"""Do the levers add under load? Request rate (batching under load) x speculation x prefix cache on
the serving metrics a serve run measured (output throughput, TTFT and TPOT p50), from its rows: one
per (rate, trace, prefix cache, spec).

Two views, as the closed loop's factorial (analysis/factorial.py): per rate, speculation's benefit
with the prefix cache on and off (paired request by request on the same trace, crossover.benefit)
and their ratio, the interaction, with a Welch interval over the traces; and a log-linear model of
each metric over the three factors with all two-way interactions (OLS on the logs, statsmodels).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specnative.analysis import crossover
from specnative.analysis.factorial import loglinear, reference_level
from specnative.analysis.stats import LogEstimate, welch_ratio
from specnative.report.text import fmt, md_table
from specnative.serving import arrivals

METRICS = ("output_throughput", "ttft_p50_ms", "tpot_p50_ms")
FACTORS = ["request_rate", "spec_decode", "prefix_cache"]


def with_modes(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with a prefix_cache column (runs before the factor served without sharing)."""
    rows = rows.copy()
    rows["prefix_cache"] = rows["prefix_cache"].fillna("off") if "prefix_cache" in rows else "off"
    if "verdict" not in rows:
        rows["verdict"] = None
    return rows


def per_trace_benefits(pairs: pd.DataFrame, metric: str) -> list[float]:
    """Speculation's benefit on each trace (> 1: it helps), oriented by the metric's direction."""
    higher = crossover.METRICS[metric][1]
    on, off = pairs[f"{metric}_on"].astype(float), pairs[f"{metric}_off"].astype(float)
    ratios = on / off if higher else off / on
    return [r for r in ratios if r > 0 and math.isfinite(r)]


def interaction_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per rate and metric: the benefit with the prefix cache off and on, and on / off with its
    interval (Welch on the logs of the per-trace benefits)."""
    pairs = crossover.paired(with_modes(rows))
    out = []
    for rate, group in pairs.groupby("request_rate", sort=True):
        for metric in METRICS:
            benefit = {mode: per_trace_benefits(group[group["prefix_cache"] == mode], metric) for mode in ("off", "on")}
            estimates = {mode: LogEstimate.of_values(values, "traces") for mode, values in benefit.items()}
            ratio = (welch_ratio(estimates["off"], estimates["on"]) if estimates["off"] and estimates["on"]
                     else None)
            out.append({"request_rate": rate, "metric": metric, "label": crossover.METRICS[metric][0],
                        "benefit_off": float(np.exp(np.mean(np.log(benefit["off"])))) if benefit["off"] else math.nan,
                        "benefit_on": float(np.exp(np.mean(np.log(benefit["on"])))) if benefit["on"] else math.nan,
                        "interaction": ratio.estimate if ratio else math.nan,
                        "low": ratio.low if ratio else math.nan, "high": ratio.high if ratio else math.nan})
    return pd.DataFrame(out)


def reading(row) -> str:
    low, high = row["low"], row["high"]
    if not (math.isfinite(low) and math.isfinite(high)):
        return "undecided (too few traces for an interval)"
    if high < 1:
        return "the prefix cache lowers speculation's benefit"
    if low > 1:
        return "the prefix cache raises speculation's benefit"
    return "add within noise"


def section_md(rows: pd.DataFrame) -> str | None:
    """None when the run has one prefix-cache mode (nothing crosses with speculation but the rate)."""
    rows = with_modes(rows)
    if rows["prefix_cache"].nunique() < 2:
        return None
    table = interaction_table(rows)
    lines = [[arrivals.rate_label(r["request_rate"]), r["label"], fmt(r["benefit_off"]), fmt(r["benefit_on"]),
              f"{fmt(r['interaction'])} [{fmt(r['low'])}, {fmt(r['high'])}]", reading(r)] for _, r in table.iterrows()]
    parts = ["Speculation's benefit (> 1: it helps; paired request by request on the same trace) with the prefix "
             "cache off and on, and their ratio: 1 inside the interval means the two levers add.",
             md_table(["req/s", "metric", "benefit, cache off", "benefit, cache on", "on / off [95 %]", "reading"],
                      lines)]
    for metric in METRICS:
        model = loglinear(rows, metric, FACTORS, unit=FACTORS)  # a level's traces are its replicates
        decided = model[model["interaction"] & model["decided"]] if not model.empty else model
        text = "; ".join(f"{r['term']}: {r['effect']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
                         for _, r in decided.iterrows()) or (
            f"nothing decided: {model.attrs['why']}"
            if model.empty and model.attrs.get("why") else "none decided")
        parts.append(f"- log-linear model of {crossover.METRICS[metric][0]} (rate x spec x prefix cache, two-way "
                     f"interactions against rate {reference_level('request_rate', rows['request_rate'])}, spec off, "
                     f"cache on): "
                     f"{text}")
    return "\n\n".join(parts)
