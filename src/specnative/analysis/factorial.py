"""Do the levers add? Quantization, batching, prefix caching and speculation as one factorial.

Each lever attacks another bottleneck (decode bandwidth, compute utilisation, repeated prefill,
serial steps) but they share one device, so "quantize + batch + speculate" is not the product of
the separate gains. Two views, both from the repeats a sweep measured (traces.csv's tps_repeats,
speedup_repeats, e2e_tps_repeats; tidy.py lays them out one row per repeat):

* the 2x2 of quant_bits x spec_decode per regime (every other factor fixed): the gain of the lower
  bit width with speculation off, G_q = tps(low, off) / tps(high, off); speculation's gain at the
  higher width, G_s = tps(high, on) / tps(high, off); the combined gain tps(low, on) / tps(high, off);
  and the interaction ratio combined / (G_q G_s) = speedup(low) / speedup(high), each with a 95 %
  Welch interval on the log scale (stats.welch_ratio; speedups are paired within their cell). An
  interval that excludes 1 decides that the levers do not add there.
* a log-linear model of tokens/s over every factor the run varies, with all two-way interactions
  (statsmodels OLS on the logs of the repeats): which levers interact, in which direction, by how
  much, as multiplicative effects with intervals.
A cell judged `fail` gives no number: its regime gets no estimate, and its repeats stay out of the
model.
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass

import pandas as pd

from specnative.analysis.stats import Interval, LogEstimate, geometric_interval, welch_ratio
from specnative.analysis.tidy import FACTORS, tidy_frame

LEVEL = 0.95
# the regime of a 2x2: every factor but the two it crosses
REGIME_FACTORS = tuple(f for f in FACTORS if f not in ("quant_bits", "spec_decode"))


@dataclass
class TwoByTwo:
    regime: dict
    low_bits: int
    high_bits: int
    g_q: Interval | None = None          # tps(low, off) / tps(high, off)
    g_s: Interval | None = None          # tps(high, on) / tps(high, off)
    combined: Interval | None = None     # tps(low, on) / tps(high, off)
    interaction: Interval | None = None  # combined / (g_q * g_s) = speedup(low) / speedup(high)
    missing: str = ""                    # why there is no estimate

    @property
    def reading(self) -> str:
        if self.missing:
            return f"no estimate: {self.missing}"
        iv = self.interaction
        if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
            return "undecided (too few repeats for an interval)"
        if iv.high < 1:
            return "do not add: speculation gains less at the lower bit width"
        if iv.low > 1:
            return "do not add: speculation gains more at the lower bit width"
        return "add within noise"


def log_of(values: list[float]) -> LogEstimate | None:
    return LogEstimate.of_values([v for v in values if v > 0], "repeats", LEVEL)


def ratio(numerator: list[float], denominator: list[float]) -> Interval | None:
    """numerator / denominator of two independent cells' repeats (Welch on the logs)."""
    a, b = log_of(denominator), log_of(numerator)
    return welch_ratio(a, b, LEVEL) if a and b else None


def two_by_two(tidy: pd.DataFrame) -> list[TwoByTwo]:
    """One 2x2 per regime that has both bit widths (the lowest and the highest of the run)."""
    bits = sorted(tidy["quant_bits"].dropna().unique())
    if len(bits) < 2:
        return []
    low, high = int(bits[0]), int(bits[-1])
    out = []
    for keys, group in tidy.groupby(list(REGIME_FACTORS), dropna=False, sort=True):
        regime = dict(zip(REGIME_FACTORS, keys if isinstance(keys, tuple) else (keys,)))
        if regime.get("spec_method") == "off":
            continue  # the off rows join the regimes of their on rows below
        out.append(one_two_by_two(regime, low, high, tidy))
    return [t for t in out if t is not None]


def cell_repeats(tidy: pd.DataFrame, regime: dict, bits: int, spec: str) -> pd.DataFrame:
    """The repeats of one cell of a 2x2: off rows match the regime but for the speculation method."""
    chosen = tidy[(tidy["quant_bits"] == bits) & (tidy["spec_decode"] == spec)]
    for factor, value in regime.items():
        if factor == "spec_method" and spec == "off":
            continue
        chosen = chosen[(chosen[factor] == value) | (chosen[factor].isna() & pd.isna(value))]
    return chosen


def one_two_by_two(regime: dict, low: int, high: int, tidy: pd.DataFrame) -> TwoByTwo | None:
    cells = {(b, s): cell_repeats(tidy, regime, b, s) for b in (low, high) for s in ("off", "on")}
    if all(c.empty for c in cells.values()):
        return None
    result = TwoByTwo(regime, low, high)
    absent = [f"{b}-bit spec {s}" for (b, s), c in cells.items() if c.empty]
    failed = [f"{b}-bit spec {s}" for (b, s), c in cells.items() if (c["verdict"] == "fail").any()]
    if absent or failed:
        result.missing = ("; ".join([f"{', '.join(absent)} not measured"] * bool(absent)
                                    + [f"{', '.join(failed)} judged fail"] * bool(failed)))
        return result
    tps = {key: c["tps"].tolist() for key, c in cells.items()}
    result.g_q = ratio(tps[(low, "off")], tps[(high, "off")])
    result.combined = ratio(tps[(low, "on")], tps[(high, "off")])
    speedup = {b: log_of(cells[(b, "on")]["speedup"].dropna().tolist()) for b in (low, high)}
    if not (speedup[low] and speedup[high] and result.g_q and result.combined):
        result.missing = "a cell without per-repeat rates (a run written before they were recorded)"
        return result
    result.g_s = geometric_interval(cells[(high, "on")]["speedup"].dropna().tolist(), LEVEL)
    result.interaction = welch_ratio(speedup[high], speedup[low], LEVEL)
    return result


def varied_factors(tidy: pd.DataFrame) -> list[str]:
    return [f for f in FACTORS if f in tidy and tidy[f].astype(str).nunique() > 1]


# The columns that name one measured cell of the closed loop: its repeats are its replicates.
CELL_COLUMNS = ("run_id", "cell_id", "spec_method")
EMPTY_MODEL = ["term", "effect", "low", "high", "p_value", "decided", "interaction"]


def no_model(why: str) -> pd.DataFrame:
    """An empty table of terms that says why nothing could be decided (attrs["why"])."""
    frame = pd.DataFrame(columns=EMPTY_MODEL)
    frame.attrs["why"] = why
    return frame


def replicated(data: pd.DataFrame, unit: list[str]) -> pd.DataFrame:
    """The observations of the units (cells) measured at least twice. A unit measured once has no
    spread of its own: fitted anyway, the model's residual is then only the interactions it leaves
    out (a saturated or unreplicated grid), and an interval on it decides nothing."""
    keys = [data[c].astype(str) for c in unit]
    size = data.groupby(keys, dropna=False)["y"].transform("size")
    return data[size >= 2]


def loglinear(tidy: pd.DataFrame, metric: str = "tps", factors: list[str] | None = None,
              unit: list[str] | None = None) -> pd.DataFrame:
    """log(metric) ~ (every varied factor)**2, OLS over the repeats of lossless cells; one row per
    term: the multiplicative effect exp(coef) with its 95 % interval and p-value. Factors are
    categorical with a reference level (reference_level). `factors`: which columns (default the
    closed loop's, spec_method carrying speculation); those that do not vary are left out.
    `unit`: the columns naming one measured cell, whose observations are replicates (default the
    closed loop's cell: CELL_COLUMNS, its repeats; serve passes its levels' factors: the traces).
    Only replicated cells enter the fit, so every interval stands on a measured spread; when none
    is replicated, or the fit leaves no residual, the table is empty and attrs["why"] says why."""
    import statsmodels.api as sm  # a dependency; imported here: it is slow to import
    import statsmodels.formula.api as smf

    data = tidy[(tidy["verdict"] != "fail") & (tidy[metric] > 0)].copy()
    if factors is None:
        factors = [f for f in varied_factors(data) if f != "spec_decode"]  # spec_method carries spec on/off
    else:
        factors = [f for f in factors if f in data and data[f].astype(str).nunique() > 1]
    if not factors:
        return no_model("no factor varies among the cells with a number")
    data["y"] = data[metric].map(math.log)
    unit = list(unit) if unit is not None else [c for c in CELL_COLUMNS if c in data]
    data = replicated(data, unit or factors)
    if data.empty:
        return no_model("every cell was measured once (one repeat, or one trace per level), so none has a "
                        "spread of its own to judge an effect against")
    for f in factors:
        data[f] = data[f].astype(str)
    factors = [f for f in factors if data[f].nunique() > 1]
    if not factors:
        return no_model("the cells measured more than once differ in no factor")
    formula = "y ~ (" + " + ".join(categorical(f, data) for f in factors) + ")" + ("**2" if len(factors) > 1 else "")
    model = smf.ols(formula, data=data)
    names, exog = supported_columns(model.exog_names, model.exog)
    with warnings.catch_warnings():  # a saturated model (no residual) is refused just below, not warned of
        warnings.simplefilter("ignore", RuntimeWarning)
        fit = sm.OLS(model.endog, exog).fit()
    if fit.df_resid <= 0:  # cannot happen with replicated cells; kept as the guard of the intervals
        return no_model("the model has as many terms as observations: no spread left to give any interval")
    intervals = fit.conf_int(alpha=1 - LEVEL)
    rows = []
    for i, term in enumerate(names):
        if term == "Intercept" or not math.isfinite(fit.bse[i]):
            continue
        low, high = math.exp(intervals[i, 0]), math.exp(intervals[i, 1])
        rows.append({"term": readable_term(term), "effect": math.exp(fit.params[i]), "low": low, "high": high,
                     "p_value": float(fit.pvalues[i]), "decided": high < 1 or low > 1,
                     "interaction": ":" in term})
    return pd.DataFrame(rows, columns=EMPTY_MODEL)


def supported_columns(names: list, exog) -> tuple[list, object]:
    """The design's columns that the measured cells can estimate, in order: a column is kept where it
    adds to the rank of those before it. A grid with cells left unmeasured (an interrupted run) has
    interaction columns of zeros or copies of others; fitted anyway, they come out as effects of
    exactly 1 with a zero-width interval, which would read as decided."""
    import numpy as np

    kept = []
    for i in range(exog.shape[1]):
        if np.linalg.matrix_rank(exog[:, kept + [i]]) > len(kept):
            kept.append(i)
    return [names[i] for i in kept], exog[:, kept]


# The level every effect is measured against: speculation off, the prefix cache on (the usual
# setting), otherwise the first level in sorted order.
PREFERRED_REFERENCE = {"spec_method": "off", "spec_decode": "off", "prefix_cache": "on"}


def level_order(text: str) -> tuple:
    """Numbers in numeric order (4 before 16), then text."""
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def reference_level(factor: str, levels) -> str:
    levels = sorted({str(v) for v in levels}, key=level_order)
    preferred = PREFERRED_REFERENCE.get(factor)
    return preferred if preferred in levels else levels[0]


def categorical(factor: str, data: pd.DataFrame) -> str:
    reference = reference_level(factor, data[factor])
    return f"C({factor}, Treatment(reference={reference!r}))"


TERM = re.compile(r"C\((\w+)[^\[]*\)\[T\.(.*)\]$")


def readable_term(term: str) -> str:
    """C(quant_bits, Treatment(reference='4'))[T.8]:C(spec_method, ...)[T.model k=4]
    -> quant_bits=8 x spec_method=model k=4."""
    parts = []
    for part in term.split(":"):
        match = TERM.match(part)
        parts.append(f"{match.group(1)}={match.group(2)}" if match else part)
    return " x ".join(parts)


def reference_levels(tidy: pd.DataFrame) -> dict:
    return {f: reference_level(f, tidy[f]) for f in varied_factors(tidy) if f != "spec_decode"}


def analyse(traces: pd.DataFrame) -> tuple[pd.DataFrame, list[TwoByTwo], dict]:
    """The tidy repeats, the 2x2s, and the log-linear tables by metric (decode and end-to-end)."""
    tidy = tidy_frame(traces)
    if tidy.empty:
        return tidy, [], {}
    models = {metric: loglinear(tidy, metric) for metric in ("tps", "e2e_tps")
              if tidy[metric].notna().any() and varied_factors(tidy)}
    return tidy, two_by_two(tidy), models
