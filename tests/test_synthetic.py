"""Synthetic acceptance: drafts kept at random at requested per-position rates (llama.cpp's
--spec-synth-rates / --spec-synth-len conventions), with the real drafter, verify and rollback."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import PROMPTS, check_counts
from scipy.stats import binom

from specnative import lossless
from specnative.analysis import theory
from specnative.engine import DecodeSpec, synthetic
from specnative.serving import arrivals
from specnative.serving.loop import serve

PROFILES = ["0.6", "rates:0.95/0.8/0.6/0.45/0.3/0.2/0.1/0.05", "len:2.5"]
NGRAM_OPTIONS = {"spec-ngram-simple-size-n": 1, "spec-ngram-simple-size-m": 4}


def within_binomial_bounds(totals, rates, level_family=0.99):
    """Per draft position, accepted_at within the binomial interval of its drafted_at rounds at the
    requested unconditional rate; the family of positions at `level_family` (Bonferroni)."""
    level = 1.0 - (1.0 - level_family) / len(rates)
    for i, rate in enumerate(rates):
        n, got = int(totals["drafted_at"][i]), int(totals["accepted_at"][i])
        low, high = binom.interval(level, n, rate)
        assert n > 100, f"position {i + 1}: only {n} rounds drafted it"
        assert low <= got <= high, f"position {i + 1}: {got}/{n} accepted, requested rate {rate:.3f} " \
                                   f"(bounds {low:.0f}..{high:.0f})"


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("text", PROFILES)
def test_realised_acceptance_per_position_matches_the_request(copy_engine, text, k):
    profile = synthetic.parse_profile(text)
    if profile.kind == "len" and profile.values[0] > k + 1:
        pytest.skip("length beyond k + 1")
    result = copy_engine.generate(PROMPTS + ["A B C"], n_predict=320, spec=True, k=k, synthetic=profile,
                                  stop_at_eos=False, seed=3)
    check_counts(result, k)
    within_binomial_bounds(result.totals, profile.rates(k))


def test_a_plain_alpha_is_the_per_token_rate_and_len_the_mean_acceptance_length():
    assert synthetic.parse_profile("0.5").rates(3) == pytest.approx([0.5, 0.25, 0.125])
    assert synthetic.parse_profile("0.5").conditional(3) == pytest.approx([0.5, 0.5, 0.5])
    length = synthetic.parse_profile("len:2.5")
    assert length.mean_length(4) == pytest.approx(2.5)
    p = length.conditional(4)
    assert max(p) - min(p) < 1e-9  # one constant conditional rate, as llama.cpp solves it
    rates = synthetic.parse_profile("rates:0.9/0.6/0.3/0")
    assert rates.conditional(4) == pytest.approx([0.9, 2 / 3, 0.5, 0.0])
    assert synthetic.parse_profile("len:1").rates(2) == [0.0, 0.0]
    assert synthetic.parse_profile("len:5").rates(4) == pytest.approx([1.0] * 4)
    # the profile's alpha: the i.i.d. alpha with its expected tokens per round
    assert theory.expected_tokens_per_round(rates.alpha(4), 4) == pytest.approx(rates.mean_length(4))


@pytest.mark.parametrize("text, words", [
    ("nan", "finite"), ("inf", "finite"), ("1.2", "within [0, 1]"), ("-0.1", "within [0, 1]"),
    ("rates:0.5/0.7", "must not increase"), ("rates:0.9/nan", "finite"), ("rates:0.9/1.5", "within [0, 1]"),
    ("rates:0.9//0.5", "rates:r1/r2"), ("len:0.5", ">= 1"), ("len:nan", "finite"), ("often", "not a number")])
def test_invalid_profiles_are_refused_with_a_clear_message(text, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        synthetic.parse_profile(text)


def test_invalid_synthetic_runs_raise_python_errors(copy_engine):
    kw = dict(n_predict=8, spec=True)
    with pytest.raises(ValueError, match="k = 4 needs one per draft position"):
        copy_engine.generate(PROMPTS, k=4, synthetic="rates:0.9/0.5", **kw)
    with pytest.raises(ValueError, match="over k \\+ 1"):
        copy_engine.generate(PROMPTS, k=2, synthetic="len:4", **kw)
    with pytest.raises(ValueError, match="must not increase"):
        copy_engine.generate(PROMPTS, k=2, synthetic="rates:0.2/0.9", **kw)
    with pytest.raises(ValueError, match="speculative runs"):
        copy_engine.generate(PROMPTS, n_predict=8, synthetic="0.5")
    # the core checks what reaches it too (no abort on a bad vector)
    prompts = [copy_engine.tokenize(p).tolist() for p in PROMPTS]
    for bad in ([0.5, float("nan")], [0.5, 1.5], [0.5]):
        with pytest.raises(ValueError, match="synthetic acceptance"):
            params = DecodeSpec(n_predict=8, spec=True, k=2).core_params()
            params.synthetic = bad
            copy_engine._core.generate(prompts, params)


def test_a_rejection_emits_the_target_token_and_rolls_back_like_a_real_round(copy_engine, copy_pair):
    """With an exact-copy draft every draft is the target's token, so any keep/reject pattern emits the
    target's own output: the synthetic run must reproduce the baseline and leave a consistent cache."""
    base = copy_engine.generate(PROMPTS, n_predict=40)
    for text in ("0.3", "rates:0.9/0.9/0.2/0.1"):
        run = copy_engine.generate(PROMPTS, n_predict=40, spec=True, k=4, synthetic=text)
        assert run.totals["rejected"] > 0 and run.totals["accepted"] > 0
        for s, tokens in enumerate(run.tokens):
            assert np.array_equal(tokens, base.tokens[s])
            prompt_len = len(copy_engine.tokenize(PROMPTS[s]))
            assert copy_engine._core.cache_extent(s) == prompt_len + len(tokens) - 1


@pytest.mark.parametrize("drafter", ["model", "ngram-simple"])
def test_every_drafter_family_runs_synthetic_and_counts_stay_exact(noisy_engine, drafter):
    options = NGRAM_OPTIONS if drafter != "model" else None
    run = noisy_engine.generate(PROMPTS, n_predict=48, spec=True, k=3, drafter=drafter, drafter_options=options,
                                synthetic="0.8", temperature=0.7, accept_rule="rejection", seed=5)
    check_counts(run, 3)
    assert run.totals["drafted"] > 0
    again = noisy_engine.generate(PROMPTS, n_predict=48, spec=True, k=3, drafter=drafter, drafter_options=options,
                                  synthetic="0.8", temperature=0.7, accept_rule="rejection", seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(run.tokens, again.tokens))  # seeded: repeatable


def test_serve_takes_a_synthetic_profile(noisy_engine):
    prompts = [noisy_engine.tokenize(t).tolist() for t in PROMPTS]
    trace = arrivals.build_trace(prompts, [60, 60, 60], float("inf"), 6, seed=2)
    run = serve(noisy_engine, trace, max_concurrency=3, spec=True, k=3, synthetic="rates:0.9/0.5/0.2")
    totals = run.totals
    rates = np.asarray(totals["accepted_at"]) / np.asarray(totals["drafted_at"])
    assert np.all(np.abs(rates - [0.9, 0.5, 0.2]) < 0.12), rates
    assert not math.isnan(run.draft_accept_rate)
    with pytest.raises(ValueError, match="within"):
        serve(noisy_engine, trace, max_concurrency=3, spec=True, k=3, synthetic="1.5")


def test_synthetic_output_is_not_passed_off_as_lossless(noisy_engine):
    """The noisy draft kept at random: the output parts from the target's, and the ordinary verdict
    would call that a failure: synthetic runs get no lossless check at all (rows say 'synthetic')."""
    base = noisy_engine.generate(PROMPTS, n_predict=32)
    run = noisy_engine.generate(PROMPTS, n_predict=32, spec=True, k=4, synthetic="0.95")
    assert lossless.first_divergence(base.tokens, run.tokens)[0] >= 0


# ---- the sweep and serve axis, the verdict and the break-even report -----------------------------
@pytest.fixture(scope="module")
def synthetic_sweep(noisy_pair, tmp_path_factory):
    from conftest import TEST_NGL

    from specnative.sweep import SweepConfig, run_sweep
    target, draft = noisy_pair
    out = tmp_path_factory.mktemp("synthetic-sweep")
    cfg = SweepConfig(targets=[target], draft=draft, ctx_lens=[0], concurrencies=[2], ks=[3], n_predict=24,
                      warmup=0, repeats=2, max_repeats=2, threads=1, gpu_layers=TEST_NGL, out_dir=out,
                      synthetic=synthetic.parse_profiles("0.3,rates:0.95/0.9/0.8,len:3.5"))
    run_sweep(cfg)
    from specnative.report.summary import write_report
    write_report(out)
    return out


def test_synthetic_rows_have_their_own_verdict_and_columns(synthetic_sweep):
    from specnative.record import schema
    frame = schema.read_traces(synthetic_sweep / "traces.csv")
    synth = schema.synthetic_rows(frame)
    real = schema.real_rows(frame)
    assert len(real) == 2 and sorted(real["spec_decode"]) == ["off", "on"] and real["lossless_ok"].all()
    assert sorted(synth["synthetic_acceptance"]) == sorted(["0.3", "rates:0.95/0.9/0.8", "len:3.5"])
    assert (synth["verdict"] == "synthetic").all() and synth["lossless_ok"].isna().all()
    assert (synth["spec_decode"] == "on").all() and (synth["k"] == 3).all()
    assert synth["cell_id"].str.endswith(tuple(f"|k3|synthetic={t}" for t in synth["synthetic_acceptance"])).all()
    row = synth[synth["synthetic_acceptance"] == "rates:0.95/0.9/0.8"].iloc[0]
    assert row["synthetic_rates"] == "0.9500;0.9000;0.8000"
    assert row["synthetic_alpha"] > 0.9 and row["speedup_ci_low"] <= row["speedup"] <= row["speedup_ci_high"]
    assert synth.set_index("synthetic_acceptance").loc["0.3", "synthetic_alpha"] == pytest.approx(0.3)
    # paired with the cell's own off runs: the same tps_baseline as the real on row
    assert (synth["tps_baseline"] == real[real["spec_decode"] == "on"]["tps_baseline"].iloc[0]).all()


def test_the_report_keeps_synthetic_rows_out_of_verdicts_and_gives_the_break_even(synthetic_sweep):
    import pandas as pd
    summary = (synthetic_sweep / "summary.md").read_text()
    answer = summary.split("## The answer", 1)[1].split("\n## ", 1)[0]
    assert "Lossless verdicts of the 1 speculative cells: 1 exact" in answer or "1 speculative cell" in answer
    assert "Which alpha would pay (synthetic acceptance; never lossless" in answer
    assert "## Which alpha would pay: break-even per regime" in summary
    advice = pd.read_csv(synthetic_sweep / "advice.csv")
    assert len(advice) == 1  # one regime: the synthetic rows are no regimes of their own
    assert advice["alpha_star"].notna().all() and advice["real_alpha"].between(0, 1).all()  # beside the decision
    table = pd.read_csv(synthetic_sweep / "break_even.csv")
    assert len(table) == 1 and table["points"].iloc[0] == 3 and table["repeats"].iloc[0] == 2
    row = table.iloc[0]
    assert row["alpha_star"] == pytest.approx(theory.break_even_alpha(3, row["c"])) or math.isinf(row["alpha_star"])
    assert 0 <= row["real_alpha"] <= 1
    assert (synthetic_sweep / "break_even.png").is_file()


def test_a_run_without_the_axis_says_how_to_ask_for_it(noisy_pair, tmp_path):
    from specnative.report import break_even
    from specnative.report.summary import write_report
    from specnative.sweep import SweepConfig, run_sweep
    target, draft = noisy_pair
    cfg = SweepConfig(targets=[target], draft=draft, ctx_lens=[0], concurrencies=[1], ks=[2], n_predict=8,
                      warmup=0, repeats=1, max_repeats=1, threads=1, out_dir=tmp_path / "run", report=False)
    run_sweep(cfg)
    summary = write_report(tmp_path / "run").read_text()
    assert break_even.HOW_TO_ASK in summary and not (tmp_path / "run" / "break_even.csv").exists()


def test_the_closed_form_break_even_inverts_the_expected_tokens():
    for k, c in ((4, 1.3), (2, 0.2), (8, 3.0)):
        a = theory.break_even_alpha(k, c)
        assert theory.predicted_speedup(a, k, c) == pytest.approx(1.0, abs=1e-8)
    assert theory.break_even_alpha(4, 4.5) == math.inf  # even alpha 1 gives 5 < 5.5 tokens per round
    assert theory.break_even_alpha(4, -0.1) == 0.0
    reach = [1.0, 0.5, 0.25]
    a = theory.break_even_alpha(3, 0.6, reach)
    assert theory.predicted_speedup_lengths(a, reach, 0.6) == pytest.approx(1.0, abs=1e-8)


def test_sweep_and_serve_flags_refuse_bad_profiles(capsys):
    from specnative.cli import main
    for argv in (["sweep", "--synthetic-acceptance", "0.5,1.5"], ["serve", "--synthetic-acceptance", "rates:0.2/0.5"],
                 ["sweep", "-k", "4", "--synthetic-acceptance", "rates:0.9/0.8"]):
        with pytest.raises(SystemExit) as refused:
            main(argv)
        said = capsys.readouterr().err + str(refused.value.code)  # argparse prints; the flag checks raise
        assert "synthetic acceptance" in said, said


def test_the_llama_server_peer_gets_the_same_per_position_rates():
    import argparse
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from peerkit import serve_table
    from peerkit import server as srv
    a = argparse.Namespace(threads=1, n_batch=512, flash_attn="off", ngl=0)
    serve = {"drafter": "model", "k": 3, "max_concurrency": 2, "synthetic_acceptance": ["0.5"]}
    on = serve_table.replay_cmd({srv.NAME: "/opt/llama-server"}, {"target": "t.gguf", "draft": "d.gguf"}, serve, True,
                                1024, a)
    off = serve_table.replay_cmd({srv.NAME: "/opt/llama-server"}, {"target": "t.gguf", "draft": "d.gguf"}, serve, False,
                                 1024, a)
    assert on[on.index("--spec-synth-rates") + 1] == "0.5,0.25,0.125" and "--spec-synth-rates" not in off


def test_serve_replays_each_level_with_the_profiles_and_reports_alpha_star_per_rate(noisy_pair, tmp_path):
    from specnative.cli import main
    from specnative.record import schema
    target, draft = noisy_pair
    out = tmp_path / "serve"
    argv = ["serve", "-m", str(target), "-md", str(draft), "--request-rate", "inf", "--max-concurrency", "2",
            "--num-requests", "4", "-r", "2", "-n", "8", "-k", "3", "-t", "1", "--synthetic-acceptance", "0.5,0.9",
            "-o", str(out)]
    assert main(argv) == 0
    rows = schema.read_traces(out / "traces.csv")
    synth, real = schema.synthetic_rows(rows), schema.real_rows(rows)
    assert len(real) == 2 * 2 and len(synth) == 2 * 2  # seeds x (off, on) and seeds x profiles
    assert (synth["verdict"] == "synthetic").all() and synth["lossless_ok"].isna().all() and real["lossless_ok"].all()
    assert synth["cell_id"].str.contains("/synthetic=").all()
    for _, row in synth.iterrows():  # paired with the same trace's off run
        off = real[(real["seed"] == row["seed"]) & (real["spec_decode"] == "off")].iloc[0]
        assert row["tps_baseline"] == pytest.approx(off["tps"]) and row["trace_sha256"] == off["trace_sha256"]
    summary = (out / "summary.md").read_text()
    section = summary.split("## Which alpha would pay under load", 1)[1].split("\n## ", 1)[0]
    assert "| inf |" in section and "alpha*" in section


def test_the_break_even_pairs_a_synthetic_chain_with_the_real_chain_not_a_tree_of_that_budget(synthetic_sweep):
    """A draft tree whose node budget equals k is another proposal: it must not stand in for the
    drafter's own alpha beside a synthetic chain of k (it is shown beside it, named as a tree)."""
    import pandas as pd

    from specnative.analysis.break_even import break_even_table
    from specnative.record import schema
    from specnative.report import break_even

    frame = schema.read_traces(synthetic_sweep / "traces.csv")
    chain = schema.real_rows(frame)
    chain = chain[chain["spec_decode"] == "on"].iloc[0]
    tree = chain.copy()
    tree["draft_shape"], tree["token_accept_rate"], tree["speedup"] = "tree:topk=2,depth=2,budget=3", 1.0, 9.0
    tree["cell_id"] = f"{chain['cell_id']}|shape=tree:topk=2,depth=2,budget=3"
    with_tree = pd.concat([frame, tree.to_frame().T], ignore_index=True)  # the tree row last, as a sweep writes it
    row = break_even_table(with_tree).iloc[0]
    assert row["real_alpha"] == pytest.approx(float(chain["token_accept_rate"]))
    assert row["real_speedup"] == pytest.approx(float(chain["speedup"]))
    assert row["tree_shape"] == "tree:topk=2,depth=2,budget=3" and row["tree_alpha"] == 1.0
    text = break_even.needs_text(row)
    assert f"reaches {float(chain['token_accept_rate']):.2f} as a chain" in text and "as the tree" in text


def test_each_alpha_is_named_for_what_it_counts(synthetic_sweep):
    """The cells table's α is accepted / drafted; the break-even table's is the per-token alpha."""
    summary = (synthetic_sweep / "summary.md").read_text()
    cells = summary.split("## Cells", 1)[1].split("\n## ", 1)[0]
    assert "| α (accepted/drafted) |" in cells
    section = summary.split("## Which alpha would pay: break-even per regime", 1)[1].split("\n## ", 1)[0]
    assert "real alpha (per-token, chain)" in section


def test_a_synthetic_row_names_no_acceptance_rule(synthetic_sweep):
    """A synthetic row's drafts are kept by a keyed draw, whatever the run's rule: its rule column says
    so (it said `rejection` at T 0 in a run whose grid also held T > 0), and the break-even still
    pairs it with the real row, whose rule it reports."""
    import pandas as pd

    from specnative.record import schema
    frame = schema.read_traces(synthetic_sweep / "traces.csv")
    assert (schema.synthetic_rows(frame)["accept_rule"] == "synthetic").all()
    real = schema.real_rows(frame)
    table = pd.read_csv(synthetic_sweep / "break_even.csv")
    assert table["accept_rule"].tolist() == real[real["spec_decode"] == "on"]["accept_rule"].tolist()
    assert table["real_alpha"].notna().all()
