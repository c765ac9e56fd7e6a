"""The decision flow (docs/advice.md): per regime, should speculative decoding be on, off, or measured
again?

Only measured columns of traces.csv decide, through the speedup's confidence interval (stats.py):
"on" only when its lower bound is above break-even, "off" only when its upper bound is below,
otherwise "measure-more" with the interval shown. A traces.csv from before the intervals falls
back to the range over the repeats (slowest pairing to fastest), judged the same way. The closed form of theory.py never does: it assumes
i.i.d. acceptance and is exactly what the measurement is there to check. Structural rules (draft
too heavy, alpha low, compute saturated, long context) explain an `off` and warn on an `on`; they
never overturn a speedup that was measured clearly above break-even.

    >>> verdicts = advise(load_traces("runs/x/traces.csv"))
    >>> verdicts_frame(verdicts)          # one row per regime: decision, rule, why
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import pandas as pd

from specnative.analysis import theory
from specnative.record import schema
from specnative.record.factors import FACTORS, FACTOR_NAMES

# A regime is one on-cell. Its baseline is the off row with the same BASELINE_KEYS (off rows
# carry no draft columns, so k and accept_rule cannot be part of the join).
_CELL_KEYS = ("quant_bits", "ctx_len", "concurrency", "k", "temperature", "accept_rule", "task", "drafter",
              "draft_p_min", "prefix_cache")
REGIME_KEYS = _CELL_KEYS + tuple(name for name in FACTOR_NAMES if name not in _CELL_KEYS)
# (record/factors.py: on rows at a factor's default read as it)
# (drafter: each drafter's cell measured its own baseline beside it; empty in older traces;
# draft_p_min likewise, 0 = fixed k, filled in by load_traces for off rows and older traces)
BASELINE_KEYS = ("target_model", "quant_bits", "ctx_len", "concurrency", "temperature", "task", "drafter",
                 "draft_p_min", "prompts_sha256", "prefix_cache")
# (prompts_sha256: a public set's task has a cell per batch of prompts, each with its own baseline)
# Off-row columns a regime needs: the baseline's rate, its spread and its timings.
BASELINE_COLUMNS = ("tps", "tps_std", "tps_min", "tps_max", "repeats", "step_ms", "decode_ms",
                    "prefill_target_ms", "total_ms")

ON, OFF, MORE = "on", "off", "measure-more"


@dataclass(frozen=True)
class Thresholds:
    """What the rules compare against. Defaults: the seed's where it gives one, else ours (why
    beside each)."""

    # the break-even line of the speedup curve.
    break_even: float = 1.0
    # a low acceptance rate (below 0.5) is a reason to turn speculation off. alpha is accepted / drafted,
    # the llama.cpp definition.
    min_alpha: float = 0.5
    # ours: a round costs at least 1 + k * c_draft baseline steps, so at c_draft >= 0.5 and k = 4
    # it needs tau >= 3 (three of four drafts accepted every round) just to break even.
    heavy_draft_c: float = 0.5
    # ours: speedup scales as 1 / (1 + c); a 20 % higher (1 + c) at the longest context than at
    # the shortest costs 20 % of the speedup, well above the few % that repeats vary on a CPU.
    long_ctx_rise: float = 0.20
    # ours: speedup must have fallen >= 10 % from its best at a lower concurrency (and be below
    # break-even) before the fall is blamed on concurrency, not on noise.
    saturation_drop: float = 0.10
    # ours: 2 timed repeats are the fewest that give an interval (the interval, not the count,
    # then says whether they were enough; a fixed count of 3 has none).
    min_repeats: int = 2
    # ours: a speedup range wider than half the speedup itself means at least one run was far
    # off (a quiet machine spreads a few %); the step times are means over those same runs.
    max_rel_spread: float = 0.5
    # ours: a lossless failure where the target's top-2 logits were closer than this is labelled
    # a numeric near-tie (llama.cpp's logits move by ~0.01-0.3 between batch shapes on CPU).
    near_tie_margin: float = 0.5


@dataclass(frozen=True)
class Finding:
    rule: str      # one of RULES ("pays" only as a Verdict's rule: nothing stood in the way)
    message: str   # the rule and its numbers, one line
    values: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    regime: dict             # REGIME_KEYS -> value
    decision: str            # ON, OFF or MORE
    rule: str                # the rule that decided ("pays" when none stood in the way)
    reason: str              # its message
    findings: tuple = ()     # every rule that fired, deciding one included
    speedup: float = math.nan
    speedup_lo: float = math.nan
    speedup_hi: float = math.nan
    interval: str = ""       # what speedup_lo..hi is: "95 % CI" or "range" (older traces)


# --------------------------------------------------------------------------------------------
# Loading and pairing on-cells with their baselines

def load_traces(source, synthetic: bool = False) -> pd.DataFrame:
    """traces.csv (a path, a run directory, or a DataFrame) with every schema column present;
    a cell written twice (a resumed sweep) keeps its last row. The synthetic acceptance rows (never
    lossless: analysis/break_even.py) only with `synthetic`: every verdict, advice and gate is about
    real drafters."""
    if isinstance(source, pd.DataFrame):
        frame = source.copy()
    else:
        path = Path(source)
        frame = schema.read_traces(path / "traces.csv" if path.is_dir() else path)
    frame = schema.with_all_columns(frame)
    keyed = frame["cell_id"].notna()
    frame = pd.concat([frame[keyed].drop_duplicates("cell_id", keep="last"), frame[~keyed]])
    frame = frame if synthetic else schema.real_rows(frame)
    return with_p_min(frame.sort_index().reset_index(drop=True))


def _p_min_of_cell_id(cell_id) -> float:
    """The stop rule's p from a cell_id (sweep.Cell.key adds '|pmin=P' only when P > 0)."""
    if isinstance(cell_id, str):
        for part in cell_id.split("|"):
            if part.startswith("pmin="):
                return float(part[5:])
    return 0.0


def with_p_min(frame: pd.DataFrame) -> pd.DataFrame:
    """draft_p_min on every row: the column where written (on rows of draft-model cells), else from
    the cell_id (off rows), else 0 (fixed k; older traces, n-gram cells), so that a p_min cell's
    on rows pair with its own baseline and stay apart from the fixed-k cell of the same regime."""
    frame = frame.copy()
    column = frame["draft_p_min"] if "draft_p_min" in frame else pd.Series(math.nan, index=frame.index)
    parsed = frame["cell_id"].map(_p_min_of_cell_id) if "cell_id" in frame else 0.0
    frame["draft_p_min"] = pd.to_numeric(column, errors="coerce").fillna(parsed).fillna(0.0).astype(float)
    # the prefix cache likewise: runs before the axis shared the prefix (on); serve rows say theirs
    shared = pd.Series("on", index=frame.index)
    if "request_rate" in frame:  # serve levels shared nothing before the axis
        shared[frame["request_rate"].notna()] = "off"
    frame["prefix_cache"] = frame["prefix_cache"].fillna(shared) if "prefix_cache" in frame else shared
    on = frame["spec_decode"] == "on" if "spec_decode" in frame else pd.Series(False, index=frame.index)
    for factor in FACTORS:  # an on row without the factor's column ran at its default (older runs too)
        if factor.name in BASELINE_KEYS:
            continue  # filled in above on every row (the stop rule: its cell's off rows pair by it too)
        column = frame[factor.name] if factor.name in frame else pd.Series(None, index=frame.index, dtype=object)
        frame[factor.name] = column.astype(object).where(~(on & column.isna()), factor.default)
    return frame


def pair_cells(traces: pd.DataFrame) -> pd.DataFrame:
    """On-rows with their off-row baseline joined (columns suffixed `_off`), the speedup filled
    in where the CSV lacks it, and how sure it is as [speedup_lo, speedup_hi]: the confidence
    interval where the CSV has one, else the range over the repeats (column `interval` says
    which)."""
    traces = with_p_min(traces)
    on = traces[traces["spec_decode"] == "on"].reset_index(drop=True)
    off = traces[traces["spec_decode"] == "off"]
    off = off[list(BASELINE_KEYS) + list(BASELINE_COLUMNS)].drop_duplicates(
        list(BASELINE_KEYS), keep="last")
    off = off.rename(columns={c: f"{c}_off" for c in BASELINE_COLUMNS})
    cells = on.merge(off, on=list(BASELINE_KEYS), how="left")
    cells["speedup"] = [_speedup(r) for r in cells.itertuples()]
    bands = [speedup_interval(r) for r in cells.itertuples()]
    cells["speedup_lo"] = [b[0] for b in bands]
    cells["speedup_hi"] = [b[1] for b in bands]
    cells["interval"] = [b[2] for b in bands]
    return cells.sort_values(list(REGIME_KEYS), kind="stable").reset_index(drop=True)


def as_float(value) -> float:
    """A CSV cell as a float; missing (None, NA, NaN) -> NaN."""
    return math.nan if value is None or pd.isna(value) else float(value)


def _speedup(row) -> float:
    recorded = as_float(row.speedup)
    if math.isfinite(recorded):
        return recorded
    baseline = as_float(row.tps_baseline)
    if not math.isfinite(baseline):
        baseline = as_float(row.tps_off)
    return theory.measured_speedup(as_float(row.tps), baseline)


def speedup_band(row) -> tuple[float, float]:
    """The speedup's range over the repeats: slowest spec run over fastest baseline run, and the
    reverse. Wider than a standard error on purpose: the advisor only calls a regime settled when
    even the worst pairing of runs stays on one side of break-even."""
    return (theory.measured_speedup(as_float(row.tps_min), as_float(row.tps_max_off)),
            theory.measured_speedup(as_float(row.tps_max), as_float(row.tps_min_off)))


def speedup_interval(row) -> tuple[float, float, str]:
    """(low, high, what it is): the recorded confidence interval, else speedup_band's range."""
    low, high = as_float(row.speedup_ci_low), as_float(row.speedup_ci_high)
    if math.isfinite(low) and math.isfinite(high):
        level = as_float(row.ci_level)
        return low, high, (f"{level:.0%} CI" if math.isfinite(level) else "CI")
    return (*speedup_band(row), "range")


def has_ci(cell) -> bool:
    return str(cell.get("interval", "")).endswith("CI")


def regime_of(row) -> dict:
    return {key: (None if pd.isna(row[key]) else row[key]) for key in REGIME_KEYS}


# --------------------------------------------------------------------------------------------
# Rules on one cell. Each returns a Finding when it fires, else None.

def _rule_lossless(cell, t: Thresholds):
    ok = cell["lossless_ok"]
    if pd.isna(ok):
        return Finding("lossless-unchecked", "lossless check not recorded: cannot recommend")
    verdict = cell.get("verdict")
    if isinstance(verdict, str) and verdict:  # the three-way verdict of lossless.py
        values = {"first_divergence": as_float(cell["first_divergence"]),
                  "tolerance": as_float(cell.get("noise_tolerance"))}
        if verdict == "fail":
            return Finding("lossless", f"lossless verdict FAIL: {cell.get('verdict_reason')}: a bug, "
                                       f"no number from this cell", values)
        if verdict == "numeric":
            return Finding("numeric-lossless", f"lossless up to the target's own numeric noise: "
                                               f"{cell.get('verdict_reason')}", values)
        return None
    if not ok:
        margin = cell["divergence_margin"]
        # llama.cpp's logits depend on the batch shape (k+1 verify tokens vs 1), so a greedy
        # decision the target barely made can flip: say so, but still never recommend it
        cause = (" — a near-tie: batch-shape numerics of the verify pass, not the acceptance rule"
                 if pd.notna(margin) and margin < t.near_tie_margin else "")
        return Finding("lossless", (f"output differs from the baseline at token "
                                    f"{_fmt(cell['first_divergence'])} (top-2 logit margin "
                                    f"{_fmt(margin)}{cause}): never use a lossy config"),
                       {"first_divergence": as_float(cell["first_divergence"]),
                        "divergence_margin": as_float(cell["divergence_margin"])})
    return None


def _rule_unmeasured(cell, t: Thresholds):
    if not math.isfinite(cell["speedup"]):
        return Finding("unmeasured", "no speedup: the spec-off baseline of this regime is missing")
    return None


def _rule_few_repeats(cell, t: Thresholds):
    used = as_float(cell["repeats_used"])  # adaptive sweeps; older files: the fixed count
    repeats = used if math.isfinite(used) else as_float(cell["repeats"])
    if not repeats >= t.min_repeats:  # also fires on a missing count
        return Finding("few-repeats", f"{_fmt(repeats)} timed repeats < {t.min_repeats}",
                       {"repeats": repeats, "min_repeats": t.min_repeats})
    return None


def _rule_noisy(cell, t: Thresholds):
    s, lo, hi = cell["speedup"], cell["speedup_lo"], cell["speedup_hi"]
    values = {"speedup": s, "speedup_lo": lo, "speedup_hi": hi}
    if has_ci(cell):
        if lo <= t.break_even <= hi:
            stop = cell.get("stop_reason")
            after = f" after {_fmt(cell['repeats_used'])} repeats ({stop})" if pd.notna(stop) else ""
            return Finding("noisy", (f"speedup {s:.2f}, {cell['interval']} {lo:.2f}–{hi:.2f} contains "
                                     f"{t.break_even:g}{after}: measure more"), values)
        return None  # an interval wholly on one side decides, however wide
    if lo <= t.break_even <= hi:  # NaN compares false: no spread, no finding
        return Finding("noisy", (f"speedup {s:.2f} but its range over the repeats {lo:.2f}–{hi:.2f} "
                                 f"straddles {t.break_even:g}"), values)
    if (hi - lo) > t.max_rel_spread * s:
        return Finding("noisy", (f"speedup {s:.2f} ranges {lo:.2f}–{hi:.2f} over the repeats, wider "
                                 f"than {t.max_rel_spread:.0%} of itself: a run was far off"), values)
    return None


def _rule_below_break_even(cell, t: Thresholds):
    # with an interval, its upper bound decides (the point can sit outside a skewed interval)
    if (cell["speedup_hi"] if has_ci(cell) else cell["speedup"]) < t.break_even:
        return Finding("below-break-even",
                       f"speedup {cell['speedup']:.2f}{_interval_text(cell)} < {t.break_even:g}: slower "
                       f"than the target alone",
                       {"speedup": cell["speedup"]})
    return None


def _rule_low_alpha(cell, t: Thresholds):
    alpha = as_float(cell["draft_accept_rate"])
    if alpha < t.min_alpha:
        return Finding("low-alpha", f"alpha {alpha:.2f} < {t.min_alpha:g}",
                       {"alpha": alpha, "min_alpha": t.min_alpha})
    return None


def _rule_heavy_draft(cell, t: Thresholds):
    c_draft = as_float(cell["c_draft"])
    if c_draft >= t.heavy_draft_c:
        return Finding("heavy-draft", (f"a draft step costs {c_draft:.2f} of a target step "
                                       f"(c_draft >= {t.heavy_draft_c:g}): the draft is too "
                                       f"heavy next to the target"),
                       {"c_draft": c_draft, "heavy_draft_c": t.heavy_draft_c})
    return None


CELL_RULES = (_rule_lossless, _rule_unmeasured, _rule_few_repeats, _rule_noisy,
              _rule_below_break_even, _rule_low_alpha, _rule_heavy_draft)


# --------------------------------------------------------------------------------------------
# Rules on a series: the same regime with one axis (concurrency or ctx_len) varied.

def _series(cells: pd.DataFrame, axis: str):
    """Cells that differ only in `axis`, grouped and sorted along it."""
    others = [k for k in REGIME_KEYS if k != axis] + ["target_model", "draft_model"]
    for _, group in cells.groupby(others, dropna=False, sort=False):
        yield group.sort_values(axis)


def _rule_saturation(cells: pd.DataFrame, t: Thresholds):
    """Speedup below break-even here and fallen from its best at a lower concurrency."""
    for group in _series(cells, "concurrency"):
        for position, (index, cell) in enumerate(group.iterrows()):
            lower = group.iloc[:position]
            if lower.empty or not lower["speedup"].notna().any():
                continue
            best = lower.loc[lower["speedup"].idxmax()]
            fell = cell["speedup"] <= best["speedup"] * (1.0 - t.saturation_drop)
            if fell and cell["speedup"] < t.break_even:
                yield index, Finding(
                    "saturation",
                    (f"speedup falls from {best['speedup']:.2f} at concurrency "
                     f"{int(best['concurrency'])} to {cell['speedup']:.2f} at "
                     f"{int(cell['concurrency'])}: batching already uses the compute"),
                    {"speedup": cell["speedup"], "best_speedup": best["speedup"],
                     "best_concurrency": int(best["concurrency"])})


def _rule_long_context(cells: pd.DataFrame, t: Thresholds):
    """(1 + c) at this context clearly above (1 + c) at the series' shortest context."""
    for group in _series(cells, "ctx_len"):
        group = group[group["verify_cost_c"].notna()]
        if len(group) < 2:
            continue
        short = group.iloc[0]
        for index, cell in group.iloc[1:].iterrows():
            rise = (1.0 + cell["verify_cost_c"]) / (1.0 + short["verify_cost_c"]) - 1.0
            if rise >= t.long_ctx_rise:
                yield index, Finding(
                    "long-context",
                    (f"c {cell['verify_cost_c']:.2f} at ctx {int(cell['ctx_len'])} vs "
                     f"{short['verify_cost_c']:.2f} at ctx {int(short['ctx_len'])}: a round costs "
                     f"{rise:.0%} more relative to a step"),
                    {"c": cell["verify_cost_c"], "c_shortest": short["verify_cost_c"],
                     "ctx_shortest": int(short["ctx_len"]), "rise": rise})


SERIES_RULES = (_rule_saturation, _rule_long_context)

# Why an off regime is off: the most actionable cause first (a lighter draft fixes heavy-draft
# and low-alpha at every concurrency; saturation and long context are properties of the regime).
OFF_CAUSES = ("heavy-draft", "low-alpha", "saturation", "long-context", "below-break-even")
UNSETTLED = ("lossless", "lossless-unchecked", "unmeasured", "few-repeats", "noisy")
# Said, never deciding: a `numeric` lossless verdict (the output parts from the baseline only
# where the target's own batch-shape noise explains it).
NOTES = ("numeric-lossless",)
RULES = UNSETTLED + OFF_CAUSES + NOTES


def _decide(cell, findings: list, t: Thresholds) -> Verdict:
    fired = {f.rule: f for f in findings}

    def verdict(decision, finding):
        return Verdict(regime_of(cell), decision, finding.rule, finding.message, tuple(findings),
                       cell["speedup"], cell["speedup_lo"], cell["speedup_hi"], cell["interval"])

    if "lossless" in fired:
        return verdict(OFF, fired["lossless"])
    for rule in UNSETTLED[1:]:
        if rule in fired:
            return verdict(MORE, fired[rule])
    if "below-break-even" in fired:
        return verdict(OFF, next(fired[r] for r in OFF_CAUSES if r in fired))
    pays = Finding("pays", (f"speedup {cell['speedup']:.2f} ({cell['interval']} {_fmt(cell['speedup_lo'])}–"
                            f"{_fmt(cell['speedup_hi'])}) above {t.break_even:g}"),
                   {"speedup": cell["speedup"]})
    return verdict(ON, pays)


def advise(traces, thresholds: Thresholds | None = None) -> list[Verdict]:
    """One Verdict per on-cell (regime) of `traces` (anything load_traces takes)."""
    t = thresholds or Thresholds()
    cells = pair_cells(load_traces(traces))
    findings = {index: [] for index in cells.index}
    for index, cell in cells.iterrows():
        findings[index] += [f for rule in CELL_RULES if (f := rule(cell, t)) is not None]
    # Series rules compare cells with each other: only cells that are lossless and measured
    # well enough take part (a lossy or noisy cell is no reference for anything).
    trusted = [i for i in cells.index if not {f.rule for f in findings[i]} & set(UNSETTLED)]
    for rule in SERIES_RULES:
        for index, finding in rule(cells.loc[trusted], t):
            findings[index].append(finding)
    return [_decide(cells.loc[i], findings[i], t) for i in cells.index]


def verdicts_frame(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per regime: its keys, decision, deciding rule, why, and every other rule that fired."""
    rows = []
    for v in verdicts:
        others = "; ".join(f.message for f in v.findings if f.rule != v.rule)
        rows.append({**v.regime, "decision": v.decision, "rule": v.rule, "reason": v.reason,
                     "speedup": v.speedup, "speedup_lo": v.speedup_lo, "speedup_hi": v.speedup_hi,
                     "interval": v.interval,
                     "also": others})
    return pd.DataFrame(rows)


def threshold_fields() -> list:
    """(name, default, type) of every threshold, for command-line flags."""
    return [(f.name, f.default, type(f.default)) for f in fields(Thresholds)]


def _interval_text(cell) -> str:
    return f" ({cell['interval']} {_fmt(cell['speedup_lo'])}–{_fmt(cell['speedup_hi'])})" if has_ci(cell) else ""


def _fmt(value) -> str:
    value = as_float(value)
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.0f}" if value == int(value) else f"{value:.2f}"


# --------------------------------------------------------------------------------------------
# By task category: acceptance depends on what the sequences write, so the advice can too.

TASK_DECISIONS = (ON, OFF, MORE)


def by_task(traces, thresholds: Thresholds | None = None) -> pd.DataFrame:
    """One row per task (category of the prompts): alpha and tau pooled over its lossless
    on-cells (the engine's definitions, on summed counts), the median speedup and its range over
    those cells, and how many of its regimes the advisor calls on / off / measure-more."""
    from specnative.engine import native

    frame = load_traces(traces)
    cells = pair_cells(frame)
    decisions = verdicts_frame(advise(frame, thresholds))
    rows = []
    for task, group in cells.groupby(cells["task"].fillna("(not recorded)"), sort=False):
        kept = group[group["lossless_ok"].fillna(False).astype(bool)]
        counts = {c: int(kept[c].fillna(0).sum()) for c in ("drafted", "accepted", "rejected", "rounds", "emitted")}
        rates = native.accept_rates(**counts)
        speedups = kept["speedup"].dropna()
        verdicts = decisions[decisions["task"].fillna("(not recorded)") == task]["decision"]
        rows.append({"task": task, "cells": len(group), "lossless_cells": len(kept),
                     "alpha": rates["draft_accept_rate"], "tau": rates["mean_accept_len"],
                     "speedup_median": speedups.median() if len(speedups) else math.nan,
                     "speedup_min": speedups.min() if len(speedups) else math.nan,
                     "speedup_max": speedups.max() if len(speedups) else math.nan,
                     **{f"n_{d.replace('-', '_')}": int((verdicts == d).sum()) for d in TASK_DECISIONS}})
    return pd.DataFrame(rows)


def task_decision(row) -> str:
    """on / off / measure-more when every regime of the task agrees, else 'depends'."""
    counts = {d: row[f"n_{d.replace('-', '_')}"] for d in TASK_DECISIONS}
    decided = [d for d, n in counts.items() if n > 0]
    return decided[0] if len(decided) == 1 else "depends"


# --------------------------------------------------------------------------------------------
# Which drafter: per regime (every key but the drafter), the drafter the measurements favour.

def drafter_advice(traces, thresholds: Thresholds | None = None) -> pd.DataFrame:
    """One row per regime without the drafter key: the recommended drafter and why. Among the
    drafters the advisor calls `on` there, the one whose speedup interval has the highest lower
    bound (the surest gain, not the luckiest); if none is `on`: `none` when every drafter is
    `off`, else `measure-more`. `ranking` lists every drafter's decision and speedup."""
    frame = verdicts_frame(advise(traces, thresholds))
    keys = [k for k in REGIME_KEYS if k != "drafter"]
    if frame.empty:
        return pd.DataFrame(columns=keys + ["recommend", "decision", "speedup", "speedup_lo", "ranking"])
    frame = frame.assign(drafter=frame["drafter"].fillna("model"))
    rows = []
    for regime, group in frame.groupby([frame[k].astype(str) for k in keys], sort=False, dropna=False):
        first = group.iloc[0]
        # the surest gain first (the interval's lower bound); where no interval was recorded (older
        # traces), the speedup itself ranks
        ranked = group.assign(_rank=group["speedup_lo"].fillna(group["speedup"])).sort_values(
            "_rank", ascending=False, na_position="last").drop(columns="_rank")
        ranking = "; ".join(f"{r['drafter']} {r['decision']} {_fmt(r['speedup'])}" for _, r in ranked.iterrows())
        on = ranked[ranked["decision"] == ON]
        if not on.empty:
            best, decision = on.iloc[0], ON
            recommend = best["drafter"]
        elif (group["decision"] == OFF).all():
            best, decision, recommend = ranked.iloc[0], OFF, "none"
        else:
            best, decision, recommend = ranked.iloc[0], MORE, "measure-more"
        rows.append({**{k: first[k] for k in keys}, "recommend": recommend, "decision": decision,
                     "speedup": best["speedup"] if decision == ON else math.nan,
                     "speedup_lo": best["speedup_lo"] if decision == ON else math.nan, "ranking": ranking})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Which k (pick_k.py): per regime without the k key, the draft length to use

K_ADVICE_KEYS = tuple(k for k in REGIME_KEYS if k not in ("k", "drafter"))


def k_advice(traces) -> pd.DataFrame:
    """One row per regime (REGIME_KEYS without k; draft-model cells only, the n-gram drafters'
    k only caps a lookup): the k' with the highest speedup predicted from the run at the
    largest k measured there (its histogram and cost curve), `recommend` = that k' or `none`
    when no k' is predicted above break-even, the predicted speedup, and -- with --check-k --
    the k measured to check it and its measured speedup. Rows without a prediction (traces
    from before the cost curve) are left out, and so are the stop rule's cells (draft_p_min > 0):
    their drafts are not k long, so the fixed-length prediction at k' does not apply to them
    (p_min_advice compares them with fixed k instead)."""
    cells = load_traces(traces)
    cells = cells[(cells["spec_decode"] == "on") & (cells["drafter"].fillna("model") == "model")
                  & cells["recommended_k"].notna()]
    columns = list(K_ADVICE_KEYS) + ["k_max", "recommend", "predicted_speedup", "check_k", "check_speedup",
                                     "predicted_by_k"]
    if cells.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for _, group in cells.groupby([cells[k].astype(str) for k in K_ADVICE_KEYS], sort=False, dropna=False):
        row = group.sort_values("k").iloc[-1]  # the largest k: its prediction covers every k' <= k
        rec = int(row["recommended_k"])
        rows.append({**{k: row[k] for k in K_ADVICE_KEYS}, "k_max": int(row["k"]),
                     "recommend": str(rec) if rec > 0 else "none",
                     "predicted_speedup": as_float(row["recommended_speedup"]),
                     "check_k": row["check_k"], "check_speedup": as_float(row["check_k_speedup"]),
                     "predicted_by_k": row["predicted_speedup_by_k"]})
    return pd.DataFrame(rows, columns=columns)


# --------------------------------------------------------------------------------------------
# The draft stop rule (--draft-p-min) against fixed k: per regime (every key but draft_p_min),
# where both a fixed-k cell (p_min 0) and at least one p_min cell were measured

P_MIN_ADVICE_KEYS = tuple(k for k in REGIME_KEYS if k != "draft_p_min")


def p_min_advice(traces, thresholds: Thresholds | None = None) -> pd.DataFrame:
    """One row per regime (REGIME_KEYS without draft_p_min, draft-model cells) measured both at
    fixed k and with the stop rule: the fixed-k speedup, the best p_min's, their mean draft
    lengths, and `recommend` -- among the variants the advisor calls `on`, the one with the
    highest lower bound of the speedup interval ("fixed k" or "p_min=P"); `none` when every
    variant is off, else `measure-more`. `ranking` lists every variant's decision and speedup.
    A p_min cell pairs with its own baseline, measured beside it, like a drafter's cell."""
    columns = list(P_MIN_ADVICE_KEYS) + ["fixed_speedup", "fixed_draft_len", "best_p_min", "p_min_speedup",
                                         "p_min_draft_len", "recommend", "decision", "ranking"]
    frame = load_traces(traces)
    cells = pair_cells(frame)
    verdicts = verdicts_frame(advise(frame, thresholds))
    if verdicts.empty:
        return pd.DataFrame(columns=columns)
    verdicts["mean_draft_len"] = cells["mean_draft_len"].to_numpy()  # advise keeps pair_cells' order
    verdicts = verdicts[verdicts["drafter"].fillna("model") == "model"]
    rows = []
    for _, group in verdicts.groupby([verdicts[k].astype(str) for k in P_MIN_ADVICE_KEYS], sort=False,
                                     dropna=False):
        fixed, stop = group[group["draft_p_min"] == 0], group[group["draft_p_min"] > 0]
        if fixed.empty or stop.empty:
            continue
        name = group["draft_p_min"].map(lambda p: "fixed k" if p == 0 else f"p_min={p:g}")
        ranked = group.assign(variant=name).sort_values("speedup_lo", ascending=False, na_position="last")
        on = ranked[ranked["decision"] == ON]
        if not on.empty:
            decision, recommend = ON, on.iloc[0]["variant"]
        elif (group["decision"] == OFF).all():
            decision, recommend = OFF, "none"
        else:
            decision, recommend = MORE, "measure-more"
        best_stop = stop.sort_values("speedup_lo", ascending=False, na_position="last").iloc[0]
        first = group.iloc[0]
        rows.append({**{k: first[k] for k in P_MIN_ADVICE_KEYS},
                     "fixed_speedup": as_float(fixed.iloc[0]["speedup"]),
                     "fixed_draft_len": as_float(fixed.iloc[0]["mean_draft_len"]),
                     "best_p_min": float(best_stop["draft_p_min"]), "p_min_speedup": as_float(best_stop["speedup"]),
                     "p_min_draft_len": as_float(best_stop["mean_draft_len"]),
                     "recommend": recommend, "decision": decision,
                     "ranking": "; ".join(f"{r['variant']} {r['decision']} {_fmt(r['speedup'])}"
                                          for _, r in ranked.iterrows())})
    return pd.DataFrame(rows, columns=columns)
