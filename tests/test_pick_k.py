"""Which k: tau at k' predicted from the accepted-length histogram at k_max equals what a run at k'
measures (greedy, tiny noisy pair), the speedup prediction lands within the timers' own spread,
and the cost curve is a well-formed, validated measurement."""
from __future__ import annotations

import math
import os
import statistics

import numpy as np
import pytest
from conftest import PROMPTS, assert_lossless_verdict, assert_real_figure
from synthetic_traces import assert_tables_well_formed

from specnative.analysis import pick_k
from specnative.report import drafter_sections, figures
from specnative.report import summary as report_summary

K_MAX = 5  # (k'+1) divides 6 for k' = 1, 2, 5: the exact cases; 3 and 4 straddle
# stop_at_eos off: a segment that ends on an accepted EOG emits m tokens, not m + 1, and the
# tiny models' EOG position is an accident of their weights. The n_predict tail needs no care:
# a round capped at n_predict - len - 1 drafts ends its segment at the sequence's end, in the run
# at k_max and at k' alike (pick_k's docstring), so every count below includes it.
RUN = dict(n_predict=48, stop_at_eos=False)


def spec_run(engine, prompts, k):
    return engine.generate(prompts, spec=True, k=k, **RUN)


def simulate_rounds(agree: list, k: int) -> tuple[list, int, int]:
    """The engine's greedy rounds over one sequence's fixed token stream (csrc engine: a round drafts
    min(k, n_predict - emitted - 1) tokens, accepts the leading ones the target agrees with, and
    emits them plus one). agree[j]: whether the draft's token for stream position j is the target's
    -- a property of the stream, whatever k. Returns (accept_len_hist, tokens emitted, rounds)."""
    n_predict, emitted, hist, rounds = len(agree), 1, [0] * (k + 1), 0  # token 0 is prefill's
    while emitted < n_predict:
        budget = min(k, n_predict - emitted - 1)
        m = 0
        while m < budget and agree[emitted + m]:
            m += 1
        hist[m] += 1
        rounds += 1
        emitted += m + 1
    return hist, emitted - 1, rounds


def test_tau_at_k_prime_is_exact_for_greedy():
    """Streams with every mix of matches and mismatches, run at k_max and at each k': the
    prediction from the k_max histogram counts the tokens and rounds of the run at k' exactly where
    (k'+1) | (k_max+1), and bounds tau from below elsewhere. (On the engine the stream is the same at
    every k up to batch-shape near-ties: the next test.)"""
    rng = np.random.default_rng(3)
    streams = [list(rng.random(48) < alpha) for alpha in (0.2, 0.5, 0.8, 0.95) for _ in range(25)]
    straddled = 0
    for agree in streams:
        hist = simulate_rounds(agree, K_MAX)[0]
        straddled += hist[K_MAX] > 0
        for k in range(1, K_MAX + 1):
            _, tokens_k, rounds_k = simulate_rounds(agree, k)
            tokens, rounds = pick_k.tokens_and_rounds(hist, k)
            lower, point = pick_k.tau_bounds(hist, k)
            assert tokens == tokens_k == len(agree) - 1
            if pick_k.exact_for(K_MAX, k):
                assert rounds == rounds_k and lower == point == pytest.approx(tokens_k / rounds_k, rel=1e-12)
            else:
                assert lower <= tokens_k / rounds_k + 1e-12
    assert straddled > 10  # fully accepted segments, which the exact/bound distinction is about


def test_runs_at_every_k_emit_the_stream_the_prediction_cuts(noisy_engine):
    """The premise on the engine: greedy runs at k = 1..k_max emit the baseline's stream (lossless
    verdict: up to batch-shape near-ties, which the verify's k+1 rows make differ with k), and the
    prediction counts the tokens they emit."""
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    base = noisy_engine.generate(prompts, **RUN)
    at_max = spec_run(noisy_engine, prompts, K_MAX)
    hist = at_max.totals["accept_len_hist"]
    assert 0 < hist[K_MAX] < hist.sum(), "the pair must both accept fully and reject for this test to bite"
    for k in range(1, K_MAX + 1):
        run = at_max if k == K_MAX else spec_run(noisy_engine, prompts, k)
        assert_lossless_verdict(noisy_engine, prompts, base.tokens, run.tokens, k=k)  # conftest
        assert pick_k.tokens_and_rounds(hist, k)[0] == run.totals["emitted"]


def test_tau_is_not_min_of_accepted_length():
    """One round at k_max that accepted 5 becomes two rounds at k' = 2 (3 + 3 tokens)."""
    hist = [0, 0, 0, 0, 0, 1]
    assert pick_k.tokens_and_rounds(hist, 2) == (6.0, 2.0)
    assert pick_k.tau_at(hist, 2) == 3.0


def pooled(runs):
    ms = sum(r.steady["ms"] for r in runs)
    steps = sum(r.steady["steps"] for r in runs)
    tokens = sum(r.steady["tokens"] for r in runs)
    return {"iteration_ms": ms / steps, "tps": tokens / (ms / 1000.0), "tau": tokens / (steps * len(runs[0].tokens))}


def relative_range(values):
    return (max(values) - min(values)) / statistics.median(values)


# A timing comparison: on a shared, loaded machine the cost curve's medians spike 10-1000x and no
# stated tolerance holds, so it runs only when asked (a quiet machine): SPECNATIVE_TIMING_TESTS=1.
@pytest.mark.skipif(os.environ.get("SPECNATIVE_TIMING_TESTS") != "1",
                    reason="timing comparison; set SPECNATIVE_TIMING_TESTS=1 on a quiet machine")
def test_speedup_prediction_within_the_timers_spread(noisy_engine):
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    k_check, repeats = 2, 5
    runs = {"off": [], K_MAX: [], k_check: []}
    for _ in range(repeats + 1):  # the first round of runs warms up and is dropped
        for kind in runs:
            spec = kind != "off"
            runs[kind].append(noisy_engine.generate(prompts, spec=spec, k=kind if spec else 4, **RUN))
    runs = {kind: rs[1:] for kind, rs in runs.items()}
    curve = noisy_engine._core.cost_curve(prompts, K_MAX, 5)
    off, at_max, check = pooled(runs["off"]), pooled(runs[K_MAX]), pooled(runs[k_check])
    hist = sum(r.totals["accept_len_hist"] for r in runs[K_MAX])
    resample = sum(r.times["resample"] for r in runs[K_MAX]) / sum(r.steps for r in runs[K_MAX])
    prediction = pick_k.predict(hist, K_MAX, curve["verify_ms"], curve["draft_ms_per_pos"], resample,
                                at_max["iteration_ms"], off["iteration_ms"], at_max["tau"])
    # At k_max the prediction is the measurement by construction.
    assert prediction.speedup[-1] == pytest.approx(at_max["tps"] / off["tps"], rel=1e-9)
    measured = check["tps"] / off["tps"]
    predicted = prediction.speedup[k_check - 1]
    # Tolerance: the model's own error plus the timers' noise. The model leaves out per-round
    # costs that do not scale with k (the draft catching up on 1-2 emitted tokens, launching each
    # decode) and approximates the steady window's tau; on this 2-core CPU that put k'=1..4 within
    # 5-27 % of the measurement (one run: +7, +20, +25, +27 %), hence 30 %. Noise: how far T_round
    # moved between repeats at both k, summed and tripled.
    spread = lambda kind: relative_range([r.steady["iteration_ms"] for r in runs[kind]])
    tolerance = 0.30 + 3 * (spread(K_MAX) + spread(k_check))
    assert abs(predicted / measured - 1) <= tolerance, (predicted, measured, tolerance)


def test_recommends_no_k_when_nothing_pays():
    hist = [90, 8, 2]  # the draft is almost always wrong
    verify = [1.0, 1.1, 1.2]
    p = pick_k.predict(hist, 2, verify, 0.5, 0.05, round_ms=2.35, step_ms=1.0, steady_tau=pick_k.tau_at(hist, 2))
    assert p.recommended_k == 0 and p.recommended_speedup < 1
    good = pick_k.predict([0, 0, 100], 2, verify, 0.05, 0.0, round_ms=1.3, step_ms=1.0, steady_tau=3.0)
    assert good.recommended_k == 2 and good.recommended_speedup == pytest.approx(3.0 / 1.3)


def test_predict_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="k_max\\+1"):
        pick_k.predict([1, 2], 2, [1, 1, 1], 0.1, 0.0, 1.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="cost curve"):
        pick_k.predict([1, 2, 3], 2, [1, 1], 0.1, 0.0, 1.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="at least 1"):
        pick_k.tau_at([1, 2, 3], 0)


def test_cost_curve_shape_validation_and_state(noisy_engine):
    prompts = noisy_engine.to_token_prompts(PROMPTS)
    before = spec_run(noisy_engine, prompts, 3)
    curve = noisy_engine._core.cost_curve(prompts, 4, 2)
    assert len(curve["verify_ms"]) == 5 and curve["n_seq"] == len(prompts) and curve["repeats"] == 2
    assert all(math.isfinite(v) and v > 0 for v in curve["verify_ms"]) and curve["draft_ms_per_pos"] > 0
    after = spec_run(noisy_engine, prompts, 3)  # the curve's rolled-back cache does not leak
    assert [list(t) for t in after.tokens] == [list(t) for t in before.tokens]
    with pytest.raises(ValueError, match="k_max must be at least 1"):
        noisy_engine._core.cost_curve(prompts, 0, 2)
    with pytest.raises(ValueError, match="exceed n_batch"):
        noisy_engine._core.cost_curve(prompts, 200, 2)
    with pytest.raises(ValueError, match="no prompts"):
        noisy_engine._core.cost_curve([], 2, 2)
    with pytest.raises(ValueError, match="repeats"):
        noisy_engine._core.cost_curve(prompts, 2, 0)


def _on_row(k, recommended, concurrency=1, check=None):
    return {"spec_decode": "on", "quant_bits": 8, "ctx_len": 0, "concurrency": concurrency, "k": k,
            "temperature": 0.0, "accept_rule": "greedy", "task": "mixed", "drafter": "model", "tps": 10.0,
            "seed": 0, "cell_id": f"c{concurrency}-k{k}", "speedup": 1.1, "recommended_k": recommended,
            "recommended_speedup": 1.3 if recommended else 0.8, "predicted_speedup_by_k": "0.9;1.3;1.1"[: 4 * k - 1],
            "verify_ms_by_len": ";".join(["1.0"] * (k + 1)), "draft_ms_per_pos": 0.2,
            "check_k": check, "check_k_speedup": 1.25 if check else None}


def test_k_advice_uses_the_largest_k_and_says_none(tmp_path):
    import pandas as pd

    from specnative.analysis import advisor

    frame = pd.DataFrame([_on_row(2, 2), _on_row(3, 2, check=2), _on_row(3, 0, concurrency=4)])
    advice = advisor.k_advice(frame)
    assert list(advice["concurrency"]) == [1, 4]
    assert list(advice["k_max"]) == [3, 3] and list(advice["recommend"]) == ["2", "none"]
    assert advice["check_speedup"].iloc[0] == 1.25
    text = drafter_sections.which_k_md(advisor.load_traces(frame))
    assert "**none**" in text and "2: 1.25" in text
    assert_tables_well_formed(text)
    two_keys = frame.assign(ctx_len=[0, 0, 2048])  # regimes differing in two keys: one label column
    assert_tables_well_formed(drafter_sections.which_k_md(advisor.load_traces(two_keys)))
    figures.save(drafter_sections.plot_which_k(advisor.load_traces(frame)), tmp_path / "which_k")
    assert_real_figure(tmp_path / "which_k.png")


def test_monotone_curve_drops_load_spikes_only():
    assert list(pick_k.monotone_curve([0.7, 0.5, 0.55, 700.0, 1.0])) == [0.5, 0.5, 0.55, 1.0, 1.0]
    assert list(pick_k.monotone_curve([1.0, 2.0, 3.0])) == [1.0, 2.0, 3.0]


def test_advice_table_shows_the_recommended_k(tmp_path, no_figure_files):
    """summary.md's main advice table carries each regime's recommended k, its predicted speedup
    and the --check-k measurement; n/a where no prediction applies (a p_min cell)."""
    from synthetic_traces import cell, off_row, on_row, write_run

    k_cols = lambda rec, check: dict(recommended_k=rec, recommended_speedup=1.62, predicted_speedup_by_k="1.3;1.62;1.5;1.4",
                                     verify_ms_by_len="1;1;1;1;1", draft_ms_per_pos=0.2, check_k=check,
                                     check_k_speedup=1.55 if check else None, draft_p_min=0.0)
    rows = cell(conc=1, **k_cols(2, 2)) + cell(conc=4, **k_cols(0, None))
    rows += [off_row(conc=1, tps=42.0, cell_id="q4-c0-n1-T0.0-off|pmin=0.75"),
             on_row(conc=1, speedup=1.8, tps_off=42.0, draft_p_min=0.75, mean_draft_len=2.2,
                    cell_id="q4-c0-n1-T0.0|pmin=0.75|k4")]
    run = write_run(tmp_path / "run", rows)
    summary = report_summary.write_artifacts(run)["summary.md"].read_text()
    advice = summary.split("## Advice per regime")[1].split("\n## ")[0]
    header = next(line for line in advice.splitlines() if line.startswith("| "))
    assert "recommended k" in header and "p_min" not in header.split("decision")[1]
    lines = [line for line in advice.splitlines() if line.startswith("| ") and line != header]
    assert any("**2** (pred 1.62; checked k=2: 1.55)" in line for line in lines)
    assert any("none (no k pays)" in line for line in lines)
    assert any("p_min=0.75" in line and "| n/a |" in line for line in lines)


def test_p_min_cell_pairs_with_its_own_baseline_and_is_compared_with_fixed_k(tmp_path, no_figure_files):
    import pandas as pd
    from synthetic_traces import cell, off_row, on_row, write_run

    from specnative.analysis import advisor

    rows = cell(conc=1, speedup=1.5, mean_draft_len=4.0) + [
        off_row(conc=1, tps=50.0, cell_id="base|pmin=0.75"),  # another baseline beside the p_min cell
        on_row(conc=1, speedup=1.8, tps_off=50.0, draft_p_min=0.75, mean_draft_len=2.2, cell_id="base|pmin=0.75|k4")]
    traces = advisor.load_traces(pd.DataFrame(rows))
    assert sorted(traces["draft_p_min"]) == [0.0, 0.0, 0.75, 0.75]  # off rows and older rows filled in
    cells = advisor.pair_cells(traces)
    assert len(cells) == 2
    assert sorted(cells["tps_off"]) == [40.0, 50.0]  # each on row with its own baseline
    advice = advisor.p_min_advice(traces)
    assert len(advice) == 1
    r = advice.iloc[0]
    assert r["fixed_speedup"] == 1.5 and r["p_min_speedup"] == 1.8 and r["best_p_min"] == 0.75
    assert r["fixed_draft_len"] == 4.0 and r["p_min_draft_len"] == 2.2
    assert (r["recommend"], r["decision"]) == ("p_min=0.75", "on")  # both pay, the stop rule surely more
    # the surest gain, not the highest estimate: a noisy p_min cell loses to a steady fixed k
    noisy = rows[:2] + [rows[2], dict(rows[3], tps_min=50.0 * 0.4, tps_max=50.0 * 3.2)]
    assert advisor.p_min_advice(advisor.load_traces(pd.DataFrame(noisy))).iloc[0]["recommend"] == "fixed k"
    run = write_run(tmp_path / "run", rows)
    summary = report_summary.write_artifacts(run)["summary.md"].read_text()
    assert "## Draft stop rule (p_min) against fixed k" in summary
    assert_tables_well_formed(summary)
    # regimes that differ in two keys (concurrency and ctx_len): one column per key in every table
    wider = rows + cell(conc=4, ctx=2048, speedup=1.2, mean_draft_len=4.0) + [
        off_row(conc=4, ctx=2048, tps=50.0, cell_id="b4|pmin=0.75"),
        on_row(conc=4, ctx=2048, speedup=1.1, tps_off=50.0, draft_p_min=0.75, mean_draft_len=2.0,
               cell_id="b4|pmin=0.75|k4")]
    wide = report_summary.write_artifacts(write_run(tmp_path / "wide", wider))["summary.md"].read_text()
    assert_tables_well_formed(wide)
    # only fixed-k cells (older traces): no such section, and no p_min column anywhere
    old = write_run(tmp_path / "old", cell(conc=1))
    assert "p_min" not in report_summary.write_artifacts(old)["summary.md"].read_text()
