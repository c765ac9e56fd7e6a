"""Figures and summary.md for one sweep run directory (traces.csv + provenance.json).

    python -m specnative.report RUN_DIR [--compare OTHER_RUN_DIR_OR_CSV] [--min-alpha 0.5 ...]

writes into RUN_DIR: speedup_curve, timing_breakdown, theory_vs_measured, acceptance_by_position
(each .png and .pdf), advice.csv and summary.md; with --compare also compare.png/.pdf and
compare.csv. The sweep calls write_report(run_dir) when it finishes.

Every plotting function takes the data and returns a matplotlib Figure (no pyplot state), so
tests can read the plotted series back. Spec cells that failed the lossless check are left out
of every figure and listed in summary.md; off rows are baselines and always kept.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure  # Agg canvas on savefig; pyplot is never imported

from specnative import crossover, theory
from specnative.schema import TracesError
from specnative import category_table, progress
from specnative.advisor import (K_ADVICE_KEYS, REGIME_KEYS, Thresholds, advise, as_float, by_task, drafter_advice,
                                k_advice, load_traces, p_min_advice, pair_cells, task_advice, threshold_fields,
                                verdicts_frame)

CURVE_DIMS = ("quant_bits", "k", "temperature", "accept_rule", "draft_model", "task", "drafter",
              "draft_p_min")  # split lines if varied
ON_STEPS = ("prefill_target_ms", "prefill_draft_ms", "draft_ms", "draft_ingest_ms", "verify_ms", "resample_ms")
OFF_STEPS = ("prefill_target_ms", "decode_ms")
STEP_COLORS = {"prefill_target_ms": "#9e9e9e", "prefill_draft_ms": "#cfcfcf", "draft_ms": "#f28e2b",
               "draft_ingest_ms": "#b07aa1",
               "verify_ms": "#4e79a7", "resample_ms": "#e15759", "decode_ms": "#59a14f",
               "other_ms": "#ffffff"}
BAND_CAPTION = ("error bars: the speedup's confidence interval (paired repeats, Student t on log "
                "ratios; stats.py),\nor where a traces.csv has none, the range over the timed repeats "
                "(slowest spec run / fastest baseline run to fastest / slowest); points: median tps ratio")


# --------------------------------------------------------------------------------------------
# Small helpers

def _fmt(value, digits=2) -> str:
    value = as_float(value)
    return "n/a" if not math.isfinite(value) else f"{value:.{digits}f}"


def _floats(text) -> list[float]:
    """'0.91;0.85' -> [0.91, 0.85]; empty or missing -> []."""
    if text is None or pd.isna(text) or not str(text).strip():
        return []
    return [float(x) for x in str(text).split(";") if x.strip()]


def lossless_cells(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["lossless_ok"].fillna(False).astype(bool)]


def failed_cells(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[~cells["lossless_ok"].fillna(True).astype(bool)]


def varied(cells: pd.DataFrame, dims=CURVE_DIMS) -> list[str]:
    return [d for d in dims if d in cells and cells[d].nunique(dropna=False) > 1]


def _key_text(key: str, value) -> str:
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
    return ", ".join(_key_text(k, row[k]) for k in keys)


def colors(n: int) -> list:
    """n distinguishable colors: tab10 up to 10 lines, tab20 up to 20, then a continuous map."""
    from matplotlib import colormaps
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["viridis"](i / (n - 1)) for i in range(n)]


def _new_figure(width, height, ncols=1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _empty(ax, message):
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _caption(fig, *lines):
    """Small grey text under the panels: what the marks mean, where the numbers come from."""
    fig.supxlabel("\n".join(line for line in lines if line), fontsize=7.5, color="#444444")


def save(fig: Figure, stem: Path) -> list[Path]:
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    fig.savefig(paths[0], dpi=150)
    fig.savefig(paths[1])
    return paths


# --------------------------------------------------------------------------------------------
# Figure: speedup against concurrency (one line per ctx_len) and against ctx_len

def _errorbar(ax, x, cells, line_label, **style):
    s = cells["speedup"].to_numpy(float)
    lo, hi = cells["speedup_lo"].to_numpy(float), cells["speedup_hi"].to_numpy(float)
    err = np.vstack([np.clip(s - lo, 0, None), np.clip(hi - s, 0, None)])
    err = np.nan_to_num(err)  # no spread recorded: no bar
    line, = ax.plot(x, s, marker="o", label=line_label, **style)
    ax.errorbar(x, s, yerr=err, fmt="none", capsize=3, label=f"_range {line_label}", **style)
    if "verdict" in cells:  # `numeric` lossless verdicts: hollow markers
        numeric = (cells["verdict"] == "numeric").fillna(False).to_numpy(bool)
        if numeric.any():
            ax.plot(np.asarray(x)[numeric], s[numeric], linestyle="none", marker="o", markerfacecolor="white",
                    markeredgecolor=line.get_color(), label=f"_numeric {line_label}")


def plot_speedup_curve(cells: pd.DataFrame, note: str = "") -> Figure:
    """(a) speedup vs concurrency, log2 x, one line per ctx_len (and per varied quant/k/T/rule);
    (b) speedup vs ctx_len, one line per concurrency. Lossless cells only."""
    cells = lossless_cells(cells)
    fig, (ax_c, ax_x) = _new_figure(13, 4.6, 2)
    if cells.empty:
        for ax in (ax_c, ax_x):
            _empty(ax, "no lossless spec-on cell")
        return fig
    dims = varied(cells)
    for axis, other, ax in (("concurrency", "ctx_len", ax_c), ("ctx_len", "concurrency", ax_x)):
        lines = list(cells.groupby([other] + dims, dropna=False, sort=True))
        for color, (_, line) in zip(colors(len(lines)), lines):
            line = line.sort_values(axis)
            _errorbar(ax, line[axis].to_numpy(float), line, label(line.iloc[0], [other] + dims),
                      color=color)
        ax.axhline(1.0, color="black", ls="--", lw=1, label="break-even (1.0)")
        ax.set_ylabel("speedup  tps(spec on) / tps(spec off)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # never over a point
    ax_c.set_xscale("log", base=2)
    ax_c.set_xticks(sorted(cells["concurrency"].unique()), labels=None)
    ax_c.xaxis.set_major_formatter("{x:g}")
    ax_c.set_xlabel("concurrency (sequences decoded together, log2)")
    ax_c.set_title("(a) speedup vs concurrency")
    ax_x.set_xticks(sorted(cells["ctx_len"].unique()))
    ax_x.set_xlabel("context length (prompt tokens)")
    ax_x.set_title("(b) speedup vs context length")
    _caption(fig, f"{BAND_CAPTION}; lossless cells only (hollow markers: `numeric` lossless verdict).", note)
    return fig


# --------------------------------------------------------------------------------------------
# Figure: per-step timing breakdown

ORDER_KEYS = ["quant_bits", "ctx_len", "concurrency", "temperature", "task", "_on", "k", "accept_rule"]


def ordered(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows by regime, each off row first and its on rows after it."""
    rows = rows.assign(_on=(rows["spec_decode"] == "on").astype(int))
    return rows.sort_values(ORDER_KEYS, kind="stable").drop(columns="_on").reset_index(drop=True)


def _bar_rows(traces: pd.DataFrame) -> pd.DataFrame:
    """One row per bar: each off row, followed by its regime's lossless on rows."""
    keep = (traces["spec_decode"] == "off") | traces["lossless_ok"].fillna(False).astype(bool)
    return ordered(traces[keep])


def step_parts(row) -> dict:
    """Step times of one run (ms) by step, plus what the timers leave of total_ms."""
    steps = ON_STEPS if row["spec_decode"] == "on" else OFF_STEPS
    parts = {s: np.nan_to_num(as_float(row.get(s, np.nan))) for s in steps}  # older traces lack draft_ingest_ms
    parts["other_ms"] = as_float(row["total_ms"]) - sum(parts.values())
    return parts


def _bar_label(row, dims) -> str:
    regime = label(row, ["quant_bits", "ctx_len", "concurrency"] + dims)
    if row["spec_decode"] == "off":
        return f"{regime} | off"
    return f"{regime} | on k={_fmt(row['k'], 0)}"


def _shade_regimes(ax, rows, y):
    """Alternate a light band behind each regime so its off and on bars read as one group."""
    regime = (rows[["quant_bits", "ctx_len", "concurrency", "temperature", "task"]]
              .astype(object).fillna("").astype(str).agg("|".join, axis=1))  # task: NA in older traces
    group = (regime != regime.shift()).cumsum().to_numpy()
    for g in np.unique(group)[::2]:
        members = y[group == g]
        ax.axhspan(members.min() - 0.5, members.max() + 0.5, color="#f0f0f0", zorder=0)


def plot_timing_breakdown(traces: pd.DataFrame, note: str = "") -> Figure:
    """Stacked horizontal bars of the step timers of one run, each spec-off row beside its
    spec-on rows: (a) the whole run, (b) generation only (prefill left out)."""
    rows = _bar_rows(traces)
    fig, axes = _new_figure(12, 2.0 + 0.3 * max(len(rows), 1), 2)
    if rows.empty:
        for ax in axes:
            _empty(ax, "no cell")
        return fig
    parts = pd.DataFrame([step_parts(r) for _, r in rows.iterrows()]).reindex(columns=list(STEP_COLORS))
    dims = varied(rows[rows["spec_decode"] == "on"], ("temperature", "accept_rule", "draft_model", "task"))
    labels = [_bar_label(r, dims) for _, r in rows.iterrows()]
    y = np.arange(len(rows))[::-1]
    panels = ((axes[0], list(STEP_COLORS), "(a) one run, prefill included"),
              (axes[1], [s for s in STEP_COLORS if not s.startswith("prefill")],
               "(b) generation only (what the speedup measures)"))
    for ax, steps, title in panels:
        _shade_regimes(ax, rows, y)
        left = np.zeros(len(rows))
        for step in steps:
            width = parts[step].fillna(0).clip(lower=0).to_numpy()  # negative other: timers overlap
            ax.barh(y, width, left=left, height=0.7, color=STEP_COLORS[step], edgecolor="#555555",
                    linewidth=0.4, label=step.removesuffix("_ms").replace("_", " "), zorder=2)
            left += width
        ax.set_yticks(y, labels if ax is axes[0] else [""] * len(y), fontsize=8)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_xlim(0, 1.03 * max(left.max(), 1e-9))
        if ax is axes[1]:  # the engine's own share of generation (issue 17), where recorded
            own = pd.to_numeric(rows["engine_own_share"], errors="coerce").to_numpy()
            for yi, x, share in zip(y, left, own):
                if np.isfinite(share):
                    ax.text(x, yi, f" own {share:.1%}", va="center", fontsize=6, zorder=3,
                            color="#b00020" if share > ENGINE_OWN_GOAL else "#333333")
            if np.isfinite(own).any():
                ax.set_xlim(0, 1.2 * max(left.max(), 1e-9))
        ax.set_xlabel("ms per run (mean over repeats)")
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center",
               ncol=len(STEP_COLORS), fontsize=8)
    _caption(fig, "white 'other': total_ms not covered by the step timers. 'own': the engine's own share of "
                  "generation (not inside llama.cpp calls; red above 1 %). Failed lossless cells left out.", note)
    return fig


# --------------------------------------------------------------------------------------------
# Theory against measurement

def theory_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per lossless cell: the closed forms of theory.py with the measured alpha, k and c, beside
    the measured speedup and tau; also with the per-token alpha from the histogram."""
    rows = []
    for _, cell in lossless_cells(cells).iterrows():
        alpha, alpha_tok = as_float(cell["draft_accept_rate"]), as_float(cell["token_accept_rate"])
        k, c = as_float(cell["k"]), as_float(cell["verify_cost_c"])
        k = int(k) if math.isfinite(k) else 0
        reach = _floats(cell.get("draft_reach"))
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


def _identity_panel(ax, table, x_cols, y_col, title, unit):
    series = ((x_cols[0], "o", "#4e79a7", "α = accepted / drafted (schema)"),
              (x_cols[1], "s", "#f28e2b", "α per reached draft (token_accept_rate)"))
    for x_col, marker, color, name in series:
        ax.scatter(table[x_col], table[y_col], marker=marker, color=color, label=name, zorder=3)
    values = pd.concat([table[x_cols[0]], table[x_cols[1]], table[y_col]]).dropna()
    lo, hi = (values.min(), values.max()) if len(values) else (0.0, 1.0)
    pad = 0.08 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="black", lw=1, ls="--", label="y = x")
    ax.set_xlabel(f"closed form (theory.py), {unit}")
    ax.set_ylabel(f"measured, {unit}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_theory(table: pd.DataFrame, note: str = "") -> Figure:
    """(a) predicted_speedup(alpha, k, c) vs measured speedup; (b) expected_tokens_per_round
    vs measured tau. One point per lossless cell, for both definitions of alpha."""
    fig, (ax_s, ax_t) = _new_figure(11, 4.6, 2)
    if table.empty:
        for ax in (ax_s, ax_t):
            _empty(ax, "no lossless spec-on cell")
        return fig
    _identity_panel(ax_s, table, ("predicted", "predicted_token"), "speedup",
                    r"(a) speedup $\frac{1-\alpha^{k+1}}{(1-\alpha)(1+c)}$", "speedup")
    _identity_panel(ax_t, table, ("tau_expected", "tau_expected_token"), "tau",
                    r"(b) tokens per round $\tau$ vs $\frac{1-\alpha^{k+1}}{1-\alpha}$", "tau")
    _caption(fig, "points off y = x: acceptance is not i.i.d. across positions (see "
                  "acceptance_by_position), or alpha's definition.", note)
    return fig


def conditional_acceptance(accept_at_pos) -> list[float]:
    """accept_at_pos[i] counts rounds that accepted position i+1, so it includes every earlier
    rejection; the chance of accepting position i+1 once reached is the ratio to position i.
    Approximate where the last rounds drafted fewer than k (the rates then have different
    denominators; a ratio can even pass 1)."""
    reached = [1.0] + _floats(accept_at_pos)
    return [a / r if r > 0 else math.nan for r, a in zip(reached, reached[1:])]


def plot_acceptance_by_position(cells: pd.DataFrame, note: str = "") -> Figure:
    """(a) accept_at_pos as recorded, (b) acceptance of a position once reached: flat if alpha
    does not decay with draft position. One line per lossless cell."""
    cells = lossless_cells(cells)
    cells = cells[cells["accept_at_pos"].notna()]
    fig, (ax_a, ax_c) = _new_figure(11, 4.6, 2)
    if cells.empty:
        for ax in (ax_a, ax_c):
            _empty(ax, "no per-position acceptance recorded")
        return fig
    keys = ["ctx_len", "concurrency"] + varied(cells)
    for color, (_, cell) in zip(colors(len(cells)), cells.iterrows()):
        raw = _floats(cell["accept_at_pos"])
        positions = np.arange(1, len(raw) + 1)
        name = label(cell, keys)
        ax_a.plot(positions, raw, marker="o", color=color, label=name)
        ax_c.plot(positions, conditional_acceptance(cell["accept_at_pos"]), marker="o",
                  color=color, label=name)
    ax_a.set_title("(a) share of rounds that accepted draft position i")
    ax_c.set_title("(b) acceptance at position i, given i-1 accepted")
    for ax in (ax_a, ax_c):
        ax.set_xlabel("draft position i")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(-0.03, max(1.03, ax.get_ylim()[1]))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    ax_c.legend(fontsize=7, ncol=1 + len(cells) // 12, loc="lower left")
    _caption(fig, "(b) is flat when acceptance is i.i.d., the closed form's assumption; its last "
                  "positions are biased where rounds near the end of n_predict drafted fewer than k.",
             note)
    return fig


# --------------------------------------------------------------------------------------------
# Slope of speedup against concurrency at high concurrency (seed §9.3)

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


# --------------------------------------------------------------------------------------------
# Compare mode: run A against run B (another quant or another machine)

COMPARE_COLUMNS = ("tps", "tps_off", "speedup", "speedup_lo", "speedup_hi", "draft_accept_rate",
                   "verify_cost_c", "c_draft", "decision", "rule")


def compare_runs(cells_a: pd.DataFrame, cells_b: pd.DataFrame, verdicts_a=None, verdicts_b=None):
    """Lossless cells of A and B joined on the regime keys they share values of. A key whose
    values do not overlap (quant 4 vs 8) is what the comparison is about: it is left out of the
    join and shown for each side. Returns (joined frame, join keys)."""
    sides = []
    for cells, verdicts in ((cells_a, verdicts_a), (cells_b, verdicts_b)):
        cells = lossless_cells(cells).reset_index(drop=True)
        if verdicts is not None:
            cells = cells.merge(verdicts[list(REGIME_KEYS) + ["decision", "rule"]],
                                on=list(REGIME_KEYS), how="left")
        else:
            cells = cells.assign(decision=pd.NA, rule=pd.NA)
        sides.append(cells)
    a, b = sides
    keys = [k for k in REGIME_KEYS
            if set(a[k].dropna().unique()) & set(b[k].dropna().unique())
            or (a[k].isna().all() and b[k].isna().all())]
    differing = [k for k in REGIME_KEYS if k not in keys]
    wanted = keys + differing + list(COMPARE_COLUMNS)
    joined = a[wanted].merge(b[wanted], on=keys, suffixes=("_a", "_b"))
    return joined.sort_values(keys).reset_index(drop=True), keys


def plot_compare(joined: pd.DataFrame, keys: list, label_a: str, label_b: str) -> Figure:
    """Grouped bars per joined regime: (a) speedup of A and B with their ranges, (b) spec-on tps."""
    fig, (ax_s, ax_t) = _new_figure(12, 1.8 + 0.45 * max(len(joined), 1), 2)
    if joined.empty:
        for ax in (ax_s, ax_t):
            _empty(ax, "no regime in common")
        return fig
    y = np.arange(len(joined))[::-1].astype(float)
    shown = [k for k in keys if joined[k].nunique(dropna=False) > 1] or keys
    names = [label(r, shown) for _, r in joined.iterrows()]
    for side, offset, color, name in (("a", 0.2, "#4e79a7", label_a), ("b", -0.2, "#f28e2b", label_b)):
        s = joined[f"speedup_{side}"].to_numpy(float)
        err = np.nan_to_num(np.vstack([s - joined[f"speedup_lo_{side}"].to_numpy(float),
                                       joined[f"speedup_hi_{side}"].to_numpy(float) - s]).clip(0))
        ax_s.barh(y + offset, s, height=0.4, xerr=err, color=color, label=name, capsize=2)
        ax_t.barh(y + offset, joined[f"tps_{side}"].to_numpy(float), height=0.4, color=color,
                  label=name)
    ax_s.axvline(1.0, color="black", ls="--", lw=1, label="break-even (1.0)")
    ax_s.set_yticks(y, names, fontsize=8)
    ax_t.set_yticks(y, [""] * len(y))
    ax_s.set_xlabel("speedup tps(on) / tps(off)")
    ax_t.set_xlabel("tps with speculation (tokens/s, all sequences)")
    ax_s.set_title("(a) speedup")
    ax_t.set_title("(b) spec-on throughput")
    for ax in (ax_s, ax_t):
        ax.grid(axis="x", alpha=0.3)
    fig.legend(*ax_s.get_legend_handles_labels(), loc="outside upper center", ncol=3, fontsize=8)
    _caption(fig, BAND_CAPTION.replace("points", "bars") + ". Each run self-measured on its own hardware.")
    return fig


# --------------------------------------------------------------------------------------------
# By task category (advisor.by_task)

def plot_by_task(summary: pd.DataFrame, note: str = "") -> Figure:
    """(a) alpha pooled over each task's lossless cells, tau written on the bar; (b) the median
    speedup over those cells with their lowest and highest as the bar. Tasks by alpha."""
    fig, (ax_a, ax_s) = _new_figure(12, 1.6 + 0.4 * max(len(summary), 1), 2)
    summary = summary[summary["lossless_cells"] > 0] if not summary.empty else summary
    if summary.empty:
        for ax in (ax_a, ax_s):
            _empty(ax, "no lossless spec-on cell")
        return fig
    summary = summary.sort_values("alpha").reset_index(drop=True)
    y = np.arange(len(summary))
    ax_a.barh(y, summary["alpha"], color="#4e79a7")
    for i, row in summary.iterrows():
        ax_a.text(row["alpha"], i, f" τ {_fmt(row['tau'])}", va="center", fontsize=8)
    ax_a.set_xlim(0, 1.15)
    ax_a.set_yticks(y, summary["task"].astype(str))
    ax_a.set_xlabel("α = accepted / drafted, pooled over the task's cells")
    ax_a.set_title("(a) acceptance by task")
    s = summary["speedup_median"].to_numpy(float)
    err = np.nan_to_num(np.vstack([s - summary["speedup_min"].to_numpy(float),
                                   summary["speedup_max"].to_numpy(float) - s]).clip(0))
    ax_s.barh(y, s, xerr=err, color="#f28e2b", capsize=3)
    ax_s.axvline(1.0, color="black", ls="--", lw=1)
    ax_s.set_yticks(y, [""] * len(y))
    ax_s.set_xlabel("speedup: median over the task's cells (bar: lowest to highest cell)")
    ax_s.set_title("(b) speedup by task")
    for ax in (ax_a, ax_s):
        ax.grid(axis="x", alpha=0.3)
    _caption(fig, "Cells of every context length, concurrency and target are pooled per task; lossless "
                  "cells only. See the cells table for each regime.", note)
    return fig


def task_md(summary: pd.DataFrame) -> str:
    if summary.empty:
        return "No spec-on cell."
    rows = [[r["task"], f"{r['lossless_cells']}/{r['cells']}", _fmt(r["alpha"]), _fmt(r["tau"]),
             f"{_fmt(r['speedup_median'])} ({_fmt(r['speedup_min'])}–{_fmt(r['speedup_max'])})",
             f"{r['n_on']} / {r['n_off']} / {r['n_measure_more']}"]
            for _, r in summary.sort_values("alpha", ascending=False).iterrows()]
    return (f"**By task: {task_advice(summary)}.**\n\n"
            "α and τ pooled over each task's lossless cells (summed counts); speedup: median over "
            "those cells (lowest–highest). Decisions: the advisor's per regime, above.\n\n"
            + md_table(["task", "lossless cells", "α", "τ", "speedup [self-measured]",
                        "regimes on / off / measure-more"], rows)
            + "\n\n![by task](by_task.png)")


# --------------------------------------------------------------------------------------------
# By drafter (advisor.drafter_advice): which drafter pays, per regime and per task

def has_ngram_drafters(traces: pd.DataFrame) -> bool:
    return "drafter" in traces and (traces["drafter"].dropna() != "model").any()


def by_drafter(cells: pd.DataFrame) -> pd.DataFrame:
    """Per task and drafter, over lossless cells: alpha and tau on summed counts, drafted tokens
    per round, share of rounds without a draft, median c and median speedup (lowest-highest)."""
    from specnative import _core

    kept = lossless_cells(cells)
    rows = []
    for (task, drafter), group in kept.groupby([kept["task"].fillna("(not recorded)"),
                                                kept["drafter"].fillna("model")], sort=True):
        counts = {c: int(group[c].fillna(0).sum()) for c in ("drafted", "accepted", "rejected", "rounds", "emitted")}
        rates = _core.accept_rates(**counts)
        s = group["speedup"].dropna()
        rows.append({"task": task, "drafter": drafter, "cells": len(group), "alpha": rates["draft_accept_rate"],
                     "tau": rates["mean_accept_len"],
                     "draft_len": counts["drafted"] / counts["rounds"] if counts["rounds"] else math.nan,
                     "empty": group["empty_draft_frac"].astype(float).median(),
                     "c": group["verify_cost_c"].astype(float).median(),
                     "speedup": s.median() if len(s) else math.nan,
                     "speedup_min": s.min() if len(s) else math.nan, "speedup_max": s.max() if len(s) else math.nan})
    return pd.DataFrame(rows)


def plot_by_drafter(summary: pd.DataFrame, note: str = "") -> Figure:
    """Median speedup per task, one bar per drafter (whisker: lowest to highest cell)."""
    tasks = list(dict.fromkeys(summary["task"])) if not summary.empty else []
    fig, (ax,) = _new_figure(10, 1.8 + 0.5 * max(len(tasks), 1) * max(summary["drafter"].nunique(), 1)
                             if not summary.empty else 3)
    if summary.empty:
        _empty(ax, "no lossless spec-on cell")
        return fig
    drafters = sorted(summary["drafter"].unique(), key=lambda d: (d != "model", d))
    height = 0.8 / len(drafters)
    for i, (drafter, color) in enumerate(zip(drafters, colors(len(drafters)))):
        part = summary[summary["drafter"] == drafter].set_index("task").reindex(tasks)
        y = np.arange(len(tasks)) + i * height
        s = part["speedup"].to_numpy(float)
        err = np.nan_to_num(np.vstack([s - part["speedup_min"].to_numpy(float),
                                       part["speedup_max"].to_numpy(float) - s]).clip(0))
        ax.barh(y, s, height=height, xerr=err, color=color, capsize=2, label=drafter)
        for yy, a, tau in zip(y, part["alpha"], part["tau"]):
            if math.isfinite(as_float(a)):
                ax.text(0.02, yy, f"α {_fmt(a)} τ {_fmt(tau)}", va="center", fontsize=7)
    ax.axvline(1.0, color="black", ls="--", lw=1)
    ax.set_yticks(np.arange(len(tasks)) + 0.4 - height / 2, tasks)
    ax.set_xlabel("speedup: median over the cells of the task (bar: lowest to highest)")
    ax.set_title("Which drafter pays, by task")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    _caption(fig, "Lossless cells only; α = accepted / drafted, τ = tokens per sequence-round (bonus included).",
             note)
    return fig


def drafters_md(traces: pd.DataFrame, cells: pd.DataFrame, thresholds: Thresholds) -> str:
    advice = drafter_advice(traces, thresholds)
    keys = [k for k in REGIME_KEYS if k != "drafter" and k in advice and advice[k].nunique(dropna=False) > 1] \
        or ["concurrency"]
    regime_rows = [[label(r, keys), f"**{r['recommend']}**", _fmt(r["speedup"]), r["ranking"]]
                   for _, r in advice.iterrows()]
    summary = by_drafter(cells)
    task_rows = [[r["task"], r["drafter"], r["cells"], _fmt(r["alpha"]), _fmt(r["tau"]), _fmt(r["draft_len"]),
                  _fmt(r["empty"]), _fmt(r["c"]),
                  f"{_fmt(r['speedup'])} ({_fmt(r['speedup_min'])}–{_fmt(r['speedup_max'])})"]
                 for _, r in summary.iterrows()]
    return ("The advisor's drafter per regime: among the drafters it calls **on** there, the one whose "
            "speedup interval has the highest lower bound; `none`: every drafter is off; `measure-more`: "
            "none is decided on. Ranking: every drafter's decision and speedup, surest first.\n\n"
            + md_table(["regime", "drafter", "speedup [self-measured]", "ranking"], regime_rows)
            + "\n\nPer task (lossless cells; α, τ on summed counts; draft length = drafted tokens per "
              "sequence-round; empty = share of rounds without a draft, i.e. plain target steps):\n\n"
            + md_table(["task", "drafter", "cells", "α", "τ", "draft length", "empty", "c",
                        "speedup [self-measured]"], task_rows)
            + "\n\n![by drafter](by_drafter.png)")


# --------------------------------------------------------------------------------------------
# Which k (pick_k.py, advisor.k_advice): the cost curve, the speedup predicted at every k' <= k,
# and the measured check of the pick

def has_k_prediction(traces: pd.DataFrame) -> bool:
    return "recommended_k" in traces and traces["recommended_k"].notna().any()


def _k_rows(traces: pd.DataFrame) -> pd.DataFrame:
    on = traces[(traces["spec_decode"] == "on") & traces["recommended_k"].notna()]
    return on.sort_values("k").drop_duplicates([k for k in REGIME_KEYS if k != "k"], keep="last")


def plot_which_k(traces: pd.DataFrame, note: str = "") -> Figure:
    """Left: the verify-cost curve (target ms for 1..k+1 positions per sequence; a cross: one
    draft position) per regime. Right: speedup predicted at every k' (line) and measured (dots:
    the run at k and the --check-k run)."""
    rows = _k_rows(traces)
    fig, (left, right) = _new_figure(11, 4, ncols=2)
    if rows.empty:
        _empty(left, "no cost curve")
        _empty(right, "no prediction")
        return fig
    keys = varied(rows, [k for k in REGIME_KEYS if k != "k"]) or ["concurrency"]
    for (_, r), color in zip(rows.iterrows(), colors(len(rows))):
        name = label(r, keys)
        verify = _floats(r["verify_ms_by_len"])
        left.plot(range(1, len(verify) + 1), verify, "o-", color=color, label=name)
        left.plot([1], [as_float(r["draft_ms_per_pos"])], "x", color=color, ms=9)
        predicted = _floats(r["predicted_speedup_by_k"])
        right.plot(range(1, len(predicted) + 1), predicted, "-", color=color, label=name)
        right.plot([int(r["k"])], [as_float(r["speedup"])], "o", color=color)
        if pd.notna(r.get("check_k")):
            right.plot([int(r["check_k"])], [as_float(r["check_k_speedup"])], "s", color=color, mfc="none", ms=9)
    left.set_xlabel("positions per sequence in one target decode (k + 1 for a verify batch)")
    left.set_ylabel("ms (median; log scale)")
    left.set_yscale("log")
    left.set_title("Verify-cost curve (x: one draft position)")
    left.legend(fontsize=7)
    right.axhline(1.0, color="black", ls="--", lw=1)
    right.set_xlabel("draft length k")
    right.xaxis.get_major_locator().set_params(integer=True)
    right.set_ylabel("speedup")
    right.set_title("Predicted (line) vs measured (dot: run at k; square: check)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    _caption(fig, "Prediction from the run at the largest k: tau from its accepted-length histogram, "
             "T_round from the cost curve anchored at that run (pick_k.py).", note)
    return fig


def which_k_md(traces: pd.DataFrame) -> str:
    advice = k_advice(traces)
    if advice.empty:
        return "No draft-model cell with a cost curve."
    keys = [k for k in REGIME_KEYS if k in advice and advice[k].nunique(dropna=False) > 1] or ["concurrency"]
    rows = []
    for _, r in advice.iterrows():
        check = (f"{int(r['check_k'])}: {_fmt(r['check_speedup'])}" if pd.notna(r["check_k"]) else "not run")
        rows.append([label(r, [k]) for k in keys]  # one column per key, as in the advice table
                    + [r["k_max"], f"**{r['recommend']}**", _fmt(r["predicted_speedup"]), check,
                       " ".join(_fmt(v) for v in _floats(r["predicted_by_k"]))])
    return ("Draft length per regime (draft-model cells), predicted from the run at the largest k measured "
            "(k max): tau(k') from its accepted-length histogram (a round that accepted m drafts is "
            "ceil((m+1)/(k'+1)) rounds at k'; exact for greedy where (k'+1) divides (k max+1)), T_round(k') "
            "= k' x draft ms per position + verify ms at k'+1 positions + resample ms, from the cost curve "
            "scaled to the measured T_round at k max; steady state as the sweep measures it. `none`: no k "
            "is predicted above break-even. Checked: the best predicted k measured (--check-k), speedup "
            "measured the sweep's way (steady state, pooled). Cells with the draft stop rule (p_min > 0) get "
            "no prediction: their drafts are not k' long every round.\n\n"
            + md_table(keys + ["k max", "recommended k", "predicted speedup", "checked k: measured speedup",
                               "predicted at k = 1..k max"], rows)
            + "\n\n![which k](which_k.png)")


# --------------------------------------------------------------------------------------------
# The draft stop rule (--draft-p-min, advisor.p_min_advice) against fixed k

def has_p_min(traces: pd.DataFrame) -> bool:
    return "draft_p_min" in traces and (pd.to_numeric(traces["draft_p_min"], errors="coerce") > 0).any()


def p_min_md(traces: pd.DataFrame, thresholds: Thresholds) -> str:
    advice = p_min_advice(traces, thresholds)
    intro = ("The draft model stops a sequence's draft for the round at the first position whose top "
             "draft probability (softmax at temperature 1 over the 10 largest draft logits, llama.cpp's "
             "--spec-draft-p-min) is below p_min, so its drafts are 0..k long (mean draft length below). "
             "Each p_min cell has its own baseline measured beside it. No which-k prediction is made for "
             "p_min cells: the fixed-length prediction at k' assumes every round drafts k'.")
    if advice.empty:
        return intro + "\n\nNo regime was measured both at fixed k and with p_min."
    keys = [k for k in REGIME_KEYS if k in advice and k != "draft_p_min" and advice[k].nunique(dropna=False) > 1] \
        or ["k"]
    rows = [[label(r, [k]) for k in keys]  # one column per key, as in the advice table
            + [_fmt(r["fixed_speedup"]), _fmt(r["fixed_draft_len"]), f"{r['best_p_min']:g}",
               _fmt(r["p_min_speedup"]), _fmt(r["p_min_draft_len"]), f"**{r['recommend']}**", r["ranking"]]
            for _, r in advice.iterrows()]
    return (intro + " Recommended: among the variants the advisor calls on, the highest lower bound of the "
            "speedup interval.\n\n"
            + md_table(keys + ["fixed k: speedup", "fixed k: draft len", "best p_min", "p_min: speedup",
                               "p_min: draft len", "recommended", "all variants"], rows))


# --------------------------------------------------------------------------------------------
# summary.md

def md_table(headers: list, rows: list) -> str:
    lines = ["| " + " | ".join(str(h).replace("|", "\\|") for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


class ReportInputError(ValueError):
    """A run directory the report cannot use: the message names the file and what is wrong."""


def load_provenance(run_dir: Path) -> dict:
    """provenance.json as a dict; {} when the run has none (the report says so). A damaged one
    is an error: numbers must not be reported under a record that cannot be read."""
    path = Path(run_dir) / "provenance.json"
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ReportInputError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    except RecursionError:
        raise ReportInputError(f"{path}: JSON nested too deeply to be a sweep's record") from None
    except UnicodeDecodeError as error:
        raise ReportInputError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise ReportInputError(f"{path}: cannot read it ({error.strerror})") from None
    if not isinstance(record, dict):
        raise ReportInputError(f"{path}: expected a JSON object, found a {type(record).__name__}")
    return record


def hardware(prov: dict) -> str:
    gpu = prov.get("gpu")
    if gpu:
        return (f"GPU {gpu.get('name', '?')} ({gpu.get('memory_gb', '?')} GB, driver "
                f"{gpu.get('driver', '?')}), {prov.get('backend') or 'backend not recorded'}")
    cpu = prov.get("cpu_model") or "CPU not recorded"
    return (f"CPU {cpu} ({prov.get('cpu_count', '?')} cores, {prov.get('memory_gb', '?')} GB), "
            f"{prov.get('backend') or 'backend not recorded'}")


def _value(prov, key):
    value = prov.get(key)
    return "not recorded" if value is None or value == "" else value


def provenance_md(prov: dict) -> str:
    if not prov:
        return "**provenance.json is missing: these numbers cannot be reproduced or attributed.**"
    rows = [("specnative", _value(prov, "specnative_version")),
            ("llama.cpp commit", f"`{_value(prov, 'llama_cpp_commit')}`"),
            ("build flags", f"`{_value(prov, 'build_flags')}`"),
            ("backend", _value(prov, "backend")),
            ("hardware", hardware(prov)),
            ("system info", f"`{_value(prov, 'system_info')}`"),
            ("OS / Python", f"{_value(prov, 'os')} / {_value(prov, 'python')}"),
            ("threads / GPU layers / flash attn",
             f"{_value(prov, 'n_threads')} / {_value(prov, 'n_gpu_layers')} / {_value(prov, 'flash_attn')}"),
            ("warm-up / repeats", _repeats_text(prov)),
            ("which k (cost curve)", "measured" if prov.get("which_k") else
             "not measured (the default; pass --which-k)" if "which_k" in prov else "not recorded"),
            ("rejection cells' distributional test", f"at least {prov['dist_positions']} positions"
             if "dist_positions" in prov else "not recorded"),
            ("grid", "; ".join(f"{k}: {v}" for k, v in (prov.get("grid") or {}).items()) or "not recorded"),
            ("preset", prov.get("preset") or "none (models given)"),
            ("date", _value(prov, "date")),
            ("run id", _value(prov, "run_id"))]
    models = [(m.get("role"), m.get("name"), f"`{m.get('path')}`", m.get("type"), m.get("quant_bits"),
               m.get("n_params"), m.get("size_bytes"), f"`{m.get('sha256')}`")
              for m in prov.get("models") or []]
    return "\n\n".join([
        *_incomplete(prov),
        md_table(["", ""], rows),
        "Command:\n\n```\n" + str(_value(prov, "command")) + "\n```",
        md_table(["role", "name", "file", "type", "bits", "params", "bytes", "sha256"], models)
        if models else "Models: not recorded.",
        *noise_control_md(prov)])


def noise_control_md(prov: dict) -> list:
    """The lossless verdict's control per target and backend (provenance noise_control)."""
    noise = prov.get("noise_control") or {}
    if not noise:
        return []
    rows = [[name, _fmt(n.get("max_abs_delta"), 3), _fmt(n.get("max_spread"), 3), _fmt(n.get("tolerance"), 3),
             f"{n.get('flips', 0)}/{n.get('positions', 0)}",
             ", ".join(f"{v} {c}" for v, c in (n.get("verdicts") or {}).items())]
            for name, n in noise.items()]
    return ["Numeric-noise control (the target's own logits, baseline 1-token steps vs k+1-token verify "
            "batches, same tokens teacher-forced, per cell; the lossless verdict's tolerance is "
            "1.25 x the largest logit-gap movement):",
            md_table(["target [backend]", "max |Δlogit|", "max gap movement", "tolerance",
                      "greedy flips / positions", "verdicts"], rows)]


def _incomplete(prov: dict) -> list:
    """Warnings that the grid is not all there: an unfinished sweep, cells it refused to run."""
    said = []
    if prov.get("completed") is False:
        said.append("**The sweep did not finish: this report covers the cells written so far.**")
    refused = prov.get("refused_cells") or []
    if refused:
        said.append("Cells the sweep refused to run (not measured):\n\n" + md_table(
            ["target", "ctx_len", "concurrency", "reason"],
            [[r.get("target"), r.get("ctx_len"), r.get("concurrency"), r.get("reason")] for r in refused]))
    return said


def notes_md(prov: dict) -> str:
    notes = prov.get("notes") or []
    return "\n".join(f"- **{n}**" for n in notes) if notes else "- (no notes recorded)"


def _tps(row) -> str:
    return f"{_fmt(row['tps'])} ± {_fmt(row['tps_std'])}"


def _size(n_bytes) -> str:
    n = as_float(n_bytes)
    return "" if not math.isfinite(n) else f"{n / 2**20:.2f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def _params(n) -> str:
    n = as_float(n)
    return "" if not math.isfinite(n) else f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def cells_md(traces: pd.DataFrame, cells: pd.DataFrame, prov: dict) -> str:
    """llama-bench-style table: every off row and every on cell (with its speedup); rates carry
    the self-measured tag. Size and params are the target's, from provenance."""
    files = {m.get("name"): m for m in prov.get("models") or []}
    rows = []
    for _, r in ordered(pd.concat([traces[traces["spec_decode"] == "off"], cells])).iterrows():
        on = r["spec_decode"] == "on"
        draft_cols = [_fmt(r["k"], 0), f"{as_float(r['temperature']):g}", r["accept_rule"], _tps(r),
                      _speedup_range(r), _fmt(r["draft_accept_rate"]), _fmt(r["mean_accept_len"]),
                      _fmt(r["verify_cost_c"]), _fmt(r["c_draft"]),
                      {True: "yes", False: "**NO**"}.get(r["lossless_ok"], "?")]
        if not on:
            draft_cols = ["", f"{as_float(r['temperature']):g}", "", _tps(r)] + [""] * 6
        model = f"{r['target_model']} + {r['draft_model']}" if on else str(r["target_model"])
        target = files.get(r["target_model"], {})
        rows.append([model, r["target_type"], r["quant_bits"], _size(target.get("size_bytes")),
                     _params(target.get("n_params")), r["backend"], r["n_threads"],
                     f"tg{_fmt(r['n_predict'], 0)} @ d{r['ctx_len']}" + (f" {r['task']}" if pd.notna(r["task"]) else ""),
                     r["concurrency"],
                     r["spec_decode"]] + draft_cols)
    head = ["model", "type", "bits", "size", "params", "backend", "threads", "test", "conc", "spec",
            "k", "T", "rule", "t/s [self-measured]", "speedup [self-measured]", "α", "τ", "c", "c_draft", "lossless"]
    where = hardware(prov) if prov else "unrecorded hardware"
    intro = (f"Every rate below is **[self-measured]** on {where}, run {prov.get('run_id', 'n/a')}; "
             "it does not carry to other hardware. t/s: median ± sd over the timed repeats, "
             "decoding only (prefill excluded), all sequences together.")
    return intro + "\n\n" + md_table(head, rows)


def _speedup_range(r) -> str:
    kind = r.get("interval")
    kind = f"{kind} " if isinstance(kind, str) and kind else ""
    return f"{_fmt(r['speedup'])} ({kind}{_fmt(r['speedup_lo'])}–{_fmt(r['speedup_hi'])})"


def _repeats_text(prov: dict) -> str:
    if prov.get("max_repeats") is None:  # a fixed-count sweep (before adaptive repeats)
        return f"{_value(prov, 'warmup')} discarded / {_value(prov, 'repeats')} timed; rates are medians"
    return (f"warm-up until two runs agree within {prov.get('warmup_tol', 0):.0%} (at most "
            f"{prov['warmup']} discarded); {prov['repeats']}–{prov['max_repeats']} timed runs, spec off "
            f"and on interleaved, until the speedup's {prov.get('ci_level', 0.95):.0%} interval lies above "
            f"or below 1 or is narrower than {prov.get('ci_width', 0):.0%} of it; rates are medians")


def _interval(low, high) -> str:
    return "" if not (math.isfinite(as_float(low)) and math.isfinite(as_float(high))) else \
        f"{_fmt(low)}–{_fmt(high)}"


def measurement_md(traces: pd.DataFrame) -> str:
    """How sure each row is (stats.py columns): its intervals, the repeats and warm-up it took,
    why it stopped, and every run flagged as an outlier with the reason."""
    if "repeats_used" not in traces or traces["repeats_used"].isna().all():
        return ("No intervals recorded (a traces.csv from a fixed-count sweep): the advice uses the "
                "range over the repeats.")
    rows, notes = [], []
    for _, r in ordered(traces).iterrows():
        regime = label(r, ["quant_bits", "ctx_len", "concurrency"]) + (
            f", k={_fmt(r['k'], 0)}" if r["spec_decode"] == "on" else "")
        settled = {True: "", False: " (not settled)"}.get(r["warmup_settled"], "")
        rows.append([regime, r["spec_decode"], f"{_fmt(r['tps'])} ({_interval(r['tps_ci_low'], r['tps_ci_high'])})",
                     f"{_fmt(r['speedup'])} ({_interval(r['speedup_ci_low'], r['speedup_ci_high'])})"
                     if r["spec_decode"] == "on" else "", _fmt(r["repeats_used"], 0),
                     r["stop_reason"] if pd.notna(r["stop_reason"]) else "",
                     f"{_fmt(r['warmup_used'], 0)}{settled}", _fmt(r["n_outliers"], 0)])
        if pd.notna(r["outlier_note"]) and str(r["outlier_note"]):
            notes += [f"- {regime}, spec {r['spec_decode']}: {n.strip()}" for n in str(r["outlier_note"]).split(";")]
    levels = ", ".join(f"{x:.0%}" for x in sorted(traces["ci_level"].dropna().unique())) or "n/a"
    return (f"Intervals at {levels}: t/s is the geometric mean's over the repeats, the speedup's is over "
            "paired repeats (spec on and off run side by side), Student t on logs (stats.py). A cell "
            "repeats until its speedup interval lies above or below 1 or is narrow enough (stop); "
            "max-repeats means it never did.\n\n"
            + md_table(["cell", "spec", "t/s (interval)", "speedup (interval)", "repeats", "stop",
                        "warm-up runs", "outliers"], rows)
            + "\n\n" + ("Outliers (kept in every number above; flagged when a run's modified z-score "
                         "exceeds 3.5):\n\n" + "\n".join(notes) if notes else "No run was flagged as an outlier."))


def _regime_id(row, keys) -> tuple:
    """A regime's keys as text that matches across frames (ints, floats and missing alike)."""
    def text(value):
        if value is None or (not isinstance(value, str) and pd.isna(value)):
            return ""
        try:
            return f"{float(value):g}"
        except (TypeError, ValueError):
            return str(value)
    return tuple(text(row[k]) for k in keys)


def recommended_k_text(verdict, advice: pd.DataFrame) -> str:
    """The advice table's "recommended k" cell of one regime (advisor.k_advice): the k, its
    predicted speedup and, with --check-k, the measured one; n/a where there is no prediction
    (n-gram drafters, the p_min stop rule, traces without a cost curve)."""
    drafter = verdict.get("drafter")
    if (drafter is not None and not pd.isna(drafter) and drafter != "model") or as_float(verdict.get("draft_p_min")) > 0:
        return "n/a"
    match = advice[[_regime_id(a, K_ADVICE_KEYS) == _regime_id(verdict, K_ADVICE_KEYS)
                    for _, a in advice.iterrows()]] if not advice.empty else advice
    if match.empty:
        return "n/a"
    a = match.iloc[0]
    if a["recommend"] == "none":
        return "none (no k pays)"
    text = f"**{a['recommend']}** (pred {_fmt(a['predicted_speedup'])}"
    if pd.notna(a["check_k"]):
        text += f"; checked k={int(a['check_k'])}: {_fmt(a['check_speedup'])}"
    return text + ")"


def verdicts_md(verdicts: pd.DataFrame, thresholds: Thresholds, k_table: pd.DataFrame | None = None) -> str:
    """The advice table; with k_table (advisor.k_advice, non-empty) a column with each regime's
    recommended k, its predicted speedup and the --check-k measurement."""
    if verdicts.empty:
        return "No spec-on cell to judge."
    used = ", ".join(f"{name}={getattr(thresholds, name)}" for name, _, _ in threshold_fields())
    keys = [k for k in REGIME_KEYS if verdicts[k].nunique(dropna=False) > 1] or ["concurrency"]
    with_k = k_table is not None and not k_table.empty
    rows = [[label(r, [k]) for k in keys]
            + [f"**{r['decision']}**", _speedup_range(r)]
            + ([recommended_k_text(r, k_table)] if with_k else [])
            + [r["rule"], r["reason"], r["also"]]
            for _, r in verdicts.iterrows()]
    k_note = (" Recommended k: the draft length predicted best for the regime from its run at the "
              "largest k (section \"Which k\"), its predicted speedup, and the measured speedup where "
              "--check-k ran it.") if with_k else ""
    return (f"From measured values only (advisor.py; thresholds: {used}). A lossless failure is "
            "always off; a noisy or unrepeated cell is measure-more; an off names its most "
            "actionable cause." + k_note + "\n\n"
            + md_table(keys + ["decision", "speedup (interval)"] + (["recommended k"] if with_k else [])
                       + ["rule", "why", "also fired"], rows))


def verdicts_of_cells_md(cells: pd.DataFrame) -> str:
    """The three-way lossless verdict (lossless.py) per cell: counts, and every numeric or failed
    cell with its evidence."""
    if "verdict" not in cells or cells["verdict"].isna().all():
        return ""
    counts = cells["verdict"].value_counts()
    head = ", ".join(f"{counts.get(v, 0)} {v}" for v in ("exact", "numeric", "fail"))
    listed = cells[cells["verdict"].isin(["numeric", "fail"])]
    text = (f"Lossless verdicts: {head}. `numeric`: the output parts from the baseline only where the "
            "target's own numeric noise explains it (forced replay; tolerance = "
            "1.25 x the noise control's max logit-gap movement between the baseline's 1-token steps and "
            "a k+1-token verify batch, same tokens, this cell's concurrency); such cells stay in the "
            "curves (hollow markers). `fail` cells give no number.")
    if listed.empty:
        return text
    rows = [[label(r, REGIME_KEYS), f"**{r['verdict']}**", _fmt(r["first_divergence"], 0), _fmt(r["mismatches"], 0),
             _fmt(r["max_mismatch_gap"], 3), _fmt(r["noise_tolerance"], 3), _fmt(r["noise_max_abs_delta"], 3),
             _fmt(r["noise_flips"], 0), str(r["verdict_reason"])] for _, r in listed.iterrows()]
    return text + "\n\n" + md_table(["cell", "verdict", "first divergence", "mismatches", "max gap", "tolerance",
                                      "noise max |Δ|", "noise flips", "evidence"], rows)


def failures_md(cells: pd.DataFrame) -> str:
    failed = failed_cells(cells)
    verdicts = verdicts_of_cells_md(cells)
    if failed.empty:
        methods = ", ".join(sorted(cells["lossless_method"].dropna().unique())) or "not recorded"
        return (f"All {len(cells)} spec-on cells passed the lossless check (method: {methods})."
                + (f"\n\n{verdicts}" if verdicts else ""))
    if verdicts:
        return verdicts
    rows = [[label(r, REGIME_KEYS), r["lossless_method"], _fmt(r["first_divergence"], 0),
             _fmt(r["divergence_margin"], 3)] for _, r in failed.iterrows()]
    return (f"{len(failed)} of {len(cells)} spec-on cells **failed** and are left out of every "
            "figure. A small top-2 margin at the first divergence can be a numeric near-tie "
            "(logits differ across batch shapes), a large one is a bug.\n\n"
            + md_table(["cell", "method", "first divergence", "top-2 margin"], rows))


def timing_md(traces: pd.DataFrame) -> str:
    shares = [(1 - step_parts(r)["other_ms"] / as_float(r["total_ms"]))
              for _, r in traces.iterrows() if as_float(r["total_ms"]) > 0]
    if not shares:
        return "Step timers: total_ms not recorded."
    return (f"Step timers account for {min(shares):.1%}–{max(shares):.1%} of each run's total_ms "
            "(the rest is 'other' in the breakdown).\n\n" + engine_own_md(traces))


ENGINE_OWN_GOAL = 0.01  # issue 17: the engine's own share of a round (or step) at most 1 %


def _fmt_sum(rows: pd.DataFrame, column: str) -> str:
    """A column's sum over rows, '-' where the traces predate it."""
    values = pd.to_numeric(rows[column], errors="coerce") if column in rows else pd.Series(dtype=float)
    return f"{values.sum():.2f}" if values.notna().any() else "-"


def engine_own_md(traces: pd.DataFrame) -> str:
    """Where the decoding time went: inside llama.cpp calls (of which the rollbacks' KV removal,
    apart) or the engine's own (batch building, sampling, acceptance), from the sweep's llama_ms /
    kv_removal_ms / engine_own_* columns; the share is per row (a round, or a baseline step),
    summarized per mode and drafter."""
    share = pd.to_numeric(traces["engine_own_share"], errors="coerce")
    rows_with = traces[share.notna()].assign(_share=share[share.notna()])
    if rows_with.empty:
        return "Engine's own time: not recorded (traces written before llama_ms / engine_own_ms)."
    rows_with = rows_with.assign(_drafter=rows_with["drafter"].fillna("model"))
    out = []
    for (mode, drafter), g in rows_with.groupby(["spec_decode", "_drafter"], sort=True):
        worst = g.loc[g["_share"].idxmax()]
        out.append([mode, drafter if mode == "on" else f"({drafter} cell)", len(g),
                    f"{pd.to_numeric(g['llama_ms'], errors='coerce').sum():.1f}",
                    _fmt_sum(g, "kv_removal_ms"),
                    f"{pd.to_numeric(g['engine_own_ms'], errors='coerce').sum():.2f}",
                    f"{g['_share'].median():.2%}", f"{worst['_share']:.2%}",
                    label(worst, ["quant_bits", "ctx_len", "concurrency"] + (["k"] if mode == "on" else []))])
    over = int((rows_with["_share"] > ENGINE_OWN_GOAL).sum())
    verdict = (f"every row within the goal of {ENGINE_OWN_GOAL:.0%}" if over == 0 else
               f"**{over} of {len(rows_with)} rows above the goal of {ENGINE_OWN_GOAL:.0%}**")
    return ("Engine's own time (decoding time not spent inside llama.cpp calls: batch building, sampling, "
            f"acceptance), per run: {verdict}. A rollback's KV removal is a llama.cpp call (a scan over every "
            "cell of the cache), shown apart.\n\n"
            + md_table(["mode", "drafter", "rows", "inside llama.cpp, ms (sum)", "of which KV removal, ms (sum)",
                        "engine's own, ms (sum)",
                        "own share, median", "own share, max", "max at"], out))


def theory_md(table: pd.DataFrame) -> str:
    if table.empty:
        return "No lossless spec-on cell."
    ngram = "drafter" in table and table["drafter"].notna().any() and (table["drafter"].fillna("model") != "model").any()
    note = ("n-gram drafters propose 0..k tokens per round: their predictions use the measured length mix, "
            "E[τ] = 1 + Σ_j α^j P(L ≥ j) with P(L ≥ j) from draft_reach (the fixed-k closed form would "
            "credit them k drafts in every round).\n\n" if ngram else "")
    keys = [k for k in REGIME_KEYS if table[k].nunique(dropna=False) > 1] or ["concurrency"]
    rows = [[label(r, keys), _fmt(r["alpha"]), _fmt(r["alpha_token"]), _fmt(r["c"]),
             _fmt(r["speedup"]), _fmt(r["predicted"]), _fmt(r["predicted_token"]),
             _fmt(r["tau"]), _fmt(r["tau_expected"]), _fmt(r["tau_expected_token"])]
            for _, r in table.iterrows()]
    return note + md_table(["cell", "α", "α per position", "c", "speedup", "predicted (α)",
                            "predicted (α per position)", "τ", "E[τ] (α)", "E[τ] (α per position)"], rows)


def slope_md(results: list[dict]) -> str:
    rows = [[r["series"], r["n"], r["concurrencies"], _fmt(r["slope"], 4), _fmt(r["p_value"], 3),
             r["note"]] for r in results]
    return ("Linear fit of speedup on concurrency over the lossless cells with concurrency ≥ 4 "
            "(seed §9.3).\n\n" + md_table(["series", "cells", "distinct conc.", "slope per unit "
                                           "concurrency", "p", "reading"], rows))


def compare_md(joined: pd.DataFrame, keys: list, label_a: str, label_b: str) -> str:
    if joined.empty:
        return f"A = {label_a}, B = {label_b}: no lossless regime in common."
    differing = [c.removesuffix("_a") for c in joined if c.endswith("_a")
                 and c.removesuffix("_a") in REGIME_KEYS]
    rows = []
    for _, r in joined.iterrows():
        row = [label(r, keys)] + [f"{r[d + '_a']} / {r[d + '_b']}" for d in differing]
        for col in ("tps", "speedup", "draft_accept_rate", "verify_cost_c", "decision"):
            row.append(f"{_fmt(r[col + '_a']) if col != 'decision' else r[col + '_a']} / "
                       f"{_fmt(r[col + '_b']) if col != 'decision' else r[col + '_b']}")
        rows.append(row)
    head = (["regime"] + [f"{d} A / B" for d in differing]
            + ["t/s A / B [self-measured]", "speedup A / B", "α A / B", "c A / B", "advice A / B"])
    return (f"A = {label_a}; B = {label_b}. Joined on {', '.join(keys)}; lossless cells only.\n\n"
            + md_table(head, rows) + "\n\n![compare](compare.png)")


# --------------------------------------------------------------------------------------------
# Entry points

def _compare_source(other) -> tuple[pd.DataFrame, str]:
    path = Path(other)
    prov = load_provenance(path if path.is_dir() else path.parent)
    name = prov.get("run_id") or (path.name if path.is_dir() else path.parent.name + "/" + path.name)
    where = hardware(prov) if prov else "hardware not recorded"
    return load_traces(path), f"{name} ({where})"


def write_report(run_dir, compare=None, thresholds: Thresholds | None = None) -> Path:
    """Writes the report into run_dir (see write_artifacts); returns the summary.md path."""
    return write_artifacts(run_dir, compare, thresholds)["summary.md"]


def write_artifacts(run_dir, compare=None, thresholds: Thresholds | None = None) -> dict:
    """Writes figures, advice.csv and summary.md into run_dir; returns {file name: path}."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportInputError(f"{run_dir}: not a directory (give the sweep's run directory)")
    prov = load_provenance(run_dir)
    traces = load_traces(run_dir / "traces.csv")
    if traces.empty:
        raise ReportInputError(f"{run_dir / 'traces.csv'}: a header but no rows: nothing was measured")
    if crossover.is_serve_run(traces):  # the load sweep (sweep --serve) has its own report
        from specnative.serve_report import write_serve_report
        return write_serve_report(run_dir, traces, prov)
    cells = pair_cells(traces)
    verdicts = verdicts_frame(advise(traces, thresholds))
    note = f"Self-measured on {hardware(prov)}." if prov else "Hardware not recorded."
    table = theory_table(cells)
    figures = {"speedup_curve": plot_speedup_curve(cells, note),
               "timing_breakdown": plot_timing_breakdown(traces, note),
               "theory_vs_measured": plot_theory(table, note),
               "acceptance_by_position": plot_acceptance_by_position(cells, note),
               "by_task": plot_by_task(by_task(traces, thresholds), note)}
    if has_ngram_drafters(traces):
        figures["by_drafter"] = plot_by_drafter(by_drafter(cells), note)
    if has_k_prediction(traces):
        figures["which_k"] = plot_which_k(traces, note)
    out = {}
    for name, fig in figures.items():
        out[f"{name}.png"], out[f"{name}.pdf"] = save(fig, run_dir / name)
    out["advice.csv"] = run_dir / "advice.csv"
    verdicts.to_csv(out["advice.csv"], index=False)
    sections = _sections(traces, cells, verdicts, table, prov, thresholds or Thresholds())
    if has_ngram_drafters(traces):
        sections.insert(4, ("Which drafter", drafters_md(traces, cells, thresholds or Thresholds())))
    if has_k_prediction(traces):
        sections.insert(3, ("Which k: recommended draft length", which_k_md(traces)))
    if has_p_min(traces):
        sections.insert(4, ("Draft stop rule (p_min) against fixed k", p_min_md(traces, thresholds or Thresholds())))
    if (public := category_table.section_md(traces)) is not None:
        sections.insert(4, ("Public set by category (Spec-Bench's shape)", public))
    if (own_time := progress.timing_md((prov or {}).get("sweep_timing") or [])) is not None:
        sections.append(("Where the sweep's time went", own_time))
    if compare is not None:
        sections.append(("Compare", _write_compare(run_dir, prov, cells, verdicts, compare,
                                                    thresholds, out)))
    out["summary.md"] = run_dir / "summary.md"
    out["summary.md"].write_text(_render(prov, sections, list(figures)))
    return out


def _write_compare(run_dir, prov, cells, verdicts, compare, thresholds, out) -> str:
    traces_b, label_b = _compare_source(compare)
    label_a = f"{prov.get('run_id') or run_dir.name} ({hardware(prov) if prov else 'hardware not recorded'})"
    joined, keys = compare_runs(cells, pair_cells(traces_b), verdicts,
                                verdicts_frame(advise(traces_b, thresholds)))
    short = [f"{side}: {name.split(' (')[0]}" + "".join(
                 f", {_key_text(k, v[0])}" for k in REGIME_KEYS if k not in keys
                 and len(v := joined[f"{k}_{side.lower()}"].unique()) == 1)
             for side, name in (("A", label_a), ("B", label_b))]
    out["compare.png"], out["compare.pdf"] = save(plot_compare(joined, keys, *short),
                                                  run_dir / "compare")
    out["compare.csv"] = run_dir / "compare.csv"
    joined.to_csv(out["compare.csv"], index=False)
    return compare_md(joined, keys, label_a, label_b)


def _sections(traces, cells, verdicts, table, prov, thresholds) -> list:
    return [("Read first: notes from the sweep", notes_md(prov)),
            ("Cells", cells_md(traces, cells, prov)),
            ("Advice per regime (seed §6)",
             verdicts_md(verdicts, thresholds, k_advice(traces) if has_k_prediction(traces) else None)),
            ("How sure: intervals, repeats, outliers", measurement_md(traces)),
            ("By task category", task_md(by_task(traces, thresholds))),
            ("Lossless check", failures_md(cells)),
            ("Speedup against concurrency: slope", slope_md(speedup_slope(cells))),
            ("Theory against measurement", theory_md(table)),
            ("Timing", timing_md(traces))]


FIGURE_TITLES = {"speedup_curve": "Speedup against concurrency and context",
                 "timing_breakdown": "Per-step timing breakdown",
                 "theory_vs_measured": "Closed form against measurement",
                 "acceptance_by_position": "Acceptance by draft position",
                 "by_task": "Acceptance and speedup by task category",
                 "by_drafter": "Which drafter pays, by task",
                 "which_k": "Which k: verify-cost curve and predicted speedup"}


def _render(prov: dict, sections: list, figures: list) -> str:
    title = f"# specnative report: run {prov.get('run_id', 'n/a')}"
    parts = [title, "## Reproducibility record (seed §8)", provenance_md(prov)]
    for heading, body in sections:
        parts += [f"## {heading}", body]
    parts.append("## Figures")
    parts += [f"### {FIGURE_TITLES[f]}\n\n![{f}]({f}.png)\n\n[PDF]({f}.pdf)" for f in figures]
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specnative.report", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="directory holding traces.csv (and provenance.json)")
    parser.add_argument("--compare", type=Path, help="another run directory or traces.csv (B)")
    for name, default, kind in threshold_fields():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                            help=f"advisor threshold (default {default})")
    args = parser.parse_args(argv)
    thresholds = Thresholds(**{name: getattr(args, name) for name, _, _ in threshold_fields()})
    try:
        print(write_report(args.run_dir, args.compare, thresholds))
    except (TracesError, ReportInputError) as error:  # a damaged run directory: one line, no traceback
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
