"""The drafter axis: llama.cpp's model-free n-gram drafters (common/speculative.h) through the same
round loop as the draft model: exact counts with variable draft lengths 0..k, rounds without a
draft, timers, lossless verdicts, and clear errors at start."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import ENGINE_KW, assert_lossless_verdict, check_counts, check_spec_timers
from scipy import stats
from synthetic_traces import assert_tables_well_formed

from specnative import _core, lossless
from specnative.analysis import theory
from specnative.engine import DRAFTERS, DecodeSpec, drafter_defaults
from specnative.models import FIRST_NORMAL_ID
from specnative.report import summary as report_summary

NGRAM = [d for d in DRAFTERS if d.startswith("ngram-")]
# Short n-grams, so that a tiny model's 60-token generations find matches (llama.cpp's defaults
# look for 12- to 24-token matches; those are tested on the empty side below).
SHORT = {
    "spec-ngram-simple-size-n": 1, "spec-ngram-simple-size-m": 4,
    "spec-ngram-map-k-size-n": 1, "spec-ngram-map-k-size-m": 4,
    "spec-ngram-map-k4v-size-n": 1, "spec-ngram-map-k4v-size-m": 4,
    "spec-ngram-mod-n-match": 1, "spec-ngram-mod-n-min": 1, "spec-ngram-mod-n-max": 4,
}


def own(options: dict, drafter: str) -> dict:
    """The options of `drafter` alone: one of another drafter is refused (llama.cpp would ignore it)."""
    return {name: value for name, value in options.items() if _core.drafter_of_option(name) == drafter}


# No token repeats: no n-gram of two or more tokens occurs twice.
DISTINCT = list(range(FIRST_NORMAL_ID, FIRST_NORMAL_ID + 20))


@pytest.fixture(scope="module")
def own_text(target_only):
    """A prompt of the target's own greedy text: the token pairs it favours recur in it, so a
    lookup finds continuations the target often agrees with (drafts, some accepted)."""
    prompt = target_only.tokenize("The city of").tolist()
    return prompt + target_only.generate([prompt], n_predict=300).tokens[0].tolist()


@pytest.mark.parametrize("drafter", NGRAM)
def test_ngram_drafter_counts_timers_and_verdict(target_only, own_text, drafter):
    k, prompts = 4, [own_text, own_text[40:]]
    base = target_only.generate(prompts, n_predict=48, record_margins=True)
    spec = target_only.generate(prompts, n_predict=48, spec=True, k=k, drafter=drafter,
                                drafter_options=own(SHORT, drafter))
    assert spec.drafter == drafter and spec.drafter_options == {n: str(v) for n, v in own(SHORT, drafter).items()}
    check_counts(spec, k)
    check_spec_timers(spec)
    control = lossless.measure_noise(target_only, prompts, base.tokens, k)
    verdict = lossless.judge(target_only, prompts, base.tokens, spec.tokens, 0.0, 0, control)
    assert verdict.lossless_ok, verdict.reason
    assert 0 <= spec.mean_draft_len <= k
    assert spec.totals["accepted"] > 0                           # drafts were made and some kept
    assert 0 < spec.empty_draft_rounds < spec.totals["rounds"]  # ... and some rounds had none


def test_no_repeated_ngram_means_empty_drafts_counted_as_plain_steps(target_only):
    """llama.cpp's default ngram-simple needs 12 + 48 + 1 tokens of history: a 20-token prompt and
    30 generated tokens never reach that, so every round is a plain target step."""
    n_predict = 30
    base = target_only.generate([DISTINCT], n_predict=n_predict)
    spec = target_only.generate([DISTINCT], n_predict=n_predict, spec=True, k=4, drafter="ngram-simple")
    # no draft, so every verify is the baseline's 1-token step: equal bit for bit
    np.testing.assert_array_equal(base.tokens[0], spec.tokens[0])
    totals = spec.totals
    assert totals["drafted"] == 0 and totals["accepted"] == 0
    assert totals["rounds"] == n_predict - 1 == spec.empty_draft_rounds
    assert totals["accept_len_hist"][0] == totals["rounds"] and totals["emitted"] == totals["rounds"]
    assert spec.mean_accept_len == 1.0 and spec.mean_draft_len == 0.0
    check_spec_timers(spec)


def test_rounds_with_and_without_drafts_in_one_run(target_only):
    """Distinct prompt tokens: early rounds find no 2-gram match; once the generation repeats
    itself the lookup drafts. Both kinds of round are counted in one run."""
    options = {"spec-ngram-simple-size-n": 1, "spec-ngram-simple-size-m": 4}
    spec = target_only.generate([DISTINCT], n_predict=64, spec=True, k=4, drafter="ngram-simple",
                                drafter_options=options)
    check_counts(spec, 4)
    assert 0 < spec.empty_draft_rounds < spec.totals["rounds"]
    assert spec.totals["drafted"] > 0


def test_the_model_drafter_drafts_in_every_round_but_a_last_one_without_room(noisy_engine):
    """The draft model behind the drafter interface drafts k tokens whenever n_predict leaves room:
    a round without a draft is a sequence's last (its correction token is the n_predict-th)."""
    prompts = ["The city of", "Hello"]
    k, n_predict = 4, 32
    run = noisy_engine.generate(prompts, n_predict=n_predict, spec=True, k=k, drafter="model")
    assert run.drafter == "model"
    check_counts(run, k)
    assert run.empty_draft_rounds == sum(c["rounds"] - c["drafted_at"][0] for c in run.counts)
    for c in run.counts:
        # a round drafts min(k, tokens still to come - 1): none only in a last round; fewer than k
        # only in the last k rounds (each emits a token at least)
        assert c["rounds"] - c["drafted_at"][0] in (0, 1)
        assert c["drafted_at"][-1] >= c["rounds"] - k


def test_match_rule_with_ngram_drafts_reproduces_seeded_sampling(target_only, own_text):
    prompts = [own_text]
    for seed in (1, 2):
        base = target_only.generate(prompts, n_predict=40, temperature=0.8, seed=seed)
        spec = target_only.generate(prompts, n_predict=40, temperature=0.8, seed=seed, spec=True, k=4,
                                    accept_rule="match", drafter="ngram-simple",
                                    drafter_options=own(SHORT, "ngram-simple"))
        assert_lossless_verdict(target_only, prompts, base.tokens, spec.tokens, 0.8, seed, k=4)  # conftest
        assert spec.totals["drafted"] > 0


def test_rejection_step_with_a_one_hot_q_reproduces_p():
    """An n-gram draft is deterministic: q is one-hot at x. The rejection step then accepts x with
    probability p(x) and otherwise resamples from p without x: the output is distributed as p."""
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.full(30, 0.5))
    p = (p / p.sum()).astype(np.float64)
    q = np.zeros(30)
    q[int(np.argmax(p))] = 1.0  # a draft the target likes, so both paths run
    n = 100_000
    hist, accepted = _core.rejection_histogram(p, q, n, seed=11)
    assert 0 < accepted < n
    assert accepted / n == pytest.approx(float(p.max()), abs=0.01)
    expected = p / p.sum() * n
    keep = expected >= 5
    observed = np.append(hist[keep], hist[~keep].sum()).astype(np.float64)
    expected = np.append(expected[keep], expected[~keep].sum())
    observed, expected = observed[expected > 0], expected[expected > 0]
    expected *= observed.sum() / expected.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_rejection_rule_with_ngram_drafts_counts(target_only, own_text):
    spec = target_only.generate([own_text, own_text[40:]], n_predict=40, temperature=0.6, seed=3, spec=True, k=4,
                                accept_rule="rejection", drafter="ngram-simple",
                                drafter_options=own(SHORT, "ngram-simple"))
    check_counts(spec, 4)
    assert spec.totals["drafted"] > 0


def test_closed_form_over_draft_lengths():
    """E[tokens per round] = 1 + sum_j alpha^j P(L >= j): the closed form when L = k always, one
    token per round without drafts, and the length mix in between."""
    a, k = 0.6, 4
    assert theory.expected_tokens_per_round_lengths(a, [1.0] * k) == pytest.approx(
        theory.expected_tokens_per_round(a, k))
    assert theory.expected_tokens_per_round_lengths(a, [0.0] * k) == 1.0
    half = theory.expected_tokens_per_round_lengths(a, [0.5] * k)
    assert half == pytest.approx(0.5 * 1 + 0.5 * theory.expected_tokens_per_round(a, k))
    assert theory.predicted_speedup_lengths(a, [1.0] * k, 0.25) == pytest.approx(theory.predicted_speedup(a, k, 0.25))


# --- parameters and errors at start ----------------------------------------------------------------
def test_defaults_are_llama_cpps():
    defaults = drafter_defaults()
    # common/common.h at the pinned commit
    assert defaults["spec-ngram-simple-size-n"] == "12" and defaults["spec-ngram-simple-size-m"] == "48"
    assert defaults["spec-ngram-mod-n-match"] == "24" and defaults["spec-ngram-mod-n-min"] == "48"
    assert defaults["spec-ngram-mod-n-max"] == "64" and defaults["lookup-cache-static"] == ""
    assert set(DRAFTERS) == {"model", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
                             "dflash", "dspark", "eagle3", "mtp"}  # the hidden-state drafters: test_hidden_drafters.py


@pytest.mark.parametrize("kwargs, message", [
    ({"drafter": "ngram-bogus"}, "drafter must be one of"),
    ({"drafter": "ngram-mod", "drafter_options": {"spec-ngram-mod-n-nope": 3}}, "unknown drafter option"),
    ({"drafter": "ngram-mod", "drafter_options": {"spec-ngram-mod-n-match": 0}}, r"range \[1, 1024\]"),
    ({"drafter": "ngram-simple", "drafter_options": {"spec-ngram-simple-size-n": "x"}}, "must be an integer"),
    ({"drafter": "model"}, "needs a draft model"),
])
def test_bad_drafter_arguments_raise(target_only, kwargs, message):
    with pytest.raises(ValueError, match=message):
        target_only.generate([DISTINCT], n_predict=8, spec=True, **kwargs)


def test_lookup_cache_files_are_checked_before_decoding(target_only, tmp_path):
    missing = tmp_path / "missing.bin"
    with pytest.raises(ValueError, match="cannot read the lookup cache file"):
        target_only.generate([DISTINCT], n_predict=8, spec=True, drafter="ngram-cache",
                             drafter_options={"lookup-cache-static": missing})
    damaged = tmp_path / "damaged.bin"
    damaged.write_bytes(b"\x01\x00\x00\x00" * 5)  # an n-gram, then a half record
    with pytest.raises(ValueError, match="not a llama.cpp lookup cache"):
        target_only.generate([DISTINCT], n_predict=8, spec=True, drafter="ngram-cache",
                             drafter_options={"lookup-cache-dynamic": damaged})
    with pytest.raises(ValueError, match="lookup cache"):
        _core.validate_drafter("ngram-cache", {"lookup-cache-static": str(missing)})


# --- the sweep axis ----------------------------------------------------------------------------------
def test_sweep_measures_each_drafter_as_its_own_cell(noisy_pair, tmp_path):
    from specnative.analysis.advisor import drafter_advice
    from specnative.record import schema
    from specnative.sweep import SweepConfig, run_sweep

    target, draft = noisy_pair
    cfg = SweepConfig(targets=[target], draft=draft, ctx_lens=[0], concurrencies=[2], ks=[3], n_predict=12,
                      warmup=0, repeats=2, max_repeats=2, threads=1, out_dir=tmp_path, report=False,
                      drafters=["model", "ngram-simple"], drafter_options={"spec-ngram-simple-size-n": "2"})
    traces = schema.read_traces(run_sweep(cfg))
    assert list(traces["drafter"]) == ["model", "model", "ngram-simple", "ngram-simple"]
    on = traces[traces["spec_decode"] == "on"].set_index("drafter")
    assert on.loc["model", "mean_draft_len"] > 2 and pd.isna(on.loc["model", "drafter_options"])
    assert "spec-ngram-simple-size-n=2" in on.loc["ngram-simple", "drafter_options"]
    assert "spec-ngram-mod-n-min=48" in on.loc["ngram-simple", "drafter_options"]  # defaults recorded
    assert pd.isna(on.loc["ngram-simple", "draft_model"])  # no draft model took part
    assert traces["cell_id"].is_unique
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["grid"]["drafter"] == ["model", "ngram-simple"]
    assert "spec-ngram-simple-size-n=2" in prov["drafter_options"]["ngram-simple"]
    advice = drafter_advice(traces)  # the rule itself: test_drafter_advice_prefers_the_surest_gain
    assert len(advice) == 1
    assert "model" in advice["ranking"].iloc[0] and "ngram-simple" in advice["ranking"].iloc[0]


def test_drafter_advice_prefers_the_surest_gain():
    """Per regime, among the drafters that pay the one with the highest interval lower bound (not
    the highest point estimate); `none` when none pays; `measure-more` when the rest is unsure."""
    from synthetic_traces import off_row, on_row

    from specnative.analysis.advisor import drafter_advice

    rows = []
    for conc, drafters in {1: [("model", 1.5, 0.02), ("ngram-simple", 1.8, 0.02)],    # both pay: the faster
                           2: [("model", 1.6, 0.02), ("ngram-simple", 2.0, 0.9)],     # the sure one, not the noisy
                           4: [("model", 0.7, 0.02), ("ngram-simple", 0.6, 0.02)],    # neither pays
                           8: [("model", 1.02, 0.5), ("ngram-simple", 0.6, 0.02)]}.items():  # unsure and off
        for drafter, speedup, spread in drafters:
            rows += [off_row(conc=conc, drafter=drafter, cell_id=f"n{conc}-{drafter}-off"),
                     on_row(conc=conc, speedup=speedup, spread=spread, drafter=drafter, cell_id=f"n{conc}-{drafter}")]
    advice = drafter_advice(pd.DataFrame(rows)).set_index("concurrency")
    assert advice["recommend"].to_dict() == {1: "ngram-simple", 2: "model", 4: "none", 8: "measure-more"}
    assert advice.loc[2, "speedup"] == 1.6 and advice["speedup"].loc[[4, 8]].isna().all()
    assert advice.loc[1, "ranking"].startswith("ngram-simple on 1.80; model on 1.50")


@pytest.mark.parametrize("argv, message", [
    (["--drafter", "ngram-bogus"], "unknown drafter"),
    (["--drafter", "ngram-mod", "--spec-ngram-mod-n-match", "0"], "range"),
    (["--drafter", "ngram-cache", "--lookup-cache-static", "/nonexistent/cache.bin"], "lookup cache"),
    (["--drafter", "model,model"], "duplicates"),
])
def test_bad_drafter_flags_fail_before_any_work(argv, message, capsys):
    from specnative.sweep import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert message in str(exc.value.code) + capsys.readouterr().err


# --- the draft model's stop rule: llama.cpp's --spec-draft-p-min ---------------------
P_MIN_PROMPTS = ["The city of", "Once upon a time there was a", "Hello"]
P_MIN_RUN = dict(n_predict=40, spec=True, k=4)


def _same_run(a, b):
    assert [list(t) for t in a.tokens] == [list(t) for t in b.tokens]
    for key in ("drafted", "accepted", "rounds", "emitted"):
        assert a.totals[key] == b.totals[key], key
    for key in ("drafted_at", "accepted_at", "accept_len_hist"):
        assert list(a.totals[key]) == list(b.totals[key]), key


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "accept_rule": "rejection", "seed": 3}])
def test_p_min_zero_or_never_reached_reproduces_fixed_k(noisy_engine, sampling):
    """p_min 0 is today's engine; p_min below 1/10 takes the checking path but never stops (the top
    candidate of a softmax over 10 logits has p >= 0.1): the same tokens and counts exactly."""
    fixed = noisy_engine.generate(P_MIN_PROMPTS, **P_MIN_RUN, **sampling)
    assert fixed.draft_p_min == 0.0
    _same_run(fixed, noisy_engine.generate(P_MIN_PROMPTS, **P_MIN_RUN, draft_p_min=0.0, **sampling))
    checked = noisy_engine.generate(P_MIN_PROMPTS, **P_MIN_RUN, draft_p_min=0.05, **sampling)
    _same_run(fixed, checked)
    assert checked.draft_p_min == 0.05


@pytest.mark.parametrize("p_min", [0.3, 0.9])
def test_p_min_cuts_drafts_and_stays_lossless(noisy_engine, p_min):
    prompts = noisy_engine.to_token_prompts(P_MIN_PROMPTS)
    base = noisy_engine.generate(prompts, n_predict=40)
    fixed = noisy_engine.generate(prompts, **P_MIN_RUN)
    spec = noisy_engine.generate(prompts, **P_MIN_RUN, draft_p_min=p_min)
    # verify batches vs 1-token steps: up to batch-shape near-ties (conftest)
    verdict, _ = lossless.verdict_after_run(noisy_engine, prompts, base.tokens, spec.tokens, 0.0, 0, 4)
    assert verdict.verdict in (lossless.EXACT, lossless.NUMERIC) and verdict.lossless_ok, verdict.reason
    assert spec.mean_draft_len < fixed.mean_draft_len and spec.mean_draft_len < 4
    assert spec.empty_draft_rounds > fixed.empty_draft_rounds  # stopped at the first position
    check_counts(spec, 4)  # drafts of 0..k tokens, each a prefix
    assert spec.totals["drafted_at"][0] == spec.totals["rounds"] - spec.empty_draft_rounds


def test_p_min_sampling_stays_consistent(noisy_engine):
    """At temperature > 0 the rule is checked before the draft token is sampled (q is kept only
    for proposed tokens); rejection sampling then runs on the shorter drafts."""
    run = dict(P_MIN_RUN, temperature=0.8, accept_rule="rejection", seed=5)
    spec = noisy_engine.generate(P_MIN_PROMPTS, **run, draft_p_min=0.3)
    fixed = noisy_engine.generate(P_MIN_PROMPTS, **run)
    assert spec.mean_draft_len < fixed.mean_draft_len
    assert all(len(x) == 40 or (len(x) < 40 and x[-1] >= 0) for x in spec.tokens)
    assert spec.totals["accepted"] <= spec.totals["drafted"]


def test_p_min_on_an_exact_copy_accepts_every_proposed_draft(copy_engine):
    base = copy_engine.generate(P_MIN_PROMPTS, n_predict=40)
    spec = copy_engine.generate(P_MIN_PROMPTS, **P_MIN_RUN, draft_p_min=0.3)
    assert_lossless_verdict(copy_engine, P_MIN_PROMPTS, base.tokens, spec.tokens, k=4)  # near-ties: conftest
    assert 0 < spec.totals["drafted"] < 4 * spec.totals["rounds"]
    assert spec.totals["accepted"] == spec.totals["drafted"]  # the copy agrees with every draft it makes


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5, float("nan"), "x", None, True])
def test_bad_p_min_is_a_clear_value_error(noisy_engine, value):
    with pytest.raises(ValueError, match="draft_p_min"):
        noisy_engine.generate(P_MIN_PROMPTS, **P_MIN_RUN, draft_p_min=value)


def test_p_min_is_for_the_draft_model_only(noisy_engine):
    with pytest.raises(ValueError, match="draft model only"):
        noisy_engine.generate(P_MIN_PROMPTS, **P_MIN_RUN, drafter="ngram-simple", draft_p_min=0.5)
    with pytest.raises(ValueError, match="draft_p_min"):  # the C++ check, should Python's be bypassed
        params = DecodeSpec(n_predict=8, spec=True, k=2).core_params()
        params.draft_p_min = 1.0
        noisy_engine._core.generate(noisy_engine.to_token_prompts(P_MIN_PROMPTS), params)


def test_sweep_p_min_axis_rows_ids_and_report(noisy_pair, tmp_path, no_figure_files):
    from specnative.analysis.advisor import k_advice, p_min_advice
    from specnative.sweep import main

    target, draft = noisy_pair
    out = tmp_path / "run"
    argv = ["-m", str(target), "-md", str(draft), "--ctx-len", "0", "-np", "2", "-k", "3", "-n", "12",
            "--warmup", "0", "-r", "1", "--max-repeats", "1", "-t", "1", "-ngl", str(ENGINE_KW["n_gpu_layers"]),
            "--which-k", "-o", str(out), "--no-report", "--draft-p-min", "0,0.3"]
    assert main(argv) == 0
    traces = schema_read(out)
    on = traces[traces["spec_decode"] == "on"]
    off = traces[traces["spec_decode"] == "off"]
    assert sorted(on["draft_p_min"]) == [0.0, 0.3] and off["draft_p_min"].isna().all()
    assert traces["cell_id"].is_unique and len(traces) == 4
    fixed, stop = on[on["draft_p_min"] == 0].iloc[0], on[on["draft_p_min"] > 0].iloc[0]
    assert "pmin" not in fixed["cell_id"] and stop["cell_id"].endswith("|pmin=0.3|k3")
    assert pd.notna(fixed["recommended_k"]) and pd.isna(stop["recommended_k"])  # no k' prediction
    assert stop["mean_draft_len"] < fixed["mean_draft_len"]
    reach = [float(x) for x in stop["draft_reach"].split(";")]  # the closed form over the length mix
    assert stop["predicted_speedup"] == pytest.approx(
        theory.predicted_speedup_lengths(stop["token_accept_rate"], reach, stop["verify_cost_c"]), rel=1e-3)
    assert bool(stop["lossless_ok"]) and stop["lossless_method"] == "exact-greedy"
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["grid"]["draft_p_min"] == [0.0, 0.3]
    assert len(k_advice(traces)) == 1
    advice = p_min_advice(traces)
    assert len(advice) == 1 and advice["best_p_min"].iloc[0] == 0.3
    assert "fixed k" in advice["ranking"].iloc[0] and "p_min=0.3" in advice["ranking"].iloc[0]
    files = report_summary.write_artifacts(out)
    summary = files["summary.md"].read_text()
    assert "Draft stop rule (p_min) against fixed k" in summary and "recommended k" in summary
    assert "Numeric-noise control" in summary  # a real sweep's report: every table, noise control included
    assert_tables_well_formed(summary)
    # --resume: the same axis measures nothing again; without it (another grid) is refused
    assert main(argv[:-3] + ["--draft-p-min", "0,0.3", "--resume"]) == 0
    assert len(schema_read(out)) == 4
    with pytest.raises(SystemExit, match="draft_p_min"):
        main(argv[:-2] + ["--resume"])


def schema_read(out):
    from specnative.record import schema

    return schema.read_traces(out / "traces.csv")


@pytest.mark.parametrize("argv, message", [
    (["--draft-p-min", "1.0"], "draft_p_min must be in"),
    (["--draft-p-min", "0,-0.5"], "draft_p_min must be in"),
    (["--draft-p-min", "0.5,0.5"], "given twice"),
    (["--drafter", "ngram-simple", "--draft-p-min", "0.5"], "add --drafter model"),
])
def test_bad_p_min_flags_fail_before_any_work(argv, message, capsys):
    from specnative.sweep import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert message in str(exc.value.code) + capsys.readouterr().err


# --- --resume never mixes cells measured with other drafter options -------------------
def test_resume_with_other_drafter_options_is_refused(noisy_pair, tmp_path):
    """An n-gram cell's cell_id does not hold its options; the run directory's provenance does
    (drafter_options, llama.cpp's defaults overlaid), and a resume with other options is refused
    before anything is measured or removed."""
    from specnative.sweep import main

    target, draft = noisy_pair
    out = tmp_path / "run"
    argv = ["-m", str(target), "-md", str(draft), "--ctx-len", "0", "-np", "1", "-k", "2", "-n", "8",
            "--warmup", "0", "-r", "1", "--max-repeats", "1", "-t", "1", "-ngl", str(ENGINE_KW["n_gpu_layers"]),
            "-o", str(out), "--no-report", "--drafter", "ngram-simple", "--spec-ngram-simple-size-n", "1"]
    assert main(argv) == 0
    before = (out / "traces.csv").read_bytes()
    other = argv[:-1] + ["2", "--resume"]
    with pytest.raises(SystemExit) as exc:
        main(other)
    assert "settings differ" in str(exc.value.code) and "drafter_options.ngram-simple" in str(exc.value.code)
    assert (out / "traces.csv").read_bytes() == before
    assert main(argv + ["--resume"]) == 0  # the same options: resumes, measures nothing again
    assert (out / "traces.csv").read_bytes() == before
