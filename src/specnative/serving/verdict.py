"""Losslessness under continuous batching: every request's greedy output against the request
decoded alone, with a noise control that covers the widest batch serving builds and the cache
layout (a slot's cells move as others empty and refill)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from specnative import lossless
from specnative.serving.arrivals import Request

_ALONE: dict = {}  # (engine id, prompt, output_len) -> tokens of the request decoded alone


def decoded_alone(engine, request: Request) -> list:
    key = (id(engine), request.prompt, request.output_len)
    if key not in _ALONE:
        result = engine.generate([list(request.prompt)], n_predict=request.output_len, stop_at_eos=False)
        _ALONE[key] = result.tokens[0]
    return _ALONE[key]


def serving_noise(engine, prompts: list, base: list, k: int) -> lossless.NoiseControl:
    """The batch-shape control for serving: the target's noise between 1-token steps and the
    widest batch serving builds. A decode or verify token there shares its llama_decode with
    other slots' prompt chunks, up to n_batch tokens, and CPU kernels change with the batch size,
    so the verify shape (k+1 per sequence) alone can understate it; the larger of the two stands."""
    control = lossless.measure_noise(engine, prompts, base, k)
    widest = engine.context_info()["n_batch"] // len(prompts)
    if widest > k + 1:
        wide = lossless.measure_noise(engine, prompts, base, widest - 1)
        if wide.max_spread > control.max_spread:
            return wide
    return control


def layout_spread(engine, prompts: list, base: list) -> float:
    """The cache-layout control: how far the logits after the same tokens move when a sequence's
    cells sit beside other sequences' in the unified cache (in the group's order and reversed)
    rather than alone. Attention sums run over the buffer with the others' cells masked, so where
    a sequence's cells sit changes the vector lanes its sums are grouped in; serving moves cells
    around as slots empty and refill. Measured up to 0.15 logits on the tiny Q4_0 target, where
    the batch-shape control reads 0."""
    alone = [engine._core.replay([p], [b], 0.0, 0)["final_logits"][0] for p, b in zip(prompts, base)]
    spread = 0.0
    for order in (list(range(len(prompts))), list(range(len(prompts)))[::-1]):
        together = engine._core.replay([prompts[i] for i in order], [base[i] for i in order], 0.0, 0)["final_logits"]
        for at, i in enumerate(order):
            delta = np.asarray(together[at], np.float64) - np.asarray(alone[i], np.float64)
            spread = max(spread, float(delta.max() - delta.min()))
    return spread


def serving_verdict(engine, requests: list[Request], tokens: list, k: int) -> lossless.Verdict:
    """Greedy outputs of a serving run against each request decoded alone: exact, numeric (every
    difference within the target's measured noise on forced replay) or fail. Judged in groups of
    at most the engine's sequences; the worst group's verdict stands. The noise is the larger of
    each group's batch-shape control (serving_noise) and the cache-layout spread pooled over all
    groups (layout_spread: a property of the model and the cache, not of one prompt)."""
    n_seq = engine.context_info()["n_seq_max"]
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
