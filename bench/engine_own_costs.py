#!/usr/bin/env python3
"""Where the engine's own time and the KV removal go, measured on this host:

1. the sampling kernels over a 262,144-token vocabulary (Gemma's), called through the test
   bindings (so each figure includes a Python call and, for the softmax, a numpy copy);
2. a rollback's KV removal against the cache size: the tiny preset's Q4_0 target (α ≈ 0.35,
   most rounds roll back), 4 sequences, the sweep's prompts, only n_ctx changed.

    python bench/engine_own_costs.py [-o bench/results/engine-own-time/kernels-and-kv-removal.md]

Medians over repeats; nothing else should run meanwhile.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from specnative import _core, sweep
from specnative.engine import Engine
from specnative.models import presets
from specnative.record.provenance import environment
from specnative.sweep import prompts as sweep_prompts


def kernel_rows(n: int = 262144, calls: int = 200) -> list[list[str]]:
    logits = (np.random.default_rng(1).standard_normal(n) * 3).astype(np.float32)
    probs = _core._softmax(logits, 0.8)

    def median_us(call) -> float:
        times = []
        for i in range(calls):
            t0 = time.perf_counter()
            call(i)
            times.append(time.perf_counter() - t0)
        return 1e6 * statistics.median(times)

    u = lambda i: (i + 0.5) / calls
    return [["argmax", f"{median_us(lambda i: _core._argmax(logits)):.0f}"],
            ["softmax with its table (normaliser + probabilities)", f"{median_us(lambda i: _core._softmax(logits, 0.8)):.0f}"],
            ["keyed draw from the softmax, no table (normaliser + walk)",
             f"{median_us(lambda i: _core._sample_softmax(logits, 0.8, u(i))):.0f}"],
            ["draw from a probability table (inverse CDF)",
             f"{median_us(lambda i: _core._sample_from_weights(probs, u(i))):.0f}"]]


def removal_rows(n_ctxs=(1024, 2048, 4096, 8192, 33792), concurrency: int = 4, runs: int = 40) -> list[list[str]]:
    preset = presets.tiny_preset()
    target = next(t for t in preset.targets if "Q4_0" in str(t))
    cfg = sweep.SweepConfig(targets=[target], draft=preset.draft, n_predict=32)
    prompts = sweep_prompts.workload_for(cfg, target).cell_prompts("mixed", concurrency, 0)[0]
    rows = []
    for n_ctx in n_ctxs:
        with Engine(target, preset.draft, n_ctx=n_ctx, n_threads=2, n_seq_max=concurrency) as engine:
            results = [engine.generate(prompts, n_predict=32, k=4, spec=True) for _ in range(runs)]
        per_round = lambda r, ms: 1000 * ms / r.steps
        rows.append([str(n_ctx), f"{results[-1].draft_accept_rate:.2f}",
                     f"{statistics.median(r.round_ms for r in results):.2f}",
                     f"{statistics.median(per_round(r, r.times['kv_removal']) for r in results):.1f}",
                     f"{statistics.median(per_round(r, r.engine_own['engine_own_ms']) for r in results):.1f}",
                     f"{100 * statistics.median(r.engine_own['engine_own_share'] for r in results):.2f} %"])
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-ctx", default="1024,2048,4096,8192,33792", help="cache sizes of the KV removal rows")
    ap.add_argument("--runs", type=int, default=40, help="speculative runs per cache size")
    ap.add_argument("--calls", type=int, default=200, help="calls per sampling kernel")
    ap.add_argument("-o", "--out", type=Path, default=Path(__file__).parent / "results" / "engine-own-time" / "kernels-and-kv-removal.md")
    args = ap.parse_args(argv)
    try:
        n_ctxs = [int(n) for n in args.n_ctx.split(",")]
    except ValueError:
        ap.error(f"--n-ctx: comma-separated integers, not {args.n_ctx!r}")
    if args.runs < 1 or args.calls < 1 or min(n_ctxs) < 256:
        ap.error("--runs and --calls must be >= 1 and every --n-ctx >= 256")
    command = " ".join(["python bench/engine_own_costs.py", *(sys.argv[1:] if argv is None else argv)])
    env = environment()
    kernels = kernel_rows(calls=args.calls)
    removal = removal_rows(tuple(n_ctxs), runs=args.runs)
    text = "\n\n".join([
        f"# The engine's own costs ({time.strftime('%Y-%m-%d %H:%M')}, {env.get('cpu_model', platform.processor())})",
        f"`{command}` (medians; nothing else running).",
        "Sampling kernels over 262,144 float logits, through the test bindings (each figure includes "
        "a Python call; the softmax also a numpy copy of its 1 MB table):",
        table(["kernel", "µs per call"], kernels),
        "A rollback's KV removal (llama_memory_seq_rm on target and draft, timed apart as "
        "`times['kv_removal']`, counted inside llama.cpp) against the cache size: tiny preset Q4_0 "
        "target, 4 sequences, the sweep's `mixed` prompts, k = 4, 2 threads. The sweep sizes each "
        "context length's cache for its own cells (3.5k cells for the tiny preset's ctx 0); with one "
        "cache for the whole grid a ctx-0 cell rolled back in 36k cells.",
        table(["n_ctx (cells)", "α", "round, ms", "KV removal, µs per round", "engine's own, µs per round",
               "engine's own share"], removal),
    ]) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
