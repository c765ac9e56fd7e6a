"""The lossless verdict (lossless.py): the noise control, forced replay, and planted bugs.

The correct engine must never get `fail`; each planted bug (a switch in the C++ loop that only
tests reach) must end as `fail`. Runs use the noisy tiny pair (some drafts rejected) at
concurrency 3, so rollback and acceptance paths are exercised on every round shape.
"""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import PROMPTS, injected
from scipy import stats

from specnative import lossless
from specnative.lossless import EXACT, FAIL, NUMERIC, verdicts
from specnative.lossless import noise as lossless_noise

N_PREDICT = 32
GREEDY_BUGS = ("rollback_short", "rollback_long", "verify_position", "bonus_from_q")
SAMPLING_BUGS = ("seed_mixup", "bonus_from_q", "rollback_short")


def verdict_of(engine, k=4, temperature=0.0, seed=0, fault="none", rule=None):
    rule = rule or ("greedy" if temperature == 0 else "match")
    base = engine.generate(PROMPTS, n_predict=N_PREDICT, temperature=temperature, seed=seed)
    with injected(engine, fault):
        spec = engine.generate(PROMPTS, n_predict=N_PREDICT, temperature=temperature, seed=seed, spec=True,
                               k=k, accept_rule=rule)
    verdict, _ = lossless.verdict_after_run(engine, PROMPTS, base.tokens, spec.tokens, temperature, seed, k)
    return verdict, spec


@pytest.mark.parametrize("k", [1, 3, 4])
def test_correct_engine_is_never_fail_greedy(noisy_engine, k):
    v, spec = verdict_of(noisy_engine, k=k)
    assert v.verdict in (EXACT, NUMERIC), v.reason
    assert 0 < spec.draft_accept_rate < 1  # drafts were both accepted and rejected


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correct_engine_is_never_fail_sampling(noisy_engine, seed):
    v, _ = verdict_of(noisy_engine, temperature=0.9, seed=seed)
    assert v.verdict in (EXACT, NUMERIC), v.reason


def test_exact_copy_draft_is_never_fail(copy_engine):
    """The copy's drafts are the target's own choices; verify batches against 1-token steps may
    still part at a batch-shape near-tie (conftest), so exact or numeric, never fail."""
    v, spec = verdict_of(copy_engine)
    assert v.verdict in (EXACT, NUMERIC), v.reason
    assert (v.first_divergence == -1) == (v.verdict == EXACT)  # numeric: where the near-tie parted them


@pytest.mark.parametrize("fault", GREEDY_BUGS)
def test_planted_bug_fails_greedy(noisy_engine, fault):
    v, _ = verdict_of(noisy_engine, fault=fault)
    assert v.verdict == FAIL, (fault, v)
    assert v.first_divergence >= 0 and v.mismatches > 0


@pytest.mark.parametrize("fault", SAMPLING_BUGS)
def test_planted_bug_fails_sampling(noisy_engine, fault):
    # k = 1: fully accepted rounds (where a bonus token is drawn) are common
    v, spec = verdict_of(noisy_engine, k=1, temperature=0.9, seed=5, fault=fault)
    assert spec.totals["accept_len_hist"][-1] > 0
    assert v.verdict == FAIL, (fault, v)


def test_noise_control_covers_every_position(noisy_engine):
    base = noisy_engine.generate(PROMPTS, n_predict=N_PREDICT)
    control = lossless.measure_noise(noisy_engine, PROMPTS, base.tokens, k=4)
    assert control.positions == sum(len(t) for t in base.tokens)
    assert control.chunk == 5 and control.concurrency == len(PROMPTS)
    assert 0 <= control.max_abs_delta <= control.max_spread <= 2 * control.max_abs_delta + 1e-6
    assert control.tolerance == pytest.approx(max(lossless.SAFETY * control.max_spread, control.floor))
    assert control.logit_scale > 0 and control.floor == pytest.approx(lossless_noise.float_floor(control.logit_scale))


def test_noise_control_is_zero_for_identical_shapes(noisy_engine):
    base = noisy_engine.generate(PROMPTS, n_predict=8)
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    raw = noisy_engine._core.numeric_noise(prompts, [t.tolist() for t in base.tokens], 1, 1)
    assert float(raw["max_abs_delta"].max()) == 0.0  # same shape twice: bit-identical on CPU


def test_replay_of_the_baseline_picks_its_own_tokens(noisy_engine):
    base = noisy_engine.generate(PROMPTS, n_predict=N_PREDICT, temperature=0.7, seed=3)
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    r = noisy_engine._core.replay(prompts, [t.tolist() for t in base.tokens], 0.7, 3)
    assert (r["pick"] == r["emitted"]).all()
    assert ((r["cdf_lo"] <= r["u"]) & (r["u"] < r["cdf_hi"])).all()


def test_replay_refuses_bad_input(noisy_engine):
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    with pytest.raises(ValueError, match="forced continuations"):
        noisy_engine._core.replay(prompts, [[1]], 0.0, 0)
    with pytest.raises(ValueError, match="empty"):
        noisy_engine._core.replay(prompts, [[1], [], [2]], 0.0, 0)
    with pytest.raises(ValueError, match="vocabulary"):
        noisy_engine._core.replay(prompts, [[1], [10**7], [2]], 0.0, 0)
    with pytest.raises(ValueError, match="too small to sample"):
        noisy_engine._core.replay(prompts, [[1], [1], [2]], 1e-45, 0)
    with pytest.raises(ValueError, match="unknown fault"):
        noisy_engine._core._inject_fault("typo")


# --- the decision rules on synthetic replays ------------------------------------------------
class FakeEngine:
    """Hands judge() a prepared replay (no model): isolates the verdict's arithmetic."""

    def __init__(self, replay):
        self._core = SimpleNamespace(replay=lambda *args: replay)

    @staticmethod
    def to_token_prompts(prompts):
        return prompts


def fake_replay(picks, emitted, gaps):
    n = len(picks)
    return {"seq": np.zeros(n, np.int32), "index": np.arange(n, dtype=np.int32),
            "pick": np.asarray(picks), "emitted": np.asarray(emitted), "gap": np.asarray(gaps, np.float32),
            "u": np.zeros(0), "cdf_lo": np.zeros(0), "cdf_hi": np.zeros(0)}


def control(spread, flips=0, positions=400):
    return lossless.NoiseControl(positions=positions, chunk=5, concurrency=1, max_abs_delta=spread / 2,
                                 q99_abs_delta=spread / 2, max_spread=spread, q99_spread=spread, flips=flips)


def test_a_near_tie_within_tolerance_is_numeric_and_beyond_it_fail():
    picks, emitted = [5] * 40, [5] * 40
    emitted[10] = 6
    gaps = [0.0] * 40
    gaps[10] = 0.3
    engine = FakeEngine(fake_replay(picks, emitted, gaps))
    base, spec = [[5] * 40], [emitted]
    assert lossless.judge(engine, [[1]], base, spec, 0.0, 0, control(spread=0.4)).verdict == NUMERIC
    v = lossless.judge(engine, [[1]], base, spec, 0.0, 0, control(spread=0.2))
    assert v.verdict == FAIL and "index 10" in v.reason


def test_too_many_near_ties_fail_even_within_tolerance():
    """A bug that always takes the runner-up of close calls hides among near-ties one by one."""
    n = 400
    emitted = [5 if i % 10 else 6 for i in range(n)]  # 40 mismatches, each tiny
    gaps = [0.0 if i % 10 else 0.01 for i in range(n)]
    engine = FakeEngine(fake_replay([5] * n, emitted, gaps))
    v = lossless.judge(engine, [[1]], [[5] * n], [emitted], 0.0, 0, control(spread=1.0, flips=0))
    assert v.verdict == FAIL and "near-tie" in v.reason


def test_within_reach_widens_the_cdf_interval_with_the_tolerance():
    lo, hi, temperature = np.array([0.40]), np.array([0.50]), 1.0
    assert not verdicts.within_reach(np.array([0.52]), lo, hi, 0.0, temperature)[0]
    assert verdicts.within_reach(np.array([0.45]), lo, hi, 0.0, temperature)[0]
    assert verdicts.within_reach(np.array([0.52]), lo, hi, 0.1, temperature)[0]   # hi grows to ~0.525
    assert not verdicts.within_reach(np.array([0.60]), lo, hi, 0.1, temperature)[0]
    assert verdicts.within_reach(np.array([0.60]), lo, hi, 1.0, temperature)[0]



def test_the_flip_rate_bound_is_the_rule_of_three_when_no_flip_was_seen():
    """No flip in n positions: the rate's 95 % upper bound is -ln(0.05) / n ~ 3 / n (Poisson); with
    flips, the bound stays above the rate the control saw."""
    n = 400
    none_seen = control(spread=1.0, flips=0, positions=n).flip_rate_bound
    assert none_seen * n == pytest.approx(-math.log(0.05), abs=0.01)
    assert stats.poisson.cdf(0, none_seen * n) == pytest.approx(0.05, abs=0.001)
    for flips in (1, 5, 40):
        assert control(spread=1.0, flips=flips, positions=n).flip_rate_bound > flips / n


def test_a_stale_cache_that_changed_no_token_yet_still_fails():
    """The KV-state check: the run's cache must give the logits a clean replay gives."""
    clean = [np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 1.0])]
    same = [c + 0.5 for c in clean]  # a uniform shift moves no logit gap
    assert lossless.state_problem(clean, same, tolerance=0.0) is None
    moved = [clean[0], np.array([1.0, 1.5, 1.0])]
    problem = lossless.state_problem(clean, moved, tolerance=0.1)
    assert problem and problem.startswith("seq 1")


# --- the greedy tolerance over the candidates, and the cache's extent ---------------------------
def test_greedy_tolerance_is_the_candidates_spread_and_t_above_0_the_whole_vocabulary():
    """A greedy choice depends only on the gaps between the tokens noise can lift to the top; the
    full spread (set by tokens far down the vocabulary) stays for decisions that weigh all of p."""
    sharp = dataclasses.replace(control(spread=2.0), max_candidate_spread=0.5,
                                candidate_positions=lossless_noise.MIN_CANDIDATE_POSITIONS)
    assert sharp.greedy_tolerance == pytest.approx(lossless.SAFETY * 0.5)
    few = dataclasses.replace(sharp, candidate_positions=lossless_noise.MIN_CANDIDATE_POSITIONS - 1)
    assert few.greedy_tolerance == pytest.approx(lossless.SAFETY * 2.0)  # too few near-ties seen: full
    assert sharp.tolerance == pytest.approx(lossless.SAFETY * 2.0)
    assert control(spread=2.0).greedy_tolerance == pytest.approx(lossless.SAFETY * 2.0)  # not measured: full
    picks, emitted, gaps = [5] * 40, [5] * 40, [0.0] * 40
    emitted[10], gaps[10] = 6, 1.0
    engine = FakeEngine(fake_replay(picks, emitted, gaps))
    v = lossless.judge(engine, [[1]], [[5] * 40], [emitted], 0.0, 0, sharp)
    assert v.verdict == FAIL and v.tolerance == pytest.approx(lossless.SAFETY * 0.5)  # 1.0 > 0.625, < 2.5


def test_the_candidates_spread_is_measured_and_within_the_full_spread(noisy_engine):
    base = noisy_engine.generate(PROMPTS, n_predict=N_PREDICT)
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    raw = noisy_engine._core.numeric_noise(prompts, [t.tolist() for t in base.tokens], 1, 5)
    assert (raw["candidate_spread"] <= raw["spread"] + 1e-6).all()
    control = lossless.measure_noise(noisy_engine, PROMPTS, base.tokens, k=4)
    assert control.max_candidate_spread == pytest.approx(float(raw["candidate_spread"].max()))
    assert lossless_noise.CANDIDATE_WINDOW > 1  # every token noise of the measured size can lift is a candidate


@pytest.mark.parametrize("fault, what", [("rollback_long", "stale entries kept"), ("rollback_short", "entries lost")])
def test_the_cache_extent_shows_a_rollback_bug_that_no_logit_reveals(noisy_engine, fault, what):
    """After a correct run the target's cache holds the prompt and every emitted token but the
    pending last one, whatever the drafter or rule; a rollback that keeps a rejected draft or drops
    an accepted token changes that count exactly (no noise tolerance involved)."""
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    for spec in ({"temperature": 0.0}, {"temperature": 0.9, "accept_rule": "rejection"},
                 {"temperature": 0.0, "drafter": "ngram-simple"}):
        out = noisy_engine.generate(prompts, n_predict=N_PREDICT, spec=True, k=4, **spec)
        assert lossless.cache_problem(noisy_engine, prompts, out.tokens,
                                      lossless.cache_extents(noisy_engine, len(prompts))) is None, spec
    with injected(noisy_engine, fault):
        out = noisy_engine.generate(prompts, n_predict=N_PREDICT, spec=True, k=4)
    problem = lossless.cache_problem(noisy_engine, prompts, out.tokens, lossless.cache_extents(noisy_engine, len(prompts)))
    assert problem is not None and what in problem


def test_an_accepted_end_of_generation_draft_may_stay_in_the_cache():
    """A sequence ended by an accepted EOG draft had it verified in the cache: one more position."""
    engine = SimpleNamespace(_core=SimpleNamespace(is_eog=lambda token: token == 2))
    prompts, outputs = [[1, 1, 1]], [[7, 8, 2]]
    assert lossless.cache_problem(engine, prompts, outputs, [5]) is None
    assert lossless.cache_problem(engine, prompts, outputs, [6]) is None
    assert "stale" in lossless.cache_problem(engine, prompts, outputs, [7])
    assert "stale" in lossless.cache_problem(engine, prompts, [[7, 8, 9]], [6])  # no EOG: exactly 5


def test_a_sequence_ended_by_an_accepted_end_of_generation_draft_passes_the_state_check(model_dir):
    """The KV-state check reads the pending token's logits on top of the run's cache. When an
    accepted EOG draft ended a sequence that token is already in the cache, and feeding it again
    after itself read another context: a false `fail` (logits moved 8.7 against a tolerance of
    5-6 on MT-Bench reasoning with the Qwen pair). A model that often ends on eos, drafted by its
    exact copy (every draft accepted), so EOG drafts are accepted and verified."""
    from conftest import ENGINE_KW

    from specnative import models
    from specnative.engine import Engine

    path = models.write_tiny_llama(model_dir / "tiny-eos.gguf", n_embd=64, n_ff=128,
                                   forced_token=models.EOS_ID, force_logit=3.5)
    with Engine(path, path, n_ctx=2048, n_batch=256, n_seq_max=len(PROMPTS), kv_unified=True, **ENGINE_KW) as engine:
        base = engine.generate(PROMPTS, n_predict=N_PREDICT)
        spec = engine.generate(PROMPTS, n_predict=N_PREDICT, spec=True, k=4, accept_rule="greedy")
        prompts = engine.to_token_prompts(PROMPTS)
        extents = lossless.cache_extents(engine, len(PROMPTS))
        verified = [s for s, (p, out, extent) in enumerate(zip(prompts, spec.tokens, extents))
                    if extent == len(p) + len(out)]
        assert verified, "no sequence ended by an accepted EOG draft: the case is not exercised"
        verdict, control = lossless.verdict_after_run(engine, PROMPTS, base.tokens, spec.tokens, 0.0, 0, 4)
    assert verdict.verdict in (EXACT, NUMERIC), verdict.reason


def test_at_t_above_0_the_control_counts_flips_of_the_keyed_draw(noisy_engine):
    """The near-tie allowance at T > 0 comes from the keyed draw's flips between the shapes (the
    match rule's decision), not from greedy flips: on a flat p the draw flips far more often."""
    base = noisy_engine.generate(PROMPTS, n_predict=N_PREDICT, temperature=0.9, seed=2)
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    tokens = [t.tolist() for t in base.tokens]
    raw = noisy_engine._core.numeric_noise(prompts, tokens, 1, 5, temperature=0.9, seed=2)
    assert raw["draw_a"].size == raw["argmax_a"].size
    # Strict equality is safe here: pass A and the replay both run 1-token steps over the same
    # sequences, batch for batch the same shape, so their logits are bit-identical on any CPU.
    replay = noisy_engine._core.replay(prompts, tokens, 0.9, 2)
    draws = {(int(s), int(i)): int(d) for s, i, d in zip(raw["seq"], raw["index"], raw["draw_a"])}
    assert [draws[(int(s), int(i))] for s, i in zip(replay["seq"], replay["index"])] == replay["pick"].tolist()
    control = lossless.measure_noise(noisy_engine, PROMPTS, base.tokens, 4, temperature=0.9, seed=2)
    assert control.flips == int(np.count_nonzero(raw["draw_a"] != raw["draw_b"]))
    assert noisy_engine._core.numeric_noise(prompts, tokens, 1, 5)["draw_a"].size == 0  # greedy: none


def test_distributional_runs_reuse_the_prompts_only_while_the_cache_holds_them(noisy_engine):
    """A record_pit run right after a run of the same prompts feeds no prompt token (it keeps their
    cells and last logits); after a run of other prompts it prefills them whole. Two whole prefills
    of the same prompts are the same computation (same batches; where cells land is decided by
    llama.cpp's allocator, not the CPU, so the equality holds on any host), and a stale reuse
    (other prompts' cells) would show as other probabilities."""
    other = ["Completely different words here", "and more of them", "to fill the cache"]
    kwargs = dict(n_predict=12, temperature=0.8, seed=5, spec=True, k=4, accept_rule="rejection", record_pit=True)
    noisy_engine.generate(other, n_predict=8)
    whole = noisy_engine.generate(PROMPTS, **kwargs)
    reused = noisy_engine.generate(PROMPTS, **kwargs)
    noisy_engine.generate(other[:2], n_predict=8)
    again = noisy_engine.generate(PROMPTS, **kwargs)
    assert all(len(points["index"]) for points in reused.pit)
    for a, c in zip(whole.pit, again.pit):
        np.testing.assert_array_equal(a["p_emitted"], c["p_emitted"])


def test_teacher_forced_passes_reuse_the_run_s_prompts_and_compute_what_a_fresh_prefill_does(noisy_engine):
    """A teacher-forced pass (noise control, replay) right after a run of the same prompts feeds no
    prompt token: it keeps their cells and the last prompt token's logits from the run's prefill.
    That is what a fresh prefill computes, so the replay's logits match one made after the cache
    held other prompts (cell placement may differ there: a tolerance, and no token equality, since
    such noise can flip a near-tie on another CPU)."""
    core = noisy_engine._core
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    base = noisy_engine.generate(PROMPTS, n_predict=N_PREDICT)
    tokens = [t.tolist() for t in base.tokens]
    fed = core._target_prompt_tokens_fed()
    reused = core.replay(prompts, tokens, 0.0, 0)
    core.numeric_noise(prompts, tokens, 1, 5)
    assert core._target_prompt_tokens_fed() == fed  # three passes, no prompt token fed
    noisy_engine.generate(["Completely different words here", "and more", "of them"], n_predict=4)
    fed = core._target_prompt_tokens_fed()
    fresh = core.replay(prompts, tokens, 0.0, 0)
    assert core._target_prompt_tokens_fed() > fed  # other prompts were cached: prefilled whole
    for a, b in zip(reused["final_logits"], fresh["final_logits"]):
        np.testing.assert_allclose(a, b, atol=1e-3)


def test_a_sequence_of_one_or_two_tokens_still_gets_a_measured_control(noisy_engine):
    """A sequence that ends after a token or two gave the control no verify-shaped chunk: zero
    noise, tolerance 0, and the KV-state check failed a correct run on batch-shape noise (MT-Bench
    reasoning, Qwen pair, concurrency 1). The control lengthens such continuations with the
    prompt's own tokens; the state check then replays the real output itself."""
    assert lossless.control_tokens([1, 2, 3], [7], 6) == [7, 2, 3, 1, 2, 3]  # the prompt cycled, ending on its last token
    assert lossless.control_tokens([1, 2, 3], [7] * 6, 6) == [7] * 6
    base = noisy_engine.generate(PROMPTS, n_predict=2)
    assert all(len(t) <= 2 for t in base.tokens)
    clean = []
    control = lossless.measure_noise(noisy_engine, PROMPTS, base.tokens, 4, clean_final=clean)
    assert control.positions >= len(PROMPTS) * (4 + lossless_noise.CONTROL_MIN_EXTRA)
    assert clean == []  # not a replay of the output any more
    spec = noisy_engine.generate(PROMPTS, n_predict=2, spec=True, k=4, accept_rule="greedy")
    verdict, _ = lossless.verdict_after_run(noisy_engine, PROMPTS, base.tokens, spec.tokens, 0.0, 0, 4)
    assert verdict.verdict in (EXACT, NUMERIC), verdict.reason


# --- float arithmetic's floor under every tolerance -----------------------------------------------
def test_a_control_of_zero_still_leaves_float_arithmetic_its_ulps():
    """A control that read exactly 0 (both shapes ran the same kernels in the same order) gives no
    tolerance of 0: a logit gap moved by a few float32 ulps is rounding, not a stale cache entry,
    while a real stale entry (0.01 here; planted ones move 1e5 times more than rounding) still fails."""
    zero = dataclasses.replace(control(spread=0.0), logit_scale=27.0)
    floor = lossless_noise.float_floor(27.0)
    assert floor > 0 and zero.tolerance == zero.greedy_tolerance == zero.state_tolerance == pytest.approx(floor)
    clean = [np.linspace(-27.0, 27.0, 64)]
    one_position = np.arange(64) == 7
    ulps = [clean[0] + np.where(one_position, 8 * np.spacing(np.float32(27.0)), 0.0)]
    assert lossless.state_problem(clean, ulps, tolerance=0.0) is None
    stale = [clean[0] + np.where(one_position, 0.01, 0.0)]
    assert "stale or missing cache entry" in lossless.state_problem(clean, stale, tolerance=0.0)
    picks, emitted, gaps = [5] * 40, [5] * 40, [0.0] * 40  # a greedy near-tie moved by rounding alone
    emitted[10], gaps[10] = 6, 4 * float(np.spacing(np.float32(27.0)))
    v = lossless.judge(FakeEngine(fake_replay(picks, emitted, gaps)), [[1]], [[5] * 40], [emitted], 0.0, 0, zero)
    assert v.verdict == NUMERIC, v.reason


def test_a_float16_target_is_not_failed_on_rounding_its_control_did_not_see(model_dir, tmp_path):
    """Tiny F16 target and draft at concurrency 2, ctx_len 0, 8 tokens: the noise control measures
    exactly 0 on x86 CPUs (no kernel switch between its shapes), the run's cache moves the logits
    by ulps; the verdict must be exact, and the cell keeps its numbers."""
    from specnative.models import tiny_pair
    from specnative.record import schema
    from specnative.sweep import main
    target, draft = tiny_pair(model_dir, "noisy", noise=0.03, dtype="f16")
    out = tmp_path / "run"
    assert main(["-m", str(target), "-md", str(draft), "-np", "2", "--ctx-len", "0", "-n", "8", "--warmup", "0",
                 "-r", "2", "--max-repeats", "2", "-t", "1", "-o", str(out), "--no-report", "--no-db"]) == 0
    on = schema.read_traces(out / "traces.csv").query("spec_decode == 'on'").iloc[0]
    assert on["verdict"] != "fail", on["verdict_reason"]
    assert on["noise_tolerance"] > 0 and on["speedup"] > 0
    import json
    noise = json.loads((out / "provenance.json").read_text())["noise_control"]
    assert noise and all(entry["tolerance"] > 0 for entry in noise.values())  # the record shows the floor too


class LayoutEngine(FakeEngine):
    """Replays that give `clean` for a sequence alone and `clean + beside` for sequences side by side
    in the cache: the cache-layout control (noise.layout_spread) reads max(beside) - min(beside)."""

    def __init__(self, clean, beside):
        def replay(prompts, tokens, temperature, seed):
            return {"final_logits": [clean if len(prompts) == 1 else clean + beside for _ in prompts]}
        self._core = SimpleNamespace(replay=replay)


def test_a_state_movement_within_the_cache_layout_control_is_not_a_stale_entry():
    """The tiny F32 sweep's case: prefix cache off, concurrency 2, the run's cache moved the logits
    4.37e-5 where the KV-state control allowed 2.38e-5. Same tokens, sequences alone or side by side
    in the cache, move them 1e-4 on that model: the layout, not a stale entry. A real one still fails."""
    clean = np.linspace(-0.5, 0.5, 64)  # small logits: the float floor (3.8e-6 here) is not what decides
    at = np.arange(64) == 9
    layout = LayoutEngine(clean, np.where(at, 1.0e-4, 0.0))
    state_control = dataclasses.replace(control(spread=0.0), max_state_spread=2.38e-5 / 5, logit_scale=0.5)
    tokens = [[5, 6, 7], [5, 6, 8]]
    moved = [clean + np.where(at, 4.37e-5, 0.0), clean]
    assert lossless.state_problem([clean, clean], moved, state_control.state_tolerance)  # the old false fail
    v = lossless.judge(layout, [[1], [2]], tokens, tokens, 0.0, 0, state_control, pending=moved,
                       clean_final=[clean, clean])
    assert v.verdict == EXACT, v.reason
    stale = [clean + np.where(at, 0.01, 0.0), clean]
    v = lossless.judge(layout, [[1], [2]], tokens, tokens, 0.0, 0, state_control, pending=stale,
                       clean_final=[clean, clean])
    assert v.verdict == FAIL and "stale or missing cache entry" in v.reason
