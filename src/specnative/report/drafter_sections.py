"""Report sections on what the user chooses beside on/off: the task category, the drafter, the draft
length k and the draft stop rule p_min (tables and figures)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure  # Agg canvas on savefig; pyplot is never imported

from specnative.analysis.advisor import (
    REGIME_KEYS,
    Thresholds,
    as_float,
    drafter_advice,
    k_advice,
    p_min_advice,
    task_decision,
)
from specnative.report.cells import label, lossless_cells, varied
from specnative.report.figures import caption, colors, empty_panel, new_figure
from specnative.report.text import floats, fmt, md_table


def plot_by_task(summary: pd.DataFrame, note: str = "") -> Figure:
    """(a) alpha pooled over each task's lossless cells, tau written on the bar; (b) the median
    speedup over those cells with their lowest and highest as the bar. Tasks by alpha."""
    fig, (ax_a, ax_s) = new_figure(12, 1.6 + 0.4 * max(len(summary), 1), 2)
    summary = summary[summary["lossless_cells"] > 0] if not summary.empty else summary
    if summary.empty:
        for ax in (ax_a, ax_s):
            empty_panel(ax, "no lossless spec-on cell")
        return fig
    summary = summary.sort_values("alpha").reset_index(drop=True)
    y = np.arange(len(summary))
    ax_a.barh(y, summary["alpha"], color="#4e79a7")
    for i, row in summary.iterrows():
        ax_a.text(row["alpha"], i, f" τ {fmt(row['tau'])}", va="center", fontsize=8)
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
    caption(fig, "Cells of every context length, concurrency and target are pooled per task; lossless "
                  "cells only. See the cells table for each regime.", note)
    return fig


def _task_names(tasks: list) -> str:
    """'code-completion, code-editing, code-explanation, chat' -> 'code (completion, editing,
    explanation), chat': categories sharing a 'family-' prefix are said together."""
    families = {}
    for task in tasks:
        family, _, rest = str(task).partition("-")
        families.setdefault(family if rest else task, []).append(rest if rest else None)
    parts = []
    for family, members in families.items():
        named = [m for m in members if m]
        parts.append(f"{family} ({', '.join(named)})" if len(named) > 1 else
                     f"{family}-{named[0]}" if named else family)
    return ", ".join(parts)


def task_advice(summary: pd.DataFrame) -> str:
    """One line, e.g. 'on for code (completion, editing); off for chat, translation; depends on
    the regime for math'."""
    if summary.empty:
        return "No spec-on cell to judge by task."
    said = {"on": "on for", "off": "off for", "measure-more": "measure more for",
            "depends": "depends on the regime for"}
    groups = {}
    for _, row in summary.iterrows():
        groups.setdefault(task_decision(row), []).append(row)
    parts = []
    for decision in (d for d in said if d in groups):
        rows = groups[decision]
        if decision != "measure-more":
            parts.append(f"{said[decision]} {_task_names([r['task'] for r in rows])}")
            continue
        # undecided: say which side of break-even the measured speedups lean to so far
        for lean, test in (("above", lambda v: v >= 1.0), ("below", lambda v: v < 1.0)):
            named = [r["task"] for r in rows if math.isfinite(as_float(r["speedup_median"]))
                     and test(as_float(r["speedup_median"]))]
            if named:
                parts.append(f"{said[decision]} {_task_names(named)} (median speedup {lean} 1 so far)")
        unmeasured = [r["task"] for r in rows if not math.isfinite(as_float(r["speedup_median"]))]
        if unmeasured:
            parts.append(f"{said[decision]} {_task_names(unmeasured)}")
    return "; ".join(parts)


def task_md(summary: pd.DataFrame) -> str:
    if summary.empty:
        return "No spec-on cell."
    rows = [[r["task"], f"{r['lossless_cells']}/{r['cells']}", fmt(r["alpha"]), fmt(r["tau"]),
             f"{fmt(r['speedup_median'])} ({fmt(r['speedup_min'])}–{fmt(r['speedup_max'])})",
             f"{r['n_on']} / {r['n_off']} / {r['n_measure_more']}"]
            for _, r in summary.sort_values("alpha", ascending=False).iterrows()]
    return (f"**By task: {task_advice(summary)}.**\n\n"
            "α and τ pooled over each task's lossless cells (summed counts); speedup: median over "
            "those cells (lowest–highest). Decisions: the advisor's per regime, above.\n\n"
            + md_table(["task", "lossless cells", "α", "τ", "speedup [self-measured]",
                        "regimes on / off / measure-more"], rows)
            + "\n\n![by task](by_task.png)")


def has_several_drafters(traces: pd.DataFrame) -> bool:
    """Whether more than one drafter was measured: only then is there a drafter to pick (the
    "Which drafter" section and by_drafter.png)."""
    return "drafter" in traces and traces["drafter"].dropna().nunique() > 1


def by_drafter(cells: pd.DataFrame) -> pd.DataFrame:
    """Per task and drafter, over lossless cells: alpha and tau on summed counts, drafted tokens
    per round, share of rounds without a draft, median c and median speedup (lowest-highest)."""
    from specnative.engine import native

    kept = lossless_cells(cells)
    rows = []
    for (task, drafter), group in kept.groupby([kept["task"].fillna("(not recorded)"),
                                                kept["drafter"].fillna("model")], sort=True):
        counts = {c: int(group[c].fillna(0).sum()) for c in ("drafted", "accepted", "rejected", "rounds", "emitted")}
        rates = native.accept_rates(**counts)
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
    fig, (ax,) = new_figure(10, 1.8 + 0.5 * max(len(tasks), 1) * max(summary["drafter"].nunique(), 1)
                             if not summary.empty else 3)
    if summary.empty:
        empty_panel(ax, "no lossless spec-on cell")
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
                ax.text(0.02, yy, f"α {fmt(a)} τ {fmt(tau)}", va="center", fontsize=7)
    ax.axvline(1.0, color="black", ls="--", lw=1)
    ax.set_yticks(np.arange(len(tasks)) + 0.4 - height / 2, tasks)
    ax.set_xlabel("speedup: median over the cells of the task (bar: lowest to highest)")
    ax.set_title("Which drafter pays, by task")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    caption(fig, "Lossless cells only; α = accepted / drafted, τ = tokens per sequence-round (bonus included).",
             note)
    return fig


def drafters_md(traces: pd.DataFrame, cells: pd.DataFrame, thresholds: Thresholds) -> str:
    advice = drafter_advice(traces, thresholds)
    keys = [k for k in REGIME_KEYS if k != "drafter" and k in advice and advice[k].nunique(dropna=False) > 1] \
        or ["concurrency"]
    regime_rows = [[label(r, keys), f"**{r['recommend']}**", fmt(r["speedup"]), r["ranking"]]
                   for _, r in advice.iterrows()]
    summary = by_drafter(cells)
    task_rows = [[r["task"], r["drafter"], r["cells"], fmt(r["alpha"]), fmt(r["tau"]), fmt(r["draft_len"]),
                  fmt(r["empty"]), fmt(r["c"]),
                  f"{fmt(r['speedup'])} ({fmt(r['speedup_min'])}–{fmt(r['speedup_max'])})"]
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
    fig, (left, right) = new_figure(11, 4, ncols=2)
    if rows.empty:
        empty_panel(left, "no cost curve")
        empty_panel(right, "no prediction")
        return fig
    keys = varied(rows, [k for k in REGIME_KEYS if k != "k"]) or ["concurrency"]
    for (_, r), color in zip(rows.iterrows(), colors(len(rows))):
        name = label(r, keys)
        verify = floats(r["verify_ms_by_len"])
        left.plot(range(1, len(verify) + 1), verify, "o-", color=color, label=name)
        left.plot([1], [as_float(r["draft_ms_per_pos"])], "x", color=color, ms=9)
        predicted = floats(r["predicted_speedup_by_k"])
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
    caption(fig, "Prediction from the run at the largest k: tau from its accepted-length histogram, "
             "T_round from the verify-cost curve (one decode timed per draft length) anchored at that run.", note)
    return fig


def which_k_md(traces: pd.DataFrame) -> str:
    advice = k_advice(traces)
    if advice.empty:
        return "No draft-model cell with a cost curve."
    keys = [k for k in REGIME_KEYS if k in advice and advice[k].nunique(dropna=False) > 1] or ["concurrency"]
    rows = []
    for _, r in advice.iterrows():
        check = (f"{int(r['check_k'])}: {fmt(r['check_speedup'])}" if pd.notna(r["check_k"]) else "not run")
        rows.append([label(r, [k]) for k in keys]  # one column per key, as in the advice table
                    + [r["k_max"], f"**{r['recommend']}**", fmt(r["predicted_speedup"]), check,
                       " ".join(fmt(v) for v in floats(r["predicted_by_k"]))])
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
            + [fmt(r["fixed_speedup"]), fmt(r["fixed_draft_len"]), f"{r['best_p_min']:g}",
               fmt(r["p_min_speedup"]), fmt(r["p_min_draft_len"]), f"**{r['recommend']}**", r["ranking"]]
            for _, r in advice.iterrows()]
    return (intro + " Recommended: among the variants the advisor calls on, the highest lower bound of the "
            "speedup interval.\n\n"
            + md_table(keys + ["fixed k: speedup", "fixed k: draft len", "best p_min", "p_min: speedup",
                               "p_min: draft len", "recommended", "all variants"], rows))
