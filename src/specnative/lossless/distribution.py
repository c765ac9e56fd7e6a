"""The distributional test of the rejection rule (lossless in distribution only). Under a correct
rule, given everything before it:

* every emitted token is a draw from the p of its own verify row, so its randomized
  probability-integral transform (PIT) is uniform, in any token order fixed before the draw
  (p's own and the draft's preference over p's: the statistics "target" and "draft"); the bonus
  tokens (emitted after every draft was kept) on their own too ("bonus");
* every draft the walk reached is kept with probability pi = min(1, p(x) / q(x)), p from the
  draft's own verify row and q the distribution that proposed it, so the randomized PIT of the
  decision, accepted ? V pi : pi + V (1 - pi), is uniform ("decisions");
* a rejected draft's correction token is a draw from r = norm(max(0, p - q)), so its PIT in r is
  uniform ("residuals").

The engine records all of it apart from the rule (generate(record_pit=True)): a rule that reads
the wrong verify row or q, weighs the wrong ratio, or draws from the wrong residual shows. Each
statistic is a one-sample Kolmogorov-Smirnov test of uniformity; they are Bonferroni-combined at
DIST_ALPHA. The decisions and residuals see the rule's own mistakes where the emitted tokens alone
barely move (a draft that nearly equals the target: most faults then change few tokens)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

# The distributional test's false-alarm rate per cell: a correct engine fails a cell with at most
# this probability (the noise folding only lowers it).
DIST_ALPHA = 1e-3

# Below this many emitted tokens the test has too little power to call a rule distributed as p
# (bench/results/rejection-power/README.md: the smallest size at which every planted rejection-rule
# fault fails in at least 95 % of subsets on each tiny pair measured); a smaller test still
# decides, and its reason says so.
MIN_DIST_POSITIONS = 1024


# Every other run of the distributional test drafts this many times hotter than the target (draft
# model only): the rule is lossless for any q, and a flatter q makes rejections frequent, so the
# rule's every path (acceptance test, residual, bonus) is exercised even when the user's draft
# nearly equals the target (bench/results/rejection-power/: without it such faults change few
# tokens, and pi is 1 at nearly every draft, so no test can see them).
STRESS_DRAFT_FACTOR = 2.0


# The statistics (each a KS test of uniformity) in the order the reason lists them.
ORDERS = ("draft", "target")  # the emitted tokens' PIT orders (pit_intervals)
STATISTICS = ("target", "draft", "bonus", "decisions", "residuals")
STATISTIC_TEXT = {
    "target": "emitted tokens in p's order",
    "draft": "emitted tokens in the draft's order",
    "bonus": "bonus tokens in p's order",
    "decisions": "acceptance decisions against min(1, p/q)",
    "residuals": "corrections in norm(max(0, p - q))",
}

PIT_FIELDS = ("index", "p_emitted", "above_sure", "above_maybe", "draft_above_sure", "draft_above_maybe")
DECISION_FIELDS = ("decision_index", "accept_prob", "accepted", "residual_ahead", "residual_prob")


@dataclass(frozen=True)
class Statistic:
    """One KS test of uniformity among the distributional test's statistics."""

    name: str          # STATISTICS
    statistic: float   # the smallest KS distance any placement of exact ties has (KS itself without ties)
    p_value: float     # its own p-value, P(D >= statistic) for n uniform draws (before Bonferroni)
    n: int             # values tested


@dataclass(frozen=True)
class DistributionTest:
    """The rejection rule's distributional test: its statistics, Bonferroni-combined."""

    statistic: float   # KS distance of the statistic that decided (the smallest p-value)
    p_value: float     # that p-value times the number of statistics tested (at most 1)
    positions: int     # emitted tokens tested, over all sequences and runs
    runs: int          # speculative runs (seeds) pooled
    alpha: float = DIST_ALPHA
    order: str = "target"  # the statistic that decided (STATISTICS)
    statistics: tuple[Statistic, ...] = ()
    min_positions: int = MIN_DIST_POSITIONS

    @property
    def passed(self) -> bool:
        return self.p_value >= self.alpha

    @property
    def underpowered(self) -> bool:
        return self.positions < self.min_positions

    def of(self, name: str) -> Statistic | None:
        return next((s for s in self.statistics if s.name == name), None)

    @property
    def decisions(self) -> int:
        return self.of("decisions").n if self.of("decisions") else 0

    @property
    def residuals(self) -> int:
        return self.of("residuals").n if self.of("residuals") else 0

    @property
    def reason(self) -> str:
        outcome = "consistent with" if self.passed else "NOT consistent with"
        which = STATISTIC_TEXT.get(self.order, self.order)
        each = ", ".join(f"{s.name} {s.p_value:.2g} (n {s.n})" for s in self.statistics)
        text = (f"rejection rule {outcome} the target's p: {which} decided, KS distance >= {self.statistic:.4f}, "
                f"p = {self.p_value:.3g} (Bonferroni over {len(self.statistics)} statistics; false-alarm rate "
                f"{self.alpha:g}); {self.positions} positions, {self.decisions} drafts judged, {self.residuals} "
                f"corrections, {self.runs} seeded runs; each statistic's own p: {each} (p and q from each "
                f"position's own verify row and draft, no noise to allow for)")
        if self.underpowered:
            text += (f"; UNDERPOWERED: {self.positions} positions are fewer than the {self.min_positions} the test "
                     f"needs to catch a wrong rejection rule reliably, so passing says little")
        return text


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


def decision_pits(accept_prob, accepted, v) -> np.ndarray:
    """The randomized PIT of each acceptance decision, pi = min(1, p(x)/q(x)): V pi if the draft
    was kept, pi + V (1 - pi) if not. Uniform when each decision is Bernoulli(pi) given pi; a rule
    that keeps too many drafts piles values low, one that rejects at pi = 1 puts them at 1."""
    pi = np.clip(np.asarray(accept_prob, np.float64), 0.0, 1.0)
    return np.where(np.asarray(accepted, bool), v * pi, pi + v * (1.0 - pi))


def residual_pits(ahead, prob, v) -> np.ndarray:
    """Each rejection's correction token placed in r = norm(max(0, p - q)), r's most probable first:
    r's mass ahead of it + V r(token). Uniform for draws from r; a token r cannot emit (r = 0, e.g.
    drawn from p) lands at 1."""
    return np.clip(np.asarray(ahead, np.float64) + v * np.asarray(prob, np.float64), 0.0, 1.0)


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


def distribution_test(intervals: dict, runs: int, alpha: float = DIST_ALPHA,
                      min_positions: int = MIN_DIST_POSITIONS) -> DistributionTest:
    """The test over pooled PIT intervals: {statistic: [(lo, hi) per run]} (a point is an interval
    with lo == hi). Kolmogorov-Smirnov rather than chi-square on bins: it takes every value without a
    binning choice, needs no minimum count per bin (a cell of 32 positions is valid), has an exact
    finite-n null distribution, and its statistic has the conservative bound above when values are
    intervals. One test per statistic with values, Bonferroni-combined (the smallest p-value times
    the number of statistics tested). positions: the emitted tokens ("target")."""
    tests = []
    for name, parts in intervals.items():
        lo = np.concatenate([p[0] for p in parts]) if parts else np.empty(0)
        hi = np.concatenate([p[1] for p in parts]) if parts else np.empty(0)
        if lo.size == 0:
            continue  # e.g. no rejection, no bonus token: nothing to test
        statistic = ks_distance_lower_bound(lo, hi)
        tests.append(Statistic(name, statistic, ks_p_value(statistic, lo.size), int(lo.size)))
    positions = next((s.n for s in tests if s.name == "target"), 0)
    if positions == 0:
        raise ValueError("no emitted positions to test")
    tests.sort(key=lambda s: STATISTICS.index(s.name) if s.name in STATISTICS else len(STATISTICS))
    decisive = min(tests, key=lambda s: s.p_value)
    return DistributionTest(decisive.statistic, min(1.0, decisive.p_value * len(tests)), positions, runs, alpha,
                            decisive.name, tuple(tests), min_positions)


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
        for name, bounds in pits.items():
            intervals.setdefault(name, []).append(bounds)
        positions += pits["target"][0].size
        run += 1
    return distribution_test(intervals, run)


def run_pits(out, rng, model: bool) -> dict:
    """One run's values per statistic ({name: (lo, hi)}; {} when no round emitted a token), V from
    `rng`: one V per emitted token (shared by its orders), then one per draft judged, then one per
    rejection's correction."""
    seqs = out.pit
    points = {key: np.concatenate([seq[key] for seq in seqs]) for key in PIT_FIELDS + DECISION_FIELDS}
    if points["index"].size == 0:
        return {}
    v = rng.random(points["index"].size)
    pits = {order: pit_intervals(points, v, order) for order in (ORDERS if model else ("target",))}
    bonus = np.concatenate([~np.isin(seq["index"], seq["decision_index"]) for seq in seqs])  # no draft judged there
    pits["bonus"] = tuple(bound[bonus] for bound in pits["target"])
    decisions = decision_pits(points["accept_prob"], points["accepted"], rng.random(points["accept_prob"].size))
    pits["decisions"] = (decisions, decisions)
    placed = ~points["accepted"] & ~np.isnan(points["residual_prob"])  # a rejection whose r had mass
    residuals = residual_pits(points["residual_ahead"][placed], points["residual_prob"][placed],
                              rng.random(int(placed.sum())))
    pits["residuals"] = (residuals, residuals)
    return pits


def rejection_run(engine, prompts, temperature: float, seed: int, run: int, rng, stress: bool = True, **spec):
    """Run number `run` of the distributional test, at seed + run, and its values per statistic
    (run_pits). With `stress` (draft model only) every other run drafts at STRESS_DRAFT_FACTOR x the
    temperature: a correct rule emits p either way, so the pooled PITs stay uniform."""
    model = spec.get("drafter", "model") == "model"
    hotter = STRESS_DRAFT_FACTOR * temperature if stress and model and run % 2 == 1 else None
    out = engine.generate(prompts, temperature=temperature, seed=seed + run, spec=True, accept_rule="rejection",
                          draft_temperature=hotter, record_pit=True, **spec)
    return out, run_pits(out, rng, model)
