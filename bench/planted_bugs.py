"""Planted bugs vs the lossless verdict, on a real model: every planted bug must end as `fail`,
the correct engine never.

    python bench/planted_bugs.py --models gemma -np 4 -n 48      # Gemma 3 270M Q8_0 / Q4_K_M
    python bench/planted_bugs.py --models tiny
    python bench/planted_bugs.py --models gemma-q4 -np 4 -n 32   # the widest noise tolerance

For each pair, concurrency and temperature (greedy, and T=0.8 with the `match` rule), the script
runs the baseline, then the speculative loop with each fault switched on (the C++ test-only
switch `_inject_fault`), and judges it with specnative.lossless (noise control at the cell's
shape, forced replay). Writes bench/results/planted-bugs/<models>.md (the model sets joined by '-';
-o elsewhere).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specnative import Engine, build_info, lossless
from specnative.run.workloads import MIXED, Workload

FAULTS = ("none", "rollback_short", "rollback_long", "verify_position", "seed_mixup", "bonus_from_q")


def exercised(fault: str, spec, k: int) -> bool:
    """Whether the run met the fault's trigger, from its exact counts: a fault that never fired
    leaves a correct run (nothing to catch). rollback_long needs a round that rejected with two
    or more drafts left; bonus_from_q a fully accepted round; the others fire every round."""
    hist = spec.totals["accept_len_hist"]
    if fault == "rollback_long":  # needs a rejection (short rounds near n_predict also fill low bins)
        return bool(spec.totals["rejected"] > 0 and hist[: max(k - 1, 0)].sum() > 0)
    if fault == "bonus_from_q":
        return bool(hist[k] > 0)
    return fault != "none"
SAMPLING_ONLY = {"seed_mixup"}  # greedy draws no random numbers


def pairs(names: list[str]) -> dict:
    out = {}
    for name in names:
        if name == "tiny":
            from specnative.models.presets import tiny_preset
            p = tiny_preset()
            out["tiny (Q8_0 target, 2-layer draft)"] = (p.targets[1], p.draft)
        elif name == "gemma":
            from specnative.models.presets import gemma_files
            files = gemma_files()
            out["gemma3-270m (Q8_0 target, Q4_K_M draft)"] = (files["Q8_0"], files["Q4_K_M"])
        elif name == "gemma-q4":  # the widest noise tolerance measured (Q4_K_M: 1.4 Intel, 2.6-2.9 AMD)
            from specnative.models.presets import gemma_files
            files = gemma_files()
            out["gemma3-270m (Q4_K_M target, Q4_K_M draft: the same file)"] = (files["Q4_K_M"], files["Q4_K_M"])
        else:
            raise SystemExit(f"unknown model set {name!r} (tiny, gemma, gemma-q4)")
    return out


def run(engine, prompts, fault, k, n_predict, temperature, seed):
    rule = "greedy" if temperature == 0 else "match"
    base = engine.generate(prompts, n_predict=n_predict, temperature=temperature, seed=seed)
    engine._core._inject_fault(fault)
    try:
        spec = engine.generate(prompts, n_predict=n_predict, temperature=temperature, seed=seed, spec=True,
                               k=k, accept_rule=rule)
    finally:
        engine._core._inject_fault("none")
    verdict, control = lossless.verdict_after_run(engine, prompts, base.tokens, spec.tokens, temperature, seed, k)
    return verdict, control, spec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,gemma")
    ap.add_argument("-np", "--concurrency", type=int, default=4)
    ap.add_argument("-n", "--n-predict", type=int, default=48)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--temps", default="0,0.8")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, default=None)
    args = ap.parse_args(argv)
    temps = [float(t) for t in args.temps.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    lines = [f"# Planted bugs vs the lossless verdict ({time.strftime('%Y-%m-%d')})", "",
             f"Command: `python bench/planted_bugs.py {' '.join(sys.argv[1:] if argv is None else argv)}`  ",
             f"Build: {build_info()['build_flags'].strip()} ({build_info()['backend']})  ",
             f"Concurrency {args.concurrency}, k {args.k}, n_predict {args.n_predict}, prompts: the built-in "
             f"suite, categories in turn (task 'mixed'). Tolerance = {lossless.SAFETY} x the control's max spread over each "
             f"position's candidates at greedy (lossless.NoiseControl.greedy_tolerance), over the whole vocabulary "
             f"at T > 0. The KV-state check includes the cache's extent (lossless.cache_problem).", ""]
    caught, missed, false_alarms, idle = 0, [], [], []
    for label, (target, draft) in pairs(args.models.split(",")).items():
        lines += [f"## {label}", "", "| T | seed | fault | fired | verdict | mismatches | max gap | tolerance | "
                  "noise max abs / spread / candidates' spread / flips | alpha | reason |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        with Engine(target, draft, n_ctx=4096, n_batch=512, n_seq_max=args.concurrency,
                    n_threads=args.threads) as engine:
            prompts, _ = Workload(target).token_prompts(MIXED, args.concurrency, 0)
            for temperature in temps:
                for seed in seeds if temperature > 0 else seeds[:1]:
                    for fault in FAULTS:
                        if fault in SAMPLING_ONLY and temperature == 0:
                            continue
                        v, c, spec = run(engine, prompts, fault, args.k, args.n_predict, temperature, seed)
                        print(f"{label} T={temperature} seed={seed} {fault}: {v.verdict} ({v.reason})",
                              file=sys.stderr, flush=True)
                        if fault == "none" and v.verdict == lossless.FAIL:
                            false_alarms.append(f"{label} T={temperature} seed={seed}")
                        elif fault != "none":
                            if v.verdict == lossless.FAIL:
                                caught += 1
                            elif exercised(fault, spec, args.k):
                                missed.append(f"{label} T={temperature} seed={seed} {fault}")
                            else:
                                idle.append(f"{label} T={temperature} seed={seed} {fault}")
                        fired = "yes" if exercised(fault, spec, args.k) else "no"
                        lines.append(f"| {temperature:g} | {seed} | {fault} | {fired} | **{v.verdict}** | {v.mismatches} | "
                                     f"{v.max_mismatch_gap:.3g} | {v.tolerance:.3g} | {c.max_abs_delta:.3g} / "
                                     f"{c.max_spread:.3g} / {c.max_candidate_spread:.3g} / {c.flips} | {spec.draft_accept_rate:.3f} | "
                                     f"{v.reason} |")
        lines.append("")
    lines += ["## Summary", "", f"- planted bugs caught (fail): {caught}, missed: {len(missed)} "
              f"{'(' + '; '.join(missed) + ')' if missed else ''}",
              f"- correct engine judged fail: {len(false_alarms)} {'; '.join(false_alarms)}",
              f"- faults whose trigger never occurred in the run (a correct run; nothing to catch): "
              f"{'; '.join(idle) or 'none'}", ""]
    out = args.out or Path(__file__).parent / "results" / "planted-bugs" / f"{args.models.replace(',', '-')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print(out)
    return 0 if not missed and not false_alarms else 1


if __name__ == "__main__":
    sys.exit(main())
