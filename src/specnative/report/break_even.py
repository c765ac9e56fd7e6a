"""The break-even alpha in summary.md and the serve summary: the section, the lines of "The answer"
and the figure of speedup against alpha, from analysis/break_even.py's tables (break_even_table,
serve_table). Synthetic rows are never lossless and are reported only here.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specnative.analysis import theory
from specnative.analysis.break_even import draft_reach, group_keys
from specnative.record.schema import synthetic_rows
from specnative.report.figures import caption, colors, empty_panel, new_figure
from specnative.report.text import md_table

HOW_TO_ASK = ("No synthetic acceptance was measured. To see which alpha would pay in each regime, add "
              "`--synthetic-acceptance 0.3,0.5,0.7,0.9` (a per-token alpha a keeps draft position i with "
              "probability a^i; `rates:r1/r2/...` and `len:L` give llama.cpp's per-position rates or mean "
              "length): each drafter is then also timed with its drafts kept at random at those rates, and "
              "this section gives the break-even alpha per regime beside each real drafter's alpha.")


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
            keys = group_keys(synth)
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
            reach = draft_reach(rows, k)
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
