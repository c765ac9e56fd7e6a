"""Timed runs turned into traces.csv values: steady-state rates pooled over repeats, the step timers,
the exact counts and the derived quantities (theory.py), and how sure each row is."""
from __future__ import annotations

import math
import statistics

from specnative.analysis import stats, theory
from specnative.engine import decoding_ms, engine_own_time, native
from specnative.run.row_columns import tree_count_columns


def steady_rate(run) -> float:
    """A run's tokens per second in its steady-state window (every sequence active: a server's
    constant load N; engine.GenerationResult.steady). Every rate of the sweep is this one."""
    return run.steady["tps"]


def pooled_steady(results) -> dict:
    """Steady-state windows pooled over repeats: tokens / time, time per iteration (T_round or
    T_step) and tokens per sequence-iteration (tau; 1 for the baseline). Pooled, not medians, so
    that speedup = tau / (1 + c) holds exactly in every row."""
    tokens = sum(r.steady["tokens"] for r in results)
    ms = sum(r.steady["ms"] for r in results)
    steps = sum(r.steady["steps"] for r in results)
    n_seq = len(results[0].tokens)
    return {"tps": tokens / (ms / 1000.0) if ms > 0 else math.nan,
            "iteration_ms": ms / steps if steps else math.nan,
            "tau": tokens / (steps * n_seq) if steps else math.nan,
            "occupancy": statistics.fmean(r.occupancy for r in results)}


def median_row(results) -> dict:
    tps = [steady_rate(r) for r in results]
    mean_time = lambda name: statistics.fmean(r.times[name] for r in results)
    steady = pooled_steady(results)
    return {
        "tps": steady["tps"], "occupancy": steady["occupancy"],
        "tps_std": statistics.stdev(tps) if len(tps) > 1 else 0.0,
        "tps_min": min(tps), "tps_max": max(tps),
        "prefill_target_ms": mean_time("prefill_target"), "prefill_draft_ms": mean_time("prefill_draft"),
        "draft_ms": mean_time("draft"), "verify_ms": mean_time("verify"),
        "resample_ms": mean_time("resample"), "decode_ms": mean_time("decode"),
        "draft_ingest_ms": mean_time("draft_ingest"),
        "total_ms": mean_time("total"),
        **engine_own_time(statistics.fmean(decoding_ms(r.times) for r in results), mean_time("llama"),
                          mean_time("kv_removal")),
        "e2e_tps": sum(map(generated, results)) / (sum(r.times["total"] for r in results) / 1000.0),
        "prefill_tokens": statistics.fmean(r.prefill_tokens for r in results),
        "kv_prompt_cells": results[0].kv_prompt_cells,
    }


def generated(run) -> int:
    """Tokens a run produced, every sequence's first (from the prefill) included."""
    return sum(len(tokens) for tokens in run.tokens)


def e2e_rate(run) -> float:
    """A run's end-to-end tokens per second: the prefill included (what prefix caching changes)."""
    return generated(run) / (run.times["total"] / 1000.0) if run.times["total"] > 0 else float("nan")


def spec_row(results, base_row: dict, k: int, lengths_vary: bool = False) -> dict:
    """An on row from its runs; `lengths_vary`: a factor of the cell varies the draft length per round."""
    row = median_row(results)
    drafted = sum(r.totals["drafted"] for r in results)
    accepted = sum(r.totals["accepted"] for r in results)
    rounds = sum(r.totals["rounds"] for r in results)
    emitted = sum(r.totals["emitted"] for r in results)
    rejected = sum(r.totals["rejected"] for r in results)
    drafted_at = sum(r.totals["drafted_at"] for r in results)
    accepted_at = sum(r.totals["accepted_at"] for r in results)
    hist = sum(r.totals["accept_len_hist"] for r in results)
    rates = native.accept_rates(drafted=drafted, accepted=accepted, rejected=rejected, rounds=rounds,
                               emitted=emitted)  # pooled over the repeats
    alpha, token_alpha = rates["draft_accept_rate"], rates["token_accept_rate"]
    steady = pooled_steady(results)
    round_ms = steady["iteration_ms"]
    step_ms = base_row["step_ms"]
    c = theory.verify_cost_c(round_ms, step_ms)
    engine_rounds = sum(r.steps for r in results)
    row.update({
        "draft_accept_rate": alpha, "token_accept_rate": token_alpha, "verify_cost_c": c, "k": k,
        "mean_accept_len": rates["mean_accept_len"], "steady_tau": steady["tau"],
        "predicted_speedup": theory.predicted_speedup(token_alpha, k, c),
        "c_draft": theory.draft_cost_ratio(sum(r.times["draft"] for r in results) / engine_rounds, k, step_ms),
        "verify_ratio": (sum(r.times["verify"] for r in results) / engine_rounds) / step_ms,
        "round_ms": round_ms, "step_ms": step_ms,
        "drafted": drafted, "accepted": accepted, "rounds": rounds, "emitted": emitted, "rejected": rejected,
        "accept_at_pos": ";".join(f"{a / d:.4f}" if d else "" for a, d in zip(accepted_at, drafted_at)),
        "accept_len_hist": ";".join(str(int(h)) for h in hist),
        "tps_baseline": base_row["tps"],
        "speedup": theory.measured_speedup(row["tps"], base_row["tps"]),
        "mean_draft_len": drafted / rounds if rounds else math.nan,
        "empty_draft_frac": (rounds - drafted_at[0]) / rounds if rounds and len(drafted_at) else math.nan,
        "draft_reach": ";".join(f"{d / rounds:.4f}" for d in drafted_at) if rounds else None,
    })
    # 0..k tokens per round (an n-gram lookup, or a factor's: the draft model's p_min stop rule, a
    # spec policy): the closed form over the length mix
    if lengths_vary or getattr(results[0], "drafter", "model") != "model":
        reach = drafted_at / rounds if rounds else []
        row["predicted_speedup"] = theory.predicted_speedup_lengths(token_alpha, reach, c)
    return row


def interval_or_empty(make, *values, level: float) -> stats.Interval:
    """stats' interval, or an empty one where a run produced no rate (tps 0: nothing decoded),
    which stats refuses: such a cell cannot decide and runs to --max-repeats."""
    try:
        return make(*values, level=level)
    except ValueError:
        return stats.Interval(math.nan, math.nan, math.nan, level, 0)


def interval_columns(runs: dict, kind, measuring: dict) -> dict:
    """traces.csv columns saying how sure the row is: tps and (on rows) speedup intervals, the
    repeats and warm-up used, why measuring stopped, and flagged outliers (kept, not removed:
    off rows are checked on their tps, on rows on their paired speedups, where a hiccup in
    either run of a pair shows)."""
    tps = [steady_rate(r) for r in runs[kind]]
    tps_iv = interval_or_empty(stats.geometric_interval, tps, level=measuring["ci_level"])
    columns = {key: measuring[key] for key in ("repeats_used", "warmup_used", "warmup_settled",
                                               "stop_reason", "ci_level")}
    columns.update(tps_ci_low=tps_iv.low, tps_ci_high=tps_iv.high, tps_repeats=repeats_text(tps),
                   e2e_tps_repeats=repeats_text([e2e_rate(r) for r in runs[kind]]))
    if kind == "off":
        values, what = tps, "tps"
    else:
        speedup = measuring["speedup_intervals"][kind]
        columns.update(speedup_ci_low=speedup.low, speedup_ci_high=speedup.high)
        try:
            values = stats.paired_ratios(tps, [steady_rate(r) for r in runs["off"]])
        except ValueError:  # a run without a rate: no ratios to judge
            values = []
        what = "speedup"
        columns["speedup_repeats"] = repeats_text(values)
    found = stats.flag_outliers(values, measuring["outlier_threshold"], what=what)
    columns.update(n_outliers=len(found), outlier_note="; ".join(o.reason for o in found) or None)
    return columns


def repeats_text(values: list[float]) -> str | None:
    """Every repeat's value, ';'-separated, at full precision (paired statistics are taken on them)."""
    return ";".join(f"{v:.6g}" for v in values) or None


def tree_columns(results, spelling: str, step_ms: float) -> dict:
    """A draft tree's on row beside spec_row's: its counts' columns (tree_count_columns), c_draft per
    draft decode (one per level of the deepest tree; step_ms: the baseline's T_step) and no chain
    closed form."""
    from specnative.engine import parse_draft_shape

    shape = parse_draft_shape(spelling)
    totals = {name: sum(r.totals[name] for r in results) for name in ("drafted", "rounds", "offered_rank",
                                                                       "accepted_rank")}
    engine_rounds = sum(r.steps for r in results)
    levels = shape.depth if shape.kind == "topk" else shape.budget
    return {**tree_count_columns(spelling, totals), "predicted_speedup": math.nan,
            "c_draft": theory.draft_cost_ratio(sum(r.times["draft"] for r in results) / engine_rounds, levels, step_ms)}
