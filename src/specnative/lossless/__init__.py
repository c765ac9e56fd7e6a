"""Lossless verdicts of a speculative run: `exact`, `numeric`, `exact-dist` or `fail`.

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
   T > 0; never below float arithmetic's floor (noise.float_floor: a few float32 ulps of the
   largest logit), where a control that read exactly 0 would otherwise allow nothing. And the
   number of such near-tie mismatches must be what the control's flip rate (of the
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
from specnative.lossless.distribution import (
                                              DIST_ALPHA,
                                              DistributionTest,
                                              distribution_test,
                                              rejection_distribution,
                                              rejection_run,
)
from specnative.lossless.noise import SAFETY, NoiseControl, control_tokens, measure_noise
from specnative.lossless.verdicts import (
                                              EXACT,
                                              EXACT_DIST,
                                              FAIL,
                                              NUMERIC,
                                              VERDICTS,
                                              Verdict,
                                              cache_extents,
                                              cache_problem,
                                              first_divergence,
                                              judge,
                                              pending_state,
                                              state_problem,
                                              verdict_after_run,
)

__all__ = ["DIST_ALPHA", "DistributionTest", "distribution_test", "rejection_distribution", "rejection_run", "SAFETY",
           "NoiseControl", "control_tokens", "measure_noise", "EXACT", "EXACT_DIST", "FAIL", "NUMERIC", "VERDICTS",
           "Verdict", "cache_extents", "cache_problem", "first_divergence", "judge", "pending_state", "state_problem",
           "verdict_after_run"]
