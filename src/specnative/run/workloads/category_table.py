"""Per-category results on a public set, in Spec-Bench's shape, and the prompt-copy share.

Spec-Bench reports, per task category and per method, the speedup and the mean accepted tokens.
Here each category gets, per drafter (and k): α = accepted / drafted with an interval over the
category's cells, τ = emitted / rounds (the bonus token included: Spec-Bench's "#mean accepted
tokens"), the speedup with an interval over the cells, and the prompt-copy share.

The prompt-copy share of a sequence is the fraction of its emitted tokens that lie inside an
n-gram (n = COPY_NGRAM) of the output that also occurs in its prompt: what an n-gram drafter can
find by lookup. It is computed here only (the sweep calls prompt_copy_share per cell).
"""
from __future__ import annotations

import math

import pandas as pd

from specnative.analysis import stats

COPY_NGRAM = 4


def copied_tokens(prompt, output, n: int = COPY_NGRAM) -> int:
    """Tokens of `output` covered by an n-gram of `output` that also occurs in `prompt`."""
    prompt, output = [int(t) for t in prompt], [int(t) for t in output]
    grams = {tuple(prompt[i:i + n]) for i in range(len(prompt) - n + 1)}
    covered = [False] * len(output)
    for j in range(len(output) - n + 1):
        if tuple(output[j:j + n]) in grams:
            covered[j:j + n] = [True] * n
    return sum(covered)


def prompt_copy_share(prompts, outputs, n: int = COPY_NGRAM) -> float:
    """Mean over a cell's distinct prompts of copied_tokens / emitted tokens (NaN: nothing emitted).
    A prompt a batch repeats (cycled to fill it) counts once."""
    shares = {}
    for prompt, output in zip(prompts, outputs):
        if len(output):
            shares.setdefault(tuple(int(t) for t in prompt), copied_tokens(prompt, output, n) / len(output))
    return sum(shares.values()) / len(shares) if shares else math.nan


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------
REGIME = ["dataset", "target_model", "temperature", "ctx_len", "concurrency"]


def _fmt(value, digits: int = 2) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _with_interval(interval: stats.Interval) -> str:
    if not math.isfinite(interval.estimate):
        return "n/a"
    if not math.isfinite(interval.low):
        return f"{_fmt(interval.estimate)} (1 cell)"
    return f"{_fmt(interval.estimate)} [{_fmt(interval.low)}, {_fmt(interval.high)}]"


def _speedup_interval(rows: pd.DataFrame, level: float) -> stats.Interval:
    values = [v for v in rows["speedup"].astype(float) if v > 0 and math.isfinite(v)]
    if not values:
        return stats.Interval(math.nan, math.nan, math.nan, level, 0)
    return stats.geometric_interval(values, level)


def _drafter_cells(rows: pd.DataFrame, level: float) -> list[str]:
    """α [interval], τ, speedup [interval] of one drafter's cells of one category."""
    alpha = stats.ratio_interval(rows["accepted"].astype(float), rows["drafted"].astype(float), level)
    rounds = rows["rounds"].astype(float).sum()
    tau = rows["emitted"].astype(float).sum() / rounds if rounds else math.nan
    return [_with_interval(alpha), _fmt(tau), _with_interval(_speedup_interval(rows, level))]


def _copy_share(rows: pd.DataFrame) -> float:
    """Mean prompt-copy share over the category's distinct cells (one per prompt batch)."""
    cells = rows.drop_duplicates("prompts_sha256")["prompt_copy_share"].astype(float).dropna()
    return float(cells.mean()) if len(cells) else math.nan


def _method(row) -> str:
    return f"{row['drafter'] or 'model'} k={int(row['k'])}"


def _groups(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Each category, then (MT-Bench) each turn over all categories, then all cells."""
    groups = [(str(c), part) for c, part in rows.groupby(rows["task"].astype(str), sort=False)]
    turns = rows["turn"].dropna().unique()
    if len(turns) > 1:
        groups += [(f"*turn {int(t)}, all categories*", rows[rows["turn"] == t]) for t in sorted(turns)]
    if len(groups) > 1:
        groups.append(("**all**", rows))
    return groups


def regime_table(on: pd.DataFrame, level: float) -> str:
    methods = list(dict.fromkeys(_method(r) for _, r in on.iterrows()))
    headers = ["category", "cells", "prompt copy"]
    for method in methods:
        headers += [f"{method}: α", "τ", "speedup"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for name, part in _groups(on):
        by_method = {m: part[[_method(r) == m for _, r in part.iterrows()]] for m in methods}
        # a batch of items counts once (by its ids: a turn-2 prompt holds a run's own turn-1 answer)
        cells = part.drop_duplicates("prompt_ids" if part["prompt_ids"].notna().all() else "prompts_sha256")
        row = [name, str(len(cells)), _fmt(_copy_share(part))]
        for method in methods:
            row += _drafter_cells(by_method[method], level) if len(by_method[method]) else ["–"] * 3
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def section_md(traces: pd.DataFrame) -> str | None:
    """The report's per-category section for the traces' public-set rows (None: there are none).
    Lossless spec-on cells only; each cell (a batch of prompts) counts once per drafter and k."""
    if "dataset" not in traces or traces["dataset"].isna().all():
        return None
    public = traces[traces["dataset"].notna()]
    on = public[(public["spec_decode"] == "on") & (public["lossless_ok"].fillna(False).astype(bool))]
    left_out = int(((public["spec_decode"] == "on") & ~public["lossless_ok"].fillna(False).astype(bool)).sum())
    level = float(public["ci_level"].dropna().iloc[0]) if public["ci_level"].notna().any() else 0.95
    parts = [f"Spec-Bench's shape: per category and drafter, α = accepted / drafted with its {level:.0%} interval "
             f"over the category's cells (a ratio estimator: each cell, one batch of prompts, is one sample), τ = "
             f"emitted / rounds (bonus token included: Spec-Bench's #mean accepted tokens), and the speedup (geometric "
             f"mean of the cells' speedups, t interval over the cells) [self-measured]. Prompt copy: the share of "
             f"emitted tokens inside a {COPY_NGRAM}-gram that also occurs in the prompt (baseline output), mean over "
             f"the cells. Lossless cells only" + (f" ({left_out} on-row(s) left out)." if left_out else ".")]
    if on.empty:
        return parts[0] + "\n\nNo lossless spec-on cell of a public set."
    for keys, part in on.groupby(REGIME, sort=False, dropna=False):
        regime = dict(zip(REGIME, keys))
        parts.append(f"**{regime['dataset']}**, target {regime['target_model']}, T={regime['temperature']:g}, "
                     f"ctx_len {regime['ctx_len']}, concurrency {regime['concurrency']}\n\n"
                     + regime_table(part, level))
    return "\n\n".join(parts)
