"""The lossless verdict of a speculative run: `exact`, `numeric` or `fail`.

llama.cpp's logits depend on the batch shape (one token per baseline step vs k+1 per verify batch,
and the number of sequences in it), so a correct speculative run can part from the baseline where
the target's own choice was a near-tie. The verdict tells that apart from a bug:

1. The **noise control** (`measure_noise`) feeds the same tokens through the target twice,
   teacher-forced: one position per sequence per decode (the baseline's shape) and k+1 positions
   per sequence per decode (a verify batch's), all sequences of the cell together. Per position it
   records max |Δlogit| and the *spread* max(Δ) - min(Δ): the most that any pairwise logit gap
   (the quantity a greedy or CDF decision depends on) moved between the two shapes.
2. The **forced replay** (`judge`) feeds the speculative output through the target along the
   baseline's path and checks every emitted token against what the baseline's rule picks there:
   - greedy: emitted == argmax, or logit[argmax] - logit[emitted] <= tolerance;
   - sampling (`match`, and the `rejection` rule's match proxy): emitted == the keyed inverse-CDF
     draw, or the keyed uniform u lies within the tolerance's reach of the emitted token's CDF
     interval (every logit may move by the tolerance: probability ratios by exp(tol / T)).
   The tolerance is SAFETY x the largest spread the control measured in the same cell: over each
   position's candidates at greedy (NoiseControl.greedy_tolerance), over the whole vocabulary at
   T > 0. And the number of such near-tie mismatches must be what the control's flip rate (of the
   greedy choice, or of the keyed draw at T > 0) allows: a bug that only ever picks the runner-up
   would otherwise hide among near-ties. The KV-state check compares the logits on the cache the
   run left with a clean replay's, and the cache's extent with what the prompt and the emitted
   tokens take (cache_problem: exact, no tolerance).

3. The **distributional test** (`distribution_test`) for the `rejection` rule, which is lossless in
   distribution only: under a correct rule every emitted token is a draw from the target's p given
   the emitted prefix, so its randomized probability-integral transform is i.i.d. uniform over all
   positions of all sequences and runs. The engine records, for every token a round emits, its
   place in the p of its own verify row (generate(record_pit=True): the very logits the rule had,
   read independently of how the rule used them), so there is no batch-shape noise to allow for:
   u = (mass ahead of it) + V * p(emitted), V uniform and seeded, in two orders fixed before the
   draw (p's own, and the draft's preference over p's). A one-sample Kolmogorov-Smirnov test of
   uniformity per order, Bonferroni-combined, decides at a stated false-alarm rate (DIST_ALPHA per
   cell). The target's p itself is checked by the match proxy and the KV checks above, which the
   cell must pass too.

Verdicts: `exact` (token-identical to the baseline, per seed when sampling), `numeric` (every
divergence explained by the measured noise), `exact-dist` (rejection rule: the emitted tokens are
distributed as the target's p, and the match proxy at the same seed found no bug), `fail`
(anything else: a bug; the cell gives no number). `lossless_ok` is true for all but `fail`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from . import _core
from .engine import HIDDEN_DRAFTERS

EXACT, NUMERIC, EXACT_DIST, FAIL = "exact", "numeric", "exact-dist", "fail"
VERDICTS = (EXACT, NUMERIC, EXACT_DIST, FAIL)

# The tolerance is this many times the largest gap movement the control saw: the control samples
# a few hundred positions, the run's own wobble can exceed its maximum somewhat.
SAFETY = 1.25
# Candidates of a logit comparison: the tokens within this many times the measured spread of the
# top (the C++ core's constant, used by its per-position control too).
CANDIDATE_WINDOW = float(_core.candidate_window)
# The candidates' spread sets the greedy tolerance only when measured at this many near-tie
# positions (NoiseControl.candidate_positions); otherwise the full spread does.
MIN_CANDIDATE_POSITIONS = 8
# The noise control teacher-forces at least this many tokens beyond k per sequence: a shorter
# output (a sequence that ended after a token or two) leaves pass B without a verify-shaped chunk,
# and a control of zero would fail any run on its batch-shape noise (tolerance 0).
CONTROL_MIN_EXTRA = 2
# The KV-state check's allowance over its control (see NoiseControl.state_tolerance). Planted
# cache bugs moved the state 4-1000x the control (Gemma rollback_long: 4.2x; tiny: 50x+).
STATE_FACTOR = 4.0
# Near-tie mismatches allowed: the 99.9 % Poisson quantile of the control's flip rate (upper
# bound by the rule of three when it saw none) times the positions checked.
FLIP_QUANTILE = 0.999
# The distributional test's false-alarm rate per cell: a correct engine fails a cell with at most
# this probability (the noise folding only lowers it).
DIST_ALPHA = 1e-3
# Every other run of the distributional test drafts this many times hotter than the target (draft
# model only): the rule is lossless for any q, and a flatter q makes rejections frequent, so the
# rule's every path (acceptance test, residual, bonus) is exercised even when the user's draft
# nearly equals the target (bench/results/rejection-power-*.md: without it such faults change few
# tokens and no test can see them).
STRESS_DRAFT_FACTOR = 2.0


@dataclass(frozen=True)
class NoiseControl:
    """The target's own numeric noise between the baseline's and the verify batch's shapes."""

    positions: int
    chunk: int                # positions per sequence per decode on the verify side (k + 1)
    concurrency: int
    max_abs_delta: float      # max |l_step - l_batch| over positions and vocabulary
    q99_abs_delta: float      # 99th percentile over positions of the per-position max
    max_spread: float         # max over positions of max(Δ) - min(Δ)
    q99_spread: float
    flips: int                # positions where the decision differs between the shapes: the greedy
                              # choice, or at T > 0 the keyed draw (measure_noise's temperature)
    # The KV-state check's control: one more 1-token step on top of the cache each shape built
    # (a cache computed in verify batches carries their noise in every layer's K and V).
    max_state_spread: float = 0.0
    # The spread over each position's candidates (_core.logit_spread): the tokens within
    # CANDIDATE_WINDOW x that position's spread of the top, the only ones noise of that size can
    # lift to the top. The full spread is set by tokens far down the vocabulary (Gemma 3 270M:
    # 2.17 against 0.72 over the candidates), so a greedy check on it is ~3x blunter than needed.
    # None: not measured (then the full spread stands in).
    max_candidate_spread: float | None = None
    # Positions where the candidates were more than the top token (a near-tie the control could
    # measure a gap's movement on). The maximum over a handful of them understates the noise (a
    # correct Qwen cell at concurrency 1: 0.0055 over 16 positions, then a near-tie moved 0.049):
    # below MIN_CANDIDATE_POSITIONS the full spread stands in.
    candidate_positions: int = 0

    @property
    def tolerance(self) -> float:
        """For decisions that weigh the whole vocabulary (T > 0: CDF masses, the distribution test)."""
        return SAFETY * self.max_spread

    @property
    def greedy_tolerance(self) -> float:
        """For a greedy choice: it depends on the gaps between candidates only. A correct run emits
        b over the replay's pick a only if its noise moved l_b - l_a by the gap; both lie within the
        noise's reach of the top, so the candidates' spread bounds that movement."""
        return SAFETY * (self.max_candidate_spread if self.candidates_measured else self.max_spread)

    @property
    def candidates_measured(self) -> bool:
        return self.max_candidate_spread is not None and self.candidate_positions >= MIN_CANDIDATE_POSITIONS

    @property
    def greedy_basis(self) -> str:
        """What the greedy tolerance stands on, in words (verdict reasons)."""
        return ("the candidates' noise" if self.candidates_measured
                else "the full spread: too few near-ties in the control to trust the candidates'")

    @property
    def state_tolerance(self) -> float:
        # The run's cache also differs in layout (rollbacks leave holes that later cells fill, so
        # attention sums run in another order), which teacher forcing cannot reproduce: measured
        # up to 2.7x the control on the tiny models, hence STATE_FACTOR.
        return STATE_FACTOR * SAFETY * max(self.max_state_spread, self.max_spread)

    @property
    def flip_rate_bound(self) -> float:
        """Upper bound on the per-position flip rate (rule of three when no flip was seen)."""
        return (self.flips + 3) / max(self.positions, 1)

    def as_dict(self) -> dict:
        return {**asdict(self), "tolerance": self.tolerance, "greedy_tolerance": self.greedy_tolerance,
                "state_tolerance": self.state_tolerance}


def measure_noise(engine, prompts, tokens: list, k: int, drafter: str = "", clean_final: list | None = None,
                  temperature: float = 0.0, seed: int = 0) -> NoiseControl:
    """The control, on demand: teacher-force `tokens` (one continuation per prompt, e.g. a
    baseline run's output) along 1 and k+1 positions per sequence per decode. With a
    hidden-state drafter (dflash, dspark, eagle3, mtp) the k+1 pass runs under its target
    settings (feature extraction on, which can change the graph: no op fusion over an output),
    as the speculative run's verify did: the control covers that path too. At `temperature` > 0
    the flips it counts are of the keyed draw at `seed` (the match rule's decision): the greedy
    choice's flips understate them where p is flat (Gemma 3 270M at T=0.8: 27 near-tie draws in
    128 positions on a correct run, where greedy flips allowed 20)."""
    prompts = engine.to_token_prompts(prompts)
    forced = [list(map(int, t)) for t in tokens]
    padded = [control_tokens(p, t, k + CONTROL_MIN_EXTRA) for p, t in zip(prompts, forced)]
    settings_of = drafter if drafter in HIDDEN_DRAFTERS else ""
    raw = engine._core.numeric_noise(prompts, padded, 1, k + 1, settings_of=settings_of,
                                     temperature=float(temperature), seed=int(seed))
    if clean_final is not None and padded == forced:  # the 1-token pass's final logits: a clean replay
        clean_final.extend(raw["final_logits_a"])
    max_abs, spread, candidates = raw["max_abs_delta"], raw["spread"], raw["candidate_spread"]
    return NoiseControl(
        positions=int(max_abs.size), chunk=k + 1, concurrency=len(prompts),
        max_abs_delta=float(max_abs.max(initial=0.0)),
        q99_abs_delta=float(np.quantile(max_abs, 0.99)) if max_abs.size else 0.0,
        max_spread=float(spread.max(initial=0.0)),
        q99_spread=float(np.quantile(spread, 0.99)) if spread.size else 0.0,
        flips=int(np.count_nonzero(raw["draw_a"] != raw["draw_b"]) if temperature > 0
                  else np.count_nonzero(raw["argmax_a"] != raw["argmax_b"])),
        max_state_spread=float(raw["state_spread"].max(initial=0.0)),
        max_candidate_spread=float(candidates.max(initial=0.0)),
        candidate_positions=int(np.count_nonzero(candidates > 0)))


def control_tokens(prompt: list, tokens: list, at_least: int) -> list:
    """The control's continuation of one sequence: its tokens, lengthened to `at_least` with the
    prompt's own last tokens (natural text; the control measures batch-shape noise, which does not
    depend on which tokens are fed)."""
    missing = at_least - len(tokens)
    if missing <= 0 or not prompt:
        return tokens
    tail = (list(prompt) * (missing // len(prompt) + 1))[-missing:]
    return tokens + tail


def within_reach(u, cdf_lo, cdf_hi, tolerance: float, temperature: float):
    """Whether u could fall in [cdf_lo, cdf_hi) once every logit moves by up to `tolerance`:
    the mass below the token can shrink, and the mass up to it grow, by a factor exp(tol / T)."""
    e = math.exp(min(tolerance / temperature, 700.0))
    lo_min = cdf_lo / (cdf_lo + (1.0 - cdf_lo) * e)
    hi_max = cdf_hi * e / (cdf_hi * e + (1.0 - cdf_hi))
    return (lo_min <= u) & (u < hi_max)


def cdf_distance(u, cdf_lo, cdf_hi):
    """How far the keyed uniform lies outside the emitted token's CDF interval [lo, hi) (0 inside):
    the quantity a T > 0 mismatch is judged on (within_reach)."""
    return np.maximum(np.maximum(np.asarray(cdf_lo) - u, np.asarray(u) - cdf_hi), 0.0)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    first_divergence: int     # first generated index where spec and baseline differ (-1: none)
    mismatches: int           # replayed positions whose emitted token is not the baseline rule's pick
    max_mismatch_gap: float   # largest logit[pick] - logit[emitted] among them (NaN: none)
    tolerance: float
    positions: int            # positions replayed

    @property
    def lossless_ok(self) -> bool:
        return self.verdict != FAIL


def first_divergence(base_tokens, spec_tokens) -> tuple[int, int]:
    """(index, sequence) of the earliest generated index where any sequence differs, (-1, -1)."""
    best = (-1, -1)
    for s, (a, b) in enumerate(zip(base_tokens, spec_tokens)):
        n = min(len(a), len(b))
        diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
        index = int(diff[0]) if diff.size else (n if len(a) != len(b) else -1)
        if index >= 0 and (best[0] < 0 or index < best[0]):
            best = (index, s)
    return best


def missing_output(base_tokens, spec_tokens) -> str | None:
    """A missing sequence, or one cut short or run on, is never lossless. Both runs stop at the same
    n_predict (and at an end-of-generation token the same way), so lengths may differ only after
    the outputs have parted: a speculative output that is a strict prefix of the baseline's (or
    the reverse) lost or invented tokens."""
    if len(spec_tokens) != len(base_tokens):
        return (f"the speculative run returned {len(spec_tokens)} sequence(s), the baseline "
                f"{len(base_tokens)}")
    for s, (a, b) in enumerate(zip(base_tokens, spec_tokens)):
        if len(a) == len(b):
            continue
        n = min(len(a), len(b))
        if np.array_equal(np.asarray(a[:n]), np.asarray(b[:n])):
            what = "cut short" if len(b) < len(a) else "longer"
            return (f"seq {s}: the speculative output is {what} ({len(b)} tokens, the baseline {len(a)}) "
                    f"with the same tokens up to there: tokens lost or invented, not a near-tie")
    return None


def pending_state(engine, n_seq: int) -> list:
    """Call right after a speculative run: the target's logits for each sequence's last token on
    top of the KV cache the run left (judge compares them with a clean replay's)."""
    return [engine.pending_logits(s) for s in range(n_seq)]


def state_problem(final_logits: list, pending: list, tolerance: float) -> str | None:
    """A KV cache left stale or short by the run shows as logits that a clean replay does not
    give, even when no emitted token has changed yet."""
    for s, (clean, left) in enumerate(zip(final_logits, pending)):
        delta = np.asarray(left, np.float64) - np.asarray(clean, np.float64)
        spread = float(delta.max() - delta.min())
        if spread > tolerance:
            return (f"seq {s}: the KV cache the run left gives logits that move {spread:.3g} against a clean "
                    f"replay (tolerance {tolerance:.3g}): a stale or missing cache entry")
    return None


def cache_extents(engine, n_seq: int) -> list[int]:
    """Call right after a speculative run: the positions the target's KV cache holds per sequence,
    as llama.cpp's cache reports them (cache_problem checks them)."""
    return [engine._core.cache_extent(s) for s in range(n_seq)]


def cache_problem(engine, prompts: list, spec_tokens: list, extents: list) -> str | None:
    """The structural half of the KV-state check, free of numeric noise: after a correct run the
    target's cache holds each sequence's prompt and every emitted token but the pending last one
    (one more where an accepted end-of-generation draft ended the sequence: it was verified in the
    cache). A rollback that keeps a rejected draft or drops an accepted token changes that count,
    even where the logits it moves stay inside the noise (Gemma 3 270M Q4_K_M, rollback_long at
    greedy: two near-ties moved by 0.26 logits, tolerance 0.9)."""
    for s, (prompt, out, extent) in enumerate(zip(prompts, spec_tokens, extents)):
        if not len(out):
            continue
        expected = len(prompt) + len(out) - 1
        allowed = (expected, expected + 1) if engine._core.is_eog(int(out[-1])) else (expected,)
        if extent not in allowed:
            what = "stale entries kept" if extent > expected else "entries lost"
            return (f"seq {s}: the target's KV cache holds {extent} positions after the run, where its prompt "
                    f"({len(prompt)}) and the emitted tokens but the pending last ({len(out) - 1}) take {expected}: "
                    f"{what}")
    return None


def judge(engine, prompts, base_tokens: list, spec_tokens: list, temperature: float,
          seed: int, control: NoiseControl, pending: list | None = None, clean_final: list | None = None,
          extents: list | None = None) -> Verdict:
    """The verdict of one speculative run against its baseline (same prompts, seed, T).
    `pending` (pending_state() right after the run) adds the KV-state check, `extents`
    (cache_extents() right after the run) its structural half. `clean_final`: a clean replay's
    final logits of the baseline's tokens (measure_noise's), which serve the state check of an
    output identical to the baseline's without replaying it again."""
    prompts = engine.to_token_prompts(prompts)
    index, _ = first_divergence(base_tokens, spec_tokens)
    positions = sum(len(t) for t in spec_tokens)
    tol = control.tolerance if temperature > 0 else control.greedy_tolerance
    missing = missing_output(base_tokens, spec_tokens)
    if missing:
        return Verdict(FAIL, missing, index, 0, math.nan, tol, positions)
    if index < 0 and pending is None:
        return Verdict(EXACT, "token-identical to the baseline" + (" (per seed)" if temperature > 0 else ""),
                       -1, 0, math.nan, tol, positions)
    if index < 0 and clean_final is not None and len(clean_final) == len(spec_tokens):
        replay = {"final_logits": clean_final}  # identical tokens: the control's pass was this replay
    else:
        replay = engine._core.replay(prompts, [list(map(int, t)) for t in spec_tokens], float(temperature), int(seed))
    state = ((cache_problem(engine, prompts, spec_tokens, extents) if extents is not None else None)
             or (state_problem(replay["final_logits"], pending, control.state_tolerance) if pending is not None else None))
    if state and index < 0:
        return Verdict(FAIL, state, index, 0, math.nan, tol, positions)
    if index < 0:
        return Verdict(EXACT, "token-identical to the baseline" + (" (per seed)" if temperature > 0 else "")
                       + "; the KV cache it left matches a clean replay", -1, 0, math.nan, tol, positions)
    mismatch = replay["pick"] != replay["emitted"]
    n_mismatch = int(mismatch.sum())
    gaps = replay["gap"][mismatch]
    max_gap = float(gaps.max()) if gaps.size else math.nan
    if temperature > 0:
        explained = within_reach(replay["u"][mismatch], replay["cdf_lo"][mismatch], replay["cdf_hi"][mismatch],
                                 tol, temperature)
    else:
        explained = gaps <= tol
    allowed = int(stats.poisson.ppf(FLIP_QUANTILE, control.flip_rate_bound * replay["pick"].size))
    positions = int(replay["pick"].size)
    if not explained.all():
        where = np.flatnonzero(mismatch)[np.flatnonzero(~explained)[0]]
        if temperature > 0:
            why = (f"keyed uniform {float(replay['u'][where]):.4f} outside the emitted token's CDF interval "
                   f"[{float(replay['cdf_lo'][where]):.4f}, {float(replay['cdf_hi'][where]):.4f}) even with "
                   f"every logit moved by the tolerance {tol:.3g}")
        else:
            why = f"logit gap {float(replay['gap'][where]):.3g} > tolerance {tol:.3g} ({control.greedy_basis})"
        reason = (f"seq {int(replay['seq'][where])} index {int(replay['index'][where])}: emitted "
                  f"{int(replay['emitted'][where])}, the baseline rule picks {int(replay['pick'][where])} ({why})")
        return Verdict(FAIL, reason, index, n_mismatch, max_gap, tol, positions)
    if n_mismatch > allowed:
        reason = (f"{n_mismatch} near-tie mismatches in {positions} positions; the noise control's flip "
                  f"rate allows {allowed}")
        return Verdict(FAIL, reason, index, n_mismatch, max_gap, tol, positions)
    if state:
        return Verdict(FAIL, state, index, n_mismatch, max_gap, tol, positions)
    if not n_mismatch:
        reason = "differs from the baseline run, yet every emitted token is the baseline rule's pick on replay"
    elif temperature > 0:
        distance = cdf_distance(replay["u"][mismatch], replay["cdf_lo"][mismatch], replay["cdf_hi"][mismatch])
        reason = (f"{n_mismatch} mismatch(es) in {positions} positions, each within the measured noise (largest "
                  f"distance of the keyed uniform from the emitted token's CDF interval {float(distance.max()):.3g}, "
                  f"within the reach of logit tolerance {tol:.3g} at T={temperature:g})")
    else:
        reason = (f"{n_mismatch} mismatch(es) in {positions} positions, each within the measured noise "
                  f"(largest logit gap {max_gap:.3g} <= tolerance {tol:.3g}, {control.greedy_basis})")
    return Verdict(NUMERIC, reason, index, n_mismatch, max_gap, tol, positions)


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


def record_noise(summary: dict, target_name: str, backend: str, on_rows: list[dict]) -> None:
    """Folds one cell's noise controls (traces.csv on-row columns) into the sweep's provenance
    summary per target model and backend: the largest noise seen, positions and flips summed."""
    entry = summary.setdefault(f"{target_name} [{backend}]", {
        "max_abs_delta": 0.0, "max_spread": 0.0, "positions": 0, "flips": 0, "cells": 0,
        "verdicts": {v: 0 for v in VERDICTS}, "safety": SAFETY,
        "what": "teacher-forced target logits, baseline 1-token steps vs k+1-token verify batches, same "
                "tokens, each cell's prompts and concurrency"})
    for row in on_rows:
        if row.get("noise_positions") is None:
            continue
        entry["max_abs_delta"] = max(entry["max_abs_delta"], float(row["noise_max_abs_delta"]))
        entry["max_spread"] = max(entry["max_spread"], float(row["noise_max_spread"]))
        entry["positions"] += int(row["noise_positions"])
        entry["flips"] += int(row["noise_flips"])
        entry["cells"] += 1
        entry["verdicts"][row["verdict"]] = entry["verdicts"].get(row["verdict"], 0) + 1
    entry["tolerance"] = SAFETY * entry["max_spread"]


def verdict_after_run(engine, prompts, base_tokens: list, spec_tokens: list, temperature: float, seed: int,
                      k: int, drafter: str = "") -> tuple[Verdict, NoiseControl]:
    """The whole check, called right after the speculative run (its KV cache is still there):
    the KV state first, then the noise control on the baseline's tokens (under a hidden-state
    drafter's target settings when `drafter` is one), then the verdict."""
    extents = cache_extents(engine, len(spec_tokens))
    pending = pending_state(engine, len(spec_tokens))
    clean_final: list = []
    control = measure_noise(engine, prompts, base_tokens, k, drafter, clean_final, temperature, seed)
    return judge(engine, prompts, base_tokens, spec_tokens, temperature, seed, control, pending, clean_final,
                 extents), control
