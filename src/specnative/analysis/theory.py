"""Closed forms of speculative decoding (Leviathan et al. 2023) and the measured verify cost.

Every derived quantity the sweep writes and the reports plot is defined here, once.
"""
from __future__ import annotations

import math


def verify_cost_c(round_ms: float, step_ms: float) -> float:
    """c = T_round / T_step - 1: how much more a speculative round costs than a baseline step.

    With this definition, measured speedup = tau / (1 + c) holds exactly when every sequence
    takes part in every round."""
    if not (step_ms > 0) or not math.isfinite(round_ms):
        return math.nan
    return round_ms / step_ms - 1.0


def draft_cost_ratio(draft_ms_per_round: float, k: float, step_ms: float) -> float:
    """Leviathan's c: the time of one draft decode step over one target decode step."""
    if not (step_ms > 0) or not (k > 0):
        return math.nan
    return (draft_ms_per_round / k) / step_ms


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E[tokens per round] = (1 - alpha^(k+1)) / (1 - alpha) for i.i.d. acceptance alpha."""
    if not math.isfinite(alpha):
        return math.nan
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """(1 - alpha^(k+1)) / ((1 - alpha)(1 + c)): the closed form with the measured c."""
    if not math.isfinite(c) or c <= -1.0:
        return math.nan
    return expected_tokens_per_round(alpha, k) / (1.0 + c)


def measured_speedup(tps_spec: float, tps_baseline: float) -> float:
    if not (tps_baseline > 0):
        return math.nan
    return tps_spec / tps_baseline


def expected_tokens_per_round_lengths(alpha: float, reach) -> float:
    """E[tokens per round] when the draft length L varies from round to round (an n-gram lookup
    proposes 0..k tokens): 1 + sum_j alpha^j P(L >= j), with reach[j-1] = P(L >= j) measured as
    (rounds that drafted position j) / rounds. For L = k in every round this is the closed form
    (1 - alpha^(k+1)) / (1 - alpha); a round with no draft counts 1 token (a plain target step)."""
    if not math.isfinite(alpha):
        return math.nan
    return 1.0 + sum(alpha ** j * float(r) for j, r in enumerate(reach, start=1))


def predicted_speedup_lengths(alpha: float, reach, c: float) -> float:
    """The closed form for variable draft lengths: expected_tokens_per_round_lengths / (1 + c)."""
    if not math.isfinite(c) or c <= -1.0:
        return math.nan
    return expected_tokens_per_round_lengths(alpha, reach) / (1.0 + c)


def alpha_for_tokens_per_round(tokens: float, k: int, reach=None) -> float:
    """The i.i.d. alpha whose expected tokens per round at draft length k is `tokens`: the inverse
    of expected_tokens_per_round (of expected_tokens_per_round_lengths with `reach`), which rises
    with alpha from 1 (alpha 0) to 1 + sum(reach) (k + 1 at fixed k). Outside that range: 0 below,
    +inf above (no alpha reaches it). NaN for NaN."""
    if not math.isfinite(tokens):
        return math.nan
    reach = [1.0] * int(k) if reach is None else [float(r) for r in reach]
    tokens_at = lambda a: 1.0 + sum(a ** j * r for j, r in enumerate(reach, start=1))  # noqa: E731
    if tokens <= 1.0:
        return 0.0
    if tokens >= tokens_at(1.0):
        return 1.0 if tokens == tokens_at(1.0) else math.inf
    from scipy.optimize import brentq  # a dependency; imported here to keep `import` light
    return float(brentq(lambda a: tokens_at(a) - tokens, 0.0, 1.0, xtol=1e-10))


def break_even_alpha(k: int, c: float, reach=None) -> float:
    """alpha* at which the closed form's speedup is 1 with the measured c: the alpha whose expected
    tokens per round equal 1 + c (the round's cost in baseline steps). 0: pays at any alpha (c <= 0);
    +inf: no alpha pays at this k and c (even alpha = 1 gives fewer than 1 + c tokens)."""
    if not math.isfinite(c) or c <= -1.0:
        return math.nan
    return alpha_for_tokens_per_round(1.0 + c, k, reach)
