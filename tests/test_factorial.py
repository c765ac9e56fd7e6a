"""Do the levers add? The 2x2 of quantization x speculation and the log-linear model recover effects
planted in synthetic repeats: multiplicative (additive on the log scale) effects give an interaction
ratio of 1 inside its interval, a planted interaction is decided, and a missing or failed cell gives
no estimate instead of a number from voided rows."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specnative.analysis import factorial, tidy
from specnative.report import levers

REPEATS = 8


def noisy(value: float, rng, spread: float = 0.02, repeats: int = REPEATS) -> list[float]:
    return list(value * np.exp(rng.normal(0.0, spread, repeats)))


def cell_rows(bits: int, conc: int, tps_off: float, speedup: float, rng, verdict: str = "exact",
              repeats: int = REPEATS) -> list[dict]:
    """An off row and an on row of one cell whose repeats are noisy around tps_off and speedup."""
    off = noisy(tps_off, rng, repeats=repeats)
    ratios = noisy(speedup, rng, repeats=repeats)
    on = [o * r for o, r in zip(off, ratios)]
    join = lambda values: ";".join(f"{v:.6g}" for v in values)
    base = dict(quant_bits=bits, concurrency=conc, ctx_len=0, temperature=0.0, task="mixed", run_id="synthetic")
    return [{**base, "spec_decode": "off", "cell_id": f"q{bits}-c{conc}", "tps": tps_off, "tps_repeats": join(off),
             "e2e_tps_repeats": join([v * 0.9 for v in off]), "lossless_ok": True},
            {**base, "spec_decode": "on", "cell_id": f"q{bits}-c{conc}-k4", "k": 4, "drafter": "model",
             "tps": tps_off * speedup, "tps_repeats": join(on), "speedup_repeats": join(ratios),
             "e2e_tps_repeats": join([v * 0.9 for v in on]), "verdict": verdict,
             "lossless_ok": verdict != "fail"}]


def traces(speedups: dict, verdicts: dict | None = None, seed: int = 0, repeats: int = REPEATS) -> pd.DataFrame:
    """speedups[(bits, conc)]: speculation's speedup in that cell; 4-bit off runs 1.6x the 8-bit off."""
    rng = np.random.default_rng(seed)
    rows = []
    for (bits, conc), speedup in speedups.items():
        tps_off = (160.0 if bits == 4 else 100.0) * conc ** 0.5
        rows += cell_rows(bits, conc, tps_off, speedup, rng, (verdicts or {}).get((bits, conc), "exact"), repeats)
    return pd.DataFrame(rows)


def by_concurrency(tables) -> dict:
    return {int(t.regime["concurrency"]): t for t in tables}


def test_multiplicative_levers_add_within_the_interval():
    tidy_rows, tables, _ = factorial.analyse(traces({(4, 1): 1.5, (8, 1): 1.5, (4, 8): 0.8, (8, 8): 0.8}))
    assert len(tidy_rows) == 8 * REPEATS  # one row per cell and repeat
    for table in tables:
        iv = table.interaction
        assert iv.low < 1 < iv.high, table.regime
        assert table.reading == "add within noise"
        assert table.g_q.estimate == pytest.approx(1.6, rel=0.03)  # the planted 4-bit gain
        assert table.combined.estimate == pytest.approx(table.g_q.estimate * table.g_s.estimate, rel=0.03)


def test_a_planted_interaction_is_decided_where_it_was_planted_only():
    tables = by_concurrency(factorial.analyse(traces({(4, 1): 1.0, (8, 1): 2.0, (4, 8): 0.8, (8, 8): 0.8}))[1])
    assert tables[1].interaction.estimate == pytest.approx(0.5, rel=0.05)
    assert tables[1].interaction.high < 1 and tables[1].reading.startswith("do not add")
    assert tables[8].interaction.low < 1 < tables[8].interaction.high


def test_the_loglinear_model_finds_the_planted_interaction_term():
    planted = traces({(4, 1): 1.0, (8, 1): 2.0, (4, 8): 1.0, (8, 8): 2.0})
    tidy_rows = tidy.tidy_frame(planted)
    model = factorial.loglinear(tidy_rows, "tps")
    term = interaction(model, "quant_bits=8", "spec_method=model k=4")
    assert term["effect"] == pytest.approx(2.0, rel=0.05) and term["decided"]
    assert not interaction(model, "concurrency=8", "spec_method=model k=4")["decided"]  # nothing planted there
    assert interaction(model, "concurrency=8", "quant_bits=8")["effect"] == pytest.approx(1.0, abs=0.05)


def interaction(model: pd.DataFrame, a: str, b: str) -> pd.Series:
    """The model's row of the a x b term, in whichever order the formula wrote it."""
    return model[model["term"].isin([f"{a} x {b}", f"{b} x {a}"])].iloc[0]


@pytest.mark.parametrize("drop, reason", [("missing", "not measured"), ("fail", "judged fail")])
def test_a_missing_or_failed_cell_gives_no_estimate(drop, reason):
    speedups = {(4, 1): 1.0, (8, 1): 2.0, (4, 8): 0.8, (8, 8): 0.8}
    verdicts = {}
    if drop == "missing":
        frame = traces(speedups)
        frame = frame[~((frame["quant_bits"] == 8) & (frame["concurrency"] == 1) & (frame["spec_decode"] == "on"))]
    else:
        verdicts[(8, 1)] = "fail"
        frame = traces(speedups, verdicts)
    tables = by_concurrency(factorial.analyse(frame)[1])
    assert tables[1].interaction is None and reason in tables[1].reading
    assert tables[8].interaction is not None  # the other regime is still estimated
    if drop == "fail":  # the failed cell's repeats stay out of the model too
        tidy_rows = tidy.tidy_frame(frame)
        model_rows = tidy_rows[tidy_rows["verdict"] != "fail"]
        assert len(model_rows) == len(tidy_rows) - REPEATS


def test_the_section_states_the_answer_and_the_table():
    frame = traces({(4, 1): 1.0, (8, 1): 2.0, (4, 8): 0.8, (8, 8): 0.8})
    tidy_rows, tables, models = factorial.analyse(frame)
    text = levers.section_md(tables, models, tidy_rows)
    assert "In 1 of 2 regimes" in text and "do not add" in text and "interaction = combined / (G_q G_s)" in text
    figure = levers.plot_interactions(tidy_rows, "synthetic")
    assert len(figure.axes) == 2  # speedup against quant_bits and against concurrency


def test_one_bit_width_has_no_two_by_two():
    tidy_rows, tables, models = factorial.analyse(traces({(8, 1): 1.5, (8, 8): 0.8}))
    assert tables == []
    assert "One bit width only" in levers.section_md(tables, models, tidy_rows)


def test_terms_no_measured_cell_supports_are_left_out_not_reported_as_decided():
    # an interrupted grid: concurrency 8 measured at 4 bits only, so quant_bits=8 x concurrency=8 has no cell
    frame = traces({(4, 1): 1.0, (8, 1): 2.0, (4, 8): 0.8})
    model = factorial.loglinear(tidy.tidy_frame(frame), "tps")
    assert not model["term"].str.contains("concurrency=8 x quant_bits=8|quant_bits=8 x concurrency=8").any()
    assert not ((model["low"] == model["high"]) & model["decided"]).any()  # no zero-width "decided" term
    assert interaction(model, "quant_bits=8", "spec_method=model k=4")["decided"]  # what was measured still is


PLANTED = {(4, 1): 1.0, (8, 1): 2.0, (4, 8): 1.0, (8, 8): 2.0}  # speculation gains 2x at 8 bits only


def test_cells_measured_once_decide_no_term_and_the_section_says_why():
    # one repeat per cell: 8 observations, 7 terms; the one residual degree of freedom is the untested
    # three-way interaction, not a measured spread, so no interval may decide
    frame = traces(PLANTED, repeats=1)
    tidy_rows, tables, models = factorial.analyse(frame)
    assert models and all(m.empty for m in models.values())
    assert all("measured once" in m.attrs["why"] for m in models.values())
    text = levers.section_md(tables, models, tidy_rows)
    assert "nothing decided: every cell was measured once" in text
    assert "0 add within noise" in text and "2 regime(s) are undecided" in text  # not "add within noise"


def test_a_saturated_single_width_grid_keeps_the_section_and_says_why():
    tidy_rows, tables, models = factorial.analyse(traces({(8, 1): 1.5, (8, 8): 0.8}, repeats=1))
    text = levers.section_md(tables, models, tidy_rows)
    assert text is not None and "nothing decided" in text and "measured once" in text


def test_only_replicated_cells_enter_the_model():
    replicated = traces(PLANTED)
    once = traces({(4, 2): 3.0, (8, 2): 0.3}, seed=1, repeats=1)  # unreplicated cells with a wild interaction
    model = factorial.loglinear(tidy.tidy_frame(pd.concat([replicated, once], ignore_index=True)), "tps")
    assert not model["term"].str.contains("concurrency=2").any()  # the single repeats never entered
    assert interaction(model, "quant_bits=8", "spec_method=model k=4")["decided"]


@pytest.mark.parametrize("traces_per_level", [1, 3])
def test_serve_levels_decide_only_from_several_traces(traces_per_level):
    rng = np.random.default_rng(0)
    rows = [{"request_rate": rate, "spec_decode": spec, "prefix_cache": prefix, "verdict": "exact",
             "output_throughput": 100.0 * rate * (2.0 if spec == "on" and prefix == "off" else 1.0)
             * float(np.exp(rng.normal(0.0, 0.02)))}
            for rate in (1.0, 4.0) for spec in ("off", "on") for prefix in ("off", "on")
            for _ in range(traces_per_level)]
    factors = ["request_rate", "spec_decode", "prefix_cache"]
    model = factorial.loglinear(pd.DataFrame(rows), "output_throughput", factors, unit=factors)
    if traces_per_level == 1:
        assert model.empty and "measured once" in model.attrs["why"]
    else:
        assert interaction(model, "spec_decode=on", "prefix_cache=off")["decided"]
