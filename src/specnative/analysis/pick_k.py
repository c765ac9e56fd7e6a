"""Which k? The speedup at every draft length k' <= k_max predicted from one run at k_max.

Tokens per round. With greedy decoding (and the `match` rule, whose draws are keyed by position)
the emitted token stream does not depend on k, and neither does whether the draft's token at a
position matches the target's (the draft sees the same prefix). A run at k_max cuts that stream
into segments, one per round: a round that accepted m drafts emitted m + 1 tokens (m matches,
then the correction or the bonus). A run at k' starts its rounds at the same segment starts
(a segment ends on a mismatch, which ends any round covering it) and covers k' + 1 tokens per
round, so a segment of m + 1 tokens takes ceil((m + 1) / (k' + 1)) rounds at k':

    tau(k') = sum_m hist[m] (m + 1) / sum_m hist[m] ceil((m + 1) / (k' + 1))

(hist = accept_len_hist measured at k_max). This is exact for segments that ended on a rejection
or at the end of a sequence. A fully accepted segment (m = k_max) ended on a bonus token whose
draft match was never tested: where (k' + 1) divides (k_max + 1) its k' rounds end exactly there
and the count is still exact; otherwise the round straddling its end either stops there (no match
at the bonus position: the ceil, a lower bound on tau) or runs on into the next segment. The
point estimate counts a fully accepted segment as (k_max + 1) / (k' + 1) rounds, without the
ceil (the straddling round continues at the same rate); `tau_bounds` gives the lower bound too.
Note that this is NOT "accepted length min(m, k') per round":
one round at k_max becomes several rounds at k'.
Sampling with the `rejection` rule: the bonus token after a full acceptance is drawn from p, not
accepted from q, so the stream after it may differ; the same formula is used as an approximation
(segments treated as independent draws of the same length distribution).
n-gram drafters: round starts and draft lengths depend on history lookups, not on a fixed k; no
prediction (NaN) -- their k only caps a lookup's length.
The draft stop rule (draft_p_min > 0, llama.cpp's --spec-draft-p-min): no prediction either (the
sweep writes none). A round at k_max that stopped early drafted fewer than k_max tokens because the
draft was unsure at that position, so its accepted length is not the segment length a fixed k'
would see, and the rule's draft lengths at k' are not a cut of those at k_max; its cells are
compared with fixed k by measurement instead (advisor.p_min_advice).

Time per round. T_round(k') = k' d + V(k' + 1) + r: d the draft's time per position and V(n) the
target's time for n positions per sequence, both from the cost curve (Engine.cost_curve at the
cell's prompts and concurrency; its lower non-decreasing envelope, `monotone_curve`), r the
acceptance/rollback time per round measured at k_max. The
curve is taken at the prompts' context while a run's context grows, so the curve gives the shape
and the run at k_max the level: T_round(k') = T_round_measured(k_max) x model(k') / model(k_max).

Steady state (every sequence active, what tps and speedup measure): tau(k') above is per
sequence-round over whole runs; it is scaled by steady_tau / tau(k_max) measured at k_max (the
occupancy correction), so that at k' = k_max the prediction is the measured speedup exactly.
    speedup(k') = steady_tau(k') / (T_round(k') / T_step)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def tokens_and_rounds(hist, k_prime: int, straddle: str = "continue") -> tuple[float, float]:
    """Tokens emitted and rounds needed at draft length k_prime for the segments a run at k_max
    measured (hist[m]: rounds that accepted m drafts; k_max = len(hist) - 1). straddle: how a
    fully accepted segment's last round counts where (k'+1) does not divide (k_max+1):
    "continue" (fractional: runs on into the next segment) or "stop" (ceil: the lower bound)."""
    if k_prime < 1:
        raise ValueError(f"k' must be at least 1, not {k_prime}")
    if straddle not in ("continue", "stop"):
        raise ValueError(f"straddle must be 'continue' or 'stop', not {straddle!r}")
    hist = np.asarray(hist, dtype=float)
    segment = np.arange(len(hist)) + 1.0  # tokens per segment: m accepted + one
    rounds = np.ceil(segment / (k_prime + 1))
    if straddle == "continue" and len(hist):
        rounds[-1] = segment[-1] / (k_prime + 1)
    return float(hist @ segment), float(hist @ rounds)


def tau_at(hist, k_prime: int, straddle: str = "continue") -> float:
    """Tokens per sequence-round at k_prime (greedy/match: exact where (k'+1) | (k_max+1)).
    NaN without rounds."""
    tokens, rounds = tokens_and_rounds(hist, k_prime, straddle)
    return tokens / rounds if rounds > 0 else math.nan


def tau_bounds(hist, k_prime: int) -> tuple[float, float]:
    """(lower bound, point estimate) of tau at k_prime; equal where exact_for."""
    return tau_at(hist, k_prime, "stop"), tau_at(hist, k_prime)


def exact_for(k_max: int, k_prime: int) -> bool:
    """Whether tau_at(hist, k_prime) is exact (greedy/match) for a histogram measured at k_max."""
    return (k_max + 1) % (k_prime + 1) == 0


def monotone_curve(verify_ms) -> np.ndarray:
    """The largest non-decreasing curve below the measured one: V(n) = min over m >= n of V(m).
    A decode of more positions cannot cost less, so a median above a later one is load from
    elsewhere on the machine (seen on a busy CPU), not the shape of the cost."""
    values = np.asarray(verify_ms, dtype=float)
    return np.minimum.accumulate(values[::-1])[::-1]


def round_model_ms(k_prime: int, verify_ms, draft_ms_per_pos: float, resample_ms: float) -> float:
    """k' d + V(k'+1) + r from the cost curve (verify_ms[n-1]: n positions per sequence)."""
    return k_prime * draft_ms_per_pos + float(verify_ms[k_prime]) + resample_ms


@dataclass
class KPrediction:
    ks: list               # 1..k_max
    tau: list              # steady tau predicted at each k
    round_ms: list         # T_round predicted at each k
    speedup: list          # predicted speedup at each k
    recommended_k: int     # argmax of the speedup; 0 where no k pays (every speedup <= 1)
    recommended_speedup: float  # the highest predicted speedup (at best_k)
    best_k: int            # argmax of the speedup, paying or not (what --check-k measures)

    def text(self) -> str:
        return ";".join(f"{s:.4f}" for s in self.speedup)


def predict(hist, k_max: int, verify_ms, draft_ms_per_pos: float, resample_ms_per_round: float,
            round_ms: float, step_ms: float, steady_tau: float) -> KPrediction:
    """Predicted steady tau, T_round and speedup at k' = 1..k_max from a run at k_max (hist,
    resample per round, steady T_round and tau), the baseline's steady T_step and the cost curve."""
    hist = np.asarray(hist, dtype=float)
    if len(hist) != k_max + 1:
        raise ValueError(f"accept_len_hist has {len(hist)} entries, expected k_max+1 = {k_max + 1}")
    if len(verify_ms) < k_max + 1:
        raise ValueError(f"the cost curve has {len(verify_ms)} verify times, expected k_max+1 = {k_max + 1}")
    verify_ms = monotone_curve(verify_ms)
    occupancy_scale = steady_tau / tau_at(hist, k_max)
    at_k_max = round_model_ms(k_max, verify_ms, draft_ms_per_pos, resample_ms_per_round)
    ks = list(range(1, k_max + 1))
    taus = [tau_at(hist, k) * occupancy_scale for k in ks]
    rounds = [round_ms * round_model_ms(k, verify_ms, draft_ms_per_pos, resample_ms_per_round) / at_k_max
              for k in ks]
    speedups = [t / (r / step_ms) if step_ms > 0 else math.nan for t, r in zip(taus, rounds)]
    finite = [(s, k) for s, k in zip(speedups, ks) if math.isfinite(s)]
    best_speedup, best_k = max(finite) if finite else (math.nan, 0)
    return KPrediction(ks, taus, rounds, speedups, best_k if best_speedup > 1.0 else 0, best_speedup, best_k)


def parse_list(text) -> list[float]:
    """A ';'-separated traces.csv column as floats (empty entries NaN)."""
    if text is None or (isinstance(text, float) and math.isnan(text)) or str(text) in ("", "<NA>"):
        return []
    return [float(x) if x != "" else math.nan for x in str(text).split(";")]
