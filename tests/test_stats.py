"""stats.py on synthetic timings: intervals cover what they claim, the stopping rule stops early
on clear data and runs to the maximum on ambiguous data, warm-up ends when timings settle,
outliers are flagged with a reason. No wall clock anywhere."""
import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.stats import t as student_t

from specnative import sweep
from specnative.analysis import stats
from specnative.analysis.stats import ABOVE, BELOW, MAX, NARROW, Interval, Policy
from specnative.sweep import measure as sweep_measure
from specnative.sweep import rows as sweep_rows

# --------------------------------------------------------------------------------------------
# Intervals

def test_geometric_interval_by_hand():
    # logs 0, 1, 2: mean 1, sd 1, three values -> exp(1 -+ t(0.975, 2) / sqrt(3))
    iv = stats.geometric_interval([1.0, math.e, math.e ** 2], level=0.95)
    half = student_t.ppf(0.975, 2) / math.sqrt(3)
    assert iv.estimate == pytest.approx(math.e)
    assert (iv.low, iv.high) == (pytest.approx(math.exp(1 - half)), pytest.approx(math.exp(1 + half)))
    assert (iv.level, iv.n) == (0.95, 3)


def test_interval_orders_and_widens_with_level():
    values = [10.0, 10.4, 9.7, 10.1, 9.9]
    narrow, wide = stats.geometric_interval(values, 0.80), stats.geometric_interval(values, 0.99)
    assert wide.low < narrow.low < narrow.estimate < narrow.high < wide.high
    assert narrow.estimate == wide.estimate


def test_one_value_has_no_interval_and_bad_values_raise():
    iv = stats.geometric_interval([5.0])
    assert iv.estimate == pytest.approx(5.0) and math.isnan(iv.low) and math.isnan(iv.high)
    assert math.isnan(iv.rel_width) and not iv.above(1.0) and not iv.below(10.0)
    for bad, message in [([], "no values"), ([1.0, 0.0], r"positive and finite, got \[0.0\]"),
                         ([1.0, -2.0], r"positive and finite, got \[-2.0\]"),
                         ([1.0, math.nan], r"positive and finite, got \[nan\]")]:
        with pytest.raises(ValueError, match=message):
            stats.geometric_interval(bad)


@pytest.mark.parametrize("n", [2, 3, 6])
def test_speedup_interval_covers_at_its_level(n):
    """Simulated paired runs (log-normal noise, true speedup 1.3): the 95 % interval holds the
    truth in about 95 % of 2000 cells, already at 2 and 3 repeats."""
    rng = np.random.default_rng(n)
    hits = 0
    for _ in range(2000):
        off = 40.0 * np.exp(rng.normal(0, 0.05, n))
        on = 1.3 * off * np.exp(rng.normal(0, 0.03, n))
        iv = stats.speedup_interval(on, off, 0.95)
        hits += iv.low <= 1.3 <= iv.high
    assert 0.93 <= hits / 2000 <= 0.97


def test_pairing_cancels_what_hits_both_runs():
    """The machine's load swings tps by 2x between repeats, but each on run is 1.5x its off run
    to within 1 %: the paired interval is tight around 1.5."""
    off = [40.0, 20.0, 35.0, 22.0]
    on = [1.5 * x * f for x, f in zip(off, (1.01, 0.99, 1.0, 1.005))]
    iv = stats.speedup_interval(on, off)
    assert iv.low < 1.5 < iv.high and iv.rel_width < 0.03
    unpaired = stats.geometric_interval(on)  # the same runs without their partner: far wider
    assert unpaired.rel_width > 10 * iv.rel_width


def test_paired_runs_must_pair():
    with pytest.raises(ValueError, match="paired"):
        stats.speedup_interval([1.0, 2.0], [1.0])


# --------------------------------------------------------------------------------------------
# The stopping rule

@pytest.mark.parametrize("low, high, reason", [(1.05, 1.4, ABOVE), (0.6, 0.97, BELOW),
                                               (0.99, 1.02, NARROW), (0.9, 1.1, None),
                                               (math.nan, math.nan, None)])
def test_stop_reason(low, high, reason):
    assert stats.stop_reason(Interval(1.0, low, high, 0.95, 3), Policy(rel_width=0.05)) == reason


def synthetic_pairs(ratios, off=40.0):
    """run() for repeat_until_decided: the i-th call returns a pair of tps at ratio ratios[i]."""
    it = iter(ratios)
    return lambda: (next(it) * off, off)


def decide_speedup(policy):
    return lambda pairs: stats.stop_reason(
        stats.speedup_interval([p[0] for p in pairs], [p[1] for p in pairs], policy.level), policy)


def test_clear_data_stops_at_the_minimum():
    policy = Policy(min_repeats=2, max_repeats=10)
    pairs, reason = stats.repeat_until_decided(synthetic_pairs([0.50, 0.51, 0.49] + [0.5] * 10),
                                               decide_speedup(policy), policy)
    assert (len(pairs), reason) == (2, BELOW)


def test_never_decides_before_the_minimum():
    policy = Policy(min_repeats=4, max_repeats=10)
    asked = []
    decide = lambda pairs: asked.append(len(pairs)) or decide_speedup(policy)(pairs)
    pairs, reason = stats.repeat_until_decided(synthetic_pairs([2.0] * 10), decide, policy)
    assert (len(pairs), reason, asked) == (4, ABOVE, [4])


def test_ambiguous_data_runs_to_the_maximum():
    policy = Policy(min_repeats=2, max_repeats=7, rel_width=0.01)
    seen = []
    pairs, reason = stats.repeat_until_decided(
        synthetic_pairs(itertools.cycle([0.9, 1.1])), decide_speedup(policy), policy,
        on_repeat=seen.append)
    assert (len(pairs), reason, seen) == (7, MAX, [1, 2, 3, 4, 5, 6, 7])


def test_noisy_data_needs_more_repeats_than_clear_data():
    """Ratio about 1.1 with a few % noise: undecided at 2 repeats, decided (above 1) at 4."""
    ratios = [1.06, 1.14, 1.08, 1.12, 1.10, 1.09, 1.11, 1.10, 1.10, 1.10]
    policy = Policy(min_repeats=2, max_repeats=10, rel_width=0.0)
    pairs, reason = stats.repeat_until_decided(synthetic_pairs(ratios), decide_speedup(policy), policy)
    assert (reason, len(pairs)) == (ABOVE, 4)


def test_the_first_run_from_the_warm_up_counts():
    policy = Policy(min_repeats=2, max_repeats=5)
    pairs, _ = stats.repeat_until_decided(synthetic_pairs([0.5] * 5), decide_speedup(policy), policy,
                                          first=(20.0, 40.0))
    assert pairs[0] == (20.0, 40.0) and len(pairs) == 2


def test_combined_reason_waits_for_every_interval():
    assert stats.combined_reason([ABOVE, None]) is None
    assert stats.combined_reason([ABOVE, ABOVE]) == ABOVE
    assert stats.combined_reason([BELOW, NARROW, BELOW]) == "below-break-even,narrow"


def test_policy_rejects_nonsense():
    for bad, message in [(dict(min_repeats=0), "need 1 <= min_repeats <= max_repeats, got 0 and 10"),
                         (dict(min_repeats=5, max_repeats=4), "got 5 and 4"),
                         (dict(level=1.0), "level must be between 0 and 1, got 1.0"),
                         (dict(rel_width=-0.1), "rel_width and settle_tol must be >= 0"),
                         (dict(max_warmup=-1), "max_warmup must be >= 0, got -1")]:
        with pytest.raises(ValueError, match=message):
            Policy(**bad)


# --------------------------------------------------------------------------------------------
# Warm-up

def warm_runs(timings):
    it = iter(timings)
    return lambda: next(it)


@pytest.mark.parametrize("timings, max_warmup, expected", [
    ([50, 80, 99, 100, 101], 5, (100, 3, True)),   # 99 -> 100 is the first agreeing pair
    ([50, 80, 99, 100, 101], 2, (99, 2, False)),   # gave up: the cap, and says so
    ([100, 101, 100], 3, (101, 1, True)),          # a warm machine costs one discarded run
    ([100, 130, 101], 0, (None, 0, True)),         # no warm-up asked for
])
def test_warm_up_ends_when_timings_settle(timings, max_warmup, expected):
    policy = Policy(max_warmup=max_warmup, settle_tol=0.10)
    assert stats.warm_up(warm_runs(timings), lambda x: [x], policy) == expected


def test_warm_up_starts_from_a_run_made_already():
    """The sweep's lossless check runs the same pair: it serves as the first discarded run, so a
    warm machine makes no extra run before the timed ones."""
    calls = []
    run = lambda: calls.append(1) or 101
    assert stats.warm_up(run, lambda x: [x], Policy(max_warmup=3, settle_tol=0.10), previous=100) == (101, 1, True)
    assert len(calls) == 1


def test_settled_needs_every_timing_to_agree():
    assert stats.settled([100.0, 50.0], [105.0, 52.0], 0.10)
    assert not stats.settled([100.0, 50.0], [105.0, 60.0], 0.10)
    with pytest.raises(ValueError, match="the same, non-empty set of timings"):
        stats.settled([1.0], [1.0, 2.0], 0.1)


# --------------------------------------------------------------------------------------------
# Outliers

def test_a_hiccup_is_flagged_with_its_reason():
    (outlier,) = stats.flag_outliers([100, 101, 99, 100, 62], what="tps")
    assert (outlier.index, outlier.value) == (4, 62)
    assert outlier.score < -3.5
    assert outlier.reason.startswith("repeat 5: tps 62") and "below the median 100" in outlier.reason


def test_no_flags_on_clean_or_short_data():
    assert stats.flag_outliers([100, 103, 97, 101, 99]) == []
    assert stats.flag_outliers([100, 10]) == []           # two values: which one is off?
    # most runs identical: the MAD is 0, but 0.5 % is no hiccup (scale floored at 1 %); 10 % is
    assert stats.flag_outliers([100, 100, 100, 100.5]) == []
    assert [o.index for o in stats.flag_outliers([100, 100, 100, 110])] == [3]


# --------------------------------------------------------------------------------------------
# The sweep's timing loop on a fake engine (no model, no clock)

class FakeEngine:
    """generate() returns runs whose tps follow a script per kind: a cold first run, then the
    steady rate times the noise factors given."""

    def __init__(self, off_tps, on_ratio, noise):
        self.off_tps, self.on_ratio, self.noise, self.calls = off_tps, on_ratio, iter(noise), []

    def generate(self, prompts, spec=False, **kwargs):
        self.calls.append("on" if spec else "off")
        cold = 0.5 if len(self.calls) <= 2 else 1.0  # the first pair runs cold
        tps = self.off_tps * cold * (self.on_ratio * next(self.noise) if spec else 1.0)
        # the sweep's rate is the steady one; the end-to-end one (tokens over the whole call) rides along
        return SimpleNamespace(tps=tps, steady={"tps": tps}, tokens=[[0] * 10], times={"total": 100.0})


def fake_config(**overrides):
    values = dict(targets=[], draft=None, ks=[4], repeats=2, max_repeats=8, warmup=3, warmup_tol=0.1)
    values.update(overrides)
    return sweep.SweepConfig(**values)


def test_sweep_timing_loop_stops_early_on_a_clear_cell():
    engine = FakeEngine(100.0, 0.6, itertools.cycle([1.0, 1.01, 0.99]))
    runs, measuring = sweep_measure.timed_runs(engine, [[1]], fake_config(), {}, lambda msg: None)
    # cold pair discarded, the next agreed with the one after it: warm-up 2, then 2 repeats
    assert measuring["warmup_used"] == 2 and measuring["warmup_settled"]
    assert (measuring["repeats_used"], measuring["stop_reason"]) == (2, BELOW)
    assert engine.calls == ["off", "on"] * 4  # every on run right beside its off run
    row = sweep_rows.interval_columns(runs, 4, measuring)
    assert row["speedup_ci_low"] < 0.6 < row["speedup_ci_high"] < 1.0
    assert row["tps_ci_low"] < 60.0 * 1.005 < row["tps_ci_high"]
    assert (row["n_outliers"], row["outlier_note"], row["ci_level"]) == (0, None, 0.95)


def test_sweep_timing_loop_runs_to_the_maximum_and_flags_a_hiccup():
    noise = itertools.chain([1.0, 1.0, 1.0], itertools.cycle([0.92, 1.08, 1.0, 0.96, 1.04, 0.5]))
    engine = FakeEngine(100.0, 1.0, noise)
    runs, measuring = sweep_measure.timed_runs(engine, [[1]], fake_config(ci_width=0.01), {}, lambda msg: None)
    assert (measuring["repeats_used"], measuring["stop_reason"]) == (8, MAX)
    on = sweep_rows.interval_columns(runs, 4, measuring)
    assert on["speedup_ci_low"] < 1.0 < on["speedup_ci_high"]
    assert on["n_outliers"] == 1 and "speedup 0.5" in on["outlier_note"]
    off = sweep_rows.interval_columns(runs, "off", measuring)
    assert "speedup_ci_low" not in off and off["n_outliers"] == 0


def test_sweep_timing_loop_survives_a_run_without_a_rate():
    """A run that decoded nothing (tps 0) leaves no interval: the cell runs to the maximum and
    its row has empty bounds instead of the sweep failing."""
    engine = FakeEngine(100.0, 0.6, itertools.chain([1.0] * 3, [0.0], itertools.repeat(1.0)))
    runs, measuring = sweep_measure.timed_runs(engine, [[1]], fake_config(max_repeats=4), {}, lambda msg: None)
    assert (measuring["repeats_used"], measuring["stop_reason"]) == (4, MAX)
    row = sweep_rows.interval_columns(runs, 4, measuring)
    assert math.isnan(row["speedup_ci_low"]) and math.isnan(row["tps_ci_high"]) and row["n_outliers"] == 0
