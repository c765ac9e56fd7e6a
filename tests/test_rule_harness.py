"""The acceptance rule itself, without a model (the C++ rule harness, rule_harness.h): the chain's
and the tree's rule fed synthetic p and q with real mass on their top tokens, drawn a million
times; the token emitted at each depth must be distributed as p. Every planted fault of the rule
fails the same test.

The statistic: a G-test per depth of the emitted tokens' counts against p (scipy), Bonferroni over
the depths, failing below ALPHA (fixed seeds: the outcome is deterministic; ALPHA is how unlikely
a correct rule is to fail were the seed varied). At N draws it fails, with probability >= 95 %,
any deviation whose noncentrality N * sum((p' - p)^2 / p) exceeds ~47 (15 degrees of freedom at
1e-3): at 1e6 draws, 1e-3 of mass moved onto or off a token of probability <= 0.02, or 2.6e-3
between tokens of 0.36 and 0.23 (test_the_bound_sees_a_small_deviation)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specnative import _core

V = 16
N = 1_000_000
ALPHA = 1e-3
CHAIN_DEPTH, TREE_DEPTH = 3, 2  # drafts per chain; a tree's levels of children
# the rule's own faults (acceptor.h): each changes the distribution of what the rule emits
CHAIN_FAULTS = ("residual_from_p", "accept_q_over_p", "q_prev_position", "accept_always", "bonus_from_q",
                "verify_position")
TREE_FAULTS = ("tree_residual_stale", "tree_sibling_twice", "tree_bonus_wrong_node",
               "tree_siblings_with_replacement", "tree_sibling_one_uniform")


def _softmax(logits):
    z = np.exp(logits - logits.max())
    return z / z.sum()


def _case(name: str) -> tuple[np.ndarray, np.ndarray]:
    """p (CHAIN_DEPTH + 1 rows, the last the bonus row) and q (CHAIN_DEPTH rows) over V tokens."""
    rng = np.random.default_rng(2024)
    base = rng.standard_normal((CHAIN_DEPTH + 1, V))
    noise = rng.standard_normal((CHAIN_DEPTH, V))
    if name == "peaked":  # top token p ~0.4, q ~0.5-0.9: siblings drawn first carry much of q
        return (np.array([_softmax(2.5 * b) for b in base]),
                np.array([_softmax(2.5 * (b + 0.6 * e)) for b, e in zip(base, noise)]))
    if name == "flat":  # every token ~1/V
        return (np.array([_softmax(0.3 * b) for b in base]),
                np.array([_softmax(0.3 * (b + e)) for b, e in zip(base, noise)]))
    p = np.array([_softmax(b) for b in base])
    q = p[:CHAIN_DEPTH].copy()
    if name == "disjoint":  # q only where p is 0: every draft rejected, the residual is p
        p[:, V // 2:] = 0
        q[:, :V // 2] = 0
    elif name == "q_above_p":  # a mid-ranked token gets 0.6 of q: rejected often, the rest kept
        for r in range(CHAIN_DEPTH):
            a = np.argsort(p[r])[V // 2]
            q[r] *= 0.4 / (1 - q[r, a])
            q[r, a] = 0.6
    else:
        raise ValueError(name)
    return p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)


def _logits(p):
    return np.log(np.where(p > 0, p, 1.0)) + np.where(p > 0, 0.0, -np.inf)


def _draws(p, q, siblings: int, fault: str = "none", seed: int = 11):
    if siblings:  # a tree: TREE_DEPTH levels of children, then the leaf's bonus row
        p, q = p[:TREE_DEPTH + 1], q[:TREE_DEPTH]
    counts = _core._rule_draws(_logits(p).astype(np.float32), q.astype(np.float32), siblings, N, seed, fault)
    assert counts.shape == p.shape and counts[0].sum() == N
    return counts, p


def _g_test(counts, p) -> float:
    """The counts of one depth against n * p; 0 if a token of probability 0 was emitted."""
    n = counts.sum()
    if n == 0:
        return 1.0
    if counts[p == 0].any():
        return 0.0
    return float(stats.power_divergence(counts[p > 0], n * p[p > 0], lambda_="log-likelihood").pvalue)


def p_value(counts, p) -> float:
    """Bonferroni over the depths the walk reached."""
    reached = [d for d in range(len(p)) if counts[d].sum() > 0]
    return min(1.0, len(reached) * min(_g_test(counts[d], p[d]) for d in reached))


@pytest.mark.parametrize("case", ["peaked", "flat", "disjoint", "q_above_p"])
def test_the_chain_rule_emits_p(case):
    p, q = _case(case)
    counts, p = _draws(p, q, 0)
    assert p_value(counts, p) >= ALPHA, [_g_test(c, r) for c, r in zip(counts, p)]
    if case == "disjoint":
        assert counts[1:].sum() == 0  # every draft rejected


@pytest.mark.parametrize("case, siblings", [("peaked", 3), ("flat", 3), ("disjoint", 3), ("q_above_p", 3),
                                            ("peaked", 8)])
def test_the_tree_rule_emits_p(case, siblings):
    p, q = _case(case)
    counts, p = _draws(p, q, siblings)
    assert p_value(counts, p) >= ALPHA, [_g_test(c, r) for c, r in zip(counts, p)]
    if case == "peaked":  # siblings after a rejection were tried: the first child alone keeps less
        assert counts[1].sum() > N * np.minimum(p[0], q[0]).sum() + 0.05 * N


@pytest.mark.parametrize("fault", CHAIN_FAULTS)
def test_each_chain_rule_fault_fails(fault):
    counts, p = _draws(*_case("peaked"), 0, fault)
    assert p_value(counts, p) < ALPHA


@pytest.mark.parametrize("fault", TREE_FAULTS)
def test_each_tree_rule_fault_fails(fault):
    counts, p = _draws(*_case("peaked"), 3, fault)
    assert p_value(counts, p) < ALPHA


@pytest.mark.parametrize("fault", ["tree_siblings_with_replacement", "tree_sibling_one_uniform"])
def test_the_sibling_faults_fail_with_several_siblings_on_flat_rows(fault):
    """Their deviation grows with the q mass of the siblings drawn before: visible even where every
    token has ~1/V of q, once 8 siblings are drawn."""
    counts, p = _draws(*_case("flat"), 8, fault)
    assert p_value(counts, p) < ALPHA


def test_a_fault_of_the_other_kind_leaves_the_rule_correct():
    """A chain's fault runs the tree's correct rule, and a tree's the chain's."""
    p, q = _case("peaked")
    assert p_value(*_draws(p, q, 3, "residual_from_p")) >= ALPHA
    assert p_value(*_draws(p, q, 0, "tree_residual_stale")) >= ALPHA


@pytest.mark.parametrize("shift, to_rank, fails", [(0.0, 0, False), (1e-3, 8, True), (3e-3, 1, True)])
def test_the_bound_sees_a_small_deviation(shift, to_rank, fails):
    """N multinomial draws from p with `shift` moved from its most probable token (0.36 here) to
    the token of rank `to_rank` (8: 0.019; 1: the second most probable, 0.23)."""
    p = _case("peaked")[0][0]
    order = np.argsort(-p)
    shifted = p.copy()
    shifted[order[0]] -= shift
    shifted[order[to_rank]] += shift
    assert p[order[8]] < 0.02 and 0.2 < p[order[1]] < 0.25
    counts = np.random.default_rng(5).multinomial(N, shifted)
    assert (_g_test(counts, p) < ALPHA) is fails


@pytest.mark.parametrize("logits, q, siblings, fault, words", [
    (np.zeros((3, 4)), np.full((1, 4), 0.25), 0, "none", "one row more than q"),
    (np.zeros((2, 4)), np.full((1, 3), 1 / 3), 0, "none", "same length"),
    (np.zeros((2, 4)), np.array([[0.5, 0.5, -0.1, 0.1]]), 0, "none", "non-negative"),
    (np.zeros((2, 4)), np.zeros((1, 4)), 0, "none", "mass"),
    (np.zeros((2, 4)), np.full((1, 4), 0.25), 17, "none", "siblings must be in"),
    (np.zeros((2, 4)), np.full((1, 4), 0.25), 0, "nope", "unknown fault 'nope'"),
    (np.zeros(4), np.full(4, 0.25), 0, "none", "2-D"),
])
def test_bad_rows_are_refused_with_one_line(logits, q, siblings, fault, words):
    with pytest.raises(ValueError, match=words):
        _core._rule_draws(logits.astype(np.float32), q.astype(np.float32), siblings, 10, 0, fault)
