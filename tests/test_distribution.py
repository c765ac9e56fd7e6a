"""The rejection rule's distributional verdict (lossless.rejection_distribution): the KS bound, the
PIT's uniformity under a correct rule and not under a wrong one, every planted rejection-rule fault
failing at the sweep's default cell size, and the sweep's rejection cells carrying the verdict."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specnative import Engine, lossless
from specnative.models import tiny_pair
from specnative.schema import read_traces
from specnative.sweep import SweepConfig, run_sweep

from conftest import ENGINE_KW

PROMPTS8 = ["The city of", "Once upon a time there was a", "Hello", "In the morning", "A good teacher",
            "Dear friend,", "The report says", "Here is a list"]
REJECTION_FAULTS = ("residual_from_p", "accept_q_over_p", "q_prev_position", "accept_always", "bonus_from_q")
T = 0.8


# --- the statistic ------------------------------------------------------------------------------------
def test_ks_bound_of_points_is_the_ks_statistic():
    u = np.random.default_rng(3).random(500)
    assert lossless.ks_distance_lower_bound(u, u) == pytest.approx(stats.kstest(u, "uniform").statistic)


def test_ks_bound_of_uninformative_intervals_is_zero():
    n = 200
    assert lossless.ks_distance_lower_bound(np.zeros(n), np.ones(n)) == 0.0
    # intervals all inside [0.9, 1]: no placement is uniform
    assert lossless.ks_distance_lower_bound(np.full(n, 0.9), np.ones(n)) == pytest.approx(0.9)


def _synthetic_replay(rng, n_pos: int, n_vocab: int, emit_from: str) -> dict:
    """What replay() reports, computed in numpy for categorical draws: from p (a correct rule) or
    from a 'draft' q (accept-all)."""
    out = {key: [] for key in ("rank_above_sure", "rank_above_maybe", "p_emitted", "draft_order_above")}
    for _ in range(n_pos):
        p = rng.dirichlet(np.full(n_vocab, 0.3))
        q = rng.dirichlet(np.full(n_vocab, 0.3)) * 0.5 + p * 0.5
        x = rng.choice(n_vocab, p=p if emit_from == "p" else q)
        above = p[p > p[x]].sum()
        key = np.log(q) - np.log(p)
        ahead = (key > key[x]) | ((key == key[x]) & (np.arange(n_vocab) < x))
        out["rank_above_sure"].append(above)
        out["rank_above_maybe"].append(above + p[(p == p[x])].sum() - p[x])
        out["p_emitted"].append(p[x])
        out["draft_order_above"].append(p[ahead].sum())
    return {key: np.array(v) for key, v in out.items()}


@pytest.mark.parametrize("emit_from, passes", [("p", True), ("q", False)])
def test_pit_is_uniform_for_draws_from_p_only(emit_from, passes):
    rng = np.random.default_rng(11)
    replay = _synthetic_replay(rng, 1500, 40, emit_from)
    v = rng.random(1500)
    intervals = {order: [lossless.pit_intervals(replay, 0.0, T, v, order)] for order in lossless.ORDERS}
    test = lossless.distribution_test(intervals, 1, 0.0)
    assert test.passed is passes, test.reason


def test_noise_tolerance_only_widens_the_intervals():
    rng = np.random.default_rng(5)
    replay = _synthetic_replay(rng, 300, 20, "p")
    v = rng.random(300)
    for order in lossless.ORDERS:
        lo0, hi0 = lossless.pit_intervals(replay, 0.0, T, v, order)
        lo, hi = lossless.pit_intervals(replay, 0.5, T, v, order)
        np.testing.assert_allclose(lo0, hi0, atol=1e-12)  # no noise, no ties: u itself
        assert np.all(lo <= lo0 + 1e-12) and np.all(hi >= hi0 - 1e-12) and np.all(hi - lo > 0)


def test_per_position_tolerances_and_the_tail_widen_each_interval_by_its_own():
    """One tolerance per position: a quiet position keeps a point, a noisy one an interval; the
    mass outside the tolerance's window widens every interval on both sides."""
    rng = np.random.default_rng(7)
    replay = _synthetic_replay(rng, 200, 20, "p")
    v = rng.random(200)
    tolerance = np.where(np.arange(200) % 2 == 0, 0.0, 0.5)
    lo, hi = lossless.pit_intervals(replay, tolerance, T, v, "draft")
    np.testing.assert_allclose(lo[0::2], hi[0::2], atol=1e-12)
    assert np.all(hi[1::2] - lo[1::2] > 0)
    lo_t, hi_t = lossless.pit_intervals(replay, tolerance, T, v, "draft", tail=0.01)
    np.testing.assert_allclose(np.minimum(hi_t, 1.0) - hi, np.minimum(hi + 0.01, 1.0) - hi, atol=1e-12)
    np.testing.assert_allclose(lo - lo_t, lo - np.maximum(lo - 0.01, 0.0), atol=1e-12)
    test = lossless.distribution_test({"draft": [(lo, hi)]}, 1, tolerance)
    assert test.tolerance == pytest.approx(0.5) and test.median_tolerance == pytest.approx(0.25)
    slack = lossless.tail_slack(np.array([0.0, 0.001, 0.4]), np.array([1.0, 0.8, 2.0]), T)
    np.testing.assert_allclose(slack, [0.0, 2 * 0.001 * np.exp(0.8 / T), 1.0])  # grown odds, both sides, capped


# --- the engine -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def far_engine(model_dir):
    """Draft = target + 10 % weight noise: rejections are common, so each fault changes the output."""
    target, draft = tiny_pair(model_dir, "noisy", noise=0.1)
    with Engine(target, draft, n_ctx=4096, n_batch=512, n_seq_max=8, **ENGINE_KW) as engine:
        base = engine.generate(PROMPTS8, n_predict=32, temperature=T, seed=0)
        engine.control = lossless.measure_noise(engine, PROMPTS8, base.tokens, 4)
        yield engine


def _dist(engine, fault: str) -> lossless.DistributionTest:
    engine._core._inject_fault(fault)
    try:
        return lossless.rejection_distribution(engine, PROMPTS8, T, 0,
                                               SweepConfig.dist_positions, n_predict=32, k=4)
    finally:
        engine._core._inject_fault("none")


def test_correct_rule_passes_at_the_default_cell_size(far_engine):
    """A fixed seed; the false-alarm rate is lossless.DIST_ALPHA (1e-3) by construction."""
    test = _dist(far_engine, "none")
    assert test.passed, test.reason
    assert test.positions >= SweepConfig.dist_positions and test.runs == -(-test.positions // (8 * 32))


@pytest.mark.parametrize("fault", REJECTION_FAULTS)
def test_each_rejection_fault_fails_at_the_default_cell_size(far_engine, fault):
    """bench/results/rejection-power-*.md: the positions each fault needs; 1024 is the default."""
    test = _dist(far_engine, fault)
    assert not test.passed, test.reason


def test_position_noise_is_measured_on_the_runs_own_tokens_in_replay_order(far_engine):
    """The replay visits positions step by step across the sequences; each tolerance must be the
    one measured at its own (sequence, index)."""
    prompts = far_engine.to_token_prompts(PROMPTS8[:3])
    out = far_engine.generate(prompts, n_predict=12, temperature=T, seed=4, spec=True, k=4, accept_rule="rejection")
    tokens = [list(map(int, t)) for t in out.tokens]
    mass_windows = [w * T for w in lossless.MASS_WINDOWS_T]
    replay = far_engine._core.replay(prompts, tokens, T, 4, mass_windows=mass_windows)
    windows, full = lossless.position_noise(far_engine, prompts, tokens, 4, T, "", replay["seq"], replay["index"])
    raw = far_engine._core.numeric_noise(prompts, tokens, 1, 5, mass_windows=mass_windows)
    measured = {(int(s), int(i)): r for r, (s, i) in enumerate(zip(raw["seq"], raw["index"]))}
    assert windows.shape == (len(mass_windows), replay["seq"].size) and full.size == replay["seq"].size
    assert not np.array_equal(np.argsort(replay["seq"], kind="stable"), np.arange(replay["seq"].size))  # interleaved
    for at, (s, i) in enumerate(zip(replay["seq"], replay["index"])):
        r = measured[(int(s), int(i))]
        assert full[at] == pytest.approx(lossless.SAFETY * raw["spread"][r])
        for w in range(len(mass_windows)):
            assert windows[w, at] == pytest.approx(lossless.SAFETY * raw["window_spread"][w][r])
    assert np.all(np.diff(windows, axis=0) >= -1e-6) and np.all(windows <= full + 1e-6)  # wider window, more tokens
    tails = np.array(replay["tail_mass"])
    assert tails.shape == (len(mass_windows), replay["seq"].size) and np.all((tails >= 0) & (tails < 1))
    assert np.all(np.diff(tails, axis=0) <= 1e-12)  # wider window, less mass beyond it
    assert far_engine._core.replay(prompts, tokens, T, 4)["tail_mass"] == []  # only on request
    with pytest.raises(ValueError, match="mass window"):
        far_engine._core.replay(prompts, tokens, T, 4, mass_windows=[-1.0])


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
    assert no_stress.passed and _dist(far_engine, "none").passed
    for bad in (dict(temperature=0.0, draft_temperature=1.0), dict(temperature=T, draft_temperature=0.0),
                dict(temperature=T, draft_temperature=1.0, drafter="ngram-simple")):
        with pytest.raises(ValueError, match="draft_temperature"):
            far_engine.generate(PROMPTS8[:1], n_predict=4, spec=True, **bad)
