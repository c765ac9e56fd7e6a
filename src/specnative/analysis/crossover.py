"""Where speculation stops paying under load: from the load sweep's rows (spec off and on
on the same seeded traces at each request rate), the benefit of speculation per metric and rate
with its interval over the traces, the crossover rate, and deployable advice.

The benefit b is oriented so that b > 1 means speculation pays: on/off for the throughputs and
goodput, off/on for latencies (TPOT, TTFT). Per rate, b is the geometric mean of the per-trace
paired ratios with a Student t interval on their logs (stats.speedup_interval): "pays" when the
interval lies above 1, "loses" below 1, else "tie". The crossover is the first rate at which the
point estimate falls to 1 or below after a rate where it was above; between two finite rates it
is interpolated in log rate; the bracket is (the last rate that pays, the first that loses). A
benefit within PRACTICAL of 1 is no difference, however tight its interval.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specnative.analysis import stats
from specnative.record.schema import serve_rows

# metric column -> (label, True if higher is better)
METRICS = {
    "output_throughput": ("output throughput", True),
    "tpot_p50_ms": ("p50 TPOT", False),
    "tpot_p99_ms": ("p99 TPOT", False),
    "goodput": ("goodput", True),
    "ttft_p50_ms": ("p50 TTFT", False),
}
PAYS, LOSES, TIE = "pays", "loses", "tie"


def paired(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (rate, trace, prefix cache) with each column of the off and on rows (_off / _on)."""
    keys = ["request_rate", "trace_sha256"] + (["prefix_cache"] if "prefix_cache" in rows else [])
    off, on = rows[rows["spec_decode"] == "off"], rows[rows["spec_decode"] == "on"]
    return off.merge(on, on=keys, suffixes=("_off", "_on"), how="inner")


def benefit(on: list, off: list, higher_better: bool, level: float) -> stats.Interval:
    """b > 1: speculation pays. No interval (NaN bounds) where a value is not positive (a goodput
    of 0) or there is one trace."""
    num, den = (on, off) if higher_better else (off, on)
    pairs = [(a, b) for a, b in zip(num, den) if a > 0 and b > 0]
    if len(pairs) < len(num) or not pairs:
        ratios = [a / b for a, b in zip(num, den) if b > 0]
        estimate = float(np.mean(ratios)) if ratios else math.nan
        return stats.Interval(estimate, math.nan, math.nan, level, len(ratios))
    return stats.speedup_interval([a for a, _ in pairs], [b for _, b in pairs], level)


# A benefit within this of 1 is no practical difference, however tight its interval: below
# saturation the throughput follows the arrivals, on and off alike (0.999 with a 0.1 % interval).
PRACTICAL = 0.02


def status(interval: stats.Interval) -> str:
    if interval.above(1.0) and interval.estimate >= 1.0 + PRACTICAL:
        return PAYS
    if interval.below(1.0) and interval.estimate <= 1.0 - PRACTICAL:
        return LOSES
    return TIE


def benefit_table(traces: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per rate and metric: benefit with interval and status, and the means of the on and off values."""
    pairs = paired(serve_rows(traces))
    out = []
    for rate, group in pairs.groupby("request_rate", sort=True):
        for metric, (label, higher) in METRICS.items():
            on, off = group[f"{metric}_on"].astype(float).tolist(), group[f"{metric}_off"].astype(float).tolist()
            b = benefit(on, off, higher, level)
            out.append({"request_rate": rate, "metric": metric, "label": label, "benefit": b.estimate,
                        "low": b.low, "high": b.high, "traces": b.n, "status": status(b),
                        "on_mean": float(np.mean(on)), "off_mean": float(np.mean(off)),
                        "occupancy_on": float(group["mean_occupancy_on"].mean()),
                        "occupancy_off": float(group["mean_occupancy_off"].mean())})
    return pd.DataFrame(out)


def _interpolate(r0: float, b0: float, r1: float, b1: float) -> float:
    """The rate at which b crosses 1 between (r0, b0 > 1) and (r1, b1 <= 1), linear in log rate."""
    if math.isinf(r1) or not (r0 > 0):
        return math.nan
    t = (b0 - 1.0) / (b0 - b1) if b0 != b1 else 1.0
    return float(math.exp(math.log(r0) + t * (math.log(r1) - math.log(r0))))


def crossover(table: pd.DataFrame, metric: str) -> dict:
    """The crossover of one metric: rate (NaN beyond the last finite rate or where none), the
    bracket of rates that decide it, and what happened in words."""
    rows = table[table["metric"] == metric].sort_values("request_rate")
    rates, b, st = rows["request_rate"].tolist(), rows["benefit"].tolist(), rows["status"].tolist()
    result = {"metric": metric, "rate": math.nan, "bracket": [math.nan, math.nan], "status": "none"}
    if not rates:
        return result
    for i in range(1, len(rates)):
        if b[i - 1] > 1.0 >= b[i]:
            paid = [r for r, s in zip(rates[:i], st[:i]) if s == PAYS]
            lost = [r for r, s in zip(rates[i:], st[i:]) if s == LOSES]
            result.update(rate=_interpolate(rates[i - 1], b[i - 1], rates[i], b[i]),
                          bracket=[paid[-1] if paid else math.nan, lost[0] if lost else math.nan],
                          status="crosses")
            if math.isinf(rates[i]):
                result["status"] = "crosses-beyond-last-finite-rate"
            return result
    if all(v > 1.0 for v in b):
        result["status"] = "above-1-at-every-rate"
    elif all(v <= 1.0 for v in b):
        result["status"] = "never-above-1"
    else:
        result["status"] = "no-clean-crossing"
    return result


def decided(table: pd.DataFrame, metric: str) -> dict:
    """The rates at which the interval decided, for the words beside a crossover."""
    rows = table[table["metric"] == metric].sort_values("request_rate")
    return {s: rows.loc[rows["status"] == s, "request_rate"].tolist() for s in (PAYS, LOSES)}


def crossovers(table: pd.DataFrame) -> dict:
    return {metric: crossover(table, metric) for metric in METRICS}


def _rate_text(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


# The band verdict: on where speculation makes each request faster (p50 TPOT) without costing
# throughput or goodput; off where any of them loses.
BAND_METRICS = ("tpot_p50_ms", "output_throughput", "goodput")


def band_verdict(statuses: dict) -> str:
    if any(statuses[m] == LOSES for m in BAND_METRICS):
        return "off"
    return "on" if statuses["tpot_p50_ms"] == PAYS else "either (within noise)"


def ngram_flags(on_rows: pd.DataFrame, drafter: str) -> str:
    """llama-server's flags for the n-gram drafter's sizes the rows ran with (their
    drafter_options, name=value;...: llama.cpp's CLI names), only the drafter's own."""
    if "drafter_options" not in on_rows or not on_rows["drafter_options"].notna().any():
        return ""
    pairs = (item.split("=", 1) for item in str(on_rows["drafter_options"].dropna().iloc[0]).split(";") if "=" in item)
    return "".join(f" --{name} {value}" for name, value in pairs if name.startswith(f"spec-{drafter}-"))


def k_by_batch_size(bands: list[dict], k, threshold, max_conc: int) -> dict:
    """{batch size: k or 0} for 1..max_conc: k only where speculation was measured to pay. A size
    takes the verdict of the busiest band whose mean occupancy is at most that size (below every
    band: the least busy one), as disable_by_batch_size holds from its band on; k where that band
    is on, 0 where it is off or within noise, and at every size from `threshold` on."""
    by_occupancy = sorted(bands, key=lambda band: band["mean_occupancy"])

    def pays(size: int) -> bool:
        if not by_occupancy or (threshold is not None and size >= threshold):
            return False
        below = [band for band in by_occupancy if band["mean_occupancy"] <= size]
        return (below[-1] if below else by_occupancy[0])["speculation"] == "on"
    return {str(size): (k if pays(size) else 0) for size in range(1, max_conc + 1)}


def by_batch_schedule(k_by_batch: dict) -> list[list[int]]:
    """k_by_batch_size ({size: k}) as bands of equal k, in vLLM's [[lo, hi, k], ...] form: what
    `serve --spec-policy by-batch:RUN/advice.json` replays."""
    bands: list[list[int]] = []
    for size, k in sorted((int(size), int(k)) for size, k in k_by_batch.items()):
        if bands and bands[-1][2] == k and bands[-1][1] == size - 1:
            bands[-1][1] = size
        else:
            bands.append([size, size, k])
    return bands


def advice(traces: pd.DataFrame, table: pd.DataFrame, level: float = 0.95) -> dict:
    """Deployable advice per load band (band_verdict): llama-server flags per band, a vLLM
    disable_by_batch_size-style threshold (speculation off once this many requests run: the
    occupancy of the first band where it is off) and a k per batch size table (0 = off) in the
    shape dynamic speculation reads."""
    rows = serve_rows(traces)
    on = rows[rows["spec_decode"] == "on"]
    k = int(on["k"].dropna().iloc[0]) if not on.empty and on["k"].notna().any() else None
    drafter = str(on["drafter"].dropna().iloc[0]) if not on.empty and on["drafter"].notna().any() else "model"
    max_conc = int(rows["concurrency"].max())
    flags_on = (f"-md DRAFT.gguf --spec-draft-n-max {k}" if drafter == "model"
                else f"--spec-type {drafter}{ngram_flags(on, drafter)} --spec-draft-n-max {k}")
    flags = {"on": flags_on, "off": "(none: no draft model, no --spec-type)",
             "either (within noise)": flags_on + "  # or none: no measurable difference"}
    bands, threshold = [], None
    for rate, group in table.groupby("request_rate", sort=True):
        by_metric = group.set_index("metric")
        statuses = {m: by_metric.loc[m, "status"] for m in BAND_METRICS}
        verdict = band_verdict(statuses)
        occupancy = float(by_metric.loc["tpot_p50_ms", "occupancy_on"])
        if verdict == "off" and threshold is None:
            threshold = max(1, int(math.floor(occupancy)))
        bands.append({"request_rate": _rate_text(rate), "mean_occupancy": round(occupancy, 2),
                      **{f"{m}_benefit": round(float(by_metric.loc[m, "benefit"]), 3) for m in BAND_METRICS},
                      **{f"{m}_status": statuses[m] for m in BAND_METRICS},
                      "speculation": verdict, "llama_server_flags": flags[verdict]})
    k_by_batch = k_by_batch_size(bands, k, threshold, max_conc)
    return {
        "what": "speculation per load band from the benefit on p50 TPOT, output throughput and goodput (spec on "
                "vs off on the same seeded traces, intervals over the traces), self-measured",
        "drafter": drafter, "k": k, "max_concurrency": max_conc, "ci_level": level,
        "practical_margin": PRACTICAL,
        "crossover": {m: {**c, "rate": None if math.isnan(c["rate"]) else c["rate"],
                          "bracket": [None if (isinstance(x, float) and math.isnan(x)) else x for x in c["bracket"]]}
                      for m, c in crossovers(table).items()},
        "load_bands": bands,
        "disable_by_batch_size": threshold,
        "disable_by_batch_size_note": "turn speculation off once this many requests run together (vLLM's "
                                      "speculative_config disable_by_batch_size): the mean occupancy of the first "
                                      "band where it is off, rounded down (at least 1); null: on or within noise "
                                      "at every measured load",
        "k_by_batch_size": k_by_batch,
        "by_batch_schedule": by_batch_schedule(k_by_batch) if k is not None else [],
        "by_batch_schedule_note": "k_by_batch_size as [[lo, hi, k], ...] bands (vLLM's form): `specnative serve "
                                  "--spec-policy by-batch:RUN/advice.json` replays it",
        "spec_policy": (str(on["spec_policy"].dropna().iloc[0]) if "spec_policy" in on and on["spec_policy"].notna().any()
                        else "static"),
        "k_by_batch_size_note": f"k={k} (the only k measured) where speculation pays at that batch size (the "
                                f"busiest band whose mean occupancy is at most it has verdict on), 0 where that "
                                f"band is off or within noise (nothing measured pays for the draft there) and "
                                f"from disable_by_batch_size on",
    }
