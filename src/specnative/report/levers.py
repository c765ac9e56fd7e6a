"""summary.md's "Do the levers add?" section and the interaction figure, from analysis/factorial.py's
estimates: the 2x2 of quantization x speculation per regime, the combined gain against the product
of the separate gains, and the interaction terms of the log-linear model that are decided at 95 %.
"""
from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from specnative.analysis.factorial import REGIME_FACTORS, TwoByTwo, level_order, reference_levels
from specnative.analysis.stats import geometric_interval
from specnative.report.figures import caption, colors, empty_panel, new_figure, ratio_axis
from specnative.report.text import fmt, md_table

METRICS = {"tps": "decode tokens/s (steady state)", "e2e_tps": "end-to-end tokens/s (prefill included)"}


def interval_text(iv) -> str:
    if iv is None:
        return "n/a"
    if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return f"{fmt(iv.estimate)}"
    return f"{fmt(iv.estimate)} [{fmt(iv.low)}, {fmt(iv.high)}]"


def regime_label(regime: dict, shown: list[str]) -> str:
    return ", ".join(f"{k} {regime[k]}" for k in shown) or "the one regime"


def two_by_two_md(tables: list[TwoByTwo], tidy: pd.DataFrame) -> str:
    on = tidy[tidy["spec_decode"] == "on"]  # spec_method "off" is not a regime of its own
    shown = [f for f in REGIME_FACTORS if f in on and on[f].astype(str).nunique() > 1]
    rows = []
    for t in tables:
        product = (f"{fmt(t.g_q.estimate * t.g_s.estimate)}" if t.g_q and t.g_s else "n/a")
        rows.append([regime_label(t.regime, shown), interval_text(t.g_q), interval_text(t.g_s),
                     interval_text(t.combined), product, interval_text(t.interaction), t.reading])
    low, high = tables[0].low_bits, tables[0].high_bits
    header = ["regime", f"G_q ({low}- vs {high}-bit, off)", f"G_s (spec, {high}-bit)",
              f"combined ({low}-bit + spec)", "G_q x G_s", "interaction = combined / (G_q G_s)", "reading"]
    return md_table(header, rows)


def answer_line(tables: list[TwoByTwo]) -> str:
    estimated = [t for t in tables if not t.missing and t.interaction is not None]
    unreplicated = [t for t in estimated
                    if not (math.isfinite(t.interaction.low) and math.isfinite(t.interaction.high))]
    estimated = [t for t in estimated if t not in unreplicated]
    below = [t for t in estimated if t.interaction.high < 1]
    above = [t for t in estimated if t.interaction.low > 1]
    undecided = len(estimated) - len(below) - len(above)
    missing = len(tables) - len(estimated) - len(unreplicated)
    return (f"In {len(below) + len(above)} of {len(estimated)} regimes with all four cells and an interval the "
            f"combined gain is decidedly not the product of the separate gains ({len(below)} below it: the levers "
            f"overlap; {len(above)} above it); {undecided} add within noise."
            + (f" {len(unreplicated)} regime(s) are undecided: a cell measured once has no interval (too few "
               f"repeats)." if unreplicated else "")
            + (f" {missing} regime(s) have no estimate (a cell missing or judged fail)." if missing else ""))


def model_md(models: dict, tidy: pd.DataFrame) -> str:
    refs = ", ".join(f"{f}={v}" for f, v in reference_levels(tidy).items())
    parts = [f"Log-linear model of the repeats, every varied factor and all two-way interactions (OLS on the "
             f"logs; effects are multiplicative against the reference levels {refs}). Interaction terms decided "
             f"at 95 % (interval excludes 1); every term is in `factorial.csv`:"]
    for metric, table in models.items():
        decided = table[table["interaction"] & table["decided"]] if not table.empty else table
        if table.empty and table.attrs.get("why"):
            parts.append(f"- {METRICS[metric]}: nothing decided: {table.attrs['why']}.")
            continue
        if decided.empty:
            parts.append(f"- {METRICS[metric]}: no two-way interaction decided.")
            continue
        rows = [[r["term"], f"{r['effect']:.3f}", f"[{r['low']:.3f}, {r['high']:.3f}]", f"{r['p_value']:.2g}"]
                for _, r in decided.sort_values("p_value").iterrows()]
        parts.append(f"{METRICS[metric]}:\n\n" + md_table(["interaction", "effect", "95 % interval", "p"], rows))
    return "\n\n".join(parts)


def section_md(tables: list[TwoByTwo], models: dict, tidy: pd.DataFrame) -> str | None:
    """None when the run crosses no lever with speculation (nothing to say). A model that could
    decide nothing (every cell measured once) keeps the section, saying why."""
    if not tables and not any(not m.empty or m.attrs.get("why") for m in models.values()):
        return None
    parts = []
    if tables:
        parts += [answer_line(tables), two_by_two_md(tables, tidy)]
    else:
        parts.append("One bit width only: no 2x2 of quantization x speculation (give two targets, e.g. Q4 and Q8).")
    if models:
        parts.append(model_md(models, tidy))
    return "\n\n".join(parts)


def models_frame(models: dict) -> pd.DataFrame:
    return pd.concat([m.assign(metric=metric) for metric, m in models.items()], ignore_index=True) if models \
        else pd.DataFrame()


def plot_interactions(tidy: pd.DataFrame, note: str) -> Figure:
    """Speculation's speedup against each factor the run varies, one line per level of every other
    factor (parallel lines: the levers add; crossing or converging lines: they interact), with the
    95 % interval of each cell's speedup over its repeats."""
    on = tidy[(tidy["spec_decode"] == "on") & (tidy["verdict"] != "fail") & tidy["speedup"].notna()]
    axes_factors = [f for f in ("quant_bits", "concurrency", "ctx_len", "prefix_cache", "spec_method")
                    if f in on and on[f].astype(str).nunique() > 1]
    fig, axes = new_figure(4.2 * max(len(axes_factors), 1), 3.6, ncols=max(len(axes_factors), 1))
    if on.empty or not axes_factors:
        empty_panel(axes[0], "no factor besides speculation varies")
        caption(fig, note)
        return fig
    for ax, factor in zip(axes, axes_factors):
        others = [f for f in axes_factors if f != factor]
        drawn = []
        levels = sorted(on[factor].astype(str).unique(), key=level_order)
        groups = list(on.groupby([on[o].astype(str) for o in others], sort=True)) if others else [((), on)]
        for color, (key, group) in zip(colors(len(groups)), groups):
            xs, ys, lo, hi = [], [], [], []
            for i, level in enumerate(levels):
                values = group[group[factor].astype(str) == level]["speedup"].tolist()
                if not values:
                    continue
                iv = geometric_interval(values)
                xs.append(i)
                ys.append(iv.estimate)
                drawn += [iv.estimate, iv.low, iv.high]
                lo.append(iv.estimate - iv.low if math.isfinite(iv.low) else 0.0)
                hi.append(iv.high - iv.estimate if math.isfinite(iv.high) else 0.0)
            key = key if isinstance(key, tuple) else (key,)
            label = ", ".join(f"{o} {v}" for o, v in zip(others, key)) or "speedup"
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=color, label=label)
        ax.axhline(1.0, color="0.4", lw=0.8, ls="--")
        ratio_axis(ax, drawn)
        ax.set_xticks(range(len(levels)), levels)
        ax.set_xlabel(factor)
        ax.set_ylabel("speedup of speculation (log)")
        ax.legend(fontsize=6)
    caption(fig, "Parallel lines: the factor and speculation add (multiplicatively); converging or crossing "
                 "lines: they interact. Error bars: 95 % interval over the repeats. y axis logarithmic, symmetric "
                 "about 1.", note)
    return fig


