"""The decision flow (docs/advice.md): every rule fires on a table crafted for it and stays silent where
it should, and the decision follows measured values only."""
import dataclasses

import pytest
from synthetic_traces import cell, off_row, on_row, write_run

from specnative.analysis import advisor
from specnative.analysis.advisor import MORE, OFF, ON, Thresholds, advise, load_traces, verdicts_frame


def judge(rows, tmp_path, **thresholds):
    """{(quant, ctx, conc): Verdict} for rows written to a real traces.csv."""
    write_run(tmp_path, rows, provenance=None)
    verdicts = advise(tmp_path / "traces.csv", Thresholds(**thresholds))
    return {(v.regime["quant_bits"], v.regime["ctx_len"], v.regime["concurrency"]): v
            for v in verdicts}


def fired(verdict):
    return {f.rule for f in verdict.findings}


def only(rows, tmp_path, **thresholds):
    (verdict,) = judge(rows, tmp_path, **thresholds).values()
    return verdict


def test_clear_speedup_is_on_and_nothing_fires(tmp_path):
    v = only(cell(speedup=1.5), tmp_path)
    assert (v.decision, v.rule, fired(v)) == (ON, "pays", set())
    assert v.speedup == pytest.approx(1.5)
    # the band is slowest spec run / fastest baseline run .. fastest / slowest
    assert v.speedup_lo == pytest.approx(1.5 * 0.98 / 1.02)
    assert v.speedup_hi == pytest.approx(1.5 * 1.02 / 0.98)


@pytest.mark.parametrize("lossless, rule, decision", [(False, "lossless", OFF),
                                                      (None, "lossless-unchecked", MORE)])
def test_lossless_failure_is_off_whatever_the_speed(tmp_path, lossless, rule, decision):
    v = only(cell(speedup=3.0, lossless=lossless), tmp_path)
    assert (v.decision, v.rule) == (decision, rule)
    if rule == "lossless":
        assert "17" in v.reason  # the first divergence of the fixture


def test_missing_baseline_asks_for_a_measurement(tmp_path):
    v = only([dict(on_row(), speedup=None, tps_baseline=None)], tmp_path)
    assert (v.decision, v.rule) == (MORE, "unmeasured")


@pytest.mark.parametrize("repeats, fires", [(1, True), (2, False), (3, False), (5, False)])
def test_few_repeats(tmp_path, repeats, fires):
    v = only([off_row(), on_row(speedup=1.5, repeats=repeats)], tmp_path)
    assert ("few-repeats" in fired(v)) == fires
    assert v.decision == (MORE if fires else ON)


def test_few_repeats_counts_the_repeats_used_by_an_adaptive_sweep(tmp_path):
    """--repeats is the minimum; what ran is repeats_used (1: no interval could be formed)."""
    v = only([off_row(), on_row(speedup=1.5, repeats=3, repeats_used=1)], tmp_path)
    assert (v.decision, v.rule) == (MORE, "few-repeats")


def with_ci(low, high, **on):
    """A regime whose on row carries a 95 % speedup interval (as an adaptive sweep writes it)."""
    return [off_row(), on_row(speedup_ci_low=low, speedup_ci_high=high, ci_level=0.95, repeats_used=6,
                              stop_reason="max-repeats", **on)]


@pytest.mark.parametrize("speedup, low, high, decision, rule", [
    (1.30, 1.05, 1.60, ON, "pays"),                    # lower bound above 1: on, however wide
    (0.80, 0.50, 0.95, OFF, "below-break-even"),       # upper bound below 1: off
    (1.20, 0.98, 1.45, MORE, "noisy"),                 # contains 1: measure more
    (0.90, 0.85, 1.01, MORE, "noisy"),
    (0.99, 1.01, 1.10, ON, "pays"),                    # the interval decides, not the point
    (1.01, 0.90, 0.99, OFF, "below-break-even"),
])
def test_decision_follows_the_interval(tmp_path, speedup, low, high, decision, rule):
    v = only(with_ci(low, high, speedup=speedup), tmp_path)
    assert (v.decision, v.rule) == (decision, rule)
    assert (v.speedup_lo, v.speedup_hi, v.interval) == (pytest.approx(low), pytest.approx(high), "95% CI")
    if decision == MORE:  # the interval is shown with the request to measure more
        assert f"{low:.2f}–{high:.2f}" in v.reason and "measure more" in v.reason
        assert "max-repeats" in v.reason


def test_a_wide_interval_on_one_side_is_not_noisy(tmp_path):
    """The range rule's 'a run was far off' does not apply: the interval already accounts for it."""
    v = only(with_ci(0.20, 0.90, speedup=0.65, c_draft=0.05), tmp_path)
    assert (v.decision, v.rule) == (OFF, "below-break-even") and "noisy" not in fired(v)


def test_interval_appears_in_the_verdicts_frame(tmp_path):
    write_run(tmp_path, with_ci(1.1, 1.4, speedup=1.2), provenance=None)
    frame = verdicts_frame(advise(tmp_path))
    assert list(frame[["speedup_lo", "speedup_hi", "interval"]].iloc[0]) == [1.1, 1.4, "95% CI"]


@pytest.mark.parametrize("speedup, spread, fires", [(1.05, 0.10, True), (0.95, 0.10, True),
                                                    (1.05, 0.01, False), (1.5, 0.10, False)])
def test_noisy_when_the_spread_straddles_break_even(tmp_path, speedup, spread, fires):
    rows = [off_row(spread=spread), on_row(speedup=speedup, spread=spread)]
    v = only(rows, tmp_path)
    assert ("noisy" in fired(v)) == fires
    if fires:
        assert (v.decision, v.rule) == (MORE, "noisy")
        assert v.speedup_lo < 1.0 < v.speedup_hi


def test_noisy_when_one_run_was_far_off(tmp_path):
    """A spread that stays below 1 but spans most of the speedup: c and the step times are means
    over the same runs, so nothing derived from them can be trusted either."""
    rows = [off_row(), on_row(speedup=0.65, tps_min=40 * 0.03, c_draft=1.9)]
    v = only(rows, tmp_path / "a")
    assert (v.decision, v.rule) == (MORE, "noisy") and "far off" in v.reason
    assert "noisy" not in fired(only(cell(speedup=0.65, spread=0.1), tmp_path / "b"))


@pytest.mark.parametrize("speedup, fires", [(0.8, True), (1.2, False)])
def test_below_break_even(tmp_path, speedup, fires):
    v = only(cell(speedup=speedup), tmp_path)
    assert ("below-break-even" in fired(v)) == fires
    assert (v.decision, v.rule) == ((OFF, "below-break-even") if fires else (ON, "pays"))


def test_low_alpha_explains_an_off_and_warns_on_an_on(tmp_path):
    off = only(cell(speedup=0.8, draft_accept_rate=0.3), tmp_path / "a")
    assert (off.decision, off.rule) == (OFF, "low-alpha")
    assert "0.30 < 0.5" in off.reason
    on = only(cell(speedup=1.3, draft_accept_rate=0.3), tmp_path / "b")
    assert on.decision == ON and "low-alpha" in fired(on)  # measured speedup wins
    silent = only(cell(speedup=0.8, draft_accept_rate=0.6), tmp_path / "c")
    assert "low-alpha" not in fired(silent)


def test_heavy_draft(tmp_path):
    heavy = only(cell(speedup=0.7, c_draft=0.95, draft_accept_rate=0.3), tmp_path / "a")
    # both fire; the heavy draft is named first: a lighter draft is the fix
    assert {"heavy-draft", "low-alpha"} <= fired(heavy)
    assert (heavy.decision, heavy.rule) == (OFF, "heavy-draft")
    assert heavy.findings[[f.rule for f in heavy.findings].index("heavy-draft")].values[
        "c_draft"] == pytest.approx(0.95)
    light = only(cell(speedup=0.7, c_draft=0.1), tmp_path / "b")
    assert "heavy-draft" not in fired(light)


def series(speedups, ctx=0, **on):
    return [r for conc, s in speedups.items() for r in cell(ctx=ctx, conc=conc, speedup=s, **on)]


def test_saturation_fires_where_speedup_fell_below_one(tmp_path):
    verdicts = judge(series({1: 1.6, 4: 1.2, 8: 0.8}), tmp_path)
    assert "saturation" not in fired(verdicts[(4, 0, 1)]) | fired(verdicts[(4, 0, 4)])
    high = verdicts[(4, 0, 8)]
    assert (high.decision, high.rule) == (OFF, "saturation")
    assert high.findings[-1].values["best_concurrency"] == 1


@pytest.mark.parametrize("speedups", [{1: 0.8, 4: 0.8, 8: 0.8},   # never fell
                                      {1: 0.7, 4: 0.8, 8: 0.9},   # rising
                                      {1: 1.6, 4: 1.4, 8: 1.2}])  # fell, still pays
def test_saturation_silent(tmp_path, speedups):
    verdicts = judge(series(speedups), tmp_path)
    assert not any("saturation" in fired(v) for v in verdicts.values())


def test_saturation_ignores_a_lossy_reference(tmp_path):
    rows = cell(conc=1, speedup=1.6, lossless=False) + cell(conc=8, speedup=0.8)
    verdicts = judge(rows, tmp_path)
    assert "saturation" not in fired(verdicts[(4, 0, 8)])


def test_saturation_ignores_a_noisy_reference(tmp_path):
    rows = [off_row(), on_row(speedup=1.6, tps_max=40 * 1.6 * 3)] + cell(conc=8, speedup=0.8)
    verdicts = judge(rows, tmp_path)
    assert verdicts[(4, 0, 1)].rule == "noisy"
    assert "saturation" not in fired(verdicts[(4, 0, 8)])


def test_long_context(tmp_path):
    rows = cell(ctx=0, speedup=1.4, c=0.5) + cell(ctx=32768, speedup=0.9, c=1.0)
    verdicts = judge(rows, tmp_path / "a")
    long = verdicts[(4, 32768, 1)]
    assert (long.decision, long.rule) == (OFF, "long-context")
    assert long.findings[-1].values["rise"] == pytest.approx(2.0 / 1.5 - 1)
    assert "long-context" not in fired(verdicts[(4, 0, 1)])
    mild = cell(ctx=0, speedup=1.4, c=0.5) + cell(ctx=32768, speedup=1.3, c=0.55)
    assert not any("long-context" in fired(v) for v in judge(mild, tmp_path / "b").values())


def test_thresholds_are_parameters(tmp_path):
    rows = cell(speedup=1.3, draft_accept_rate=0.6, c_draft=0.3)
    assert fired(only(rows, tmp_path / "a")) == set()
    strict = only(rows, tmp_path / "b", min_alpha=0.7, heavy_draft_c=0.25, break_even=1.4)
    assert {"low-alpha", "heavy-draft", "below-break-even"} <= fired(strict)
    assert strict.decision == OFF
    names = [name for name, _, _ in advisor.threshold_fields()]
    assert names == [f.name for f in dataclasses.fields(Thresholds)]
    assert Thresholds().min_alpha == 0.5  # the design's value


def test_decides_on_measured_values_only(tmp_path):
    """The closed-form prediction in the CSV never decides: a wild one changes nothing."""
    honest = only(cell(speedup=0.8, predicted_speedup=0.8), tmp_path / "a")
    wild = only(cell(speedup=0.8, predicted_speedup=5.0), tmp_path / "b")
    assert (honest.decision, honest.rule) == (wild.decision, wild.rule) == (OFF, "below-break-even")


def test_speedup_filled_from_tps_when_the_column_is_empty(tmp_path):
    v = only([off_row(tps=40.0), dict(on_row(), speedup=None, tps_baseline=None, tps=50.0)], tmp_path)
    assert v.speedup == pytest.approx(50.0 / 40.0)


def test_resumed_cell_keeps_its_last_row(tmp_path):
    rows = cell(speedup=0.7) + [on_row(speedup=1.5)]  # same cell_id, measured again
    write_run(tmp_path, rows, provenance=None)
    assert len(load_traces(tmp_path)) == 2
    (v,) = advise(tmp_path)
    assert v.speedup == pytest.approx(1.5)


def test_verdicts_frame(tmp_path):
    frame = verdicts_frame(judge(series({1: 1.6, 4: 1.2, 8: 0.8}), tmp_path).values())
    assert list(frame["decision"]) == [ON, ON, OFF]
    assert set(advisor.REGIME_KEYS) <= set(frame.columns)
    assert "slower than the target alone" in frame["also"].iloc[2]


@pytest.mark.parametrize("margin, near_tie", [(0.01, True), (2.5, False)])
def test_lossless_failure_names_a_numeric_near_tie(tmp_path, margin, near_tie):
    rows = [off_row(), on_row(speedup=1.5, lossless_ok=False, first_divergence=4, divergence_margin=margin)]
    v = only(rows, tmp_path)
    assert (v.decision, v.rule) == (OFF, "lossless")
    assert ("near-tie" in v.reason) == near_tie
