"""The break-even alpha per regime, from the synthetic acceptance rows (--synthetic-acceptance):
speedup against alpha (the measured synthetic points, and the closed form through the regime's
measured c), alpha* where the speedup is 1 with its interval, and beside it the alpha each real
drafter reached in the same run. Synthetic rows are never lossless and are reported only here.

alpha is Leviathan's per-token alpha (token_accept_rate; a synthetic profile's synthetic_alpha),
the alpha the closed form (theory.py) is written in.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specnative import stats, theory
from specnative.record.schema import real_rows, synthetic_rows
from specnative.report.figures import caption, colors, empty_panel, new_figure
from specnative.report.text import floats, md_table
from specnative.report.trees import is_tree_row

# A regime and drafter: the synthetic rows and the real on row that share these are compared (a
# synthetic row's accept_rule is "synthetic": the real row's rule is carried into the table).
GROUP_KEYS = ("target_model", "quant_bits", "ctx_len", "concurrency", "temperature", "task",
              "drafter", "draft_p_min", "prefix_cache", "k")

HOW_TO_ASK = ("No synthetic acceptance was measured. To see which alpha would pay in each regime, add "
              "`--synthetic-acceptance 0.3,0.5,0.7,0.9` (a per-token alpha a keeps draft position i with "
              "probability a^i; `rates:r1/r2/...` and `len:L` give llama.cpp's per-position rates or mean "
              "length): each drafter is then also timed with its drafts kept at random at those rates, and "
              "this section gives the break-even alpha per regime beside each real drafter's alpha.")


def _key(frame: pd.DataFrame) -> list[str]:
    return [k for k in GROUP_KEYS if k in frame]


def _round_costs(rows: pd.DataFrame) -> list[float]:
    """Per timed repeat, 1 + c = tau / speedup of that repeat's pair, averaged over the regime's
    synthetic rows (they share each repeat's off run, so one value per repeat)."""
    per_repeat: dict[int, list[float]] = {}
    for _, row in rows.iterrows():
        tau = float(row["steady_tau"]) if pd.notna(row.get("steady_tau")) else math.nan
        for i, speedup in enumerate(floats(row.get("speedup_repeats"))):
            if speedup > 0 and math.isfinite(tau):
                per_repeat.setdefault(i, []).append(tau / speedup)
    return [float(np.mean(v)) for _, v in sorted(per_repeat.items())]


def _reach(rows: pd.DataFrame, k: int) -> list[float] | None:
    """P(a round drafts position j) for drafters of varying length (n-gram, p_min); None: always k."""
    reaches = [floats(r) for r in rows["draft_reach"]] if "draft_reach" in rows else []
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
    keys = _key(synth)
    out = []
    for values, rows in synth.groupby(keys, dropna=False, sort=True):
        key = dict(zip(keys, values if isinstance(values, tuple) else (values,)))
        k = int(key["k"])
        if not rows["drafted"].astype(float).sum() > 0:  # nothing drafted (an n-gram lookup that never hit)
            continue
        reach = _reach(rows, k)
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


def _alpha_text(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return "> 1 (no alpha)" if math.isinf(value) else f"{value:.2f}"


def needs_text(row) -> str:
    """"ngram-simple reaches 0.62 here and needs 0.71 [0.68, 0.74]" for one regime."""
    needs = _alpha_text(row["alpha_star"])
    if math.isinf(row["alpha_star"]):
        needs = f"no alpha pays (alpha 1 gives {row['max_speedup']:.2f}x)"
    else:
        needs = (f"needs {needs} [{_alpha_text(row['alpha_star_low'])}, {_alpha_text(row['alpha_star_high'])}]"
                 if math.isfinite(row["alpha_star_low"]) else f"needs {needs}")
    reaches = (f"reaches {row['real_alpha']:.2f} as a chain" if math.isfinite(row["real_alpha"])
               else "was not measured for real as a chain")
    tree = ""
    if str(row.get("tree_shape") or "") and math.isfinite(row.get("tree_alpha", math.nan)):
        tree = (f"; as the tree {row['tree_shape']} it reaches {row['tree_alpha']:.2f} per-token "
                f"(speedup {row['tree_speedup']:.2f}, a tree: not the chain the closed form is written for)")
    return f"{row['drafter']} {reaches} here and {needs}{tree}"


def regime_text(row) -> str:
    return (f"{row['target_model']} q{row['quant_bits']}, ctx {row['ctx_len']}, ×{row['concurrency']}, "
            f"k={row['k']}, T={float(row['temperature']):g}")


def answer_lines(table: pd.DataFrame) -> list[str]:
    """One line per regime and drafter for "The answer"."""
    return [f"- {regime_text(r)}: {needs_text(r)} (synthetic acceptance, closed form through the measured "
            f"c = {r['c']:.2f})" for _, r in table.iterrows()]


def section_md(table: pd.DataFrame) -> str:
    if table.empty:
        return HOW_TO_ASK
    level = int(round(100 * float(table["level"].iloc[0])))
    head = (f"Rows with verdict `synthetic` keep each draft at random at a requested rate instead of by the "
            f"target, so their output is not the target's: they are left out of the verdicts, the lossless "
            f"counts, the advice about real drafters and compare's regression gates, and reported only here. "
            f"alpha is the per-token alpha (token_accept_rate). alpha* solves "
            f"(1 - a^(k+1)) / ((1 - a)(1 + c)) = 1 (with the measured draft-length mix for drafters of "
            f"varying length) through c measured on the synthetic runs of the regime; its {level} % interval "
            f"maps c's interval over the timed repeats (alpha* rises with c). 'measured' is where the "
            f"synthetic points themselves cross 1.")
    rows = [[regime_text(r), r["drafter"], f"{r['c']:.2f} [{r['c_low']:.2f}, {r['c_high']:.2f}]",
             _alpha_text(r["alpha_star"]), f"[{_alpha_text(r['alpha_star_low'])}, {_alpha_text(r['alpha_star_high'])}]",
             _alpha_text(r["measured_alpha_star"]), _alpha_text(r["real_alpha"]),
             f"{r['real_speedup']:.2f} [{r['real_speedup_low']:.2f}, {r['real_speedup_high']:.2f}]",
             f"{r['max_speedup']:.2f}", int(r["points"]), int(r["repeats"])] for _, r in table.iterrows()]
    body = md_table(["regime", "drafter", "c", "alpha*", f"{level} % interval", "measured",
                     "real alpha (per-token, chain)", "real speedup", "speedup at alpha 1", "points", "repeats"], rows)
    return "\n\n".join([head, body, "\n".join(f"- {regime_text(r)}: {needs_text(r)}" for _, r in table.iterrows())])


def plot_break_even(traces: pd.DataFrame, table: pd.DataFrame, note: str = ""):
    """Speedup against alpha, one panel per regime: the synthetic points with their intervals, the
    closed form through the regime's c, the real drafter as a point, the break-even line at 1."""
    if table.empty:
        fig, axes = new_figure(6, 4)
        empty_panel(axes[0], "no synthetic acceptance rows (--synthetic-acceptance)")
        return fig
    panels = table.groupby([c for c in ("target_model", "quant_bits", "ctx_len", "concurrency", "temperature")
                            if c in table], sort=True)
    n = len(panels)
    ncols = min(3, n)
    fig = Figure(figsize=(4.2 * ncols, 3.4 * math.ceil(n / ncols) + 0.6), layout="constrained")
    axes = list(fig.subplots(math.ceil(n / ncols), ncols, squeeze=False).ravel())
    synth = synthetic_rows(traces)
    grid = np.linspace(0.0, 1.0, 101)
    for ax, (values, group) in zip(axes, panels):
        for color, (_, r) in zip(colors(len(group)), group.iterrows()):
            keys = _key(synth)
            rows = synth
            for name in keys:
                rows = rows[rows[name].isna()] if pd.isna(r[name]) else rows[rows[name] == r[name]]
            label = f"{r['drafter']} k={r['k']}"
            x = rows["token_accept_rate"].astype(float).to_numpy()
            y = rows["speedup"].astype(float).to_numpy()
            low, high = rows["speedup_ci_low"].astype(float), rows["speedup_ci_high"].astype(float)
            err = np.abs(np.vstack([y - low, high - y]))
            ax.errorbar(x, y, yerr=np.nan_to_num(err), fmt="o", color=color, ms=4, capsize=2,
                        label=f"{label}: synthetic")
            k = int(r["k"])
            reach = _reach(rows, k)
            curve = [theory.predicted_speedup_lengths(a, reach, r["c"]) if reach
                     else theory.predicted_speedup(a, k, r["c"]) for a in grid]
            ax.plot(grid, curve, "-", color=color, lw=1, alpha=0.7)
            if math.isfinite(r["real_alpha"]):
                ax.plot([r["real_alpha"]], [r["real_speedup"]], "*", color=color, ms=12, mec="black",
                        label=f"{label}: real")
            if math.isfinite(r["alpha_star"]):
                ax.axvline(r["alpha_star"], color=color, ls=":", lw=1)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlim(0, 1)
        ax.set_xlabel("alpha (per-token acceptance)")
        ax.set_ylabel("speedup")
        v = dict(zip(["target_model", "quant_bits", "ctx_len", "concurrency", "temperature"], values))
        name = str(v.get("target_model")).removesuffix(".gguf")
        ax.set_title(f"{name[:28] + '…' if len(name) > 29 else name} ctx {v.get('ctx_len')} ×{v.get('concurrency')}",
                     fontsize=8)
        ax.legend(fontsize=6)
    for ax in axes[n:]:
        ax.set_visible(False)
    caption(fig, "Points: synthetic acceptance (drafts kept at random), 95 % speedup intervals; lines: closed form "
                 "through the measured c; stars: the real drafters; dotted: alpha*.", note)
    return fig


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


def serve_section_md(table: pd.DataFrame) -> str:
    if table.empty:
        return HOW_TO_ASK.replace("each drafter is then also timed", "every level is then also replayed")
    level = int(round(100 * float(table["level"].iloc[0])))
    head = ("Synthetic replays (verdict `synthetic`: drafts kept at random, output not the target's; left out of "
            "every other section). alpha* solves (1 - a^(k+1)) / (1 - a) = 1 + c with c = decoding iteration on / "
            f"off - 1 of the synthetic replays: where a request's decode speed (TPOT) breaks even. {level} % interval "
            "over the seeded traces; 'measured': where the synthetic replays' output-throughput ratio crosses 1 "
            "(at low rates throughput follows the offered load, so it may never cross).")
    rows = [["inf" if math.isinf(r["request_rate"]) else f"{r['request_rate']:g}", r["prefix_cache"], r["drafter"],
             r["k"], f"{r['c']:.2f} [{r['c_low']:.2f}, {r['c_high']:.2f}]", _alpha_text(r["alpha_star"]),
             f"[{_alpha_text(r['alpha_star_low'])}, {_alpha_text(r['alpha_star_high'])}]",
             _alpha_text(r["measured_alpha_star"]), _alpha_text(r["real_alpha"]),
             f"{r['real_speedup']:.2f}" if math.isfinite(r["real_speedup"]) else "n/a", int(r["repeats"])]
            for _, r in table.iterrows()]
    return "\n\n".join([head, md_table(["request rate", "prefix cache", "drafter", "k", "c", "alpha*",
                                        f"{level} % interval", "measured", "real alpha (accepted / (accepted + rejected))", "real speedup", "traces"],
                                       rows)])


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
