"""The break-even alpha per regime, from the synthetic acceptance rows (--synthetic-acceptance):
the regime's measured c with its interval, alpha* where the closed form's speedup is 1 (with its
interval), where the measured synthetic points cross 1, and beside it the alpha each real drafter
reached in the same run; under load (serve_table) the same per request rate. Synthetic rows are
never lossless: report/break_even.py renders these tables, and no other section reads them.

alpha is Leviathan's per-token alpha (token_accept_rate; a synthetic profile's synthetic_alpha),
the alpha the closed form (theory.py) is written in.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specnative.analysis import stats, theory
from specnative.analysis.tidy import values_of
from specnative.record.schema import is_tree_row, real_rows, synthetic_rows

# A regime and drafter: the synthetic rows and the real on row that share these are compared (a
# synthetic row's accept_rule is "synthetic": the real row's rule is carried into the table).
GROUP_KEYS = ("target_model", "quant_bits", "ctx_len", "concurrency", "temperature", "task",
              "drafter", "draft_p_min", "prefix_cache", "k")

def group_keys(frame: pd.DataFrame) -> list[str]:
    return [k for k in GROUP_KEYS if k in frame]


def _round_costs(rows: pd.DataFrame) -> list[float]:
    """Per timed repeat, 1 + c = tau / speedup of that repeat's pair, averaged over the regime's
    synthetic rows (they share each repeat's off run, so one value per repeat)."""
    per_repeat: dict[int, list[float]] = {}
    for _, row in rows.iterrows():
        tau = float(row["steady_tau"]) if pd.notna(row.get("steady_tau")) else math.nan
        for i, speedup in enumerate(values_of(row.get("speedup_repeats"))):
            if speedup > 0 and math.isfinite(tau):
                per_repeat.setdefault(i, []).append(tau / speedup)
    return [float(np.mean(v)) for _, v in sorted(per_repeat.items())]


def draft_reach(rows: pd.DataFrame, k: int) -> list[float] | None:
    """P(a round drafts position j) for drafters of varying length (n-gram, p_min); None: always k."""
    reaches = [values_of(r) for r in rows["draft_reach"]] if "draft_reach" in rows else []
    reaches = [r for r in reaches if len(r) == k]
    if not reaches or all(abs(x - 1.0) < 1e-9 for r in reaches for x in r):
        return None
    return list(np.mean(reaches, axis=0))


def _measured_crossing(alpha: np.ndarray, speedup: np.ndarray) -> float:
    """Where the measured synthetic points cross speedup 1 (linear between the two bracketing
    points, alpha ascending); NaN if they do not."""
    order = np.argsort(alpha)
    a, s = alpha[order], speedup[order]
    for i in range(len(a) - 1):
        if (s[i] - 1.0) * (s[i + 1] - 1.0) <= 0 and s[i] != s[i + 1]:
            return float(a[i] + (1.0 - s[i]) * (a[i + 1] - a[i]) / (s[i + 1] - s[i]))
    return math.nan


def break_even_table(traces: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """One row per regime and drafter with synthetic rows: c with its interval (over the timed
    repeats), alpha* from the closed form (and its interval: alpha* rises with c), the measured
    points' own crossing, and the real drafter's alpha and speedup in the same regime."""
    synth = synthetic_rows(traces)
    synth = synth[(synth["spec_decode"] == "on") & synth["request_rate"].isna()] if "request_rate" in synth else \
        synth[synth["spec_decode"] == "on"]
    if synth.empty:
        return pd.DataFrame()
    real = real_rows(traces)
    real = real[real["spec_decode"] == "on"]
    # The real drafter beside a synthetic chain of k is the chain of that k; a draft tree whose node
    # budget is k is another proposal, shown beside it under its own name.
    trees, real = real[is_tree_row(real)], real[~is_tree_row(real)]
    keys = group_keys(synth)
    out = []
    for values, rows in synth.groupby(keys, dropna=False, sort=True):
        key = dict(zip(keys, values if isinstance(values, tuple) else (values,)))
        k = int(key["k"])
        if not rows["drafted"].astype(float).sum() > 0:  # nothing drafted (an n-gram lookup that never hit)
            continue
        reach = draft_reach(rows, k)
        costs = _round_costs(rows)
        cost = stats.geometric_interval(costs, level=level) if costs else stats.Interval(math.nan, math.nan,
                                                                                       math.nan, level, 0)
        star = lambda one_plus_c: theory.break_even_alpha(k, one_plus_c - 1.0, reach)  # noqa: E731
        mine = _matching(real, key)
        tree = _matching(trees, key)
        alpha = rows["synthetic_alpha"].astype(float).to_numpy()
        speedup = rows["speedup"].astype(float).to_numpy()
        rule = mine["accept_rule"] if mine is not None and "accept_rule" in mine else math.nan
        out.append({**key, "accept_rule": rule, "c": cost.estimate - 1.0, "c_low": cost.low - 1.0, "c_high": cost.high - 1.0,
                    "alpha_star": star(cost.estimate), "alpha_star_low": star(cost.low),
                    "alpha_star_high": star(cost.high), "measured_alpha_star": _measured_crossing(alpha, speedup),
                    "points": len(rows), "repeats": cost.n, "level": level,
                    "real_alpha": float(mine["token_accept_rate"]) if mine is not None else math.nan,
                    "real_speedup": float(mine["speedup"]) if mine is not None else math.nan,
                    "real_speedup_low": float(mine["speedup_ci_low"]) if mine is not None else math.nan,
                    "real_speedup_high": float(mine["speedup_ci_high"]) if mine is not None else math.nan,
                    "max_speedup": theory.predicted_speedup_lengths(1.0, reach, cost.estimate - 1.0) if reach
                    else theory.predicted_speedup(1.0, k, cost.estimate - 1.0),
                    "tree_shape": str(tree["draft_shape"]) if tree is not None else "",
                    "tree_alpha": float(tree["token_accept_rate"]) if tree is not None else math.nan,
                    "tree_speedup": float(tree["speedup"]) if tree is not None else math.nan})
    return pd.DataFrame(out)


def _matching(rows: pd.DataFrame, key: dict):
    """The last of rows in the regime `key` (NaN matches NaN), or None."""
    for name, value in key.items():
        rows = rows[rows[name].isna()] if pd.isna(value) else rows[rows[name] == value]
    return rows.iloc[-1] if not rows.empty else None


# ---------------------------------------------------------------------------------------------
# Under load (specnative serve --synthetic-acceptance): alpha* against request rate
# ---------------------------------------------------------------------------------------------
SERVE_KEYS = ("prefix_cache", "request_rate")


def serve_table(traces: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per request rate (and prefix-cache mode): c = decoding iteration on / off - 1 of the synthetic
    replays, its interval over the seeded traces, alpha* where the tokens per iteration pay for it
    (per-request decode speed, TPOT, breaks even), and the real drafter's alpha and speedup there."""
    synth = synthetic_rows(traces)
    synth = synth[(synth["spec_decode"] == "on") & synth["request_rate"].notna()]
    if synth.empty:
        return pd.DataFrame()
    real = real_rows(traces)
    real = real[(real["spec_decode"] == "on") & real["request_rate"].notna() & ~is_tree_row(real)]
    out = []
    for (prefix, rate), rows in synth.groupby(list(SERVE_KEYS), dropna=False, sort=True):
        k = int(rows["k"].iloc[0])
        per_seed = rows.groupby("seed")["verify_cost_c"].mean().dropna() + 1.0
        cost = stats.geometric_interval(per_seed.tolist(), level=level) if len(per_seed) else \
            stats.Interval(math.nan, math.nan, math.nan, level, 0)
        mine = real[(real["prefix_cache"] == prefix) & (real["request_rate"] == rate)]
        accepted, rejected = mine["accepted"].astype(float).sum(), mine["rejected"].astype(float).sum()
        alpha = rows["synthetic_alpha"].astype(float).to_numpy()
        speedup = rows.groupby("synthetic_alpha")["speedup"].mean()
        star = lambda one_plus_c: theory.break_even_alpha(k, one_plus_c - 1.0)  # noqa: E731
        out.append({"prefix_cache": prefix, "request_rate": rate, "k": k, "drafter": rows["drafter"].iloc[0],
                    "c": cost.estimate - 1.0, "c_low": cost.low - 1.0, "c_high": cost.high - 1.0,
                    "alpha_star": star(cost.estimate), "alpha_star_low": star(cost.low),
                    "alpha_star_high": star(cost.high),
                    "measured_alpha_star": _measured_crossing(speedup.index.to_numpy(dtype=float),
                                                              speedup.to_numpy(dtype=float)),
                    "points": len(set(alpha)), "repeats": cost.n, "level": level,
                    "real_alpha": accepted / (accepted + rejected) if accepted + rejected > 0 else math.nan,
                    "real_speedup": float(mine["speedup"].mean()) if not mine.empty else math.nan})
    return pd.DataFrame(out)


ADVICE_KEYS = ("quant_bits", "ctx_len", "concurrency", "k", "temperature", "accept_rule", "task", "drafter",
               "draft_p_min")


def with_break_even(advice: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """advice.csv's regimes with the break-even alpha* (and its interval) where the run measured it
    (one target per regime key; a regime's decision is unchanged)."""
    if table.empty or advice.empty:
        return advice
    keys = [k for k in ADVICE_KEYS if k in advice and k in table]
    text = lambda frame: frame[keys].astype(str).agg("|".join, axis=1)  # noqa: E731  (types differ: compare text)
    found = table.assign(_key=text(table)).drop_duplicates("_key", keep="last").set_index("_key")
    out = advice.copy()
    joined = text(out)
    for column in ("alpha_star", "alpha_star_low", "alpha_star_high", "real_alpha"):
        out[column] = joined.map(found[column]) if column in found else math.nan
    return out
