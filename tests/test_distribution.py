"""The rejection rule's distributional verdict (lossless.rejection_distribution): the KS bound, the
PIT's uniformity under a correct rule and not under a wrong one, every planted rejection-rule fault
failing at the sweep's default cell size, and the sweep's rejection cells carrying the verdict."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import ENGINE_KW, injected
from scipy import stats

from specnative import Engine, lossless
from specnative.lossless import distribution
from specnative.models import tiny_pair
from specnative.record.schema import read_traces
from specnative.sweep import SweepConfig, run_sweep

PROMPTS8 = ["The city of", "Once upon a time there was a", "Hello", "In the morning", "A good teacher",
            "Dear friend,", "The report says", "Here is a list"]
REJECTION_FAULTS = ("residual_from_p", "accept_q_over_p", "q_prev_position", "accept_always", "bonus_from_q")
T = 0.8


# --- the statistic ------------------------------------------------------------------------------------
def test_ks_bound_of_points_is_the_ks_statistic():
    u = np.random.default_rng(3).random(500)
    assert distribution.ks_distance_lower_bound(u, u) == pytest.approx(stats.kstest(u, "uniform").statistic)


def test_ks_bound_of_uninformative_intervals_is_zero():
    n = 200
    assert distribution.ks_distance_lower_bound(np.zeros(n), np.ones(n)) == 0.0
    # intervals all inside [0.9, 1]: no placement is uniform
    assert distribution.ks_distance_lower_bound(np.full(n, 0.9), np.ones(n)) == pytest.approx(0.9)


def _synthetic_points(rng, n_pos: int, n_vocab: int, emit_from: str) -> dict:
    """What generate(record_pit=True) reports, computed in numpy for categorical draws: from p (a
    correct rule) or from a 'draft' q (accept-all)."""
    out = {key: [] for key in distribution.PIT_FIELDS}
    for i in range(n_pos):
        p = rng.dirichlet(np.full(n_vocab, 0.3))
        q = rng.dirichlet(np.full(n_vocab, 0.3)) * 0.5 + p * 0.5
        x = rng.choice(n_vocab, p=p if emit_from == "p" else q)
        above = p[p > p[x]].sum()
        key = np.log(q) - np.log(p)
        ahead = p[(key > key[x]) | ((key == key[x]) & (np.arange(n_vocab) < x))].sum()
        for field, value in zip(distribution.PIT_FIELDS, (i, p[x], above, above + p[p == p[x]].sum() - p[x], ahead, ahead)):
            out[field].append(value)
    return {key: np.array(v) for key, v in out.items()}


@pytest.mark.parametrize("emit_from, passes", [("p", True), ("q", False)])
def test_pit_is_uniform_for_draws_from_p_only(emit_from, passes):
    rng = np.random.default_rng(11)
    points = _synthetic_points(rng, 1500, 40, emit_from)
    v = rng.random(1500)
    intervals = {order: [distribution.pit_intervals(points, v, order)] for order in distribution.ORDERS}
    test = lossless.distribution_test(intervals, 1)
    assert test.passed is passes, test.reason


def test_ties_make_an_interval_as_wide_as_their_mass():
    points = {"p_emitted": np.array([0.25, 0.5]), "above_sure": np.array([0.5, 0.0]),
              "above_maybe": np.array([0.75, 0.0]), "draft_above_sure": np.zeros(2), "draft_above_maybe": np.zeros(2)}
    lo, hi = distribution.pit_intervals(points, np.array([0.5, 0.5]), "target")
    np.testing.assert_allclose(lo, [0.625, 0.25])
    np.testing.assert_allclose(hi, [0.875, 0.25])  # a tie of mass 0.25 ahead or behind; none


# --- the engine -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def far_engine(model_dir):
    """Draft = target + 10 % weight noise: rejections are common, so each fault changes the output."""
    target, draft = tiny_pair(model_dir, "noisy", noise=0.1)
    with Engine(target, draft, n_ctx=4096, n_batch=512, n_seq_max=8, **ENGINE_KW) as engine:
        yield engine


def _dist(engine, fault: str) -> lossless.DistributionTest:
    with injected(engine, fault):
        return lossless.rejection_distribution(engine, PROMPTS8, T, 0,
                                               SweepConfig.dist_positions, n_predict=32, k=4)


def test_correct_rule_passes_at_the_default_cell_size(far_engine):
    """A fixed seed; the false-alarm rate is lossless.DIST_ALPHA (1e-3) by construction."""
    test = _dist(far_engine, "none")
    assert test.passed, test.reason
    per_run = 8 * 31  # every sequence's tokens after its first
    assert test.positions >= SweepConfig.dist_positions and test.runs == -(-SweepConfig.dist_positions // per_run)


@pytest.mark.parametrize("fault", REJECTION_FAULTS)
def test_each_rejection_fault_fails_at_the_default_cell_size(far_engine, fault):
    """bench/results/rejection-power-*.md: the positions each fault needs at most, the default."""
    test = _dist(far_engine, fault)
    assert not test.passed, test.reason


def test_pit_places_every_round_token_in_its_own_verify_rows_p(far_engine):
    """The recorder reads the right verify row: every token after the first (which the prompt's
    logits give) has a point, and its p(emitted) and mass ahead agree with the target's softmax
    on the same prefix computed apart (the tiny models' batch-shape noise is ~0)."""
    prompts = far_engine.to_token_prompts(PROMPTS8[:3])
    out = far_engine.generate(prompts, n_predict=12, temperature=T, seed=4, spec=True, k=4, accept_rule="rejection",
                              record_pit=True)
    assert len(out.pit) == 3
    for prompt, tokens, points in zip(prompts, out.tokens, out.pit):
        np.testing.assert_array_equal(points["index"], np.arange(1, len(tokens)))
        for i, x in zip(points["index"], tokens[1:]):
            logits = far_engine.prompt_logits(list(prompt) + list(map(int, tokens[:i]))).astype(np.float64)
            p = np.exp((logits - logits.max()) / T)
            p /= p.sum()
            at = int(i) - 1
            assert points["p_emitted"][at] == pytest.approx(p[x], abs=2e-3)
            assert points["above_sure"][at] == pytest.approx(p[logits > logits[x]].sum(), abs=2e-3)
        assert np.all(points["above_sure"] <= points["above_maybe"])
        assert np.all((points["draft_above_sure"] >= 0) & (points["draft_above_sure"] + points["p_emitted"] <= 1 + 1e-9))
    with pytest.raises(ValueError, match="record_pit"):
        far_engine.generate(prompts, n_predict=4, temperature=T, spec=True, accept_rule="match", record_pit=True)


def test_greedy_has_no_distributional_test(far_engine):
    with pytest.raises(ValueError, match="temperature > 0"):
        lossless.rejection_distribution(far_engine, PROMPTS8, 0.0, 0, 10, n_predict=4, k=2)


# --- judge: a missing or short output is never lossless ------------------------------------------------
def test_missing_sequences_and_cut_outputs_fail(far_engine):
    prompts = PROMPTS8[:3]
    base = far_engine.generate(prompts, n_predict=8)
    control = lossless.measure_noise(far_engine, prompts, base.tokens, 2)
    judge = lambda spec: lossless.judge(far_engine, prompts, base.tokens, spec, 0.0, 0, control)
    assert judge(base.tokens).verdict == lossless.EXACT
    fewer = judge(base.tokens[:2])
    assert fewer.verdict == lossless.FAIL and "2 sequence(s)" in fewer.reason
    cut = judge([base.tokens[0][:3], *base.tokens[1:]])
    assert cut.verdict == lossless.FAIL and "cut short" in cut.reason
    longer = judge([np.append(base.tokens[0], base.tokens[0][-1]), *base.tokens[1:]])
    assert longer.verdict == lossless.FAIL and "longer" in longer.reason


# --- the sweep ------------------------------------------------------------------------------------------
def test_sweep_rejection_cells_get_the_distributional_verdict(model_dir, tmp_path):
    target, draft = tiny_pair(model_dir, "noisy", noise=0.1)
    cfg = SweepConfig(targets=[target], draft=draft, ctx_lens=[0], concurrencies=[4], temperatures=[T],
                      accept_rule="rejection", n_predict=16, warmup=1, repeats=2, max_repeats=2, threads=1,
                      out_dir=tmp_path / "run", report=False, dist_positions=256)
    rows = read_traces(run_sweep(cfg))
    on = rows[rows["spec_decode"] == "on"].iloc[0]
    assert on["verdict"] == lossless.EXACT_DIST and bool(on["lossless_ok"]), on["verdict_reason"]
    assert on["lossless_method"] == "distribution" and on["proxy_verdict"] in (lossless.EXACT, lossless.NUMERIC)
    assert on["dist_positions"] >= 256 and 0 <= on["dist_statistic"] < 1 and on["dist_p_value"] >= lossless.DIST_ALPHA
    assert "match proxy" in on["verdict_reason"] and "KS distance" in on["verdict_reason"]


def test_draft_temperature_changes_the_draft_not_the_distribution(far_engine):
    """A hotter draft proposes other tokens (lower acceptance); the rule stays lossless for any q,
    which the distributional test's stress runs rely on. Refused where it means nothing."""
    kwargs = dict(n_predict=32, temperature=T, seed=3, spec=True, k=4, accept_rule="rejection")
    plain = far_engine.generate(PROMPTS8, **kwargs)
    hot = far_engine.generate(PROMPTS8, draft_temperature=4 * T, **kwargs)
    assert hot.draft_accept_rate < plain.draft_accept_rate
    no_stress = lossless.rejection_distribution(far_engine, PROMPTS8, T, 0, 512, stress=False,
                                                n_predict=32, k=4)
    assert no_stress.passed  # with the stress runs: test_correct_rule_passes_at_the_default_cell_size
    for bad in (dict(temperature=0.0, draft_temperature=1.0), dict(temperature=T, draft_temperature=0.0),
                dict(temperature=T, draft_temperature=1.0, drafter="ngram-simple")):
        with pytest.raises(ValueError, match="draft_temperature"):
            far_engine.generate(PROMPTS8[:1], n_predict=4, spec=True, **bad)
