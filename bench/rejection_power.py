"""Power of the rejection rule's distributional verdict: how often it fails each planted
rejection-rule fault at n emitted positions, with every statistic (lossless.distribution: the
emitted tokens, the bonus tokens, the acceptance decisions and count, the residual draws) and with
the emitted tokens' PIT alone (the statistics "target" and "draft", the test before the decisions
were recorded); and how often it fails the correct engine (the false-alarm rate it promises is
lossless.DIST_ALPHA).

    python bench/rejection_power.py --models near,damped,tiny,noisy -np 1,4 --temps 0.7,1.2 --null-pool 32768
    python bench/rejection_power.py --models gemma -np 4 --temps 0.7,1.2 --pool 4096
    python bench/rejection_power.py --models noisy,noisy-peaked --draft-shape tree:topk=3,depth=4,budget=8 -np 4

A model set spelled NAME-peaked is NAME's pair with every logit of both models scaled by
PEAKED_GAIN (4): the top tokens carry real mass (a tree node's first child ~29 % of q instead of
~0.4 %), where the faults of recursive rejection over siblings show. It runs as NAME's files at
T / PEAKED_GAIN: scaling logits by a power of two is exact in float, so the engine computes the
same bits as with scaled output weights (its softmax reads logits / T only).

For each pair, concurrency, temperature and fault (switched on with the C++ test-only
`_inject_fault`; a draft tree's own faults with --draft-shape tree:...), it pools `--pool` emitted positions of `rejection` runs (seeds 0, 1, ...;
lossless.rejection_run, as the sweep's test, stress runs included), then estimates the failure rate
at n positions by testing `--draws` random subsets of whole runs of the pool (without replacement
within a subset; subsets overlap, so rates near the pool size are optimistic), and tests the pool's
disjoint blocks of 4096 positions (the default cell size) on their own. With --null-pool N, the
correct engine's own pool of N positions is cut into disjoint tests per size (no overlap: the
false-alarm rate's honest estimate). Writes bench/results/rejection-power/<models>.md (-o elsewhere).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

import numpy as np

from specnative import Engine, build_info, lossless
from specnative.engine import parse_draft_shape
from specnative.lossless import distribution
from specnative.record.provenance import environment
from specnative.run.workloads import MIXED, Workload
from specnative.sweep import SweepConfig

FAULTS = ("none", "residual_from_p", "accept_q_over_p", "q_prev_position", "accept_always", "bonus_from_q")
TREE_FAULTS = ("none", "tree_residual_stale", "tree_sibling_twice", "tree_bonus_wrong_node",
               "tree_siblings_with_replacement", "tree_sibling_one_uniform")
SIZES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
DEFAULT_SIZE = SweepConfig.dist_positions  # the sweep's --dist-positions
MODEL_SETS = ("near", "damped", "tiny", "noisy", "gemma")
PEAKED_GAIN = 4.0  # a power of two: logits * gain at T is the pair at T / gain, bit for bit
PEAKED = "-peaked"


def pair(name: str, directory: Path) -> tuple[str, Path, Path]:
    """(label, target, draft) of one model set."""
    from specnative.models import tiny_pair
    if name == "near":
        return ("near-copy: 4-layer f32 target (2 damped layers) over its 2-layer base",
                *tiny_pair(directory, "deep", extra_layers=2))
    if name == "damped":
        return ("near-copy: 4-layer f32 target (2 layers damped to 0.05) over its 2-layer base",
                *tiny_pair(directory, "deep", extra_layers=2, extra_damping=0.05))
    if name == "tiny":
        from specnative.models.presets import TINY_EXTRA_LAYERS, tiny_preset
        p = tiny_preset()
        return (f"near-copy: tiny preset, Q8_0 target ({TINY_EXTRA_LAYERS} damped layers) over its 2-layer Q8_0 base",
                p.targets[1], p.draft)
    if name == "noisy":
        return ("noisy: f32 target, draft = target + 10 % weight noise", *tiny_pair(directory, "noisy", noise=0.1))
    from specnative.models.presets import gemma_files
    files = gemma_files()
    return "gemma3-270m Q8_0 target, Q4_K_M draft", files["Q8_0"], files["Q4_K_M"]


def pairs(names: list[str], directory: Path) -> dict:
    """label -> (target, draft, logit gain); unknown names refused before any file is written."""
    unknown = [n for n in names if n.removesuffix(PEAKED) not in MODEL_SETS or n == "gemma" + PEAKED]
    if unknown:
        raise SystemExit(f"unknown model set {unknown[0]!r} ({', '.join(MODEL_SETS)}, or a tiny one + '{PEAKED}')")
    out = {}
    for spelled in names:
        label, target, draft = pair(spelled.removesuffix(PEAKED), directory)
        if spelled.endswith(PEAKED):
            out[f"peaked (logits x {PEAKED_GAIN:g}) {label}"] = (target, draft, PEAKED_GAIN)
        else:
            out[label] = (target, draft, 1.0)
    return out


def pooled_runs(engine, prompts, fault: str, temp: float, pool: int, args) -> tuple[list, float, list]:
    """Each run's values (lossless.rejection_run) until `pool` positions, alpha over them, and each
    run's tokens (the keyed RNG makes a correct run at the same seed emit the same tokens, so a
    fault shows as changed tokens exactly where it changed a decision)."""
    rng = np.random.default_rng([0, 0x9E3779B9])
    runs, outputs, positions, drafted, accepted, seed = [], [], 0, 0, 0, 0
    engine._core._inject_fault(fault)
    try:
        while positions < pool:
            out, values = lossless.rejection_run(engine, prompts, temp, 0, seed, rng, args.stress,
                                                 n_predict=args.n_predict, **shape_of(args))
            drafted += out.totals["drafted"]
            accepted += out.totals["accepted"]
            outputs.append([list(map(int, t)) for t in out.tokens])
            runs.append(values)
            positions += values["target"][0].size
            seed += 1
    finally:
        engine._core._inject_fault("none")
    return runs, accepted / max(drafted, 1), outputs


def shape_of(args) -> dict:
    """generate()'s draft arguments: k for a chain, draft_shape for a tree."""
    return {"k": args.k} if args.draft_shape == "chain" else {"draft_shape": args.draft_shape}


def changed_share(outputs: list, reference: list) -> float:
    """Share of runs whose tokens differ from the correct engine's at the same seed."""
    both = list(zip(outputs, reference))
    return sum(a != b for a, b in both) / max(len(both), 1)


def tests_of(chosen: list) -> tuple:
    """The full test and the emitted tokens' PIT alone over the chosen runs."""
    tokens = {order: [r[order] for r in chosen if order in r] for order in distribution.ORDERS}
    return distribution.pooled_test(chosen), lossless.distribution_test({o: v for o, v in tokens.items() if v},
                                                                        len(chosen))


def runs_for(runs: list, n: int) -> int:
    per_run = np.mean([r["target"][0].size for r in runs])
    return max(1, int(np.ceil(n / per_run)))


def failure_rates(runs: list, n: int, draws: int, rng) -> tuple | None:
    """(full, tokens alone, the statistics that decided the full test's failures) over subsets of
    about n positions (whole runs); None: pool too small."""
    take = runs_for(runs, n)
    if take > len(runs):
        return None
    full = tokens = 0
    decided = collections.Counter()
    for _ in range(draws):
        test, token_test = tests_of([runs[i] for i in rng.choice(len(runs), take, replace=False)])
        full += not test.passed
        tokens += not token_test.passed
        decided[test.decided_by] += not test.passed
    return full / draws, tokens / draws, decided


def disjoint_tests(runs: list, n: int) -> list:
    """The pool cut into consecutive blocks of >= n positions (whole runs), each tested apart."""
    take = runs_for(runs, n)
    return [tests_of(runs[i:i + take]) for i in range(0, len(runs) - take + 1, take)]


def cell(rate: float | None) -> str:
    return "" if rate is None else (f"**{rate:.2f}**" if rate >= 0.95 else f"{rate:.2f}")


def fault_rows(engine, prompts, temp: float, args, sizes: list, rng) -> list[str]:
    """One row per fault at the engine temperature `temp` (a peaked pair's T / PEAKED_GAIN)."""
    lines = ["| fault | alpha | runs changed | " + " | ".join(f"n={n}" for n in sizes)
             + f" | {DEFAULT_SIZE}-position blocks: p (tokens alone) | decided by | fails >= 95 % from |",
             "|---|---|---|" + "---|" * len(sizes) + "---|---|---|"]
    reference = None
    for fault in args.faults.split(","):
        started = time.monotonic()
        runs, alpha, outputs = pooled_runs(engine, prompts, fault, temp, args.pool, args)
        reference = outputs if fault == "none" else reference
        rates = [failure_rates(runs, n, args.draws, rng) for n in sizes]
        cells = ["" if r is None else f"{cell(r[0])} ({r[1]:.2f})" for r in rates]
        blocks = disjoint_tests(runs, DEFAULT_SIZE)
        block_text = "; ".join(f"{t.p_value:.1e} ({tokens.p_value:.1e})" for t, tokens in blocks)
        decided = sum((r[2] for r in rates if r is not None), collections.Counter())
        decided_text = ", ".join(f"{name} {count}" for name, count in decided.most_common(3)) or "-"
        enough = next((n for n, r in zip(sizes, rates) if r is not None and r[0] >= 0.95), None)
        verdict = "(false alarms)" if fault == "none" else (f"{enough}" if enough else f"> {sizes[-1]}")
        lines.append(f"| {fault} | {alpha:.3f} | {changed_share(outputs, reference):.0%} | " + " | ".join(cells)
                     + f" | {block_text} | {decided_text} | {verdict} |")
        print(f"  T={temp:g} {fault}: alpha {alpha:.3f}, full/tokens {[r[:2] if r else None for r in rates]}, "
              f"blocks {block_text} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    return lines


def null_rows(engine, prompts, temp: float, args, sizes: list) -> list[str]:
    """The correct engine's false alarms over disjoint tests of its own pool of --null-pool positions."""
    runs, _, _ = pooled_runs(engine, prompts, "none", temp, args.null_pool, args)
    lines = [(f"Correct engine, T {temp:g}: {args.null_pool} positions cut into disjoint tests. Share of tests "
              f"whose combined p-value is below 0.1 / 0.01 / {lossless.DIST_ALPHA:g} (a valid test: at most about "
              f"that share), and the share of each statistic's own p below 0.01:"), "",
             "| n | tests | p < 0.1 | p < 0.01 | fail (p < alpha) | own p < 0.01, per statistic |",
             "|---|---|---|---|---|---|"]
    for n in sizes:
        tests = [t for t, _ in disjoint_tests(runs, n)]
        if len(tests) < 2:
            continue
        p = np.array([t.p_value for t in tests])
        own = {name: np.mean([t.p_of(name) < 0.01 for t in tests if t.of(name)]) for name in distribution.STATISTICS
               if any(t.of(name) for t in tests)}
        lines.append(f"| {n} | {len(tests)} | {np.mean(p < 0.1):.3f} | {np.mean(p < 0.01):.3f} | "
                     f"{np.mean(p < lossless.DIST_ALPHA):.3f} | "
                     + ", ".join(f"{name} {share:.3f}" for name, share in own.items()) + " |")
        print(f"  null T={temp:g} n={n}: {len(tests)} tests, p<0.01 {np.mean(p < 0.01):.3f}", file=sys.stderr, flush=True)
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="near,damped,tiny,noisy", help=f"comma-separated: {', '.join(MODEL_SETS)}")
    ap.add_argument("-np", "--concurrency", default="1,4")
    ap.add_argument("--temps", default="0.7,1.2")
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--pool", type=int, default=8192, help="positions pooled per pair, concurrency, T and fault")
    ap.add_argument("--null-pool", type=int, default=0,
                    help="also pool this many positions of the correct engine per pair and concurrency (first T) and "
                         "cut them into disjoint tests: the false-alarm rate without overlapping subsets")
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--no-stress", dest="stress", action="store_false",
                    help="every run at the user's draft temperature (the sweep drafts every other run hotter)")
    ap.add_argument("--pairs", default=None, help="only the pairs whose label contains this text")
    ap.add_argument("--draft-shape", default="chain",
                    help="'chain' (k drafts in a line) or a draft tree's spelling (tree:topk=3,depth=4,budget=8): "
                         "then the tree's own faults")
    ap.add_argument("--faults", default=None,
                    help="comma-separated, 'none' first (the reference for 'runs changed'; default: all of the "
                         "draft shape's)")
    ap.add_argument("--model-dir", type=Path, default=Path(__file__).parent / "scratch" / "rejection-power",
                    help="where the tiny pairs are written")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, default=None)
    args = ap.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    temps = [float(t) for t in args.temps.split(",")]
    try:
        shape = parse_draft_shape(args.draft_shape)
    except ValueError as e:
        raise SystemExit(f"--draft-shape: {e}") from None
    known = FAULTS if args.draft_shape == "chain" else TREE_FAULTS
    args.faults = args.faults or ",".join(known)
    if args.faults.split(",")[0] != "none" or not set(args.faults.split(",")) <= set(known):
        raise SystemExit(f"--faults: 'none' first, then any of {', '.join(known[1:])} ({args.draft_shape})")
    if not all(t > 0 for t in temps):
        raise SystemExit("--temps: the distributional test needs temperatures > 0")
    chosen = pairs(args.models.split(","), args.model_dir)  # unknown names refused before any run
    sizes = [n for n in SIZES if n <= args.pool]
    env = environment()
    command = " ".join(sys.argv[1:] if argv is None else argv)
    load = os.getloadavg()
    stress = (f"every other run drafts at {distribution.STRESS_DRAFT_FACTOR:g} x T (as the sweep)" if args.stress
              else "every run at the draft temperature T (no stress runs)")
    lines = [f"# Power of the rejection rule's distributional verdict ({time.strftime('%Y-%m-%d')})", "",
             f"Command: `python bench/rejection_power.py {command}`  ",
             f"Commit: {env['specnative_commit']} (llama.cpp {env['llama_cpp_commit']})  ",
             (f"Host: {env['cpu_model']}, {env['cpu_count']} cores, load average {load[0]:.1f} at the start; "
              f"{args.threads} thread(s)  "),
             f"Build: {build_info()['build_flags'].strip()} ({build_info()['backend']})  ",
             (f"{'k ' + str(args.k) if args.draft_shape == 'chain' else 'draft tree ' + shape.spelling}, "
              f"n_predict {args.n_predict}, prompts: the built-in suite (task 'mixed'); {stress}; "
              f"false-alarm rate per test {lossless.DIST_ALPHA:g}; {args.draws} subsets of whole runs per size from a "
              f"pool of {args.pool} positions."), "",
             (f"Cells: share of subsets whose verdict is fail with every statistic (**bold**: >= 95 %), and in "
              f"brackets with the emitted tokens' PIT alone (the test before decisions were recorded). "
              f"'{DEFAULT_SIZE}-position blocks': the combined p-value of each disjoint block of the pool (tokens "
              f"alone in brackets); fail below {lossless.DIST_ALPHA:g}. 'decided by': the statistics whose p-value "
              f"decided the failing subsets, most often first. 'runs changed': share of the pooled runs whose tokens "
              f"differ from the correct engine's at the same seed (the keyed RNG makes them equal where the fault "
              f"changed no decision)."), ""]
    rng = np.random.default_rng(1)
    for label, (target, draft, gain) in chosen.items():
        if args.pairs and args.pairs not in label:
            continue
        for conc in concurrencies:
            with Engine(target, draft, n_ctx=4096, n_batch=512, n_seq_max=conc * shape.ids_per_sequence,
                        n_threads=args.threads) as engine:
                prompts, _ = Workload(target).token_prompts(MIXED, conc, 0)
                for temp in temps:
                    run_at = "" if gain == 1.0 else f" (run at T {temp / gain:g})"
                    print(f"{label}, concurrency {conc}, T {temp:g}{run_at}", file=sys.stderr, flush=True)
                    lines += [f"## {label}, concurrency {conc}, T {temp:g}{run_at}", ""]
                    lines += fault_rows(engine, prompts, temp / gain, args, sizes, rng) + [""]
                if args.null_pool:
                    lines += [f"### False alarms: {label}, concurrency {conc}", ""]
                    lines += null_rows(engine, prompts, temps[0] / gain, args, sizes)
    lines.append(f"Load average at the end: {os.getloadavg()[0]:.1f}.")
    out = args.out or Path(__file__).parent / "results" / "rejection-power" / f"{args.models.replace(',', '-')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
