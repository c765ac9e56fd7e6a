"""The KV-state check on one MT-Bench cell of the Qwen pair, sequence by sequence: each
sequence's output length, whether an accepted end-of-generation draft left that token in the
target's cache, and how far the logits on the run's cache moved from a clean replay's (the check
fails a cell above its tolerance, 5-6 here). The check once fed such a token again after
itself: 8.7 on the first reasoning batch before the fix (commit ef2a0df), 0.74 after.

    python bench/kv_state_eog.py --category reasoning --batch 0 [-k 6] [-t 1]

Prints a markdown table; the kept output is bench/results/public-sets-qwen/kv-state-eog.md. Needs
the qwen2.5-coder preset's files (`specnative models fetch qwen2.5-coder`).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from specnative import lossless
from specnative.engine import Engine
from specnative.models import presets
from specnative.run import workloads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--category", default="reasoning")
    ap.add_argument("--batch", type=int, default=0, help="the cell's batch of 4 items (turn 1 first)")
    ap.add_argument("-k", type=int, default=6)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args(argv)
    files = presets.qwen_files()
    target, draft = files["Q4_K_M"], files["draft"]
    workload = workloads.dataset_workload("mt-bench", target, n_predict=args.n)
    with Engine(target, draft, n_ctx=4096, n_batch=512, n_threads=args.threads, n_seq_max=4, kv_unified=True) as engine:
        workload.answer_with(engine)
        prompts, chosen = workload.cell_prompts(args.category, 4, 0, args.batch)
        base = engine.generate(prompts, n_predict=args.n)
        spec = engine.generate(prompts, n_predict=args.n, spec=True, k=args.k, accept_rule="greedy")
        extents = lossless.cache_extents(engine, len(prompts))
        pending = lossless.pending_state(engine, len(prompts))
        replay = engine._core.replay(prompts, [list(map(int, t)) for t in spec.tokens], 0.0, 0)
    print(f"MT-Bench {args.category}, batch {args.batch}, k={args.k}: {', '.join(p.ident for p in chosen)}")
    print("| seq | item | tokens | same as baseline | EOG draft in cache | state moved |")
    print("|---|---|---|---|---|---|")
    for s, (prompt, out, extent) in enumerate(zip(prompts, spec.tokens, extents)):
        moved = np.asarray(pending[s], np.float64) - np.asarray(replay["final_logits"][s], np.float64)
        print(f"| {s} | {chosen[s].ident} | {len(out)} | {np.array_equal(out, base.tokens[s])} | "
              f"{extent == len(prompt) + len(out)} | {moved.max() - moved.min():.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
