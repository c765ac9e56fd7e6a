"""A cell's lossless check before it is timed: spec output against the baseline's (lossless/), and the
distributional test of a rejection cell."""
from __future__ import annotations

import dataclasses
import math

from specnative import lossless
from specnative.sweep.config import Cell, SweepConfig, drafter_options_of, kind_args, kind_budget


# ---------------------------------------------------------------------------------------------
# Measuring one cell
# ---------------------------------------------------------------------------------------------
def first_divergence(base, spec) -> tuple[int, float]:
    """First generated index where any sequence differs (lossless.first_divergence), and the
    baseline target's top-1 minus top-2 logit there (a small margin suggests a near-tie)."""
    index, s = lossless.first_divergence(base.tokens, spec.tokens)
    if index < 0 or index >= len(base.margins[s]):
        return index, math.nan
    return index, float(base.margins[s][index])


def lossless_check(engine, prompts, cfg: SweepConfig, k: int, temperature: float, drafter: str = "model",
                   on_progress=lambda msg: None, runs_out: dict | None = None,
                   prefix_cache: bool = True, prefix_limit: int | None = None, spec_args: dict | None = None) -> dict:
    """The cell's lossless verdict at k (lossless.py). `runs_out` receives the baseline and
    speculative runs it made ({"off": ..., k: ...}), which the warm-up can use as its first pair.
    The runs use the cell's prefix caching (and its limit, the shared context's length): the verdict
    is on the configuration that is timed. `spec_args`: the cell's factors' generate() keywords
    (Cell.factor_args) for its spec runs."""
    if temperature == 0:
        method, rule = "exact-greedy", "greedy"
    elif cfg.accept_rule == "match":
        method, rule = "exact-seed", "match"
    else:  # the rule is lossless in distribution: tested so, and its match proxy at the same seed
        method, rule = "distribution", "match"
    common = dict(n_predict=cfg.n_predict, temperature=temperature)
    if not prefix_cache:
        common["prefix_cache"] = False
    elif prefix_limit is not None:
        common["prefix_limit"] = prefix_limit
    base = engine.generate(prompts, seed=cfg.seed, **common)  # plain: in a warm engine also a timed run
    spec = engine.generate(prompts, seed=cfg.seed + cfg.check_seed_offset, spec=True, **kind_args(k),
                           accept_rule=rule, drafter=drafter, drafter_options=drafter_options_of(cfg, drafter),
                           **(spec_args or {}), **common)
    on_progress(f"noise control {k}")
    if runs_out is not None:
        runs_out.update({"off": base, k: spec})
    verdict, control = lossless.verdict_after_run(engine, prompts, base.tokens, spec.tokens, temperature,
                                                  cfg.seed, kind_budget(k), drafter)
    index, margin = first_divergence(base, spec)
    if index >= 0:  # the baseline's top-2 margin where the outputs part: one more run, only then
        index, margin = first_divergence(engine.generate(prompts, seed=cfg.seed, record_margins=True, **common), spec)
    columns = {}
    if method == "distribution":
        on_progress(f"distribution test {k}")
        verdict, columns = distribution_verdict(engine, prompts, cfg, k, temperature, verdict,
                                                drafter=drafter, spec_args=spec_args)
    return {**columns, "lossless_ok": verdict.lossless_ok, "lossless_method": method, "first_divergence": index,
            "divergence_margin": margin, "verdict": verdict.verdict, "verdict_reason": verdict.reason,
            "mismatches": verdict.mismatches, "max_mismatch_gap": verdict.max_mismatch_gap,
            "noise_tolerance": verdict.tolerance, "noise_max_abs_delta": control.max_abs_delta,
            "noise_max_spread": control.max_spread, "noise_flips": control.flips,
            "noise_state_spread": control.max_state_spread, "noise_candidate_spread": control.max_candidate_spread,
            "noise_positions": control.positions}


def distribution_verdict(engine, prompts, cfg: SweepConfig, k: int, temperature: float, proxy,
                         drafter: str, spec_args: dict | None = None) -> tuple:
    """A rejection cell's verdict: the distributional test (lossless.rejection_distribution) over at
    least cfg.dist_positions emitted tokens, and the match proxy's verdict beside it (it also checks
    the KV state, which no distribution can). Either failing fails the cell."""
    spec = dict(n_predict=cfg.n_predict, **kind_args(k), drafter=drafter, drafter_options=drafter_options_of(cfg, drafter))
    spec.update(spec_args or {})
    dist = lossless.rejection_distribution(engine, prompts, temperature, cfg.seed + cfg.check_seed_offset,
                                           cfg.dist_positions, **spec)
    columns = {"dist_statistic": dist.statistic, "dist_p_value": dist.p_value, "dist_positions": dist.positions,
               "dist_runs": dist.runs, "proxy_verdict": proxy.verdict, "dist_decisions": dist.decisions,
               "dist_decision_p_value": dist.decision_p_value, "dist_residuals": dist.residuals,
               "dist_residual_p_value": dist.p_of("residuals"), "dist_decided_by": dist.decided_by}
    ok = dist.passed and proxy.lossless_ok
    verdict = lossless.EXACT_DIST if ok else lossless.FAIL
    reason = f"{dist.reason}; match proxy at the same seed: {proxy.verdict} ({proxy.reason})"
    return dataclasses.replace(proxy, verdict=verdict, reason=reason), columns


def dist_runs(cfg: SweepConfig, cell: Cell) -> int:
    """The runs a cell's distributional test makes (0 but for rejection cells at T > 0): every
    sequence's tokens after its first are tested."""
    if cell.temperature == 0 or cfg.accept_rule == "match":  # as lossless_check decides
        return 0
    return math.ceil(cfg.dist_positions / (cell.concurrency * max(cfg.n_predict - 1, 1)))
