"""Losslessness under continuous batching, judged as the closed loop judges a cell: every request's
output against the request decoded alone, with a noise control that covers the widest batch
serving builds and the cache layout (a slot's cells move as others empty and refill).

- temperature 0 (serving_verdict): greedy outputs, exact or numeric;
- temperature > 0 (sampled_serving_verdict): per seed. Serving keys request i's random stream by
  its index in the trace (the position-keyed RNG: a uniform is a function of seed, sequence key,
  position), so "decoded alone" is the trace replayed one request at a time with the same keys
  (max_concurrency 1, spec off); a difference is judged on a forced replay of the served tokens
  with the request's own keyed uniforms against the noise's reach (lossless.within_reach);
- the rejection rule (rejection_verdict): lossless in distribution only, so its check is the
  distributional test over the engine's closed-loop runs on the trace's prompts, beside the match
  proxy on the serving loop itself (the same trace served under `match`, judged per seed).
"""
from __future__ import annotations

import dataclasses
import math
import weakref

import numpy as np
from scipy import stats

from specnative import lossless
from specnative.lossless.noise import FLIP_QUANTILE, layout_spread
from specnative.lossless.verdicts import cdf_distance, missing_output, within_reach
from specnative.serving.arrivals import Request

LOSSLESS_METHODS = {  # lossless_method of serve rows, and what it checked (the report says it)
    "alone-greedy": "greedy: every request's output against the request decoded alone (exact, or numeric where "
                    "batch-shape and cache-layout noise explains a difference)",
    "alone-seed": "sampling: every request's output against the request decoded alone with the same seed and "
                  "keys (each request's random stream is keyed by its place in the trace), exact per seed, or "
                  "numeric where the noise's reach explains a difference",
    "distribution": "rejection rule: the distributional test over the engine's closed-loop runs on the trace's "
                    "prompts, and the match proxy on the serving loop (the same trace served under match, judged "
                    "per seed against each request decoded alone)",
}


def methods_text(methods) -> str:
    """What the verdicts of rows with these lossless_method values checked, in words (the report)."""
    known = [m for m in LOSSLESS_METHODS if m in set(methods)]
    return "; ".join(f"`{m}`: {LOSSLESS_METHODS[m]}" for m in known) or "no row was checked"


# Per engine (entries go with it: an id can be reused by a later engine): what was decoded alone
# or tested once, so the off and on runs of every level share it
_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _cache(engine, kind: str) -> dict:
    return _CACHES.setdefault(engine, {}).setdefault(kind, {})


def decoded_alone(engine, request: Request) -> list:
    cache, key = _cache(engine, "alone"), (request.prompt, request.output_len)
    if key not in cache:
        result = engine.generate([list(request.prompt)], n_predict=request.output_len, stop_at_eos=False)
        cache[key] = result.tokens[0]
    return cache[key]


def serving_noise(engine, prompts: list, base: list, k: int, temperature: float = 0.0,
                  seed: int = 0) -> lossless.NoiseControl:
    """The batch-shape control for serving: the target's noise between 1-token steps and the
    widest batch serving builds. A decode or verify token there shares its llama_decode with
    other slots' prompt chunks, up to n_batch tokens, and CPU kernels change with the batch size,
    so the verify shape (k+1 per sequence) alone can understate it; the larger of the two stands."""
    control = lossless.measure_noise(engine, prompts, base, k, temperature=temperature, seed=seed)
    widest = engine.context_info()["n_batch"] // len(prompts)
    if widest > k + 1:
        wide = lossless.measure_noise(engine, prompts, base, widest - 1, temperature=temperature, seed=seed)
        if wide.max_spread > control.max_spread:
            return wide
    return control


def replay_group(engine, ids_per_sequence: int = 1) -> int:
    """How many requests a check replays together: the engine's sequences, each request taking
    ids_per_sequence of them (a draft tree's branches; 1 for chains)."""
    return max(1, engine.context_info()["n_seq_max"] // ids_per_sequence)


def serving_verdict(engine, requests: list[Request], tokens: list, k: int, ids_per_sequence: int = 1) -> lossless.Verdict:
    """Greedy outputs of a serving run against each request decoded alone: exact, numeric (every
    difference within the target's measured noise on forced replay) or fail. Judged in groups of
    at most the engine's sequences; the worst group's verdict stands. The noise is the larger of
    each group's batch-shape control (serving_noise) and the cache-layout spread pooled over all
    groups (layout_spread: a property of the model and the cache, not of one prompt)."""
    n_seq = replay_group(engine, ids_per_sequence)
    groups = []
    for start in range(0, len(requests), n_seq):
        group = requests[start:start + n_seq]
        groups.append(([list(r.prompt) for r in group], [list(map(int, decoded_alone(engine, r))) for r in group],
                       [list(map(int, t)) for t in tokens[start:start + n_seq]]))
    if all(b == t for _, base, served in groups for b, t in zip(base, served)):
        return lossless.Verdict(lossless.EXACT, "token-identical to every request decoded alone", -1, 0, math.nan,
                                0.0, sum(len(t) for t in tokens))
    layout = max(layout_spread(engine, prompts, base) for prompts, base, _ in groups)
    order = {lossless.FAIL: 2, lossless.NUMERIC: 1, lossless.EXACT: 0}
    worst = None
    for prompts, base, served in groups:
        control = serving_noise(engine, prompts, base, k)
        if layout > control.max_spread:
            control = dataclasses.replace(control, max_spread=layout)
        if layout > (control.max_candidate_spread or 0.0):  # a full spread bounds the candidates' too
            control = dataclasses.replace(control, max_candidate_spread=layout)
        verdict = lossless.judge(engine, prompts, base, served, 0.0, 0, control)
        if worst is None or order[verdict.verdict] > order[worst.verdict]:
            worst = verdict
    return worst


# ---------------------------------------------------------------------------------------------
# Sampling (temperature > 0): per seed, with each request's own keys
# ---------------------------------------------------------------------------------------------
def decoded_alone_sampled(engine, requests: list[Request], temperature: float, seed: int) -> list:
    """Each request of a trace decoded alone with the keys a serving run gives it (its index in
    the trace): the trace replayed through the serving loop one request at a time, spec off."""
    from specnative.serving.loop import serve

    cache = _cache(engine, "alone-sampled")
    key = (tuple((r.prompt, r.output_len) for r in requests), float(temperature), int(seed))
    if key not in cache:
        alone = [Request(0.0, r.prompt, r.output_len, r.label) for r in requests]
        run = serve(engine, alone, max_concurrency=1, temperature=temperature, seed=seed, virtual_clock=True)
        cache[key] = [list(map(int, t)) for t in run.tokens]
    return cache[key]


def sampled_serving_verdict(engine, requests: list[Request], tokens: list, k: int, temperature: float,
                            seed: int, ids_per_sequence: int = 1) -> lossless.Verdict:
    """Sampled outputs of a serving run against each request decoded alone at the same seed and
    keys: exact (token-identical per seed), numeric (every emitted token the keyed draw on a
    forced replay, or within the measured noise's reach of it, and no more such near-ties than the
    noise control's flip rate allows) or fail."""
    base = decoded_alone_sampled(engine, requests, temperature, seed)
    served = [list(map(int, t)) for t in tokens]
    positions = sum(len(t) for t in served)
    missing = missing_output(base, served)
    index, _ = lossless.first_divergence(base, served)
    if missing:
        return lossless.Verdict(lossless.FAIL, missing, index, 0, math.nan, math.nan, positions)
    differ = [i for i, (b, t) in enumerate(zip(base, served)) if b != t]
    if not differ:
        return lossless.Verdict(lossless.EXACT, "token-identical per seed to every request decoded alone with its "
                                "keyed seed", -1, 0, math.nan, 0.0, positions)
    group = differ[:replay_group(engine, ids_per_sequence)]
    prompts = [list(requests[i].prompt) for i in group]
    control = serving_noise(engine, prompts, [base[i] for i in group], k, temperature, seed)
    layout = layout_spread(engine, prompts, [base[i] for i in group])
    tol = max(lossless.SAFETY * max(control.max_spread, layout), control.floor)
    checked, n_mismatch, worst = 0, 0, None
    for i in differ:
        # the request's own key (its place in the trace), as the serving loop drew its tokens
        replay = engine._core.replay([list(requests[i].prompt)], [served[i]], float(temperature), int(seed), keys=[i])
        u = np.asarray(replay["u"])
        lo, hi = np.asarray(replay["cdf_lo"]), np.asarray(replay["cdf_hi"])
        mismatch = ~((lo <= u) & (u < hi))
        checked += u.size
        n_mismatch += int(mismatch.sum())
        explained = within_reach(u[mismatch], lo[mismatch], hi[mismatch], tol, temperature)
        if not explained.all():
            at = np.flatnonzero(mismatch)[np.flatnonzero(~explained)[0]]
            reason = (f"request {i} index {int(replay['index'][at])}: keyed uniform {u[at]:.4f} outside the served "
                      f"token's CDF interval [{lo[at]:.4f}, {hi[at]:.4f}) even with every logit moved by the "
                      f"tolerance {tol:.3g}")
            return lossless.Verdict(lossless.FAIL, reason, index, n_mismatch, math.nan, tol, checked)
        if mismatch.any():
            distance = float(cdf_distance(u[mismatch], lo[mismatch], hi[mismatch]).max())
            worst = distance if worst is None else max(worst, distance)
    allowed = int(stats.poisson.ppf(FLIP_QUANTILE, control.flip_rate_bound * checked))
    if n_mismatch > allowed:
        return lossless.Verdict(lossless.FAIL, f"{n_mismatch} near-tie mismatches in {checked} positions; the noise "
                                f"control's flip rate allows {allowed}", index, n_mismatch, math.nan, tol, checked)
    reason = (f"{len(differ)} request(s) differ from their decoding alone; every served token is the keyed draw on "
              f"a forced replay" if not n_mismatch else
              f"{n_mismatch} mismatch(es) in {checked} positions of {len(differ)} differing request(s), each within "
              f"the measured noise (largest distance of the keyed uniform from the served token's CDF interval "
              f"{worst:.3g}, within the reach of logit tolerance {tol:.3g} at T={temperature:g})")
    return lossless.Verdict(lossless.NUMERIC, reason, index, n_mismatch, math.nan, tol, checked)


def rejection_distribution(engine, requests: list[Request], temperature: float, seed: int, k: int,
                           min_positions: int, drafter: str = "model", drafter_options: dict | None = None,
                           draft_shape=None):
    """The rejection rule's distributional test (lossless.rejection_distribution) over the engine's
    closed-loop runs on the trace's distinct prompts (at most the engine's sequences), each
    generating the longest output length of the trace; run once per engine, prompts and settings.
    draft_shape: a draft tree (DraftShape) the runs draft instead of chains of k."""
    tree = draft_shape.spelling if draft_shape is not None and draft_shape.is_tree else None
    per = draft_shape.ids_per_sequence if draft_shape is not None else 1
    prompts = list(dict.fromkeys(r.prompt for r in requests))[:replay_group(engine, per)]
    n_predict = max(r.output_len for r in requests)
    cache = _cache(engine, "distribution")
    key = (tuple(prompts), float(temperature), int(seed), k, drafter, n_predict, min_positions,
           tuple(sorted((drafter_options or {}).items())), tree)
    if key not in cache:
        cache[key] = lossless.rejection_distribution(
            engine, [list(p) for p in prompts], temperature, seed, min_positions, n_predict=n_predict, k=k,
            drafter=drafter, drafter_options=drafter_options or None, **({"draft_shape": tree} if tree else {}))
    return cache[key]
