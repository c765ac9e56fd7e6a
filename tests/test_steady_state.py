"""Steady-state concurrency: rates come from the iterations in which every sequence is active (a
server's constant load N), not the tail of a fixed batch where finished sequences have left. The
window is checked against the exact counts: it ends with the round in which the first sequence
finishes. (speedup = tau / (1 + c) then holds by the definitions in theory.py, given tau = 1 for
the baseline, which is what is checked.)"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from specnative.sweep import rows as sweep_rows

PROMPTS8 = ["The city of", "Once upon a time there was a", "Hello", "A B C D", "x", "Dear sir",
            "The report of the", "In the morning"]
K = 4


def window_bounds(run, k: int) -> tuple[int, int]:
    """The tokens a window of the first m rounds can hold, m = the fewest rounds of any sequence:
    each sequence's later rounds emit 1..k+1 tokens each, the rest are the window's."""
    m = min(c["rounds"] for c in run.counts)
    later = [c["rounds"] - m for c in run.counts]
    return (sum(c["emitted"] - (k + 1) * n for c, n in zip(run.counts, later)),
            sum(c["emitted"] - n for c, n in zip(run.counts, later)))


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_the_window_ends_when_the_first_sequence_finishes(noisy_engine, concurrency):
    prompts = PROMPTS8[:concurrency]
    spec = noisy_engine.generate(prompts, n_predict=24, spec=True, k=K)
    rounds = [c["rounds"] for c in spec.counts]
    assert spec.steady["steps"] == min(rounds)  # every sequence starts in round 1 and stays until done
    low, high = window_bounds(spec, K)
    assert low <= spec.steady["tokens"] <= high
    assert spec.steady["tokens"] >= concurrency * spec.steady["steps"]  # each steady round emits per sequence
    assert spec.steady["tau"] == pytest.approx(spec.steady["tokens"] / (spec.steady["steps"] * concurrency))
    assert spec.occupancy == pytest.approx(sum(rounds) / (spec.steps * concurrency))  # mean share active
    spent = spec.times["draft"] + spec.times["draft_ingest"] + spec.times["verify"] + spec.times["resample"]
    assert spec.steady["ms"] <= spent * (1 + 1e-9)
    if concurrency == 1:  # one sequence: the whole run is steady
        assert spec.steady["steps"] == spec.steps and spec.occupancy == 1
        assert spec.steady["tokens"] == spec.totals["emitted"]
        assert spec.steady["ms"] == pytest.approx(spent, rel=1e-9)
    else:
        assert max(rounds) > min(rounds) and spec.steady["steps"] < spec.steps  # a tail was left out


def test_the_baseline_window_is_every_step_one_token_each(noisy_engine):
    """Sequences decoded together one token per step finish together: every step is steady, and
    tau (tokens per sequence per iteration) is exactly 1, so speedup = steady tau / (1 + c)."""
    base = noisy_engine.generate(PROMPTS8[:3], n_predict=24, stop_at_eos=False)
    assert base.steady["steps"] == base.steps == 23 and base.occupancy == 1
    assert base.steady["tokens"] == 3 * 23 and base.steady["tau"] == 1.0
    assert base.steady["ms"] == pytest.approx(base.times["decode"], rel=1e-9)


def fake_run(tokens, ms, steps, n_seq=4, occupancy=1.0):
    return SimpleNamespace(steady={"tokens": tokens, "ms": ms, "steps": steps, "tps": tokens / ms * 1000},
                           tokens=[[0]] * n_seq, occupancy=occupancy)


def test_pooled_rows_sum_the_windows_over_repeats():
    """Pooled, not averaged: 640 tokens in 1.5 s over 59 rounds of 4 sequences. The mean of the two
    runs' rates (471.4 and 387.5 tokens/s) would be 429.5, not 426.7."""
    on = [fake_run(330, 700.0, 30, occupancy=0.9), fake_run(310, 800.0, 29, occupancy=0.8)]
    pooled = sweep_rows.pooled_steady(on)
    assert pooled["tps"] == pytest.approx(640 / 1.5)
    assert pooled["iteration_ms"] == pytest.approx(1500.0 / 59)
    assert pooled["tau"] == pytest.approx(640 / (59 * 4))
    assert pooled["occupancy"] == pytest.approx(0.85)
    off = sweep_rows.pooled_steady([fake_run(400, 900.0, 100), fake_run(400, 1000.0, 100)])
    assert off["tau"] == 1.0 and off["iteration_ms"] == pytest.approx(9.5)
    assert math.isnan(sweep_rows.pooled_steady([fake_run(0, 1.0, 0)])["tau"])  # no steady round
