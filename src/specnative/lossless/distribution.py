"""The distributional test of the rejection rule (lossless in distribution only). Under a correct
rule, given everything before it:

* every emitted token is a draw from the p of its own verify row, so its randomized
  probability-integral transform (PIT) is uniform, in any token order fixed before the draw
  (p's own and the draft's preference over p's: the statistics "target" and "draft"); the bonus
  tokens (emitted after every draft was kept) on their own too ("bonus");
* every draft the walk reached is kept with probability pi = min(1, p(x) / q(x)), p from the
  draft's own verify row and q the distribution that proposed it: the randomized PIT of each
  decision, accepted ? V pi : pi + V (1 - pi), is uniform ("decisions"), and the number of drafts
  kept has the Poisson-binomial distribution of the pi ("acceptances");
* a rejected draft's correction token is a draw from r = norm(max(0, p - q)), so its PIT in r is
  uniform ("residuals").

The engine records all of it apart from the rule (generate(record_pit=True)): a rule that reads
the wrong verify row or q, weighs the wrong ratio, or draws from the wrong residual shows. The
statistics are Bonferroni-combined at DIST_ALPHA. The decisions and residuals see the rule's own
mistakes where the emitted tokens alone barely move (a draft that nearly equals the target: a
faulty rule then changes few tokens, but each of its decisions is still judged)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

# The distributional test's false-alarm rate per cell: a correct engine fails a cell with at most
# this probability (the noise folding only lowers it).
DIST_ALPHA = 1e-3

# Below this many emitted tokens the test has too little power to call a rule distributed as p:
# the smallest size at which every planted rejection-rule fault failed in at least 95 % of the
# tests on every tiny pair measured (bench/results/rejection-power/README.md). A smaller test
# still decides, and its reason says it was underpowered.
MIN_DIST_POSITIONS = 1024


# Every other run of the distributional test drafts this many times hotter than the target (draft
# model only): the rule is lossless for any q, and a flatter q makes rejections frequent, so the
# rule's every path (acceptance test, residual, bonus) is exercised even when the user's draft
# nearly equals the target (bench/results/rejection-power/: without it pi is 1 at nearly every
# draft, a faulty rule changes few decisions, and no statistic can see what did not change).
STRESS_DRAFT_FACTOR = 2.0

# pi is computed apart from the rule, in double precision; the rule's own float p(x) / q(x) may
# round across 1 (or 0) by ~1e-6. A decision the other side of such a pi is then possible, not
# impossible: the acceptance count weighs pi clipped to [PI_ROUNDING, 1 - PI_ROUNDING].
PI_ROUNDING = 1e-4

# The acceptance count is tested apart for the drafts a correct rule keeps with pi >= this (near
# certainly) and for the others (acceptance_test).
ACCEPTANCE_SPLIT = 0.99

ORDERS = ("draft", "target")  # the emitted tokens' PIT orders (pit_intervals)
# The statistics, in the order the reason lists them.
STATISTICS = ("target", "draft", "bonus", "decisions", "acceptances", "residuals")
STATISTIC_TEXT = {
    "target": "the emitted tokens' PIT in p's order",
    "draft": "the emitted tokens' PIT in the draft's order",
    "bonus": "the bonus tokens' PIT in p's order",
    "decisions": "the acceptance decisions' PIT against min(1, p/q)",
    "acceptances": "the number of drafts kept against min(1, p/q)",
    "residuals": "the corrections' PIT in norm(max(0, p - q))",
}

PIT_FIELDS = ("index", "p_emitted", "above_sure", "above_maybe", "draft_above_sure", "draft_above_maybe")
DECISION_FIELDS = ("decision_index", "accept_prob", "accepted", "residual_ahead", "residual_prob")


@dataclass(frozen=True)
class Statistic:
    """One test among the distributional test's statistics."""

    name: str          # STATISTICS
    statistic: float   # a KS distance from uniform (the smallest any placement of exact ties has);
                       # "acceptances": z, (kept - sum pi) / sqrt(sum pi (1 - pi))
    p_value: float     # its own p-value (before Bonferroni)
    n: int             # values tested


@dataclass(frozen=True)
class DistributionTest:
    """The rejection rule's distributional test: its statistics, Bonferroni-combined."""

    statistic: float   # KS distance of the emitted tokens' PIT (the token order with the smaller p)
    p_value: float     # the smallest p-value times the number of statistics tested (at most 1)
    positions: int     # emitted tokens tested, over all sequences and runs
    runs: int          # speculative runs (seeds) pooled
    alpha: float = DIST_ALPHA
    decided_by: str = "target"  # the statistic with the smallest p-value (STATISTICS)
    statistics: tuple[Statistic, ...] = ()
    min_positions: int = MIN_DIST_POSITIONS

    @property
    def passed(self) -> bool:
        return self.p_value >= self.alpha

    @property
    def underpowered(self) -> bool:
        """Too few positions for the test to catch a wrong rule reliably (MIN_DIST_POSITIONS)."""
        return self.positions < self.min_positions

    def of(self, name: str) -> Statistic | None:
        return next((s for s in self.statistics if s.name == name), None)

    def p_of(self, name: str) -> float:
        """A statistic's own p-value (before Bonferroni); NaN when it had nothing to test."""
        s = self.of(name)
        return s.p_value if s else float("nan")

    @property
    def decisions(self) -> int:
        """Drafts judged: every draft the walk reached."""
        s = self.of("decisions")
        return s.n if s else 0

    @property
    def decision_p_value(self) -> float:
        """The acceptance decisions' own p-value: the smaller of their PIT's and their count's
        (before Bonferroni); NaN without drafts."""
        return float(np.nanmin([self.p_of("decisions"), self.p_of("acceptances")])) if self.decisions else float("nan")

    @property
    def residuals(self) -> int:
        """Rejections whose correction was placed in its residual."""
        s = self.of("residuals")
        return s.n if s else 0

    @property
    def reason(self) -> str:
        outcome = "consistent with" if self.passed else "NOT consistent with"
        decisive = self.of(self.decided_by)
        measure = (f"z = {decisive.statistic:+.1f}" if decisive and decisive.name == "acceptances"
                   else f"KS distance >= {decisive.statistic if decisive else self.statistic:.4f}")
        each = ", ".join(f"{s.name} {s.p_value:.2g}" for s in self.statistics)
        text = (f"rejection rule {outcome} the target's p: {STATISTIC_TEXT[self.decided_by]} decided ({measure}), "
                f"p = {self.p_value:.3g} (Bonferroni over {len(self.statistics)} statistics, false-alarm rate "
                f"{self.alpha:g}; each one's own p: {each}; the emitted tokens' PIT at KS distance >= "
                f"{self.statistic:.4f}); {self.positions} positions, {self.decisions} drafts "
                f"judged, {self.residuals} corrections, {self.runs} seeded runs (p and q from each position's own "
                f"verify row and draft, no noise to allow for)")
        if self.underpowered:
            text += (f"; UNDERPOWERED: {self.positions} positions are fewer than the {self.min_positions} the test "
                     f"needs to catch a wrong rejection rule reliably, so a pass says little")
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


def poisson_binomial_pmf(probs) -> np.ndarray:
    """P(K = 0..n) for K the number of successes of independent Bernoulli(probs): the product of
    the polynomials (1 - p_i) + p_i x, multiplied pairwise by FFT (n log^2 n; a tail is exact to
    ~1e-13 absolute, far below any level the test decides at)."""
    probs = np.asarray(probs, np.float64)
    n = probs.size
    pieces = np.zeros((1 << max(0, (n - 1).bit_length()), 2))
    pieces[:, 0] = 1.0  # padding: factors 1 (no trial)
    pieces[:n, 0], pieces[:n, 1] = 1.0 - probs, probs
    while pieces.shape[0] > 1:
        length = 2 * pieces.shape[1] - 1
        size = 1 << (length - 1).bit_length()
        spectra = np.fft.rfft(pieces, size, axis=1)
        pieces = np.maximum(np.fft.irfft(spectra[0::2] * spectra[1::2], size, axis=1)[:, :length], 0.0)
    return pieces[0, :n + 1]


def acceptance_test(accept_prob, accepted) -> Statistic:
    """The number of drafts kept against its distribution under a correct rule (each kept with
    probability pi, PI_ROUNDING allowed either side of 0 and 1): two-sided, exact Poisson-binomial
    tails, apart for the drafts with pi >= ACCEPTANCE_SPLIT and the others (Bonferroni over the
    two). Far more powerful than the decisions' PIT against a rule that keeps too many or too few
    (a pi near 1 adds V's noise to the PIT, nothing to the count); apart, because a wrong rule
    may reject drafts a correct one nearly always keeps and keep too many of the others (a q of
    the wrong position does both), which cancel in one count."""
    pi = np.clip(np.asarray(accept_prob, np.float64), PI_ROUNDING, 1.0 - PI_ROUNDING)
    kept = np.asarray(accepted, bool)
    parts = []
    for part in (pi >= ACCEPTANCE_SPLIT, pi < ACCEPTANCE_SPLIT):
        if not part.any():
            continue
        pmf = poisson_binomial_pmf(pi[part])
        k = int(np.count_nonzero(kept[part]))
        p_value = min(1.0, 2.0 * min(pmf[:k + 1].sum(), pmf[k:].sum()))
        z = (k - pi[part].sum()) / np.sqrt(max((pi[part] * (1.0 - pi[part])).sum(), 1e-300))
        parts.append((p_value, float(z)))
    p_value, z = min(parts)
    return Statistic("acceptances", z, float(min(1.0, p_value * len(parts))), int(pi.size))


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


def ks_test(name: str, parts: list) -> Statistic | None:
    """A KS test of uniformity over pooled intervals [(lo, hi) per run] (None: no values)."""
    lo = np.concatenate([p[0] for p in parts]) if parts else np.empty(0)
    hi = np.concatenate([p[1] for p in parts]) if parts else np.empty(0)
    if lo.size == 0:
        return None  # e.g. no rejection, no bonus token: nothing to test
    statistic = ks_distance_lower_bound(lo, hi)
    return Statistic(name, statistic, ks_p_value(statistic, lo.size), int(lo.size))


def distribution_test(intervals: dict, runs: int, alpha: float = DIST_ALPHA, decisions: list | None = None,
                      min_positions: int = MIN_DIST_POSITIONS) -> DistributionTest:
    """The test over pooled values: `intervals` {statistic: [(lo, hi) per run]} for the PITs (a
    point is an interval with lo == hi), `decisions` [(accept_prob, accepted) per run] for the
    acceptance count. Kolmogorov-Smirnov for the PITs rather than chi-square on bins: it takes every
    value without a binning choice, needs no minimum count per bin (a cell of 32 positions is
    valid), has an exact finite-n null distribution, and its statistic has the conservative bound
    above when values are intervals. Every statistic with values is tested; the smallest p-value
    times their number (Bonferroni) decides. positions: the emitted tokens ("target")."""
    tests = [t for t in (ks_test(name, parts) for name, parts in intervals.items()) if t is not None]
    if decisions and sum(len(pi) for pi, _ in decisions):
        tests.append(acceptance_test(np.concatenate([pi for pi, _ in decisions]),
                                     np.concatenate([kept for _, kept in decisions])))
    tokens = [t for t in tests if t.name in ORDERS]
    if not tokens:
        raise ValueError("no emitted positions to test")
    tests.sort(key=lambda t: STATISTICS.index(t.name))
    decisive = min(tests, key=lambda t: t.p_value)
    return DistributionTest(min(tokens, key=lambda t: t.p_value).statistic, min(1.0, decisive.p_value * len(tests)),
                            tokens[0].n, runs, alpha, decisive.name, tuple(tests), min_positions)


def rejection_distribution(engine, prompts, temperature: float, seed: int, min_positions: int, stress: bool = True,
                           **spec) -> DistributionTest:
    """Runs the `rejection` rule (rejection_run) at seeds seed, seed + 1, ... until `min_positions`
    tokens were emitted by rounds, and tests their pooled values. `spec`: generate()'s other
    arguments (n_predict, k, ...)."""
    if temperature <= 0:
        raise ValueError("the distributional test needs temperature > 0 (greedy is checked exactly)")
    prompts = engine.to_token_prompts(prompts)
    rng = np.random.default_rng([int(seed), 0x9E3779B9])  # V: fixed by the cell's seed
    runs, positions = [], 0
    while positions < min_positions:
        _, values = rejection_run(engine, prompts, temperature, seed, len(runs), rng, stress, **spec)
        if not values:
            break  # no round emitted anything (n_predict <= 1): nothing to test
        runs.append(values)
        positions += values["target"][0].size
    return pooled_test(runs)


def pooled_test(runs: list, alpha: float = DIST_ALPHA) -> DistributionTest:
    """distribution_test over runs' values (rejection_run's second result, one per run)."""
    intervals = {name: [r[name] for r in runs if name in r] for name in STATISTICS
                 if name != "acceptances" and any(name in r for r in runs)}
    return distribution_test(intervals, len(runs), alpha, [r["acceptances"] for r in runs])


def run_values(out, rng, model: bool) -> dict:
    """One run's values: {statistic: (lo, hi)} for the PITs, and "acceptances": (pi, accepted);
    {} when no round emitted a token. V from `rng`: one per emitted token (shared by its orders),
    then one per draft judged, then one per rejection's correction."""
    seqs = out.pit
    points = {key: np.concatenate([seq[key] for seq in seqs]) for key in PIT_FIELDS + DECISION_FIELDS}
    if points["index"].size == 0:
        return {}
    v = rng.random(points["index"].size)
    values = {order: pit_intervals(points, v, order) for order in (ORDERS if model else ("target",))}
    bonus = np.concatenate([~np.isin(seq["index"], seq["decision_index"]) for seq in seqs])  # no draft judged there
    values["bonus"] = tuple(bound[bonus] for bound in values["target"])
    pi, kept = points["accept_prob"], points["accepted"].astype(bool)
    decisions = decision_pits(pi, kept, rng.random(pi.size))
    values["decisions"] = (decisions, decisions)
    values["acceptances"] = (pi, kept)
    placed = ~kept & ~np.isnan(points["residual_prob"])  # a rejection whose r had mass
    residuals = residual_pits(points["residual_ahead"][placed], points["residual_prob"][placed],
                              rng.random(int(placed.sum())))
    values["residuals"] = (residuals, residuals)
    return values


def rejection_run(engine, prompts, temperature: float, seed: int, run: int, rng, stress: bool = True, **spec):
    """Run number `run` of the distributional test, at seed + run, and its values (run_values).
    With `stress` (draft model only) every other run drafts at STRESS_DRAFT_FACTOR x the
    temperature: a correct rule emits p either way, so the pooled values stay uniform."""
    model = spec.get("drafter", "model") == "model"
    hotter = STRESS_DRAFT_FACTOR * temperature if stress and model and run % 2 == 1 else None
    out = engine.generate(prompts, temperature=temperature, seed=seed + run, spec=True, accept_rule="rejection",
                          draft_temperature=hotter, record_pit=True, **spec)
    return out, run_values(out, rng, model)
