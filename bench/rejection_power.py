"""Power of the rejection rule's distributional verdict: how many emitted positions it needs to
fail each planted rejection-rule fault with >= 95 % probability, and how often it fails the
correct engine (the false-alarm rate it promises is lossless.DIST_ALPHA).

    python bench/rejection_power.py --models tiny -np 1,4,8
    python bench/rejection_power.py --models gemma -np 4 --pool 2048

For each pair, concurrency and fault (switched on with the C++ test-only `_inject_fault`), it pools
`--pool` emitted positions of `rejection` runs at T (seeds 0, 1, ...; lossless.rejection_run, as the
sweep's test: each emitted token placed in the p of its own verify row), then estimates
the failure rate at n positions by testing `--draws` random subsets of whole runs of the pool
(without replacement within a subset; subsets overlap, so rates near the pool size are optimistic).
Writes bench/results/rejection-power/<models>.md (the model sets joined by '-'; -o elsewhere).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from specnative import Engine, build_info, lossless
from specnative.lossless import distribution
from specnative.workloads import MIXED, Workload

FAULTS = ("none", "residual_from_p", "accept_q_over_p", "q_prev_position", "accept_always", "bonus_from_q")
SIZES = (128, 256, 512, 1024, 2048, 4096)


def pairs(names: list[str]) -> dict:
    out = {}
    for name in names:
        if name == "tiny":
            from specnative.models.presets import tiny_preset
            p = tiny_preset()
            out["tiny Q4_0 target, 2-layer Q8_0 draft"] = (p.targets[0], p.draft)
            out["tiny Q8_0 target, 2-layer Q8_0 draft"] = (p.targets[1], p.draft)
        elif name == "gemma":
            from specnative.models.presets import gemma_files
            files = gemma_files()
            out["gemma3-270m Q8_0 target, Q4_K_M draft"] = (files["Q8_0"], files["Q4_K_M"])
        elif name == "gemma-q4":
            from specnative.models.presets import gemma_files
            files = gemma_files()
            out["gemma3-270m Q4_K_M target, Q4_K_M draft (the same file)"] = (files["Q4_K_M"], files["Q4_K_M"])
        else:
            raise SystemExit(f"unknown model set {name!r} (tiny, gemma, gemma-q4)")
    return out


def pooled_runs(engine, prompts, fault: str, args) -> tuple[list, float, list]:
    """PIT intervals per run ({order: (lo, hi)}) until --pool positions,
    alpha over them, and each run's tokens (the keyed RNG makes a correct run at the same seed emit
    the same tokens, so a fault shows as changed tokens exactly where it changed a decision)."""
    rng = np.random.default_rng([0, 0x9E3779B9])
    runs, outputs, positions, drafted, accepted, seed = [], [], 0, 0, 0, 0
    engine._core._inject_fault(fault)
    try:
        while positions < args.pool:
            out, pits = lossless.rejection_run(engine, prompts, args.temp, 0, seed, rng, args.stress,
                                               n_predict=args.n_predict, k=args.k)
            drafted += out.totals["drafted"]
            accepted += out.totals["accepted"]
            outputs.append([list(map(int, t)) for t in out.tokens])
            runs.append(pits)
            positions += pits["target"][0].size
            seed += 1
    finally:
        engine._core._inject_fault("none")
    return runs, accepted / max(drafted, 1), outputs


def changed_share(outputs: list, reference: list) -> float:
    """Share of runs whose tokens differ from the correct engine's at the same seed."""
    pairs = list(zip(outputs, reference))
    return sum(a != b for a, b in pairs) / max(len(pairs), 1)


def failure_rate(runs: list, n: int, draws: int, rng) -> float | None:
    """Share of subsets of about n positions (whole runs) whose test fails; None: pool too small."""
    per_run = runs[0]["draft"][0].size
    take = max(1, -(-n // per_run))
    if take > len(runs):
        return None
    fails = 0
    for _ in range(draws):
        chosen = [runs[i] for i in rng.choice(len(runs), take, replace=False)]
        intervals = {order: [r[order] for r in chosen] for order in distribution.ORDERS}
        fails += not lossless.distribution_test(intervals, take).passed
    return fails / draws


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny")
    ap.add_argument("-np", "--concurrency", default="1,4,8")
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--pool", type=int, default=8192, help="positions pooled per pair, concurrency and fault")
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--no-stress", dest="stress", action="store_false",
                    help="every run at the user's draft temperature (the sweep drafts every other run hotter)")
    ap.add_argument("--pairs", default=None, help="only the pairs whose label contains this text")
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help="comma-separated, 'none' first (the reference for 'runs changed'; default: all)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, default=None)
    args = ap.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if args.faults.split(",")[0] != "none" or not set(args.faults.split(",")) <= set(FAULTS):
        raise SystemExit(f"--faults: 'none' first, then any of {', '.join(FAULTS[1:])}")
    sizes = [n for n in SIZES if n <= args.pool]
    command = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# Power of the rejection rule's distributional verdict ({time.strftime('%Y-%m-%d')})", "",
             f"Command: `python bench/rejection_power.py {command}`  ",
             f"Build: {build_info()['build_flags'].strip()} ({build_info()['backend']})  ",
             f"T {args.temp:g}, k {args.k}, n_predict {args.n_predict}, prompts: the built-in suite (task 'mixed'); "
             f"{'every other run drafts at ' + str(distribution.STRESS_DRAFT_FACTOR) + ' x T (as the sweep) ' if args.stress else 'every run at the draft temperature T (no stress runs)'}; "
             f"false-alarm rate per cell {lossless.DIST_ALPHA:g}; {args.draws} subsets of whole runs per size from a "
             f"pool of {args.pool} positions. Cells: share of subsets whose verdict is fail; **bold**: >= 95 %. "
             f"'runs changed': share of the pooled runs whose tokens differ from the correct engine's at the same "
             f"seed (the keyed RNG makes them equal where the fault changed no decision): a fault that changes "
             f"few runs barely changes the distribution, and no test can see what did not change.", ""]
    rng = np.random.default_rng(1)
    for label, (target, draft) in pairs(args.models.split(",")).items():
        if args.pairs and args.pairs not in label:
            continue
        for conc in concurrencies:
            lines += [f"## {label}, concurrency {conc}", "",
                      "| fault | alpha | runs changed | " + " | ".join(f"n={n}" for n in sizes) + " | fails >= 95 % from |",
                      "|---|---|---|" + "---|" * len(sizes) + "---|"]
            with Engine(target, draft, n_ctx=4096, n_batch=512, n_seq_max=conc, n_threads=args.threads) as engine:
                prompts, _ = Workload(target).token_prompts(MIXED, conc, 0)
                reference = None
                for fault in args.faults.split(","):
                    started = time.monotonic()
                    runs, alpha, outputs = pooled_runs(engine, prompts, fault, args)
                    reference = outputs if fault == "none" else reference
                    changed = changed_share(outputs, reference)
                    rates = [failure_rate(runs, n, args.draws, rng) for n in sizes]
                    cells = ["" if r is None else (f"**{r:.2f}**" if r >= 0.95 else f"{r:.2f}") for r in rates]
                    enough = next((n for n, r in zip(sizes, rates) if r is not None and r >= 0.95), None)
                    verdict = "(false alarms)" if fault == "none" else (f"{enough}" if enough else f"> {sizes[-1]}")
                    lines.append(f"| {fault} | {alpha:.3f} | {changed:.0%} | " + " | ".join(cells) + f" | {verdict} |")
                    print(f"{label} c={conc} {fault}: alpha {alpha:.3f} rates {rates} "
                          f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
                lines.append("")
    out = args.out or Path(__file__).parent / "results" / "rejection-power" / f"{args.models.replace(',', '-')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
