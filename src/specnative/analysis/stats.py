"""How sure a measured number is: intervals, adaptive repeats, settled warm-up, outliers.

The one place these are computed (the sweep and bench/ use them alike). Everything here works on
plain lists of numbers or on callables that return one measurement, so it can be tested on
synthetic timings and imported from anywhere:

    from specnative.analysis import stats
    iv = stats.speedup_interval(on=[52.0, 51.0, 53.5], off=[40.0, 39.5, 40.8])  # paired runs
    iv.estimate, iv.low, iv.high                  # 1.30, 1.28, 1.33 (95 %)
    stats.stop_reason(iv, stats.Policy())         # 'above-break-even': measured enough
    stats.flag_outliers([100, 101, 99, 62])       # [Outlier(index=3, ...)]

Why a Student t interval on log ratios and not a bootstrap: timings are positive and skewed and
a speedup is a ratio, so logs make noise symmetric and on/off comparisons additive. On the few
repeats a sweep can afford (2-10), a percentile bootstrap covers far less than its stated level
(simulated with 3 % log-normal noise: 52 % at 2 repeats, 75 % at 3, 89 % at 4, where t gives
95 %), while t covers its level at every n, and a one-run hiccup widens it (more repeats) rather
than narrowing it. See bench/results/adaptive-repeats-tiny.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

# Why a cell stopped repeating (the traces.csv stop_reason column).
ABOVE, BELOW, NARROW, MAX = "above-break-even", "below-break-even", "narrow", "max-repeats"


@dataclass(frozen=True)
class Interval:
    """A point estimate and its two-sided confidence interval at `level`, from n values.
    low/high are NaN when n < 2 (one value says nothing about its spread)."""

    estimate: float
    low: float
    high: float
    level: float
    n: int

    @property
    def rel_width(self) -> float:
        """Full width relative to the estimate (0.05: the interval spans 5 % of the value)."""
        if not (self.estimate > 0) or not math.isfinite(self.high - self.low):
            return math.nan
        return (self.high - self.low) / self.estimate

    def above(self, value: float) -> bool:
        return self.low > value  # False while the bound is NaN

    def below(self, value: float) -> bool:
        return self.high < value


@dataclass(frozen=True)
class Policy:
    """When to stop measuring. The sweep's flags map onto these one to one."""

    min_repeats: int = 2        # --repeats: timed runs before the first decision (2: one interval)
    max_repeats: int = 10       # --max-repeats: give up deciding after this many
    level: float = 0.95         # --ci-level
    rel_width: float = 0.05     # --ci-width: an interval this narrow is decided even around 1.0
    break_even: float = 1.0     # speedup 1: spec on exactly as fast as off
    max_warmup: int = 3         # --warmup: most discarded runs before timing starts
    settle_tol: float = 0.10    # --warmup-tol: two runs this close (relative) mean warmed up
    outlier_mads: float = 3.5   # modified z-score above which a run is flagged (Iglewicz-Hoaglin)

    def __post_init__(self):
        problems = []
        if self.min_repeats < 1 or self.max_repeats < self.min_repeats:
            problems.append(f"need 1 <= min_repeats <= max_repeats, got {self.min_repeats} and "
                            f"{self.max_repeats}")
        if not 0 < self.level < 1:
            problems.append(f"level must be between 0 and 1, got {self.level}")
        if not (self.rel_width >= 0 and self.settle_tol >= 0 and self.outlier_mads > 0):
            problems.append("rel_width and settle_tol must be >= 0 and outlier_mads > 0")
        if self.max_warmup < 0:
            problems.append(f"max_warmup must be >= 0, got {self.max_warmup}")
        if problems:
            raise ValueError("; ".join(problems))


# --------------------------------------------------------------------------------------------
# Intervals

def _positive(values, what: str) -> list[float]:
    values = [float(v) for v in values]
    bad = [v for v in values if not (v > 0 and math.isfinite(v))]
    if bad:
        raise ValueError(f"{what} must be positive and finite, got {bad[:3]}")
    return values


def t_quantile(level: float, dof: int) -> float:
    """The two-sided Student t quantile of a `level` interval with `dof` degrees of freedom."""
    from scipy.stats import t  # scipy is a dependency; imported here to keep `import` light
    return float(t.ppf(0.5 + level / 2.0, dof))


def geometric_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Geometric mean of positive values (rates, times, ratios) with a Student t interval on
    their logs: exact for log-normal noise, and symmetric in the ratio sense."""
    values = _positive(values, "values")
    if not values:
        raise ValueError("no values")
    logs = [math.log(v) for v in values]
    n, mean = len(logs), math.fsum(logs) / len(logs)
    if n < 2:
        return Interval(math.exp(mean), math.nan, math.nan, level, n)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(level, n - 1) * sd / math.sqrt(n)
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), level, n)


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """num_i / den_i of runs measured side by side (repeat i of spec on over repeat i of off):
    what the machine did to both in that moment cancels."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired runs differ in number: {len(numerators)} vs {len(denominators)}")
    nums, dens = _positive(numerators, "numerators"), _positive(denominators, "denominators")
    return [a / b for a, b in zip(nums, dens)]


def speedup_interval(on: Sequence[float], off: Sequence[float], level: float = 0.95) -> Interval:
    """Speedup tps_on / tps_off from paired repeats (on[i] and off[i] measured together):
    geometric mean of the paired ratios with its t interval."""
    return geometric_interval(paired_ratios(on, off), level)


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float], level: float = 0.95) -> Interval:
    """A ratio of sums, sum(a) / sum(d) (alpha = accepted / drafted pooled over cells), with a
    Student t interval that treats each (a_i, d_i) pair as one sample: the linearised variance of a
    ratio estimator, se = sqrt(n * sum((a_i - r d_i)^2) / (n - 1)) / sum(d). Rounds inside a cell
    are correlated; cells (prompts) are the independent samples. Kept within [0, 1] where every
    a_i <= d_i (a proportion), at >= 0 where every value is."""
    a, d = [float(v) for v in numerators], [float(v) for v in denominators]
    if len(a) != len(d):
        raise ValueError(f"numerators and denominators differ in number: {len(a)} vs {len(d)}")
    total = math.fsum(d)
    if not a or not total > 0:
        return Interval(math.nan, math.nan, math.nan, level, len(a))
    ratio, n = math.fsum(a) / total, len(a)
    if n < 2:
        return Interval(ratio, math.nan, math.nan, level, n)
    spread = math.fsum((x - ratio * y) ** 2 for x, y in zip(a, d)) / (n - 1)
    half = t_quantile(level, n - 1) * math.sqrt(n * spread) / total
    low, high = ratio - half, ratio + half
    if all(x >= 0 for x in a + d):
        low = max(low, 0.0)
        if all(x <= y for x, y in zip(a, d)):
            high = min(high, 1.0)
    return Interval(ratio, low, high, level, n)


# --------------------------------------------------------------------------------------------
# Stopping and warm-up

def stop_reason(interval: Interval, policy: Policy) -> str | None:
    """Why this interval is enough to stop (ABOVE / BELOW break-even, or NARROW), else None."""
    if interval.above(policy.break_even):
        return ABOVE
    if interval.below(policy.break_even):
        return BELOW
    if interval.rel_width <= policy.rel_width:  # NaN (no interval yet) compares False
        return NARROW
    return None


def settled(previous: Sequence[float], current: Sequence[float], tolerance: float) -> bool:
    """Whether two runs' timings (one number per thing measured, e.g. off and on tps) all agree
    within `tolerance` relative to the smaller one."""
    if len(previous) != len(current) or not current:
        raise ValueError("settled() needs the same, non-empty set of timings from both runs")
    return all(abs(a - b) <= tolerance * min(abs(a), abs(b)) for a, b in zip(previous, current))


def warm_up(run: Callable[[], object], timings: Callable[[object], Sequence[float]],
            policy: Policy, previous=None) -> tuple[object | None, int, bool]:
    """Runs until two consecutive runs agree within policy.settle_tol, discarding at most
    policy.max_warmup runs. The second run of the agreeing pair is already in the steady state:
    it is returned as the first timed run rather than thrown away (so a warm machine costs one
    discarded run, like a fixed warm-up of 1). `previous`: a run made already (the sweep's
    lossless check), which then serves as the first discarded one.

    Returns (first timed run or None when max_warmup is 0, runs discarded, whether they settled)."""
    if policy.max_warmup == 0:
        return None, 0, True
    previous, discarded = (run() if previous is None else previous), 0
    while True:
        current = run()
        discarded += 1  # `previous` is discarded
        if settled(timings(previous), timings(current), policy.settle_tol):
            return current, discarded, True
        if discarded >= policy.max_warmup:
            return current, discarded, False
        previous = current


def repeat_until_decided(run: Callable[[], object], decide: Callable[[list], str | None],
                         policy: Policy, first=None, on_repeat: Callable[[int], None] = lambda n: None
                         ) -> tuple[list, str]:
    """Timed runs (starting with `first` when given) until `decide(runs)` names a stop reason,
    tried from policy.min_repeats runs on, or policy.max_repeats runs were made (MAX).
    on_repeat(n) is called before the n-th run (progress display)."""
    runs = [] if first is None else [first]
    while True:
        if len(runs) >= policy.min_repeats:
            reason = decide(runs)
            if reason is not None:
                return runs, reason
        if len(runs) >= policy.max_repeats:
            return runs, MAX
        on_repeat(len(runs) + 1)
        runs.append(run())


def combined_reason(reasons: Sequence[str | None]) -> str | None:
    """One stop reason for several intervals measured in the same runs (e.g. several k): None
    until every one has a reason; then the reasons, distinct, in order."""
    if not reasons or any(r is None for r in reasons):
        return None
    return ",".join(dict.fromkeys(reasons))


# --------------------------------------------------------------------------------------------
# Outliers

@dataclass(frozen=True)
class Outlier:
    index: int      # position in the list (repeat index - 1)
    value: float
    score: float    # modified z-score: 0.6745 (value - median) / MAD
    reason: str


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def flag_outliers(values: Sequence[float], threshold: float = Policy.outlier_mads,
                  min_rel_scale: float = 0.01, what: str = "value") -> list[Outlier]:
    """Values far outside the rest: modified z-score |0.6745 (x - median) / MAD| > threshold
    (Iglewicz and Hoaglin's rule; robust, so one hiccup cannot hide itself by inflating the
    spread the way it inflates a standard deviation). The MAD is floored at min_rel_scale of the
    median: when most runs agree to the microsecond, a 1 % deviation is no hiccup. Needs 3
    values (with 2 there is no telling which one is off). Outliers are reported, not removed."""
    values = [float(v) for v in values]
    if len(values) < 3:
        return []
    median = _median(values)
    mad = _median([abs(v - median) for v in values])
    scale = max(mad, min_rel_scale * abs(median))
    if scale <= 0:
        return []
    found = []
    for i, v in enumerate(values):
        score = 0.6745 * (v - median) / scale
        if abs(score) > threshold:
            side = "above" if score > 0 else "below"
            found.append(Outlier(i, v, score, (
                f"repeat {i + 1}: {what} {v:.4g} is {abs(score):.1f} robust SDs {side} the median "
                f"{median:.4g} ({(v / median - 1) * 100 if median else math.nan:+.0f} %)")))
    return found


@dataclass(frozen=True)
class LogEstimate:
    """A positive quantity as the mean of its logs, the variance of that mean and the repeats n."""
    mean: float
    var: float      # NaN: one repeat, no spread known
    n: int
    source: str     # where the spread came from (the repeats themselves, a recorded interval, ...)

    @classmethod
    def of_interval(cls, interval: Interval, source: str) -> LogEstimate | None:
        """Undoes a t interval on logs: se = (ln high - ln low) / (2 t_{n-1})."""
        low, high, n = interval.low, interval.high, interval.n
        if n >= 2 and 0 < low <= high < math.inf:
            se = (math.log(high) - math.log(low)) / (2 * t_quantile(interval.level, n - 1))
            return cls((math.log(low) + math.log(high)) / 2, se * se, n, source)
        if interval.estimate > 0:
            return cls(math.log(interval.estimate), math.nan, max(n, 1), source)
        return None

    @classmethod
    def of_values(cls, values: list, source: str, level: float = 0.95) -> LogEstimate | None:
        values = [v for v in values if v == v]
        if not values or min(values) <= 0:
            return None
        return cls.of_interval(geometric_interval(values, level), source)


# --- The interval of a ratio of two runs' estimates, and what it decides -----------------------------
def welch_ratio(a: LogEstimate, b: LogEstimate, level: float = 0.95) -> Interval:
    """B / A with a Welch t interval on the log scale (unequal variances, Welch-Satterthwaite
    degrees of freedom): the two runs' repeats are independent samples of different sizes."""
    estimate = math.exp(b.mean - a.mean)
    var = a.var + b.var
    if not math.isfinite(var):
        return Interval(estimate, math.nan, math.nan, level, a.n + b.n)
    if var == 0:
        return Interval(estimate, estimate, estimate, level, a.n + b.n)
    dof = var ** 2 / sum(v ** 2 / (n - 1) for v, n in ((a.var, a.n), (b.var, b.n)) if v > 0)
    half = t_quantile(level, dof) * math.sqrt(var)
    return Interval(estimate, math.exp(b.mean - a.mean - half), math.exp(b.mean - a.mean + half), level, a.n + b.n)
