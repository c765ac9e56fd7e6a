"""The engine's sampling kernels against numpy: the vectorized softmax (our own exp) and the
blocked inverse-CDF walk. Both run over the whole vocabulary per sampled token (262k logits on
Gemma), so they are written to vectorize; these tests pin down that they still compute what the
plain definitions compute."""
import numpy as np
import pytest

from specnative import _core

# vocabulary sizes around the kernels' blocks (16 lanes, 256-entry sums) and real ones
SIZES = [1, 2, 15, 16, 17, 255, 256, 257, 1000, 1024, 32000, 151936, 262144]


def _softmax_reference(logits, temperature):
    # the exponent rounded to float as the engine forms it (that rounding is not the kernel's);
    # exp and the sum in double
    z = (logits - np.max(logits)) * np.float32(1 / np.float32(temperature))
    e = np.exp(z.astype(np.float64))
    return e / e.sum()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_softmax_matches_numpy_in_float_precision(n, temperature):
    rng = np.random.default_rng(n)
    logits = (rng.standard_normal(n) * 4).astype(np.float32)
    got = _core._softmax(logits, temperature)
    want = _softmax_reference(logits, temperature)
    assert got.dtype == np.float32 and got.shape == (n,)
    # float32 result: a few ulps relative to every probability that is a normal float
    normal = want > 1e-30
    assert np.max(np.abs(got[normal] / want[normal] - 1)) < 2e-6
    assert abs(float(got.astype(np.float64).sum()) - 1) < 1e-5


def test_softmax_at_the_edges_of_exp():
    logits = np.array([0.0, -20.0, -80.0, -87.0, -87.5, -100.0, -np.inf, 0.0], dtype=np.float32)
    got = _core._softmax(logits, 1.0)
    want = _softmax_reference(np.where(np.isinf(logits), -1e30, logits).astype(np.float32), 1.0)
    assert got[6] == 0.0  # a masked logit can never be drawn
    assert got[3] > 0.0  # exp(-87) is still a float
    assert got[4] == 0.0 and got[5] == 0.0  # below float's normal range (< 1.2e-38)
    assert got[0] == got[7]  # ties stay ties
    normal = want > 1e-30
    assert np.max(np.abs(got[normal] / want[normal] - 1)) < 2e-6


def test_softmax_refuses_temperatures_it_cannot_use():
    for bad, message in [(0.0, "softmax needs a temperature > 0"), (-1.0, "a finite number >= 0"),
                         (1e-45, "too small to sample with"), (float("nan"), "a finite number >= 0")]:
        with pytest.raises(ValueError, match=message):
            _core._softmax(np.zeros(4, dtype=np.float32), bad)


def _inverse_cdf_reference(weights, us):
    """The first index whose cumulative weight (in double) exceeds u * total, for each u."""
    w = np.where(weights > 0, weights.astype(np.float64), 0.0)
    cdf = np.cumsum(w)
    picks = np.searchsorted(cdf, np.asarray(us) * cdf[-1], side="right")
    return np.minimum(picks, np.flatnonzero(w)[-1])


@pytest.mark.parametrize("n", SIZES)
def test_sample_from_weights_is_the_inverse_cdf(n):
    rng = np.random.default_rng(1000 + n)
    weights = rng.random(n).astype(np.float32) ** 4
    weights[rng.random(n) < 0.3] = 0.0  # zero weights are never drawn
    if not weights.any():
        weights[-1] = 1.0
    us = np.linspace(0, 1, 401, endpoint=False) + 0.5 / 401
    got = np.array([_core._sample_from_weights(weights, float(u)) for u in us])
    assert np.all(weights[got] > 0)
    disagree = int(np.sum(got != _inverse_cdf_reference(weights, us)))
    # a block sum in float lanes may round a boundary the other way: rare and off by one token
    assert disagree <= 2, disagree


def test_sample_from_weights_edges():
    w = np.zeros(1000, dtype=np.float32)
    w[[3, 700]] = [1.0, 3.0]
    assert _core._sample_from_weights(w, 0.0) == 3
    assert _core._sample_from_weights(w, 0.2499) == 3
    assert _core._sample_from_weights(w, 0.2501) == 700
    assert _core._sample_from_weights(w, 1 - 2**-53) == 700  # never past the last positive weight
    w[:] = 0
    w[999] = 1e-30
    assert _core._sample_from_weights(w, 0.5) == 999
    w[:] = 0  # no positive weight at all: index 0, as before
    assert _core._sample_from_weights(w, 0.5) == 0


def test_the_engines_draw_is_the_inverse_cdf_of_its_softmax():
    """sample_softmax (no probability table: block sums, then one block recomputed) picks what
    the inverse CDF of the materialized softmax picks, but for rounding at a boundary."""
    rng = np.random.default_rng(3)
    for n in (17, 256, 1000, 32000, 262144):
        logits = (rng.standard_normal(n) * 3).astype(np.float32)
        logits[rng.random(n) < 0.1] = -np.inf
        p = _core._softmax(logits, 0.7)
        us = np.linspace(0, 1, 301, endpoint=False) + 0.5 / 301
        picks = np.array([_core._sample_softmax(logits, 0.7, float(u)) for u in us])
        assert np.all(np.isfinite(logits[picks]))  # a masked token is never drawn
        disagree = int(np.sum(picks != _inverse_cdf_reference(p, us)))
        assert disagree <= 2, (n, disagree)


def test_sampled_tokens_follow_the_softmax():
    """Chi-square goodness of fit of 20k draws over a 65k vocabulary whose mass sits on 20
    tokens (plus a long tail pooled into one bin); seed fixed, threshold p > 1e-4."""
    from scipy import stats

    n, rng = 65536, np.random.default_rng(5)
    logits = np.full(n, -30.0, dtype=np.float32) + rng.standard_normal(n).astype(np.float32)
    heads = rng.choice(n, 20, replace=False)
    logits[heads] = rng.uniform(0, 3, 20).astype(np.float32)
    p = _core._softmax(logits, 1.0)
    draws = np.array([_core._sample_softmax(logits, 1.0, u) for u in rng.random(20_000)])
    observed = np.array([np.sum(draws == h) for h in heads] + [np.sum(~np.isin(draws, heads))])
    head_p = p[heads].astype(np.float64)
    expected_p = np.append(head_p, 1 - head_p.sum())
    keep = expected_p * len(draws) >= 5
    expected = expected_p[keep] / expected_p[keep].sum() * observed[keep].sum()
    assert stats.chisquare(observed[keep], expected).pvalue > 1e-4
