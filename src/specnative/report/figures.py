"""The run's figures: speedup against concurrency, the per-step timing breakdown, theory against
measurement and acceptance by draft position. Every function takes the data and returns a
matplotlib Figure (no pyplot state), so tests can read the plotted series back."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure  # Agg canvas on savefig; pyplot is never imported

from specnative.report.cells import (
    ENGINE_OWN_GOAL,
    conditional_acceptance,
    label,
    lossless_cells,
    ordered,
    step_parts,
    varied,
)
from specnative.report.text import floats, fmt

STEP_COLORS = {"prefill_target_ms": "#9e9e9e", "prefill_draft_ms": "#cfcfcf", "draft_ms": "#f28e2b",
               "draft_ingest_ms": "#b07aa1",
               "verify_ms": "#4e79a7", "resample_ms": "#e15759", "decode_ms": "#59a14f",
               "other_ms": "#ffffff"}


BAND_CAPTION = ("error bars: the speedup's confidence interval (paired repeats, Student t on the log "
                "ratios),\nor where a traces.csv has none, the range over the timed repeats "
                "(slowest spec run / fastest baseline run to fastest / slowest); points: median tps ratio; "
                "y axis logarithmic, symmetric about 1")


def colors(n: int) -> list:
    """n distinguishable colors: tab10 up to 10 lines, tab20 up to 20, then a continuous map."""
    from matplotlib import colormaps
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["viridis"](i / (n - 1)) for i in range(n)]


def new_figure(width, height, ncols=1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def empty_panel(ax, message):
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


CAPTION_POINTS = 7.5
# Average advance of a caption character, in points per point of font size (DejaVu Sans, mixed
# text, measured with some margin): the caption is wrapped to the figure's width with it.
CAPTION_CHAR_WIDTH = 0.56


def caption(fig, *lines):
    """Small grey text under the panels: what the marks mean, where the numbers come from; wrapped
    to the figure's width so that no character falls off either side."""
    width_points = fig.get_figwidth() * 72 * 0.96
    columns = max(20, int(width_points / (CAPTION_POINTS * CAPTION_CHAR_WIDTH)))
    wrapped = [part for line in lines if line for paragraph in line.split("\n")
               for part in (textwrap.wrap(paragraph, columns) or [""])]
    fig.supxlabel("\n".join(wrapped), fontsize=CAPTION_POINTS, color="#444444")


def save(fig: Figure, stem: Path) -> list[Path]:
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    fig.savefig(paths[0], dpi=150)
    fig.savefig(paths[1])
    return paths


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


def ratio_axis(ax, values) -> None:
    """A ratio's y axis: logarithmic, so a speedup of 2 and a slowdown to 1/2 lie equally far from
    1 and one wide interval cannot squeeze every other cell against the floor; its limits are
    symmetric about 1 and hold every value given (points and interval ends)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    values = np.asarray(pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce"), float)
    values = values[np.isfinite(values) & (values > 0)]
    reach = float(np.abs(np.log(values)).max()) if values.size else 0.0
    reach = max(reach, np.log(1.25)) * 1.1
    ax.set_yscale("log")
    ax.set_ylim(np.exp(-reach), np.exp(reach))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_speedup_curve(cells: pd.DataFrame, note: str = "") -> Figure:
    """(a) speedup vs concurrency, log2 x, one line per ctx_len (and per varied quant/k/T/rule);
    (b) speedup vs ctx_len, one line per concurrency. Lossless cells only."""
    cells = lossless_cells(cells)
    fig, (ax_c, ax_x) = new_figure(13, 4.6, 2)
    if cells.empty:
        for ax in (ax_c, ax_x):
            empty_panel(ax, "no lossless spec-on cell")
        return fig
    dims = varied(cells)
    for axis, other, ax in (("concurrency", "ctx_len", ax_c), ("ctx_len", "concurrency", ax_x)):
        lines = list(cells.groupby([other] + dims, dropna=False, sort=True))
        for color, (_, line) in zip(colors(len(lines)), lines):
            line = line.sort_values(axis)
            _errorbar(ax, line[axis].to_numpy(float), line, label(line.iloc[0], [other] + dims),
                      color=color)
        ax.axhline(1.0, color="black", ls="--", lw=1, label="break-even (1.0)")
        ratio_axis(ax, pd.concat([cells[c] for c in ("speedup", "speedup_lo", "speedup_hi") if c in cells]))
        ax.set_ylabel("speedup  tps(spec on) / tps(spec off), log")
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
    caption(fig, f"{BAND_CAPTION}; lossless cells only (hollow markers: `numeric` lossless verdict).", note)
    return fig


def _bar_rows(traces: pd.DataFrame) -> pd.DataFrame:
    """One row per bar: each off row, followed by its regime's lossless on rows."""
    keep = (traces["spec_decode"] == "off") | traces["lossless_ok"].fillna(False).astype(bool)
    return ordered(traces[keep])


def _bar_label(row, dims) -> str:
    regime = label(row, ["quant_bits", "ctx_len", "concurrency"] + dims)
    if row["spec_decode"] == "off":
        return f"{regime} | off"
    return f"{regime} | on k={fmt(row['k'], 0)}"


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
    fig, axes = new_figure(12, 2.0 + 0.3 * max(len(rows), 1), 2)
    if rows.empty:
        for ax in axes:
            empty_panel(ax, "no cell")
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
        if ax is axes[1]:  # the engine's own share of generation, where recorded
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
    caption(fig, "white 'other': total_ms not covered by the step timers. 'own': the engine's own share of "
                  "generation (not inside llama.cpp calls; red above 1 %). Failed lossless cells left out.", note)
    return fig


def _identity_panel(ax, table, x_cols, y_col, title, unit):
    series = ((x_cols[0], "o", "#4e79a7", "α = accepted / drafted (schema)"),
              (x_cols[1], "s", "#f28e2b", "α per reached draft (token_accept_rate)"))
    for x_col, marker, color, name in series:
        ax.scatter(table[x_col], table[y_col], marker=marker, color=color, label=name, zorder=3)
    values = pd.concat([table[x_cols[0]], table[x_cols[1]], table[y_col]]).dropna()
    lo, hi = (values.min(), values.max()) if len(values) else (0.0, 1.0)
    pad = 0.08 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="black", lw=1, ls="--", label="y = x")
    ax.set_xlabel(f"closed form (acceptance i.i.d. at rate alpha), {unit}")
    ax.set_ylabel(f"measured, {unit}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_theory(table: pd.DataFrame, note: str = "") -> Figure:
    """(a) predicted_speedup(alpha, k, c) vs measured speedup; (b) expected_tokens_per_round
    vs measured tau. One point per lossless cell, for both definitions of alpha."""
    fig, (ax_s, ax_t) = new_figure(11, 4.6, 2)
    if table.empty:
        for ax in (ax_s, ax_t):
            empty_panel(ax, "no lossless spec-on cell")
        return fig
    _identity_panel(ax_s, table, ("predicted", "predicted_token"), "speedup",
                    r"(a) speedup $\frac{1-\alpha^{k+1}}{(1-\alpha)(1+c)}$", "speedup")
    _identity_panel(ax_t, table, ("tau_expected", "tau_expected_token"), "tau",
                    r"(b) tokens per round $\tau$ vs $\frac{1-\alpha^{k+1}}{1-\alpha}$", "tau")
    caption(fig, "points off y = x: acceptance is not i.i.d. across positions (see "
                  "acceptance_by_position), or alpha's definition.", note)
    return fig


def plot_acceptance_by_position(cells: pd.DataFrame, note: str = "") -> Figure:
    """(a) accept_at_pos as recorded, (b) acceptance of a position once reached: flat if alpha
    does not decay with draft position. One line per lossless cell."""
    cells = lossless_cells(cells)
    cells = cells[cells["accept_at_pos"].notna()]
    fig, (ax_a, ax_c) = new_figure(11, 4.6, 2)
    if cells.empty:
        for ax in (ax_a, ax_c):
            empty_panel(ax, "no per-position acceptance recorded")
        return fig
    keys = ["ctx_len", "concurrency"] + varied(cells)
    for color, (_, cell) in zip(colors(len(cells)), cells.iterrows()):
        raw = floats(cell["accept_at_pos"])
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
    caption(fig, "(b) is flat when acceptance is i.i.d., the closed form's assumption; its last "
                  "positions are biased where rounds near the end of n_predict drafted fewer than k.",
             note)
    return fig
