"""Steady-state concurrency: rates come from the iterations in which every sequence is active, so
that speedup = tau / (1 + c) holds exactly at every concurrency (the tail of a fixed batch, where
finished sequences have left, is not what a server at load N sees)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from specnative import theory
from specnative.sweep import rows as sweep_rows

PROMPTS8 = ["The city of", "Once upon a time there was a", "Hello", "A B C D", "x", "Dear sir",
            "The report of the", "In the morning"]


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_identity_is_exact_in_the_engine(noisy_engine, concurrency):
    prompts = PROMPTS8[:concurrency]
    base = noisy_engine.generate(prompts, n_predict=24)
    spec = noisy_engine.generate(prompts, n_predict=24, spec=True, k=4)
    c = theory.verify_cost_c(spec.steady["iteration_ms"], base.steady["iteration_ms"])
    speedup = spec.steady["tps"] / base.steady["tps"]
    assert speedup == pytest.approx(spec.steady["tau"] / (1 + c), rel=1e-9)
    assert base.steady["tau"] == pytest.approx(1.0)
    assert 0 < spec.occupancy <= 1 and spec.steady["steps"] <= spec.steps
    if concurrency == 1:  # one sequence: the whole run is steady
        assert spec.steady["steps"] == spec.steps and spec.occupancy == 1


def test_window_ends_when_the_first_sequence_finishes(noisy_engine):
    spec = noisy_engine.generate(PROMPTS8[:4], n_predict=24, spec=True, k=4)
    # every steady round emitted at least one token per sequence, and the window is a prefix
    assert spec.steady["tokens"] >= 4 * spec.steady["steps"]
    assert sum(len(t) for t in spec.tokens) - 4 >= spec.steady["tokens"]


def fake_run(tokens, ms, steps, n_seq=4, occupancy=1.0):
    return SimpleNamespace(steady={"tokens": tokens, "ms": ms, "steps": steps, "tps": tokens / ms * 1000},
                           tokens=[[0]] * n_seq, occupancy=occupancy)


def test_pooled_rows_keep_the_identity_exact():
    on = [fake_run(330, 700.0, 30), fake_run(310, 800.0, 29)]
    off = [fake_run(400, 900.0, 100), fake_run(400, 1000.0, 100)]
    p_on, p_off = sweep_rows.pooled_steady(on), sweep_rows.pooled_steady(off)
    c = theory.verify_cost_c(p_on["iteration_ms"], p_off["iteration_ms"])
    assert p_on["tps"] / p_off["tps"] == pytest.approx(p_on["tau"] / (1 + c), rel=1e-12)
    assert p_off["tau"] == pytest.approx(1.0)
    assert math.isclose(p_on["occupancy"], 1.0)
