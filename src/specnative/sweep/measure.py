"""Measuring one cell: its lossless check, warm-up, timed repeats of spec off and on interleaved
until the speedup's interval decides, and its rows."""
from __future__ import annotations

from specnative.analysis import stats
from specnative.record.factors import FACTORS, factor_named
from specnative.run import hidden_drafters
from specnative.run.row_columns import synthetic_columns
from specnative.run.workloads import category_table
from specnative.sweep.checks import lossless_check
from specnative.sweep.config import Cell, SweepConfig, drafter_options_of, kind_args, kind_budget, on_kinds
from specnative.sweep.prompts import build_prompts
from specnative.sweep.rows import (
    interval_columns,
    interval_or_empty,
    median_row,
    pooled_steady,
    spec_row,
    steady_rate,
    tree_columns,
)
from specnative.sweep.which_k import add_k_columns


def factor_columns(cell: Cell, runs: list) -> dict:
    """An on row's columns from the cell's factors (record/factors.py): each factor's value where the
    cell leaves its default (or where the factor's column is on every row of the cell's drafter),
    and what the factor adds from the row's runs."""
    columns = {f.name: f.default for f in FACTORS if f.column_always(cell.drafter)}
    for name, value in cell.factors:
        columns.update({name: value, **factor_named(name).columns(value, runs)})
    return columns


def policy_of(cfg: SweepConfig) -> stats.Policy:
    return stats.Policy(min_repeats=cfg.repeats, max_repeats=cfg.max_repeats, level=cfg.ci_level,
                        rel_width=cfg.ci_width, max_warmup=cfg.warmup, settle_tol=cfg.warmup_tol)


def synthetic_kind(profile, k: int) -> tuple:
    """The timed runs' key of a synthetic profile at draft length k (beside "off" and each k)."""
    return ("synthetic", profile.text, k)


def _speedup_intervals(pairs: list[dict], ks, level: float) -> dict:
    off = [steady_rate(p["off"]) for p in pairs]
    return {k: interval_or_empty(stats.speedup_interval, [steady_rate(p[k]) for p in pairs], off, level=level) for k in ks}


def timed_runs(engine, prompts, cfg: SweepConfig, common: dict, on_progress, previous: dict | None = None,
               warm: bool = False, kinds: list | None = None, spec_args: dict | None = None) -> tuple[dict, dict]:
    """Warm-up until the timings settle, then timed repeats until every k's speedup interval
    decides (stats.Policy). Each repeat runs spec off, then spec on for every k, right beside
    each other: the speedup interval is over these pairs, so load that hits both cancels.
    `previous`: a pair made already (the lossless check's, same rule and seed): the first warm-up
    run, or with `warm` (the engine measured a cell just before: nothing left to warm) the first
    timed run, no warm-up run at all.
    Returns the timed runs by kind ("off", k, ..., a tree's spelling, ...) and how the measuring went.
    `kinds`: the on rows (config.on_kinds; None: every k of the chain). `spec_args`: the cell's
    factors' keywords (Cell.factor_args), for every speculative run."""
    policy = policy_of(cfg)
    spec_args = spec_args or {}
    kinds = list(cfg.ks) if kinds is None else kinds

    def with_synthetic(pair: dict) -> dict:
        """The same drafter with its drafts kept at random, beside the pair (off by default)."""
        for k in cfg.ks:
            for profile in cfg.synthetic:
                if synthetic_kind(profile, k) not in pair:
                    pair[synthetic_kind(profile, k)] = engine.generate(
                        prompts, spec=True, k=k, accept_rule=cfg.accept_rule, synthetic=profile, **spec_args,
                        **common)
        return pair

    def one_repeat() -> dict:
        pair = {"off": engine.generate(prompts, **common)}
        for kind in kinds:
            pair[kind] = engine.generate(prompts, spec=True, accept_rule=cfg.accept_rule, **kind_args(kind),
                                         **spec_args, **common)
        return with_synthetic(pair)

    warmups, shown = 0, ""
    real = ["off", *kinds]  # the kinds that decide warm-up and repeats (synthetic runs ride along)

    def warm_up_run() -> dict:
        nonlocal warmups
        warmups += 1
        on_progress(f"warm-up {warmups}")
        return one_repeat()

    def decide(pairs: list) -> str | None:
        nonlocal shown
        intervals = _speedup_intervals(pairs, kinds, policy.level)
        shown = " ".join(f"[{iv.low:.2f},{iv.high:.2f}]" for iv in intervals.values())
        return stats.combined_reason([stats.stop_reason(iv, policy) for iv in intervals.values()])

    if warm and previous is not None and policy.max_warmup > 0:
        first, warmup_used, settled = previous, 0, True
    else:
        first, warmup_used, settled = stats.warm_up(warm_up_run,
                                                    lambda pair: [steady_rate(pair[kind]) for kind in real],
                                                    policy, previous)
    first = with_synthetic(dict(first)) if cfg.synthetic and first is not None else first
    pairs, reason = stats.repeat_until_decided(
        one_repeat, decide, policy, first,
        on_repeat=lambda n: on_progress(f"repeat {n}/{policy.max_repeats} {shown}"))
    runs = {kind: [p[kind] for p in pairs] for kind in pairs[0]}
    measuring = {"repeats_used": len(pairs), "warmup_used": warmup_used, "warmup_settled": settled,
                 "stop_reason": reason, "ci_level": policy.level,
                 "speedup_intervals": _speedup_intervals(pairs, [kind for kind in runs if kind != "off"], policy.level),
                 "outlier_threshold": policy.outlier_mads}
    return runs, measuring


def measure_cell(engine, cell: Cell, cfg: SweepConfig, on_progress=lambda msg: None, warm: bool = False) -> list[dict]:
    """Rows (one off, one on per k) of one cell, without the identity columns."""
    prompts = build_prompts(engine, cell, cfg)
    common = dict(n_predict=cfg.n_predict, temperature=cell.temperature, seed=cfg.seed,
                  drafter=cell.drafter, drafter_options=drafter_options_of(cfg, cell.drafter))
    if not cell.shares_prefix:  # every sequence prefills its own copy of the context, every run (both
        common["prefix_cache"] = False  # sides of a hidden-state drafter's cell: its spec runs cannot share)
    else:  # only the shared context is shared and kept from run to run; each sequence's own prompt is
        common["prefix_limit"] = cell.ctx_len  # prefilled on every run (at ctx_len 0: the whole prompt)
    checks, check_pair = {}, {}
    kinds = on_kinds(cfg, cell.drafter, cell)
    for k in kinds:
        on_progress(f"lossless check {'k=' + str(k) if isinstance(k, int) else k}")
        checks[k] = lossless_check(engine, prompts, cfg, k, cell.temperature, cell.drafter,
                                   on_progress=on_progress, runs_out=check_pair, prefix_cache=cell.shares_prefix,
                                   prefix_limit=cell.ctx_len, spec_args=cell.factor_args)
    # the check's runs are the first warm-up pair when they ran the timed rule (the rejection rule
    # is checked through its match proxy) at the timed seed
    same_runs = (cell.temperature == 0 or cfg.accept_rule == "match") and cfg.check_seed_offset == 0
    runs, measuring = timed_runs(engine, prompts, cfg, common, on_progress, check_pair if same_runs else None, warm,
                                 kinds, cell.factor_args)
    off = median_row(runs["off"])
    off.update({"step_ms": pooled_steady(runs["off"])["iteration_ms"], "speedup": 1.0,
                "lossless_ok": True, "lossless_method": "reference", "first_divergence": -1})
    off["tps_baseline"] = off["tps"]
    rows = [{"spec_decode": "off", **off, **interval_columns(runs, "off", measuring)}]
    for k in kinds:
        rows.append({"spec_decode": "on", "accept_rule": cfg.accept_rule,
                     **spec_row(runs[k], off, kind_budget(k), cell.lengths_vary), **checks[k],
                     **interval_columns(runs, k, measuring), **factor_columns(cell, runs[k])})
        if isinstance(k, str):  # a draft tree: its shape and counts (chain rows as before)
            rows[-1].update(tree_columns(runs[k], k, off["step_ms"]))
    rows += synthetic_rows(runs, off, cfg, cell, measuring)
    # n-gram drafters and a factor's cells (the p_min stop rule, a spec policy): k only caps a draft
    # of varying length, or which-k's runs are not the cell's, so the fixed-length prediction at
    # k' <= k does not apply (pick_k.py); no which-k columns
    if cell.drafter == "model" and not cell.factors and (cfg.which_k or cfg.check_k):
        add_k_columns(engine, prompts, cfg, common, runs, [r for r in rows if "draft_shape" not in r], on_progress)
    copy_share = category_table.prompt_copy_share(prompts, runs["off"][0].tokens)
    for row in rows:
        row["prompt_copy_share"] = copy_share
    if hidden_drafters.is_hidden(cell.drafter):  # what its extraction settings cost the plain step
        on_progress("baseline under the drafter's target settings")
        settings = hidden_drafters.settings_step_columns(engine, prompts, common, cfg.repeats, off["step_ms"])
        for row in rows[1:]:
            row.update(settings)
    return rows


def synthetic_rows(runs: dict, off: dict, cfg: SweepConfig, cell: Cell, measuring: dict) -> list[dict]:
    """One on row per synthetic profile and k: timed beside the cell's own runs (paired with the same
    off runs), counted exactly, never lossless (verdict "synthetic", no lossless check)."""
    rows = []
    for k in cfg.ks:
        for profile in cfg.synthetic:
            kind = synthetic_kind(profile, k)
            row = {"spec_decode": "on", "accept_rule": cfg.accept_rule, **spec_row(runs[kind], off, k, cell.lengths_vary),
                   **interval_columns(runs, kind, measuring), **factor_columns(cell, runs[kind]),
                   **synthetic_columns(profile, k)}
            rows.append(row)
    return rows
