"""The spec policy (engine/spec_policy.py, csrc/core/spec_policy.cpp): which draft lengths the
adaptive policy's arithmetic picks on given costs, that every policy leaves the outputs lossless and
records its choices, and the refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import PROMPTS, assert_lossless_verdict, check_counts, check_spec_timers

from specnative import DecodeSpec, _core
from specnative.analysis import theory
from specnative.engine import parse_spec_policy
from specnative.serving import arrivals
from specnative.serving.loop import serve
from specnative.serving.runner import serving_verdict

POLICIES = ("static", "adaptive", "by-batch:[[1,1,4],[2,8,1]]", "by-batch:[[1,8,0]]")


# --- the adaptive policy's choice on synthetic costs --------------------------------------------
def test_the_policy_drafts_nothing_where_a_verify_costs_more_than_it_brings():
    # every verify row costs a whole step: a chain of k brings at most k tokens for k rows' time
    verify_ms = [10.0 * rows for rows in range(1, 11)]
    ks, probed = _core._policy_choice([[0.9] * 4, [0.9] * 4], [4, 4], verify_ms, draft_step_ms=1.0, other_ms=0.0)
    assert ks == [0, 0]
    assert probed == [False, False]  # even a draft always kept would not pay: no probes


def test_a_sequence_off_for_its_acceptance_is_probed_and_one_off_for_the_cost_is_not():
    # cheap rows: the draft that is rarely kept sits out but is probed, its acceptance could change;
    # a draft step dearer than the target's decode switches a sequence off whatever it accepts
    cheap_rows = [10.0 + 0.5 * rows for rows in range(1, 20)]
    ks, probed = _core._policy_choice([[0.02] * 4], [4], cheap_rows, draft_step_ms=2.0, other_ms=0.0)
    assert ks == [0] and probed == [True]
    ks, probed = _core._policy_choice([[0.02] * 4], [4], cheap_rows, draft_step_ms=12.0, other_ms=0.0)
    assert ks == [0] and probed == [False]


def test_the_policy_drafts_the_whole_budget_where_rows_are_free_and_drafts_always_kept():
    verify_ms = [10.0] * 10
    assert _core._policy_choice([[1.0] * 4, [1.0] * 4], [4, 4], verify_ms, 0.5, 0.0)[0] == [4, 4]


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.85, 0.95])
@pytest.mark.parametrize("c", [0.02, 0.1, 0.3])
def test_the_policy_picks_the_k_of_the_closed_form(alpha, c):
    """One sequence, i.i.d. acceptance alpha, a verify as dear as a step whatever its rows, each
    draft position c steps: the round costs 1 + c k steps, the closed form's (1 + c)."""
    k_max = 8
    step = 10.0
    verify_ms = [step] * (k_max + 1)
    ks, _ = _core._policy_choice([[alpha] * k_max], [k_max], verify_ms, draft_step_ms=c * step, other_ms=0.0)
    best = max(range(k_max + 1), key=lambda k: theory.predicted_speedup(alpha, k, c * k))
    assert ks == [best]


def test_sequences_of_one_batch_get_different_lengths():
    # rows are cheap, so a sequence drafts where its own acceptance pays for its draft positions
    verify_ms = [10.0 + 0.5 * rows for rows in range(1, 20)]
    ks, _ = _core._policy_choice([[0.95] * 6, [0.05] * 6], [6, 6], verify_ms, draft_step_ms=0.2, other_ms=0.0)
    assert ks[0] >= 4 and ks[1] <= 1


def test_a_changed_row_count_pays_the_graph_rebuild_so_a_marginal_change_keeps_the_last_rounds_rows():
    """Two sequences at a break-even: drafting one token each pays 4 % on the verify curve alone,
    so with no rebuild cost the policy drafts; a rebuild of 1 ms on a changed row count (llama.cpp
    reuses a graph only for the shape it was built for) outweighs that, and the last round's 2 rows
    stay. Once the last round verified 4 rows, the same choice pays no rebuild and drafting stays."""
    verify_ms = [10.0, 10.0, 11.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0, 24.0]
    acceptance = [[0.3] * 4, [0.3] * 4]
    free, _ = _core._policy_choice(acceptance, [4, 4], verify_ms, draft_step_ms=0.5, other_ms=0.0)
    assert free == [1, 1]  # 2.6 tokens in 12.5 ms against 2 in 10 ms
    kept, _ = _core._policy_choice(acceptance, [4, 4], verify_ms, draft_step_ms=0.5, other_ms=0.0,
                                   last_rows=2, rebuild_ms=1.0)
    assert kept == [0, 0]
    again, _ = _core._policy_choice(acceptance, [4, 4], verify_ms, draft_step_ms=0.5, other_ms=0.0,
                                    last_rows=4, rebuild_ms=1.0)
    assert again == [1, 1]


def test_the_adaptive_options_spell_and_refuse():
    assert parse_spec_policy("adaptive:optimism=0").text == "adaptive:optimism=0"
    assert parse_spec_policy("adaptive:optimism=0.3").text == "adaptive"  # the default
    with pytest.raises(ValueError, match="optimism must be a finite number >= 0"):
        parse_spec_policy("adaptive:optimism=-1")


def test_the_choice_refuses_mismatched_arguments():
    with pytest.raises(ValueError, match="one entry per sequence"):
        _core._policy_choice([[0.5]], [1, 1], [1.0] * 4, 0.0, 0.0)
    with pytest.raises(ValueError, match="verify_ms"):
        _core._policy_choice([[0.5] * 4], [4], [1.0], 0.0, 0.0)


# --- every policy in the engine -------------------------------------------------------------------
@pytest.fixture(scope="module")
def baseline(noisy_engine):
    return noisy_engine.generate(PROMPTS, DecodeSpec(n_predict=40))


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_is_lossless_and_records_its_choices(noisy_engine, baseline, policy):
    r = noisy_engine.generate(PROMPTS, DecodeSpec(n_predict=40, spec=True, k=4, spec_policy=policy))
    assert_lossless_verdict(noisy_engine, PROMPTS, baseline.tokens, r.tokens, k=4)
    check_counts(r, 4)
    check_spec_timers(r)
    for c in r.counts:
        hist = c["k_chosen_hist"]
        assert len(hist) == 5 and hist.sum() == c["rounds"]
        # a round drafts at most what the policy allowed it
        allowed_at = np.cumsum(hist[::-1])[::-1][1:]  # rounds allowed at least j+1 drafts
        assert np.all(c["drafted_at"] <= allowed_at)
    if policy == "by-batch:[[1,8,0]]":
        assert r.totals["drafted"] == 0 and r.totals["k_chosen_hist"][0] == r.totals["rounds"]
    if policy == "adaptive":
        assert r.times["policy"] > r.times["policy_startup"] > 0  # a cost curve at start-up, then every round
    else:
        assert r.times["policy_startup"] == 0


def _pooled_kept(engine) -> dict:
    """What the engine's adaptive runs left behind: kept drafts by position, per decoding settings."""
    return {key: np.array(learned["pooled"][0][1]) for key, learned in engine._core._policy_memory().items()}


def test_an_adaptive_run_starts_from_the_engines_earlier_runs_and_adds_its_own(noisy_engine):
    spec = DecodeSpec(n_predict=40, spec=True, k=4, seed=11, temperature=0.0, spec_policy="adaptive")
    before = _pooled_kept(noisy_engine)
    first = noisy_engine.generate(PROMPTS, spec)
    after_first = _pooled_kept(noisy_engine)
    (key,) = [k for k in after_first if k.startswith("model ")] or [None]
    assert key is not None and "rule=" in key
    kept_by_run = sum(c["accepted_at"] for c in first.counts)
    np.testing.assert_array_equal(after_first[key], before.get(key, 0) + kept_by_run)
    second = noisy_engine.generate(PROMPTS, spec)
    np.testing.assert_array_equal(_pooled_kept(noisy_engine)[key], after_first[key] + sum(
        c["accepted_at"] for c in second.counts))
    # fresh: learns from the prior alone and leaves nothing behind
    fresh = noisy_engine.generate(PROMPTS, DecodeSpec(n_predict=40, spec=True, k=4, spec_policy="adaptive:fresh"))
    assert fresh.totals["drafted"] > 0
    np.testing.assert_array_equal(_pooled_kept(noisy_engine)[key], after_first[key] + sum(
        c["accepted_at"] for c in second.counts))
    memory = noisy_engine._core._policy_memory()[key]
    assert memory["verify_scale"] > 0 and len(PROMPTS) in memory["draft_step_ms"]


def test_the_static_policy_drafts_k_as_before(noisy_engine):
    plain = noisy_engine.generate(PROMPTS, DecodeSpec(n_predict=40, spec=True, k=3))
    static = noisy_engine.generate(PROMPTS, DecodeSpec(n_predict=40, spec=True, k=3, spec_policy="static"))
    assert [t.tolist() for t in plain.tokens] == [t.tolist() for t in static.tokens]
    assert plain.totals["drafted"] == static.totals["drafted"]
    assert static.times["policy"] == 0


def test_a_by_batch_band_applies_only_at_its_occupancy(noisy_engine):
    # three sequences decode together until the first finishes: the [3, 3] band drafts nothing
    prompts = PROMPTS[:3]
    r = noisy_engine.generate(prompts, DecodeSpec(n_predict=24, spec=True, k=4,
                                                  spec_policy="by-batch:[[3,3,0],[1,2,2]]"))
    hist = r.totals["k_chosen_hist"]
    assert hist[0] > 0 and hist[3:].sum() == 0


@pytest.mark.parametrize("drafter", ["ngram-simple"])
def test_the_adaptive_policy_with_an_ngram_drafter_is_lossless(target_only, drafter):
    prompts = PROMPTS[:2]
    base = target_only.generate(prompts, DecodeSpec(n_predict=40))
    r = target_only.generate(prompts, DecodeSpec(n_predict=40, spec=True, k=4, drafter=drafter,
                                                 spec_policy="adaptive"))
    assert_lossless_verdict(target_only, prompts, base.tokens, r.tokens, k=4, drafter=drafter)
    check_counts(r, 4)


def test_sampling_under_the_adaptive_policy_keeps_the_target_draws(noisy_engine):
    """The match rule keeps a draft only where it is the target's own keyed draw: under any policy the
    outputs are the baseline's at T 0.8."""
    spec = DecodeSpec(n_predict=32, temperature=0.8, seed=5)
    base = noisy_engine.generate(PROMPTS, spec)
    r = noisy_engine.generate(PROMPTS, DecodeSpec(n_predict=32, temperature=0.8, seed=5, spec=True, k=4,
                                                  accept_rule="match", spec_policy="adaptive"))
    assert_lossless_verdict(noisy_engine, PROMPTS, base.tokens, r.tokens, temperature=0.8, seed=5, k=4)


def test_serving_under_every_policy_is_lossless_and_counts_per_request(noisy_engine):
    prompts = [noisy_engine.tokenize(p) for p in PROMPTS]
    trace = arrivals.build_trace(prompts, [20, 16, 24], 300.0, 6, seed=3)
    trace = [arrivals.Request(r.arrival_s, r.prompt, r.output_len, label="a" if i % 2 else "b")
             for i, r in enumerate(trace)]
    for policy in POLICIES:
        run = serve(noisy_engine, trace, max_concurrency=3, spec=True, k=3, virtual_clock=True,
                    spec_policy=policy.replace("[1,1,4]", "[1,1,3]"))
        verdict = serving_verdict(noisy_engine, trace, run.tokens, k=3)
        assert verdict.lossless_ok, (policy, verdict.reason)
        for record in run.records:
            c = record["counts"]
            assert c["k_chosen_hist"].sum() == c["rounds"]
        t = run.times
        steps = sum(t[b] for b in ("prefill_target", "prefill_draft", "draft", "draft_ingest", "verify", "resample",
                                   "decode", "policy"))
        assert steps + run.idle_ms == pytest.approx(t["total"], rel=0.01, abs=0.5)


def test_a_policy_defers_the_draft_models_prompt_until_it_drafts(noisy_engine):
    """Under a policy a request may never be drafted for: its prompt reaches the draft model only in
    the first round that drafts for it, so a policy that never drafts costs the draft nothing and
    one that does still decodes the same tokens."""
    prompts = [noisy_engine.tokenize(p) for p in PROMPTS]
    trace = arrivals.build_trace(prompts, [20, 16, 24], 300.0, 6, seed=3)
    static = serve(noisy_engine, trace, max_concurrency=3, spec=True, k=3, virtual_clock=True)
    assert static.times["prefill_draft"] > 0  # static: the prompt into the draft at admission, as before
    never = serve(noisy_engine, trace, max_concurrency=3, spec=True, k=3, virtual_clock=True,
                  spec_policy="by-batch:[[1,8,0]]")
    # what is left is the admission's bookkeeping, microseconds: no draft decode
    assert never.times["prefill_draft"] < 0.02 * static.times["prefill_draft"]
    assert never.times["draft"] < 0.02 * static.times["draft"]
    assert never.totals["drafted"] == 0
    some = serve(noisy_engine, trace, max_concurrency=3, spec=True, k=3, virtual_clock=True,
                 spec_policy="by-batch:[[1,1,0],[2,8,3]]")
    assert some.totals["drafted"] > 0
    for run in (never, some):
        assert serving_verdict(noisy_engine, trace, run.tokens, k=3).lossless_ok



def test_a_deferred_prompts_catch_up_is_not_priced_as_a_draft_step(noisy_pair):
    """Requests arriving together under a policy give the draft model their whole prompts in the first
    round that drafts: that catch-up is timed apart, so the draft step the policy learns at that batch
    size is a step's (a prompt priced as one kept a paying pair off wherever it happened)."""
    from conftest import ENGINE_KW
    from specnative import Engine
    target, draft = noisy_pair
    with Engine(target, draft, n_ctx=4096, n_batch=256, n_seq_max=4, **ENGINE_KW) as engine:  # its own memory
        prompts = [engine.tokenize(p * 12) for p in PROMPTS]  # 60-120 tokens each
        trace = arrivals.build_trace(prompts, [20, 16, 24], float("inf"), 6, seed=3)
        static = serve(engine, trace, max_concurrency=3, spec=True, k=3, virtual_clock=True)
        step_ms = static.times["draft"] / (static.steps * 3)  # about one draft decode of <= 3 rows
        adaptive = serve(engine, trace, max_concurrency=3, spec=True, k=3, virtual_clock=True, spec_policy="adaptive")
        assert adaptive.totals["drafted"] > 0  # its first round drafted, with the three prompts' catch-up
        (learned,) = engine._core._policy_memory().values()
        assert learned["draft_step_ms"][3] < 4 * step_ms
        assert serving_verdict(engine, trace, adaptive.tokens, k=3).lossless_ok


# --- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("spelling, message", [
    ("sometimes", "expected static, adaptive"),
    ("by-batch:", "expected static, adaptive"),
    ("by-batch:[[1,2]]", "each band is"),
    ("by-batch:[[2,1,3]]", "1 <= lo <= hi"),
    ("by-batch:[[1,2,-1]]", "k >= 0"),
    ("by-batch:[]", "at least one"),
    ("by-batch:[[1,2,3]", "not a JSON list"),
    ("by-batch:no/such/run", "no such advice.json"),
    ("adaptive:prior=2", "prior must be in"),
    ("adaptive:weight=0", "weight must be"),
    ("adaptive:speed=3", "unknown option"),
    (3, "spec_policy must be"),
])
def test_bad_policy_spellings_are_refused(spelling, message):
    with pytest.raises(ValueError, match=message):
        parse_spec_policy(spelling)


def test_a_policy_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="speculative runs"):
        DecodeSpec(spec_policy="adaptive")
    with pytest.raises(ValueError, match="applies to chains"):
        DecodeSpec(spec=True, spec_policy="adaptive", draft_shape="tree:topk=2,depth=3,budget=6")
    with pytest.raises(ValueError, match="drafts more than k=4"):
        DecodeSpec(spec=True, k=4, spec_policy="by-batch:[[1,8,6]]")


def test_the_schedule_is_read_from_a_run_s_advice(tmp_path):
    (tmp_path / "advice.json").write_text(json.dumps({"by_batch_schedule": [[1, 2, 4], [3, 8, 0]]}))
    policy = parse_spec_policy(f"by-batch:{tmp_path}")
    assert policy.schedule == ((1, 2, 4), (3, 8, 0)) and policy.text == "by-batch:[[1,2,4],[3,8,0]]"
    (tmp_path / "advice.json").write_text(json.dumps({"k": 4}))
    with pytest.raises(ValueError, match="no by_batch_schedule"):
        parse_spec_policy(f"by-batch:{tmp_path / 'advice.json'}")


def test_the_fresh_option_is_spelled_back():
    assert parse_spec_policy("adaptive:fresh").text == "adaptive:fresh"
    assert not parse_spec_policy("adaptive:fresh").remember and parse_spec_policy("adaptive").remember
    assert parse_spec_policy("adaptive:prior=0.7,fresh").text == "adaptive:fresh,prior=0.7,weight=2"
