"""The verdict of a speculative run against the baseline: exact, numeric (every divergence explained
by the noise control) or fail; the forced replay, the KV-state check and the cache's extent."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from specnative.lossless.noise import FLIP_QUANTILE, NoiseControl, float_floor, layout_spread, measure_noise

EXACT, NUMERIC, EXACT_DIST, FAIL = "exact", "numeric", "exact-dist", "fail"


VERDICTS = (EXACT, NUMERIC, EXACT_DIST, FAIL)


def within_reach(u, cdf_lo, cdf_hi, tolerance: float, temperature: float):
    """Whether u could fall in [cdf_lo, cdf_hi) once every logit moves by up to `tolerance`:
    the mass below the token can shrink, and the mass up to it grow, by a factor exp(tol / T)."""
    e = math.exp(min(tolerance / temperature, 700.0))
    lo_min = cdf_lo / (cdf_lo + (1.0 - cdf_lo) * e)
    hi_max = cdf_hi * e / (cdf_hi * e + (1.0 - cdf_hi))
    return (lo_min <= u) & (u < hi_max)


def cdf_distance(u, cdf_lo, cdf_hi):
    """How far the keyed uniform lies outside the emitted token's CDF interval [lo, hi) (0 inside):
    the quantity a T > 0 mismatch is judged on (within_reach)."""
    return np.maximum(np.maximum(np.asarray(cdf_lo) - u, np.asarray(u) - cdf_hi), 0.0)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    first_divergence: int     # first generated index where spec and baseline differ (-1: none)
    mismatches: int           # replayed positions whose emitted token is not the baseline rule's pick
    max_mismatch_gap: float   # largest logit[pick] - logit[emitted] among them (NaN: none)
    tolerance: float
    positions: int            # positions replayed

    @property
    def lossless_ok(self) -> bool:
        return self.verdict != FAIL


def first_divergence(base_tokens, spec_tokens) -> tuple[int, int]:
    """(index, sequence) of the earliest generated index where any sequence differs, (-1, -1)."""
    best = (-1, -1)
    for s, (a, b) in enumerate(zip(base_tokens, spec_tokens)):
        n = min(len(a), len(b))
        diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
        index = int(diff[0]) if diff.size else (n if len(a) != len(b) else -1)
        if index >= 0 and (best[0] < 0 or index < best[0]):
            best = (index, s)
    return best


def missing_output(base_tokens, spec_tokens) -> str | None:
    """A missing sequence, or one cut short or run on, is never lossless. Both runs stop at the same
    n_predict (and at an end-of-generation token the same way), so lengths may differ only after
    the outputs have parted: a speculative output that is a strict prefix of the baseline's (or
    the reverse) lost or invented tokens."""
    if len(spec_tokens) != len(base_tokens):
        return (f"the speculative run returned {len(spec_tokens)} sequence(s), the baseline "
                f"{len(base_tokens)}")
    for s, (a, b) in enumerate(zip(base_tokens, spec_tokens)):
        if len(a) == len(b):
            continue
        n = min(len(a), len(b))
        if np.array_equal(np.asarray(a[:n]), np.asarray(b[:n])):
            what = "cut short" if len(b) < len(a) else "longer"
            return (f"seq {s}: the speculative output is {what} ({len(b)} tokens, the baseline {len(a)}) "
                    f"with the same tokens up to there: tokens lost or invented, not a near-tie")
    return None


def pending_state(engine, n_seq: int) -> list:
    """Call right after a speculative run: the target's logits for each sequence's last token on
    top of the KV cache the run left (judge compares them with a clean replay's)."""
    return [engine.pending_logits(s) for s in range(n_seq)]


def state_problem(final_logits: list, pending: list, tolerance: float) -> str | None:
    """A KV cache left stale or short by the run shows as logits that a clean replay does not
    give, even when no emitted token has changed yet. The tolerance is never below float
    arithmetic's own floor at these logits' scale (noise.float_floor)."""
    for s, (clean, left) in enumerate(zip(final_logits, pending)):
        clean = np.asarray(clean, np.float64)
        delta = np.asarray(left, np.float64) - clean
        spread = float(delta.max() - delta.min())
        tolerance = max(tolerance, float_floor(np.abs(clean).max(initial=0.0)))
        if spread > tolerance:
            return (f"seq {s}: the KV cache the run left gives logits that move {spread:.3g} against a clean "
                    f"replay (tolerance {tolerance:.3g}): a stale or missing cache entry")
    return None


def cache_extents(engine, n_seq: int) -> list[int]:
    """Call right after a speculative run: the positions the target's KV cache holds per sequence,
    as llama.cpp's cache reports them (cache_problem checks them)."""
    return [engine._core.cache_extent(s) for s in range(n_seq)]


def cache_problem(engine, prompts: list, spec_tokens: list, extents: list) -> str | None:
    """The structural half of the KV-state check, free of numeric noise: after a correct run the
    target's cache holds each sequence's prompt and every emitted token but the pending last one
    (one more where an accepted end-of-generation draft ended the sequence: it was verified in the
    cache). A rollback that keeps a rejected draft or drops an accepted token changes that count,
    even where the logits it moves stay inside the noise (Gemma 3 270M Q4_K_M, rollback_long at
    greedy: two near-ties moved by 0.26 logits, tolerance 0.9)."""
    for s, (prompt, out, extent) in enumerate(zip(prompts, spec_tokens, extents)):
        if not len(out):
            continue
        expected = len(prompt) + len(out) - 1
        allowed = (expected, expected + 1) if engine._core.is_eog(int(out[-1])) else (expected,)
        if extent not in allowed:
            what = "stale entries kept" if extent > expected else "entries lost"
            return (f"seq {s}: the target's KV cache holds {extent} positions after the run, where its prompt "
                    f"({len(prompt)}) and the emitted tokens but the pending last ({len(out) - 1}) take {expected}: "
                    f"{what}")
    return None


def judge(engine, prompts, base_tokens: list, spec_tokens: list, temperature: float,
          seed: int, control: NoiseControl, pending: list | None = None, clean_final: list | None = None,
          extents: list | None = None) -> Verdict:
    """The verdict of one speculative run against its baseline (same prompts, seed, T).
    `pending` (pending_state() right after the run) adds the KV-state check, `extents`
    (cache_extents() right after the run) its structural half. `clean_final`: a clean replay's
    final logits of the baseline's tokens (measure_noise's), which serve the state check of an
    output identical to the baseline's without replaying it again."""
    prompts = engine.to_token_prompts(prompts)
    index, _ = first_divergence(base_tokens, spec_tokens)
    positions = sum(len(t) for t in spec_tokens)
    tol = control.tolerance if temperature > 0 else control.greedy_tolerance
    missing = missing_output(base_tokens, spec_tokens)
    if missing:
        return Verdict(FAIL, missing, index, 0, math.nan, tol, positions)
    if index < 0 and pending is None:
        return Verdict(EXACT, "token-identical to the baseline" + (" (per seed)" if temperature > 0 else ""),
                       -1, 0, math.nan, tol, positions)
    if index < 0 and clean_final is not None and len(clean_final) == len(spec_tokens):
        replay = {"final_logits": clean_final}  # identical tokens: the control's pass was this replay
    else:
        replay = engine._core.replay(prompts, [list(map(int, t)) for t in spec_tokens], float(temperature), int(seed))
    state = cache_problem(engine, prompts, spec_tokens, extents) if extents is not None else None
    if not state and pending is not None:
        state = state_problem(replay["final_logits"], pending, control.state_tolerance)
        if state and not control.max_layout_spread:  # before calling it a bug: what the cache's layout does
            tokens = [list(map(int, t)) for t in spec_tokens]
            control = replace(control, max_layout_spread=layout_spread(engine, prompts, tokens))
            state = state_problem(replay["final_logits"], pending, control.state_tolerance)
    if state and index < 0:
        return Verdict(FAIL, state, index, 0, math.nan, tol, positions)
    if index < 0:
        return Verdict(EXACT, "token-identical to the baseline" + (" (per seed)" if temperature > 0 else "")
                       + "; the KV cache it left matches a clean replay", -1, 0, math.nan, tol, positions)
    mismatch = replay["pick"] != replay["emitted"]
    n_mismatch = int(mismatch.sum())
    gaps = replay["gap"][mismatch]
    max_gap = float(gaps.max()) if gaps.size else math.nan
    if temperature > 0:
        explained = within_reach(replay["u"][mismatch], replay["cdf_lo"][mismatch], replay["cdf_hi"][mismatch],
                                 tol, temperature)
    else:
        explained = gaps <= tol
    allowed = int(stats.poisson.ppf(FLIP_QUANTILE, control.flip_rate_bound * replay["pick"].size))
    positions = int(replay["pick"].size)
    if not explained.all():
        where = np.flatnonzero(mismatch)[np.flatnonzero(~explained)[0]]
        if temperature > 0:
            why = (f"keyed uniform {float(replay['u'][where]):.4f} outside the emitted token's CDF interval "
                   f"[{float(replay['cdf_lo'][where]):.4f}, {float(replay['cdf_hi'][where]):.4f}) even with "
                   f"every logit moved by the tolerance {tol:.3g}")
        else:
            why = f"logit gap {float(replay['gap'][where]):.3g} > tolerance {tol:.3g} ({control.greedy_basis})"
        reason = (f"seq {int(replay['seq'][where])} index {int(replay['index'][where])}: emitted "
                  f"{int(replay['emitted'][where])}, the baseline rule picks {int(replay['pick'][where])} ({why})")
        return Verdict(FAIL, reason, index, n_mismatch, max_gap, tol, positions)
    if n_mismatch > allowed:
        reason = (f"{n_mismatch} near-tie mismatches in {positions} positions; the noise control's flip "
                  f"rate allows {allowed}")
        return Verdict(FAIL, reason, index, n_mismatch, max_gap, tol, positions)
    if state:
        return Verdict(FAIL, state, index, n_mismatch, max_gap, tol, positions)
    if not n_mismatch:
        reason = "differs from the baseline run, yet every emitted token is the baseline rule's pick on replay"
    elif temperature > 0:
        distance = cdf_distance(replay["u"][mismatch], replay["cdf_lo"][mismatch], replay["cdf_hi"][mismatch])
        reason = (f"{n_mismatch} mismatch(es) in {positions} positions, each within the measured noise (largest "
                  f"distance of the keyed uniform from the emitted token's CDF interval {float(distance.max()):.3g}, "
                  f"within the reach of logit tolerance {tol:.3g} at T={temperature:g})")
    else:
        reason = (f"{n_mismatch} mismatch(es) in {positions} positions, each within the measured noise "
                  f"(largest logit gap {max_gap:.3g} <= tolerance {tol:.3g}, {control.greedy_basis})")
    return Verdict(NUMERIC, reason, index, n_mismatch, max_gap, tol, positions)


def verdict_after_run(engine, prompts, base_tokens: list, spec_tokens: list, temperature: float, seed: int,
                      k: int, drafter: str = "") -> tuple[Verdict, NoiseControl]:
    """The whole check, called right after the speculative run (its KV cache is still there):
    the KV state first, then the noise control on the baseline's tokens (under a hidden-state
    drafter's target settings when `drafter` is one), then the verdict."""
    extents = cache_extents(engine, len(spec_tokens))
    pending = pending_state(engine, len(spec_tokens))
    clean_final: list = []
    control = measure_noise(engine, prompts, base_tokens, k, drafter, clean_final, temperature, seed)
    return judge(engine, prompts, base_tokens, spec_tokens, temperature, seed, control, pending, clean_final,
                 extents), control
