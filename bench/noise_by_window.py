"""How the target's batch-shape noise grows with the distance from the top, and how wide the
distributional test's PIT intervals stay: the figures behind lossless.MASS_WINDOWS_T.

    python bench/noise_by_window.py            # Gemma 3 270M Q4_K_M as its own draft, T 0.8

One rejection run (4 sequences, 32 tokens, seed 1, draft at 2 T as the sweep's stress runs) is
teacher-forced along 1-token steps and 5-token verify batches; per window W (in units of T) the
median and 90th percentile over positions of the logit spread over the tokens within W of the top,
the median mass beyond W, and the median width of the intersected PIT intervals per order.
"""
from __future__ import annotations

import numpy as np

from specnative import Engine, lossless
from specnative.presets import gemma_files
from specnative.workloads import MIXED, Workload

T, K, SEED = 0.8, 4, 1
WINDOWS_T = (3.0, 5.0, 8.0, 12.0, 20.0)


def main() -> None:
    target = gemma_files()["Q4_K_M"]
    with Engine(target, target, n_ctx=4096, n_batch=512, n_seq_max=4, n_threads=1) as engine:
        prompts = engine.to_token_prompts(Workload(target).token_prompts(MIXED, 4, 0)[0])
        out = engine.generate(prompts, n_predict=32, temperature=T, seed=SEED, spec=True, k=K,
                              accept_rule="rejection", draft_temperature=lossless.STRESS_DRAFT_FACTOR * T)
        tokens = [list(map(int, t)) for t in out.tokens]
        windows = [w * T for w in WINDOWS_T]
        raw = engine._core.numeric_noise(prompts, tokens, 1, K + 1, mass_windows=windows)
        tails = engine._core.replay(prompts, tokens, T, SEED, mass_windows=windows)["tail_mass"]
        print(f"| window | spread median | spread q90 | mass beyond, median |\n|---|---|---|---|")
        for w, spread, tail in zip(WINDOWS_T, raw["window_spread"], tails):
            print(f"| {w:g} T | {np.median(spread):.3f} | {np.quantile(spread, 0.9):.3f} | {np.median(tail):.4f} |")
        print(f"| whole vocabulary | {np.median(raw['spread']):.3f} | {np.quantile(raw['spread'], 0.9):.3f} | 0 |")
        pits = lossless.run_pit_intervals(engine, prompts, tokens, T, SEED, K, "model", np.random.default_rng(0))
        for order in lossless.ORDERS:
            lo, hi = pits[order]
            print(f"PIT interval width, {order} order: median {np.median(hi - lo):.3f}, q90 {np.quantile(hi - lo, 0.9):.3f}")


if __name__ == "__main__":
    main()
