"""The speculative loop: losslessness under each rule, exact counts, rollback, bad input."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import ENGINE_KW, PROMPTS, assert_lossless_verdict, check_counts, check_spec_timers
from scipy import stats

from specnative import Engine, _core
from specnative.models import tiny_pair

# Statistical tests use fixed seeds, so their outcome is deterministic; the threshold says how
# unlikely a correct implementation is to fail them (were the seed varied).
P_VALUE_THRESHOLD = 1e-3


def assert_same_tokens(a, b):
    assert len(a.tokens) == len(b.tokens)
    for x, y in zip(a.tokens, b.tokens):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("n_seq", [1, 3])
def test_greedy_spec_equals_baseline(noisy_engine, k, n_seq):
    prompts = PROMPTS[:n_seq]
    base = noisy_engine.generate(prompts, n_predict=40)
    spec = noisy_engine.generate(prompts, n_predict=40, spec=True, k=k)
    assert_lossless_verdict(noisy_engine, prompts, base.tokens, spec.tokens, k=k)  # near-ties: see conftest
    assert 0 < spec.draft_accept_rate < 1


def test_exact_copy_draft_accepts_everything(copy_engine):
    k, n_predict = 4, 42
    spec = copy_engine.generate(PROMPTS, n_predict=n_predict, spec=True, k=k)
    assert spec.draft_accept_rate == 1.0 and spec.token_accept_rate == 1.0
    assert spec.totals["rejected"] == 0
    for counts, tokens in zip(spec.counts, spec.tokens):
        assert len(tokens) == n_predict
        # first token comes from prefill; 41 more in rounds of k+1 = 5, the last round shorter
        full_rounds, rest = divmod(n_predict - 1, k + 1)
        assert counts["accept_len_hist"][k] == full_rounds
        assert counts["rounds"] == full_rounds + (rest > 0)
        assert counts["emitted"] == n_predict - 1
    assert spec.mean_accept_len == pytest.approx((n_predict - 1) / spec.counts[0]["rounds"])


def test_noisy_draft_counts_are_consistent(noisy_engine):
    k = 4
    spec = noisy_engine.generate(PROMPTS, n_predict=48, spec=True, k=k)
    totals = spec.totals
    assert 0 < spec.draft_accept_rate < 1
    check_counts(spec, k)
    for c in spec.counts:
        # every round that accepted fewer than k ended on a rejection, except possibly the last
        # (shortened to fit n_predict, all its drafts accepted)
        assert c["accept_len_hist"][:k].sum() - 1 <= c["rejected"] <= c["accept_len_hist"][:k].sum()
    assert spec.draft_accept_rate == totals["accepted"] / totals["drafted"]
    assert spec.token_accept_rate == totals["accepted"] / (totals["accepted"] + totals["rejected"])
    assert spec.token_accept_rate > spec.draft_accept_rate
    assert spec.mean_accept_len == totals["emitted"] / totals["rounds"]
    rates = spec.per_position_accept_rate
    assert rates.shape == (k,) and np.all((rates >= 0) & (rates <= 1))


def test_spec_timers_account_for_wall_time(noisy_engine):
    spec = noisy_engine.generate(PROMPTS, n_predict=40, spec=True, k=4)
    check_spec_timers(spec)
    # a draft model's run has every step; draft_ingest (its reading of the verify batch) is a no-op's
    assert all(spec.times[p] > 0 for p in ("prefill_target", "prefill_draft", "resample"))


def test_match_rule_reproduces_seeded_sampling(noisy_engine):
    for seed in (1, 2, 3):
        base = noisy_engine.generate(PROMPTS, n_predict=40, temperature=0.8, seed=seed)
        spec = noisy_engine.generate(PROMPTS, n_predict=40, temperature=0.8, seed=seed, spec=True,
                                     k=4, accept_rule="match")
        # per seed, up to a keyed uniform at a CDF boundary the batch shape moved (seen on AMD hosts)
        assert_lossless_verdict(noisy_engine, PROMPTS, base.tokens, spec.tokens, 0.8, seed, k=4)
    other_seed = noisy_engine.generate(PROMPTS, n_predict=40, temperature=0.8, seed=99)
    assert any(not np.array_equal(a, b) for a, b in zip(base.tokens, other_seed.tokens))


def test_rollback_leaves_caches_as_a_fresh_context_would(noisy_engine, target_only):
    spec = noisy_engine.generate(PROMPTS, n_predict=30, spec=True, k=6)
    assert (spec.totals["accept_len_hist"][:-1]).sum() > 0  # some rounds had rejections
    for s, (prompt, tokens) in enumerate(zip(PROMPTS, spec.tokens)):
        fed = noisy_engine.tokenize(prompt).tolist() + tokens.tolist()
        expected = target_only.prompt_logits(fed)  # the same target file, prefilled into a cleared cache
        np.testing.assert_allclose(noisy_engine.pending_logits(s), expected, rtol=1e-3, atol=1e-3)


# --- the rejection rule ----------------------------------------------------------------------
def _chi_square_p_value(counts, probs):
    """Goodness of fit of counts to probs, pooling cells with expected counts below 5."""
    n = counts.sum()
    expected = probs * n
    order = np.argsort(expected)
    pooled_counts, pooled_expected, acc_c, acc_e = [], [], 0.0, 0.0
    for i in order:
        acc_c += counts[i]
        acc_e += expected[i]
        if acc_e >= 5:
            pooled_counts.append(acc_c)
            pooled_expected.append(acc_e)
            acc_c = acc_e = 0.0
    if acc_e > 0:
        pooled_counts[-1] += acc_c
        pooled_expected[-1] += acc_e
    pooled_expected = np.array(pooled_expected) * (n / np.sum(pooled_expected))  # exact sums
    return stats.chisquare(pooled_counts, pooled_expected).pvalue


def _distribution(rng, n, concentration):
    return rng.dirichlet(np.full(n, concentration)).astype(np.float32)


@pytest.mark.parametrize("case", ["random", "disjoint", "equal", "peaked-vs-flat"])
def test_rejection_kernel_reproduces_p(case):
    rng = np.random.default_rng(12345)
    n = 40
    p = _distribution(rng, n, 0.5)
    if case == "random":
        q = _distribution(rng, n, 0.5)
    elif case == "disjoint":  # q only where p is 0: every draft rejected, residual = p
        p[n // 2:] = 0
        q = np.zeros(n, np.float32)
        q[n // 2:] = _distribution(rng, n - n // 2, 1.0)
        p /= p.sum()
    elif case == "equal":     # q = p: every draft accepted
        q = p.copy()
    else:
        q = np.full(n, 1.0 / n, np.float32)
        p = _distribution(rng, n, 0.1)
    n_draws = 200_000
    hist, accepted = _core.rejection_histogram(p, q, n_draws, seed=7)
    assert hist.sum() == n_draws
    assert np.all(hist[p == 0] == 0)
    assert _chi_square_p_value(hist, p.astype(np.float64) / p.sum()) > P_VALUE_THRESHOLD
    expected_accept = np.minimum(p, q).sum()  # P(accept) = sum_x min(p, q)
    assert accepted / n_draws == pytest.approx(expected_accept, abs=0.01)
    if case == "equal":
        assert accepted == n_draws
    if case == "disjoint":
        assert accepted == 0


def test_rejection_kernel_detects_a_wrong_rule():
    """Control: sampling from q alone (no correction) fails the same test, so it has power."""
    rng = np.random.default_rng(12345)
    p, q = _distribution(rng, 40, 0.5), _distribution(rng, 40, 0.5)
    hist, _ = _core.rejection_histogram(q, q, 200_000, seed=7)
    assert _chi_square_p_value(hist, p.astype(np.float64) / p.sum()) < P_VALUE_THRESHOLD


def test_rejection_rule_matches_baseline_distribution_end_to_end(noisy_engine):
    """Second generated token (the first one speculation decides) over many seeds and
    sequences: spec with the rejection rule vs the baseline, two-sample chi-square."""
    prompts = ["The city of"] * 8
    base_tokens, spec_tokens, accepted = [], [], 0
    for seed in range(150):
        base = noisy_engine.generate(prompts, n_predict=3, temperature=1.0, seed=seed)
        spec = noisy_engine.generate(prompts, n_predict=3, temperature=1.0, seed=seed, spec=True,
                                     k=1, accept_rule="rejection")
        base_tokens += [int(t[1]) for t in base.tokens]
        spec_tokens += [int(t[1]) for t in spec.tokens]
        accepted += spec.totals["accepted"]
    assert 0 < accepted < len(spec_tokens)  # both paths (accept, resample) were exercised
    values = sorted(set(base_tokens) | set(spec_tokens))
    table = np.array([[base_tokens.count(v) for v in values], [spec_tokens.count(v) for v in values]])
    # pool rare tokens into one column so the chi-square approximation holds
    common = table.sum(axis=0) >= 10
    pooled = np.column_stack([table[:, common], table[:, ~common].sum(axis=1)])
    pooled = pooled[:, pooled.sum(axis=0) > 0]
    assert pooled.shape[1] >= 3
    assert stats.chi2_contingency(pooled).pvalue > P_VALUE_THRESHOLD


def test_rejection_rule_accepts_more_than_match(noisy_engine):
    kwargs = dict(n_predict=40, temperature=1.0, seed=5, spec=True, k=4)
    match = noisy_engine.generate(PROMPTS, accept_rule="match", **kwargs)
    rejection = noisy_engine.generate(PROMPTS, accept_rule="rejection", **kwargs)
    assert rejection.draft_accept_rate > match.draft_accept_rate


# --- bad input -------------------------------------------------------------------------------
def test_incompatible_vocabulary_is_refused(model_dir):
    target, _ = tiny_pair(model_dir, "copy")
    shuffled, _ = tiny_pair(model_dir, "copy", vocab="shuffled")
    with pytest.raises(ValueError, match="cannot speculate.*token"):
        Engine(target, shuffled, n_ctx=256, n_seq_max=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "k must be"),
    ({"k": -2}, "k must be"),
    ({"k": 100}, "too large"),
    ({"temperature": 0.5}, "greedy"),
])
def test_bad_spec_arguments_raise(noisy_engine, kwargs, message):
    with pytest.raises(ValueError, match=message):
        noisy_engine.generate(PROMPTS, n_predict=8, spec=True, **kwargs)


def test_spec_without_a_draft_is_refused(target_only):
    with pytest.raises(ValueError, match="needs a draft model"):
        target_only.generate("The", n_predict=8, spec=True)


def test_draft_with_a_smaller_vocabulary_is_refused(model_dir):
    target, small = tiny_pair(model_dir, "small_vocab")
    with pytest.raises(ValueError, match="smaller than the target"):
        Engine(target, small, n_ctx=256, n_seq_max=1)


def test_the_sweeps_pooled_rates_weigh_each_run_by_its_counts(noisy_engine):
    """sweep.rows.spec_row pools repeats through the engine's own definitions (native.accept_rates):
    alpha weighted by drafted, tau by rounds. Two different runs (other prompts, other k budgets), so
    a pooler that reads one run, or averages the rates, gives another number."""
    from specnative.sweep import rows as sweep_rows

    runs = [noisy_engine.generate(PROMPTS, n_predict=30, spec=True, k=4),
            noisy_engine.generate(PROMPTS[:2], n_predict=12, spec=True, k=4)]
    assert runs[0].draft_accept_rate != pytest.approx(runs[1].draft_accept_rate, rel=1e-3)
    for run in runs:  # the engine's rates are native.accept_rates of its own counts
        rates = _core.accept_rates(**{key: int(run.totals[key])
                                      for key in ("drafted", "accepted", "rejected", "rounds", "emitted")})
        assert rates["draft_accept_rate"] == run.draft_accept_rate
        assert rates["token_accept_rate"] == run.token_accept_rate
        assert rates["mean_accept_len"] == run.mean_accept_len
    row = sweep_rows.spec_row(runs, {"step_ms": 1.0, "tps": 100.0}, k=4)
    weight = lambda key: np.array([r.totals[key] for r in runs], float)
    assert row["draft_accept_rate"] == pytest.approx(
        np.average([r.draft_accept_rate for r in runs], weights=weight("drafted")), rel=1e-12)
    assert row["mean_accept_len"] == pytest.approx(
        np.average([r.mean_accept_len for r in runs], weights=weight("rounds")), rel=1e-12)
    assert row["token_accept_rate"] == pytest.approx(
        np.average([r.token_accept_rate for r in runs], weights=weight("accepted") + weight("rejected")), rel=1e-12)
    assert row["drafted"] == weight("drafted").sum() and row["emitted"] == weight("emitted").sum()
    assert np.isnan(_core.accept_rates(0, 0, 0, 0, 0)["draft_accept_rate"])


def test_a_draft_prefix_handed_to_another_engine_replaces_its_prefill(noisy_pair):
    """The sweep hands the draft's cached shared context to the next target's engine. The cells
    are the ones a prefill of the same draft file would compute (same file, batch and threads), so
    the speculative run is the same token for token, and the draft prefills only the suffixes."""
    target, draft = noisy_pair
    shared = " ".join(["a shared document that every sequence reads first"] * 40)
    prompts = [shared + " Question one?", shared + " Another question."]
    kwargs = dict(n_predict=16, spec=True, k=4)
    with Engine(target, draft, n_ctx=2048, n_batch=512, n_seq_max=2, **ENGINE_KW) as first:
        first.generate(prompts, **kwargs)
        tokens, state = first._core.draft_prefix_state()
    assert len(tokens) > 300 and len(state) > 0
    draft_fed = lambda engine: engine.context_info(draft=True)["n_p_eval"]
    with Engine(target, draft, n_ctx=2048, n_batch=512, n_seq_max=2, **ENGINE_KW) as fresh:
        before = draft_fed(fresh)
        expected = fresh.generate(prompts, **kwargs)
        expected_fed = draft_fed(fresh) - before
    with Engine(target, draft, n_ctx=2048, n_batch=512, n_seq_max=2, **ENGINE_KW) as handed:
        assert handed._core.load_draft_prefix(tokens, state)
        before = draft_fed(handed)
        got = handed.generate(prompts, **kwargs)
        got_fed = draft_fed(handed) - before
        assert not handed._core.load_draft_prefix(tokens[:-1], state)  # tokens that are not the state's
    assert [list(t) for t in got.tokens] == [list(t) for t in expected.tokens]  # bit-identical cells
    assert got.totals["accepted"] == expected.totals["accepted"]
    # the draft evaluated the handed prefix's tokens fewer (llama.cpp's own count of prompt tokens)
    assert expected_fed - got_fed == len(tokens)
