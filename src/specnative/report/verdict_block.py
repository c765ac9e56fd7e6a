"""The answer first: summary.md's opening block. In which regimes speculation pays (the advisor's
decisions, counted and listed), the best and the worst cell with their intervals, the draft length
to use, and how many cells were judged exact / numeric / exact-dist / fail. Everything here is read
off the advisor's verdicts and traces.csv; nothing is computed that the sections below do not show.
"""
from __future__ import annotations

import math

import pandas as pd

from specnative.analysis.advisor import MORE, OFF, ON, as_float
from specnative.lossless.verdicts import VERDICTS
from specnative.record.schema import is_tree_row
from specnative.report.text import fmt

# Regime keys worth naming in a one-line description (the rest are usually constant in a run).
NAMED_KEYS = ("quant_bits", "ctx_len", "concurrency", "k", "temperature", "task", "drafter", "prefix_cache")


def regime_text(row, varying: list[str]) -> str:
    """'Q4 ctx 8192 x4 k4' style: only the keys that vary across the run's regimes."""
    parts = []
    for key in varying:
        value = row.get(key)
        if value is None or (not isinstance(value, str) and pd.isna(value)):
            continue
        if key == "quant_bits":
            parts.append(f"{int(as_float(value))}-bit")
        elif key == "ctx_len":
            parts.append(f"ctx {int(as_float(value))}")
        elif key == "concurrency":
            parts.append(f"x{int(as_float(value))}")
        elif key == "k":
            parts.append(f"k={int(as_float(value))}")
        elif key == "temperature":
            parts.append(f"T={as_float(value):g}")
        elif key == "prefix_cache":
            parts.append(f"prefix cache {value}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts) or "the one regime"


def varying_keys(verdicts: pd.DataFrame) -> list[str]:
    return [k for k in NAMED_KEYS if k in verdicts and verdicts[k].astype(str).nunique(dropna=False) > 1]


def interval_of(row) -> str:
    low, high = as_float(row.get("speedup_lo")), as_float(row.get("speedup_hi"))
    if math.isfinite(low) and math.isfinite(high):
        return f"{fmt(row.get('speedup'))}x [{fmt(low)}, {fmt(high)}]"
    return f"{fmt(row.get('speedup'))}x"


def decision_lines(verdicts: pd.DataFrame) -> list[str]:
    varying = varying_keys(verdicts)
    counts = verdicts["decision"].value_counts()
    n_on, n_off, n_more = (int(counts.get(d, 0)) for d in (ON, OFF, MORE))
    lines = [f"- **Speculation pays in {n_on} of {len(verdicts)} regimes** (speedup interval above 1), loses in "
             f"{n_off}, undecided in {n_more}."]
    for decision, label in ((ON, "pays"), (OFF, "loses")):
        chosen = verdicts[verdicts["decision"] == decision]
        if not chosen.empty:
            names = ", ".join(regime_text(row, varying) for _, row in chosen.iterrows())
            lines.append(f"- {label}: {names}")
    return lines


def extremes_lines(verdicts: pd.DataFrame) -> list[str]:
    """The best cell among those whose interval decides that speculation pays, the worst among those
    where it decidedly loses: a point estimate alone (one cell at [0.15, 15.97] on a busy host)
    names no best. Where none is decided, the line says so."""
    measured = verdicts[pd.to_numeric(verdicts["speedup"], errors="coerce").notna()]
    if measured.empty:
        return []
    varying = varying_keys(verdicts)
    pays, loses = (measured[measured["decision"] == d] for d in (ON, OFF))

    def named(frame: pd.DataFrame, largest: bool) -> str:
        speedups = pd.to_numeric(frame["speedup"])
        row = frame.loc[speedups.idxmax() if largest else speedups.idxmin()]
        return f"{regime_text(row, varying)}: {interval_of(row)}"

    best = named(pays, True) if not pays.empty else "undecided (no cell's speedup interval lies above 1)"
    worst = named(loses, False) if not loses.empty else "undecided (no cell's speedup interval lies below 1)"
    return [f"- Best cell: {best}; worst: {worst}."]


def k_line(traces: pd.DataFrame, advice: pd.DataFrame | None, verdicts: pd.DataFrame | None = None) -> str:
    """The recommended k: predicted per regime with --which-k, else the k the run measured (and the
    best cell's, where a cell decidedly pays: extremes_lines)."""
    if advice is not None and not advice.empty:
        picks = advice["recommend"].value_counts()
        text = ", ".join(f"k={k} in {n}" for k, n in picks.items())
        return f"- Recommended draft length (predicted from the verify-cost curve): {text} regime(s)."
    on = traces[traces["spec_decode"] == "on"]
    ks = sorted({int(as_float(k)) for k in on["k"] if math.isfinite(as_float(k))})
    if len(ks) > 1:
        pays = verdicts[verdicts["decision"] == ON] if verdicts is not None and "decision" in verdicts else on.iloc[:0]
        pays = pays[pd.to_numeric(pays["speedup"], errors="coerce").notna()] if "speedup" in pays else pays
        if pays.empty or "k" not in pays:
            return f"- Draft lengths measured: {ks}; no cell decidedly pays, so no best k."
        best = pays.loc[pd.to_numeric(pays["speedup"]).idxmax()]
        return f"- Draft lengths measured: {ks}; the best cell used k={int(as_float(best['k']))}."
    return (f"- Draft length measured: k={ks[0] if ks else 'n/a'} (add --which-k to predict the speedup at "
            f"every shorter k).")


def verdicts_of(on: pd.DataFrame) -> pd.Series:
    """Each on row's verdict; rows written before verdicts had names: `fail` where lossless_ok is
    false, else `lossless` (verdict not recorded)."""
    named = on["verdict"] if "verdict" in on else pd.Series(index=on.index, dtype=object)
    ok = on["lossless_ok"].astype(str).str.lower().isin(["true", "1", "1.0"])
    return named.where(named.notna() & (named.astype(str) != ""), ok.map({True: "lossless", False: "fail"}))


def verdict_counts_line(traces: pd.DataFrame) -> str:
    """Every verdict the run has: chains and draft trees alike (a failing tree counts here too)."""
    on = traces[traces["spec_decode"] == "on"]
    counts = verdicts_of(on).value_counts()
    n_trees = int(is_tree_row(on).sum())
    parts = [f"{int(counts.get(v, 0))} {v}" for v in VERDICTS]
    if counts.get("lossless", 0):
        parts.append(f"{int(counts['lossless'])} lossless (verdict not recorded)")
    fails = int(counts.get("fail", 0))
    tail = " — **a `fail` is a bug: that cell gives no number** (see Lossless check)" if fails else ""
    trees = f" ({n_trees} of them draft trees)" if n_trees else ""
    return f"- Lossless verdicts of the {len(on)} speculative cells{trees}: {', '.join(parts)}{tail}."


def verdict_block(traces: pd.DataFrame, verdicts: pd.DataFrame, advice: pd.DataFrame | None,
                  with_trees: pd.DataFrame | None = None) -> str:
    """The Markdown block summary.md opens with. traces: the chains the decisions are about;
    with_trees: every row, draft trees included, whose verdicts are counted too."""
    with_trees = traces if with_trees is None else with_trees
    trees_only = verdicts.empty and bool(is_tree_row(with_trees).any())
    if trees_only:
        lines = ["- No chain was measured: the draft trees' speedups and verdicts are in \"Trees or chains?\" below."]
    else:
        lines = decision_lines(verdicts) if not verdicts.empty else ["- No speculative cell was measured."]
        lines += extremes_lines(verdicts) if not verdicts.empty else []
        lines.append(k_line(traces, advice, verdicts))
    lines.append(verdict_counts_line(with_trees))
    return "\n".join(lines)

