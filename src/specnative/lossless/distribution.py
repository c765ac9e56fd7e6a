"""The distributional test of the rejection rule (lossless in distribution only): the randomized
probability-integral transform of every emitted token in its own verify row's p, tested for
uniformity with Kolmogorov-Smirnov in two token orders."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

# The distributional test's false-alarm rate per cell: a correct engine fails a cell with at most
# this probability (the noise folding only lowers it).
DIST_ALPHA = 1e-3


# Every other run of the distributional test drafts this many times hotter than the target (draft
# model only): the rule is lossless for any q, and a flatter q makes rejections frequent, so the
# rule's every path (acceptance test, residual, bonus) is exercised even when the user's draft
# nearly equals the target (bench/results/rejection-power-*.md: without it such faults change few
# tokens and no test can see them).
STRESS_DRAFT_FACTOR = 2.0


# ---------------------------------------------------------------------------------------------
# The rejection rule: lossless in distribution
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DistributionTest:
    """A one-sample KS test that the emitted tokens' randomized rank PITs are uniform."""

    statistic: float   # the smallest KS distance any placement of exact ties has (KS itself without ties)
    p_value: float     # P(D >= statistic) for n uniform draws (exact finite-n distribution)
    positions: int     # emitted tokens tested, over all sequences and runs
    runs: int          # speculative runs (seeds) pooled
    alpha: float = DIST_ALPHA
    order: str = "target"  # the PIT order whose test decided (ORDERS)

    @property
    def passed(self) -> bool:
        return self.p_value >= self.alpha

    @property
    def reason(self) -> str:
        outcome = "consistent with" if self.passed else "NOT distributed as"
        return (f"emitted tokens {outcome} the target's p: KS distance of the PIT in {self.order} order >= "
                f"{self.statistic:.4f} over {self.positions} positions ({self.runs} seeded runs), p = {self.p_value:.3g} "
                f"(false-alarm rate {self.alpha:g}; p from each token's own verify row, no noise to allow for)")


ORDERS = ("draft", "target")  # the PIT's token orders (pit_intervals)


PIT_FIELDS = ("index", "p_emitted", "above_sure", "above_maybe", "draft_above_sure", "draft_above_maybe")


def pit_intervals(points: dict, v, order: str) -> tuple[np.ndarray, np.ndarray]:
    """Each emitted token's randomized probability-integral transform u = (p's mass ahead of it) +
    V * p(emitted), V ~ U(0, 1) given as `v`; `points`: generate(record_pit=True)'s fields. Any
    order fixed before the draw keeps u uniform under a correct rule. `order` "target": p's own,
    most probable first; "draft": the draft's preference over p's (log q - log p): a fault that
    leans towards the draft's tokens (acceptance, residual, accept-all) shows at one end of it, one
    that misplaces p's own mass (a bonus token from q) in p's order. Exact ties may go either way,
    so u is an interval; without ties both ends are u itself."""
    prefix = "draft_" if order == "draft" else ""
    p_x = np.asarray(points["p_emitted"], np.float64)
    sure, maybe = (np.asarray(points[f"{prefix}above_{end}"], np.float64) for end in ("sure", "maybe"))
    return np.clip(sure + v * p_x, 0.0, 1.0), np.clip(maybe + v * p_x, 0.0, 1.0)


def ks_distance_lower_bound(lo, hi) -> float:
    """min over x_i in [lo_i, hi_i] of sup_t |F_n(t) - t| is at least this: F_n(t) lies between
    the share of intervals ending at or below t and the share starting at or below it."""
    lo, hi = np.sort(np.asarray(lo, np.float64)), np.sort(np.asarray(hi, np.float64))
    n = lo.size
    if n == 0:
        return 0.0
    j = np.arange(1, n + 1)
    return float(max(np.max(j / n - hi), np.max(lo - (j - 1) / n), 0.0))


def ks_p_value(statistic: float, n: int) -> float:
    return float(stats.kstwo.sf(statistic, n)) if statistic > 0 else 1.0


def distribution_test(intervals: dict, runs: int, alpha: float = DIST_ALPHA) -> DistributionTest:
    """The test over pooled PIT intervals: {order: [(lo, hi) per run]}. Kolmogorov-Smirnov rather
    than chi-square on bins: it takes every value without a binning choice, needs no minimum count
    per bin (a cell of 32 positions is valid), has an exact finite-n null distribution, and its
    statistic has the conservative bound above when values are intervals. One test per order,
    Bonferroni-combined (the smaller p-value times the number of orders)."""
    tests = []
    for order, parts in intervals.items():
        lo = np.concatenate([p[0] for p in parts]) if parts else np.empty(0)
        hi = np.concatenate([p[1] for p in parts]) if parts else np.empty(0)
        if lo.size == 0:
            raise ValueError("no emitted positions to test")
        statistic = ks_distance_lower_bound(lo, hi)
        tests.append((ks_p_value(statistic, lo.size), statistic, int(lo.size), order))
    p_value, statistic, positions, order = min(tests)
    return DistributionTest(statistic, min(1.0, p_value * len(tests)), positions, runs, alpha, order)


def rejection_distribution(engine, prompts, temperature: float, seed: int, min_positions: int, stress: bool = True,
                           **spec) -> DistributionTest:
    """Runs the `rejection` rule (rejection_run) at seeds seed, seed + 1, ... until `min_positions`
    tokens were emitted by rounds, and tests their pooled PITs. `spec`: generate()'s other
    arguments (n_predict, k, ...)."""
    if temperature <= 0:
        raise ValueError("the distributional test needs temperature > 0 (greedy is checked exactly)")
    prompts = engine.to_token_prompts(prompts)
    rng = np.random.default_rng([int(seed), 0x9E3779B9])  # V: fixed by the cell's seed
    intervals, positions, run = {}, 0, 0
    while positions < min_positions:
        _, pits = rejection_run(engine, prompts, temperature, seed, run, rng, stress, **spec)
        if not pits:
            break  # no round emitted anything (n_predict <= 1): nothing to test
        for order, bounds in pits.items():
            intervals.setdefault(order, []).append(bounds)
        positions += bounds[0].size
        run += 1
    return distribution_test(intervals, run)


def rejection_run(engine, prompts, temperature: float, seed: int, run: int, rng, stress: bool = True, **spec):
    """Run number `run` of the distributional test, at seed + run, and its PIT intervals per order
    ({order: (lo, hi)}; {} when no round emitted a token), V from `rng`. With `stress` (draft model
    only) every other run drafts at STRESS_DRAFT_FACTOR x the temperature: a correct rule emits p
    either way, so the pooled PITs stay uniform."""
    model = spec.get("drafter", "model") == "model"
    hotter = STRESS_DRAFT_FACTOR * temperature if stress and model and run % 2 == 1 else None
    out = engine.generate(prompts, temperature=temperature, seed=seed + run, spec=True, accept_rule="rejection",
                          draft_temperature=hotter, record_pit=True, **spec)
    points = {key: np.concatenate([seq[key] for seq in out.pit]) for key in PIT_FIELDS}
    if points["index"].size == 0:
        return out, {}
    v = rng.random(points["index"].size)  # one V per position, shared by both orders
    return out, {order: pit_intervals(points, v, order) for order in (ORDERS if model else ("target",))}
