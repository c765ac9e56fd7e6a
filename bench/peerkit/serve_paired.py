"""The paired table of the interleaved serving comparison: per request rate, spec setting and
metric, the ratio ours / llama-server of runs on the same trace measured back to back, as the
geometric mean of the per-trace ratios with its 95 % Student t interval on their logs
(specnative.analysis.stats.speedup_interval, as the closed-loop table pairs its repeats); α on each side
(accepted / drafted pooled over the traces, stats.ratio_interval) and their paired difference in
points; speculation's benefit on each side (specnative.analysis.crossover.benefit).

Input: one row per measured run (serve_parity.measure): side, spec_decode, request_rate,
trace_index and the level metrics of specnative.serving.metrics.level_summary.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specnative.analysis import stats

OURS, SERVER = "specnative", "llama-server"
# metric column -> (label, True where higher is better)
METRICS = {
    "output_throughput": ("output tok/s", True),
    "ttft_p50_ms": ("TTFT p50", False),
    "ttft_p99_ms": ("TTFT p99", False),
    "tpot_p50_ms": ("TPOT p50", False),
    "tpot_p99_ms": ("TPOT p99", False),
    "itl_p50_ms": ("ITL p50", False),
    "goodput": ("goodput", True),
}
# What "parity" asks of a ratio, oriented so that > 1 is ours better: its interval contains 1 or
# lies above 1 - TOLERANCE (for a latency: the interval of server / ours).
TOLERANCE = 0.05
ALPHA_POINTS = 2.0  # α within this many points of the server's
# Outcomes of one ratio, oriented (> 1: ours better)
BETTER, SAME, WITHIN, BELOW, NA = "ours better", "contains 1", "ours lower, within 5 %", "ours lower by > 5 %", "n/a"


def oriented(interval: stats.Interval, higher_better: bool) -> tuple[float, float, float]:
    """(estimate, low, high) with > 1 meaning ours better: the interval itself for a rate, its
    reciprocal for a latency (ours/server 1.10 in TPOT is 0.909 in speed)."""
    if higher_better:
        return interval.estimate, interval.low, interval.high
    inv = lambda x: 1.0 / x if x > 0 else math.inf
    return inv(interval.estimate), inv(interval.high), inv(interval.low)


def outcome(interval: stats.Interval, higher_better: bool, tolerance: float = TOLERANCE) -> str:
    _, low, high = oriented(interval, higher_better)
    if not (math.isfinite(low) and math.isfinite(high)):
        return NA
    if low > 1.0:
        return BETTER
    if high >= 1.0:
        return SAME
    return WITHIN if low > 1.0 - tolerance else BELOW


def at_parity(result: str) -> bool:
    """The parity criterion: the interval contains 1 or lies above 1 - TOLERANCE (or ours is better)."""
    return result in (BETTER, SAME, WITHIN)


def pairs(rows: pd.DataFrame, rate: float, spec: str, column: str) -> tuple[list, list]:
    """(ours, server) values of one column on the traces both sides measured, in trace order."""
    if column not in rows:
        return [], []
    sel = rows[(rows["request_rate"] == rate) & (rows["spec_decode"] == spec)]
    wide = sel.pivot_table(index="trace_index", columns="side", values=column, aggfunc="first")
    if OURS not in wide or SERVER not in wide:
        return [], []
    wide = wide.dropna(subset=[OURS, SERVER]).sort_index()
    return wide[OURS].astype(float).tolist(), wide[SERVER].astype(float).tolist()


def ratio(ours: list, server: list, level: float = 0.95) -> stats.Interval:
    """ours / server, paired by trace: no interval (NaN bounds) with one trace or where a value
    is not positive (a goodput of 0: no log)."""
    if not ours or any(not (v > 0 and math.isfinite(v)) for v in ours + server):
        ratios = [a / b for a, b in zip(ours, server) if b > 0]
        return stats.Interval(float(np.mean(ratios)) if ratios else math.nan, math.nan, math.nan, level, len(ratios))
    return stats.speedup_interval(ours, server, level)


def geomean(values: list) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return float(np.exp(np.mean(np.log(values)))) if values else math.nan


def ratio_table(rows: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """One line per (rate, spec, metric): both sides' geometric means, the paired ratio ours /
    server with its interval, and its outcome against parity."""
    out = []
    for (rate, spec), _ in rows.groupby(["request_rate", "spec_decode"], sort=True):
        for metric, (label, higher) in METRICS.items():
            ours, server = pairs(rows, rate, spec, metric)
            iv = ratio(ours, server, level)
            out.append({"request_rate": rate, "spec_decode": spec, "metric": metric, "label": label,
                        "higher_better": higher, "traces": len(ours), "ours": geomean(ours),
                        "server": geomean(server), "ratio": iv.estimate, "low": iv.low, "high": iv.high,
                        "outcome": outcome(iv, higher)})
    return pd.DataFrame(out)


def alpha_table(rows: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Spec-on α per rate: each side's accepted / drafted pooled over the traces (with its
    interval), the paired difference ours - server in points with a t interval, and both sides' α
    over the requests whose output is the same on both (where the two drafters saw the same text)."""
    from scipy import stats as scipy_stats
    out = []
    on = rows[rows["spec_decode"] == "on"]
    for rate, _ in on.groupby("request_rate", sort=True):
        acc_o, acc_s = pairs(rows, rate, "on", "accepted")
        dr_o, dr_s = pairs(rows, rate, "on", "drafted")
        if not dr_o:
            continue
        ours, server = stats.ratio_interval(acc_o, dr_o, level), stats.ratio_interval(acc_s, dr_s, level)
        a_o = [a / d for a, d in zip(acc_o, dr_o) if d > 0]
        a_s = [a / d for a, d in zip(acc_s, dr_s) if d > 0]
        diff = 100.0 * (ours.estimate - server.estimate)
        low = high = math.nan
        if len(a_o) == len(a_s) >= 2:
            deltas = np.subtract(a_o, a_s) * 100.0
            if np.ptp(deltas) == 0:
                low = high = float(deltas[0])
            else:
                ci = scipy_stats.ttest_rel(a_o, a_s).confidence_interval(level)
                low, high = 100.0 * ci.low, 100.0 * ci.high
        within = abs(diff) <= ALPHA_POINTS
        # α pooled over the requests whose output is the same on both sides (the same text drafted on)
        acc_io, acc_is = pairs(rows, rate, "on", "accepted_identical")
        dr_io, dr_is = pairs(rows, rate, "on", "drafted_identical")
        identical = int(sum(pairs(rows, rate, "on", "identical")[0]))
        out.append({"request_rate": rate, "traces": len(a_o), "alpha_ours": ours.estimate, "ours_low": ours.low,
                    "ours_high": ours.high, "alpha_server": server.estimate, "server_low": server.low,
                    "server_high": server.high, "diff_points": diff, "diff_low": low, "diff_high": high,
                    "within": within, "decided_within": within and -ALPHA_POINTS <= low and high <= ALPHA_POINTS,
                    "identical_requests": identical,
                    "requests": int(sum(pairs(rows, rate, "on", "n_requests")[0])),
                    "alpha_ours_identical": sum(acc_io) / sum(dr_io) if sum(dr_io) else math.nan,
                    "alpha_server_identical": sum(acc_is) / sum(dr_is) if sum(dr_is) else math.nan})
    return pd.DataFrame(out)


def benefit_table(rows: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Speculation's benefit on each side (on/off for rates, off/on for latencies; > 1 pays), per
    rate and metric, paired by trace: does it pay alike on both?"""
    from specnative.analysis import crossover
    out = []
    for (rate, side), _ in rows.groupby(["request_rate", "side"], sort=True):
        sel = rows[(rows["request_rate"] == rate) & (rows["side"] == side)]
        wide = sel.pivot_table(index="trace_index", columns="spec_decode",
                               values=[m for m in crossover.METRICS if m in rows], aggfunc="first")
        for metric, (label, higher) in crossover.METRICS.items():
            if (metric, "on") not in wide or (metric, "off") not in wide:
                continue
            both = wide[[(metric, "on"), (metric, "off")]].dropna()
            b = crossover.benefit(both[(metric, "on")].tolist(), both[(metric, "off")].tolist(), higher, level)
            out.append({"request_rate": rate, "side": side, "metric": metric, "label": label, "benefit": b.estimate,
                        "low": b.low, "high": b.high, "status": crossover.status(b)})
    return pd.DataFrame(out)


def verdict(ratios: pd.DataFrame, alphas: pd.DataFrame) -> dict:
    """The acceptance criteria: every spec-off ratio of throughput, TPOT p50 and TTFT p50 at parity;
    spec-on α within ALPHA_POINTS of the server's. Lists what fails."""
    failing = []
    key = ratios[(ratios["spec_decode"] == "off") & ratios["metric"].isin(["output_throughput", "tpot_p50_ms",
                                                                            "ttft_p50_ms"])]
    for _, r in key.iterrows():
        if not at_parity(r["outcome"]):
            failing.append(f"spec off, rate {rate_text(r['request_rate'])}: {r['label']} {r['outcome']} "
                           f"(ours/server {fmt(r['ratio'])} [{fmt(r['low'])}, {fmt(r['high'])}])")
    for _, r in alphas.iterrows():
        if not r["within"]:
            failing.append(f"rate {rate_text(r['request_rate'])}: α ours {fmt(r['alpha_ours'])} vs server "
                           f"{fmt(r['alpha_server'])} ({r['diff_points']:+.1f} points)")
    return {"parity": not failing, "failing": failing}


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------
def fmt(x, nd=3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{nd}g}"


def rate_text(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def ratio_md(ratios: pd.DataFrame) -> str:
    head = "| rate (req/s) | spec | metric | traces | ours | llama-server | ours / server [95 % CI] | outcome |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for _, r in ratios.iterrows():
        lines.append(f"| {rate_text(r['request_rate'])} | {r['spec_decode']} | {r['label']} | {r['traces']} | "
                     f"{fmt(r['ours'])} | {fmt(r['server'])} | {fmt(r['ratio'])} [{fmt(r['low'])}, {fmt(r['high'])}] | "
                     f"{r['outcome']} |")
    return "\n".join(lines)


def alpha_md(alphas: pd.DataFrame) -> str:
    lines = [("| rate (req/s) | traces | α ours [95 % CI] | α llama-server [95 % CI] | ours - server, points "
              "[95 % CI, paired] | within 2 points | requests with the same output on both sides | α on those, "
              "ours \\| server |"), "|---|---|---|---|---|---|---|---|"]
    for _, r in alphas.iterrows():
        lines.append(f"| {rate_text(r['request_rate'])} | {r['traces']} | {r['alpha_ours']:.3f} "
                     f"[{fmt(r['ours_low'])}, {fmt(r['ours_high'])}] | {r['alpha_server']:.3f} "
                     f"[{fmt(r['server_low'])}, {fmt(r['server_high'])}] | {r['diff_points']:+.1f} "
                     f"[{fmt(r['diff_low'], 2)}, {fmt(r['diff_high'], 2)}] | "
                     f"{'yes, decided' if r['decided_within'] else 'yes' if r['within'] else 'no'} | "
                     f"{r['identical_requests']} of {r['requests']} | {fmt(r['alpha_ours_identical'])} \\| "
                     f"{fmt(r['alpha_server_identical'])} |")
    return "\n".join(lines)


def benefit_md(benefits: pd.DataFrame) -> str:
    if benefits.empty:
        return "(no rate with both spec settings measured)"
    lines = ["| rate (req/s) | metric | specnative [95 % CI] | llama-server [95 % CI] |", "|---|---|---|---|"]
    for (rate, metric), group in benefits.groupby(["request_rate", "metric"], sort=False):
        cells = []
        for side in (OURS, SERVER):
            r = group[group["side"] == side]
            if r.empty:
                cells.append("–")
                continue
            r = r.iloc[0]
            cells.append(f"{fmt(r['benefit'])} [{fmt(r['low'])}, {fmt(r['high'])}] {r['status']}")
        lines.append(f"| {rate_text(rate)} | {group.iloc[0]['label']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


# Per run, the iteration-level figures that say where a difference comes from (means over traces)
DIAGNOSTICS = (("iterations", "iterations", 0), ("ms_per_iteration", "ms / iteration", 3),
               ("prefill_tokens", "prompt tokens", 0), ("mixed_iterations", "mixed iterations", 0),
               ("engine_own_share", "engine's own share", 3), ("tpot_mean_ms", "TPOT mean (client)", 2),
               ("server_tpot_mean_ms", "TPOT mean (server's own timings)", 2),
               ("identical", "requests with identical output", 0), ("busy_cores", "cores busy elsewhere before", 2))


def diagnostics_md(rows: pd.DataFrame) -> str:
    cols = [c for c, _, _ in DIAGNOSTICS if c in rows]
    labels = {c: label for c, label, _ in DIAGNOSTICS}
    digits = {c: nd for c, _, nd in DIAGNOSTICS}
    lines = ["| rate (req/s) | spec | side | " + " | ".join(labels[c] for c in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for (rate, spec, side), group in rows.groupby(["request_rate", "spec_decode", "side"], sort=True):
        cells = []
        for c in cols:
            v = pd.to_numeric(group[c], errors="coerce").mean()
            cells.append("–" if not math.isfinite(v) else f"{v:.{digits[c]}f}")
        lines.append(f"| {rate_text(rate)} | {spec} | {side} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
