"""The rejection rule's own evidence in the distributional verdict (lossless.distribution): every
draft the acceptance walk reached, judged apart from the rule against min(1, p/q), and every
rejection's correction placed in norm(max(0, p - q)). On a near-copy pair a faulty rule changes
few emitted tokens, so their PIT alone passes; the decisions, the acceptance count, the residuals
and the bonus tokens still fail it. An underpowered test says so."""
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

PROMPTS4 = ["The city of", "Once upon a time there was a", "Hello", "In the morning"]
T = 1.2


# --- the statistics on synthetic draws ------------------------------------------------------------------
def test_poisson_binomial_pmf_is_exact():
    pmf = distribution.poisson_binomial_pmf(np.full(40, 0.3))
    np.testing.assert_allclose(pmf, stats.binom.pmf(np.arange(41), 40, 0.3), atol=1e-14)
    probs = np.array([0.1, 0.5, 0.9])  # brute force over the 8 outcomes
    brute = np.zeros(4)
    for outcome in np.ndindex(2, 2, 2):
        brute[sum(outcome)] += np.prod(np.where(outcome, probs, 1 - probs))
    np.testing.assert_allclose(distribution.poisson_binomial_pmf(probs), brute, atol=1e-15)


def _synthetic_decisions(rng, n: int, rule: str):
    """Drafts judged under a correct rule (kept with probability pi), one that keeps every draft,
    or one that rejects a tenth of the drafts a correct rule keeps for sure (pi = 1)."""
    pi = np.where(rng.random(n) < 0.5, 1.0, rng.random(n))
    kept = rng.random(n) < pi
    if rule == "always":
        kept[:] = True
    elif rule == "reject_sure":
        kept &= ~((pi == 1.0) & (rng.random(n) < 0.1))
    return pi, kept


@pytest.mark.parametrize("rule, passes", [("correct", True), ("always", False), ("reject_sure", False)])
def test_decisions_and_their_count_are_judged_against_pi(rule, passes):
    rng = np.random.default_rng(7)
    pi, kept = _synthetic_decisions(rng, 2000, rule)
    u = distribution.decision_pits(pi, kept, rng.random(pi.size))
    ks = distribution.ks_test("decisions", [(u, u)])
    count = distribution.acceptance_test(pi, kept)
    if passes:
        assert ks.p_value >= 1e-3 and count.p_value >= 1e-3, (ks, count)
    else:
        assert count.p_value < 1e-6, (ks, count)


@pytest.mark.parametrize("drawn_from, passes", [("r", True), ("p", False)])
def test_residual_pit_is_uniform_for_draws_from_the_residual_only(drawn_from, passes):
    """What the engine records for a rejection (DecisionPoint), in numpy: r's mass ahead of the
    token (r descending, ties by id) and r(token)."""
    rng = np.random.default_rng(3)
    ahead, prob = [], []
    for _ in range(1500):
        p, q = rng.dirichlet(np.full(30, 0.3)), rng.dirichlet(np.full(30, 0.3))
        r = np.maximum(p - q, 0.0)
        r /= r.sum()
        c = rng.choice(30, p=r if drawn_from == "r" else p)
        ids = np.arange(30)
        ahead.append(r[(r > r[c]) | ((r == r[c]) & (ids < c))].sum())
        prob.append(r[c])
    u = distribution.residual_pits(np.array(ahead), np.array(prob), rng.random(1500))
    assert (distribution.ks_test("residuals", [(u, u)]).p_value >= 1e-3) is passes


# --- the engine's record ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def near_pair(model_dir):
    """A near copy: the 2-layer base as draft under a 4-layer target whose 2 extra layers are damped
    to 0.05 (acceptance ~0.92 at T 0.7): rejections are rare, so a wrong rule changes few tokens."""
    return tiny_pair(model_dir, "deep", extra_layers=2, extra_damping=0.05)


@pytest.fixture(scope="module")
def near_engine(near_pair):
    with Engine(*near_pair, n_ctx=4096, n_batch=512, n_seq_max=4, **ENGINE_KW) as engine:
        yield engine


def _softmax(logits, temperature):
    z = np.exp((logits.astype(np.float64) - logits.max()) / temperature)
    return z / z.sum()


def test_each_decision_is_judged_on_its_own_row_and_draft(near_engine, near_pair):
    """pi and the residual placement agree with the target's and the draft's softmax on the same
    prefix computed apart (prompt_logits of each model; the tiny models' batch-shape noise is ~0):
    accepted drafts are the emitted tokens at their index, a rejected one is followed by its
    correction at the same index, and every emitted token without a decision is a bonus token."""
    prompts = near_engine.to_token_prompts(PROMPTS4[:2])
    out = near_engine.generate(prompts, n_predict=24, temperature=T, seed=5, spec=True, k=4,
                               accept_rule="rejection", draft_temperature=2 * T, record_pit=True)
    checked = {"accepted": 0, "rejected": 0}
    with Engine(near_pair[1], n_ctx=1024, n_seq_max=1, **ENGINE_KW) as draft:
        for prompt, tokens, seq in zip(prompts, out.tokens, out.pit):
            assert np.all(np.diff(seq["decision_index"]) >= 0) and np.isin(seq["decision_index"], seq["index"]).all()
            for at, (i, pi, kept) in enumerate(zip(seq["decision_index"], seq["accept_prob"], seq["accepted"])):
                prefix = list(prompt) + list(map(int, tokens[:i]))
                p = _softmax(near_engine.prompt_logits(prefix), T)
                q = _softmax(draft.prompt_logits(prefix), 2 * T)
                x = int(tokens[i])
                if kept:
                    assert pi == pytest.approx(min(1.0, p[x] / q[x]), abs=2e-3)
                    assert np.isnan(seq["residual_prob"][at])
                    checked["accepted"] += 1
                else:
                    r = np.maximum(p - q, 0.0)
                    assert seq["residual_prob"][at] == pytest.approx(r[x] / r.sum(), abs=2e-3)
                    assert 0.0 <= seq["residual_ahead"][at] <= 1.0 - seq["residual_prob"][at] + 1e-9
                    checked["rejected"] += 1
    assert checked["accepted"] > 0 and checked["rejected"] > 0, checked  # the hotter draft makes both


# --- the verdict ------------------------------------------------------------------------------------------
def _test(engine, fault: str, positions: int, stress: bool = False) -> lossless.DistributionTest:
    with injected(engine, fault):
        return lossless.rejection_distribution(engine, PROMPTS4, T, 0, positions, stress=stress, n_predict=32, k=4)


def _tokens_alone(test: lossless.DistributionTest) -> float:
    """The test before the decisions were recorded: the emitted tokens' two PIT orders, Bonferroni."""
    return min(1.0, 2 * min(test.p_of("target"), test.p_of("draft")))


@pytest.mark.parametrize("stress", [False, True])
def test_the_correct_rule_passes_every_statistic(near_engine, stress):
    test = _test(near_engine, "none", distribution.MIN_DIST_POSITIONS, stress)
    assert test.passed, test.reason
    assert {s.name for s in test.statistics} == set(distribution.STATISTICS), test.reason
    assert test.decisions > 0 and test.residuals > 0 and "UNDERPOWERED" not in test.reason


@pytest.mark.parametrize("fault, positions, caught_by", [
    ("q_prev_position", 256, {"acceptances", "decisions"}),
    ("accept_q_over_p", 256, {"acceptances", "decisions"}),
    ("accept_always", 1024, {"acceptances", "decisions"}),
    ("residual_from_p", 1024, {"residuals"}),
    ("bonus_from_q", 124, {"bonus"}),
])
def test_each_rejection_fault_fails_where_the_emitted_tokens_alone_pass(near_engine, fault, positions, caught_by):
    """Drafting at the user's temperature (no stress runs): a wrong rule changes few of the near
    copy's tokens, and the test of the emitted tokens alone passes it; the rule's own evidence
    does not (fixed seed; margins of >= 20x on both sides of DIST_ALPHA on this pair)."""
    test = _test(near_engine, fault, positions)
    assert not test.passed and test.decided_by in caught_by, test.reason
    assert _tokens_alone(test) >= lossless.DIST_ALPHA, test.reason


def test_an_underpowered_test_says_so(near_engine):
    small = _test(near_engine, "none", 1)
    assert small.passed and small.underpowered and small.positions < distribution.MIN_DIST_POSITIONS
    assert f"UNDERPOWERED: {small.positions} positions are fewer than the {distribution.MIN_DIST_POSITIONS}" \
        in small.reason, small.reason
    big = _test(near_engine, "none", distribution.MIN_DIST_POSITIONS)
    assert not big.underpowered and f"{big.positions} positions" in big.reason


def test_sweep_rows_carry_the_decisions(near_pair, tmp_path):
    """A rejection cell's row: the decisions' and residuals' counts and p-values, which statistic
    decided, and the reason saying the cell's test was underpowered below the minimum."""
    cfg = SweepConfig(targets=[near_pair[0]], draft=near_pair[1], ctx_lens=[0], concurrencies=[2], temperatures=[T],
                      accept_rule="rejection", n_predict=16, warmup=1, repeats=2, max_repeats=2, threads=1,
                      out_dir=tmp_path / "run", report=False, dist_positions=64)
    on = read_traces(run_sweep(cfg)).query("spec_decode == 'on'").iloc[0]
    assert on["verdict"] == lossless.EXACT_DIST, on["verdict_reason"]
    assert on["dist_decisions"] > 0 and on["dist_residuals"] > 0 and 0 <= on["dist_decision_p_value"] <= 1
    assert on["dist_decided_by"] in distribution.STATISTICS
    assert "UNDERPOWERED" in on["verdict_reason"] and "drafts judged" in on["verdict_reason"]
