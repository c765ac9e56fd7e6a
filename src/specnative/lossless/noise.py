"""The noise control: the target's own numeric noise between the baseline's batch shape (one position
per sequence per decode) and a verify batch's (k+1), teacher-forced over the same tokens. Its
spreads set the tolerances of the verdicts (verdicts.py)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from specnative.engine import HIDDEN_DRAFTERS, native

# The tolerance is this many times the largest gap movement the control saw: the control samples
# a few hundred positions, the run's own wobble can exceed its maximum somewhat.
SAFETY = 1.25


# Candidates of a logit comparison: the tokens within this many times the measured spread of the
# top (the C++ core's constant, used by its per-position control too).
CANDIDATE_WINDOW = float(native.candidate_window)


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


# Float arithmetic's floor under every tolerance, in units of the float32 epsilon times the largest
# |logit| (the logits and every accumulator are float32, whatever the weights' type). The control can
# read exactly 0: both of its shapes ran the same kernels in the same order (an F16 target at
# concurrency 2), while the run's cache, laid out otherwise by rollbacks, still sums attention in
# another order, and a tolerance of 0 then calls a 1-ulp movement a bug. The tiny F32 pair's correct
# runs moved their KV-state logits a median 10 of these units (at most 209, where the control saw
# the batch-shape noise behind it); a stale or lost cache entry moved them 860000 or more.
FLOAT_FLOOR_UNITS = 64
LOGIT_EPS = float(np.finfo(np.float32).eps)


def float_floor(logit_scale: float) -> float:
    """The least tolerance any logit comparison gets: what float32 rounding alone can move a logit
    gap by when the same sums run in another order, at logits of magnitude `logit_scale`."""
    return FLOAT_FLOOR_UNITS * LOGIT_EPS * float(logit_scale)


# Near-tie mismatches allowed: the 99.9 % Poisson quantile of the control's flip rate (upper
# bound by the rule of three when it saw none) times the positions checked.
FLIP_QUANTILE = 0.999


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
    # The spread over each position's candidates (native.logit_spread): the tokens within
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
    # The largest |logit| of the control's clean replay: the scale of float_floor, the least every
    # tolerance is (0: not measured, no floor).
    logit_scale: float = 0.0
    # The cache-layout control (layout_spread), measured only where the KV-state check would fail
    # without it (judge): the run's cache lays its cells out otherwise than the control's fresh
    # ones, and where they sit changes how attention sums group (0: not measured).
    max_layout_spread: float = 0.0

    @property
    def floor(self) -> float:
        return float_floor(self.logit_scale)

    @property
    def tolerance(self) -> float:
        """For decisions that weigh the whole vocabulary (T > 0: CDF masses, the distribution test)."""
        return max(SAFETY * self.max_spread, self.floor)

    @property
    def greedy_tolerance(self) -> float:
        """For a greedy choice: it depends on the gaps between candidates only. A correct run emits
        b over the replay's pick a only if its noise moved l_b - l_a by the gap; both lie within the
        noise's reach of the top, so the candidates' spread bounds that movement."""
        return max(SAFETY * (self.max_candidate_spread if self.candidates_measured else self.max_spread), self.floor)

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
        # up to 2.7x the control on the tiny models, hence STATE_FACTOR; where that is not enough,
        # the layout control itself (max_layout_spread: up to 5.6x the state control on the tiny
        # F32 target with the prefix cache off, and within the layout control).
        return max(STATE_FACTOR * SAFETY * max(self.max_state_spread, self.max_spread, self.max_layout_spread),
                   self.floor)

    @property
    def flip_rate_bound(self) -> float:
        """Upper bound on the per-position flip rate (rule of three when no flip was seen)."""
        return (self.flips + 3) / max(self.positions, 1)

    def as_dict(self) -> dict:
        return {**asdict(self), "tolerance": self.tolerance, "greedy_tolerance": self.greedy_tolerance,
                "state_tolerance": self.state_tolerance, "floor": self.floor}


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
        candidate_positions=int(np.count_nonzero(candidates > 0)),
        logit_scale=max((float(np.abs(f).max(initial=0.0)) for f in raw["final_logits_a"]), default=0.0))


def control_tokens(prompt: list, tokens: list, at_least: int) -> list:
    """The control's continuation of one sequence: its tokens, lengthened to `at_least` with the
    prompt's own last tokens (natural text; the control measures batch-shape noise, which does not
    depend on which tokens are fed)."""
    missing = at_least - len(tokens)
    if missing <= 0 or not prompt:
        return tokens
    tail = (list(prompt) * (missing // len(prompt) + 1))[-missing:]
    return tokens + tail


def layout_spread(engine, prompts: list, base: list) -> float:
    """The cache-layout control: how far the logits after the same tokens move when a sequence's
    cells sit beside other sequences' in the unified cache (in the group's order and reversed)
    rather than alone. Attention sums run over the buffer with the others' cells masked, so where
    a sequence's cells sit changes the vector lanes its sums are grouped in; serving moves cells
    around as slots empty and refill, and a closed-loop run's rollbacks leave holes that later
    cells fill. Measured up to 0.15 logits on the tiny Q4_0 target, where the batch-shape control
    reads 0; on the tiny F32 target 1.0-1.5e-4, where the KV-state control read 1e-5."""
    alone = [engine._core.replay([p], [b], 0.0, 0)["final_logits"][0] for p, b in zip(prompts, base)]
    spread = 0.0
    for order in (list(range(len(prompts))), list(range(len(prompts)))[::-1]):
        together = engine._core.replay([prompts[i] for i in order], [base[i] for i in order], 0.0, 0)["final_logits"]
        for at, i in enumerate(order):
            delta = np.asarray(together[at], np.float64) - np.asarray(alone[i], np.float64)
            spread = max(spread, float(delta.max() - delta.min()))
    return spread
