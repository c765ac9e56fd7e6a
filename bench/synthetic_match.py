#!/usr/bin/env python3
"""Does synthetic acceptance stand in for a real drafter? At synthetic per-position rates equal to
a real drafter's measured ones, the speedup should equal that drafter's.

Per drafter: one calibration run measures the real drafter's unconditional acceptance rate at
each draft position (accepted_at / drafted_at, made non-increasing); then repeats run spec off,
the real drafter and the same drafter under `rates:` of those values, interleaved (the order
rotates from repeat to repeat), and the paired intervals compare the two speedups
(stats.speedup_interval: synthetic / real over the same repeats; it should contain 1).

    python bench/synthetic_match.py --preset tiny --drafter model -np 1,4 -n 64 --repeats 8
    python bench/synthetic_match.py --preset gemma3-270m --drafter model,ngram-simple -n 64 --repeats 8 \
        --out bench/results/synthetic-acceptance/match-gemma3-270m.md
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from specnative import Engine
from specnative.analysis import stats
from specnative.engine import synthetic
from specnative.models.registry import load_preset
from specnative.record.provenance import cpu_model
from specnative.sweep import SweepConfig
from specnative.sweep.config import Cell
from specnative.sweep.prompts import build_prompts

ROOT = Path(__file__).resolve().parent.parent
NGRAM_OPTIONS = {}  # llama.cpp's defaults



def per_position_rates(result, k: int) -> list[float]:
    """The run's unconditional acceptance rate at draft positions 1..k, made non-increasing (a
    position not drafted at all takes the previous one's rate)."""
    t = result.totals
    rates, last = [], 1.0
    for a, d in zip(t["accepted_at"], t["drafted_at"]):
        rate = a / d if d else last
        last = min(last, rate)
        rates.append(last)
    return rates[:k]


def steady(run) -> float:
    return run.steady["tps"]


def measure(engine, prompts, drafter: str, k: int, n_predict: int, repeats: int) -> dict:
    common = dict(n_predict=n_predict, drafter=drafter, drafter_options=NGRAM_OPTIONS if drafter != "model" else None)
    # (n_predict in common: the spec runs; the off runs pass it themselves)
    engine.generate(prompts, n_predict=n_predict)  # warm-up: caches, first graphs
    calibration = engine.generate(prompts, spec=True, k=k, **common)
    if calibration.totals["drafted"] == 0:
        return {"drafter": drafter, "skipped": "the drafter proposed nothing on these prompts"}
    rates = per_position_rates(calibration, k)
    profile = synthetic.parse_profile("rates:" + "/".join(f"{r:.4f}" for r in rates))
    # a seed per repeat: the synthetic draws are new each repeat (greedy output does not depend on it)
    kinds = {"off": lambda seed: engine.generate(prompts, n_predict=n_predict, seed=seed),
             "real": lambda seed: engine.generate(prompts, spec=True, k=k, seed=seed, **common),
             "synthetic": lambda seed: engine.generate(prompts, spec=True, k=k, synthetic=profile, seed=seed, **common)}
    kinds["real"](0)
    kinds["synthetic"](0)  # warm-up of both spec paths
    order = list(kinds)
    runs = {name: [] for name in kinds}
    for r in range(repeats):
        for name in order[r % 3:] + order[:r % 3]:  # rotate: no side is always first after the others
            runs[name].append(kinds[name](r + 1))
    off = [steady(x) for x in runs["off"]]
    real = [steady(x) for x in runs["real"]]
    syn = [steady(x) for x in runs["synthetic"]]
    pooled = lambda name, key: sum(np.asarray(x.totals[key], dtype=float) for x in runs[name])  # noqa: E731
    real_at = pooled("real", "accepted_at") / np.maximum(pooled("real", "drafted_at"), 1)
    syn_at = pooled("synthetic", "accepted_at") / np.maximum(pooled("synthetic", "drafted_at"), 1)
    tok = lambda name: float(np.mean([x.token_accept_rate for x in runs[name]]))  # noqa: E731
    iv = lambda on, base: stats.speedup_interval(on, base)  # noqa: E731
    return {"drafter": drafter, "profile": profile.text, "requested_rates": rates,
            "real_rates": real_at.tolist(), "synthetic_rates": syn_at.tolist(),
            "real_alpha": tok("real"), "synthetic_alpha": tok("synthetic"),
            "real_reach": (pooled("real", "drafted_at") / sum(x.totals["rounds"] for x in runs["real"])).tolist(),
            "synthetic_reach": (pooled("synthetic", "drafted_at")
                                / sum(x.totals["rounds"] for x in runs["synthetic"])).tolist(),
            "speedup_real": iv(real, off).__dict__, "speedup_synthetic": iv(syn, off).__dict__,
            "synthetic_over_real": iv(syn, real).__dict__, "tps": {"off": off, "real": real, "synthetic": syn}}


def fmt_iv(iv: dict) -> str:
    return f"{iv['estimate']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}]"


def report(results: list, args, command: str, commit: str, seconds: float) -> str:
    lines = [f"# Synthetic acceptance at a real drafter's own rates: {args.label}", "",
             "At synthetic per-position rates equal to a real drafter's measured ones, is the speedup the "
             "drafter's? Per drafter and concurrency: a calibration run gives the drafter's unconditional "
             "acceptance rate at each position (made non-increasing); then spec off, the real drafter and the "
             "same drafter under `rates:` of those values run interleaved (order rotated per repeat). "
             "Speedups are paired geometric-mean ratios with 95 % t intervals over the repeats "
             "(specnative.analysis.stats.speedup_interval); synthetic / real is paired the same way and should contain 1.",
             "", f"Command: `{command}`", "", f"Commit: `{commit}`", "",
             f"Host: {cpu_model()}, {os.cpu_count()} cores, {args.threads} threads; load average {args.loads[0]:.1f} "
             f"at the start and {args.loads[1]:.1f} at the end (other jobs on the host widen the intervals). "
             f"Wall time {seconds:.0f} s.", "",
             "| target | drafter | np | k | requested rates (real, calibration) | realised real | realised synthetic "
             "| alpha real / synthetic | speedup real | speedup synthetic | synthetic / real | contains 1 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['target']} | {r['drafter']} | {r['np']} | {r['k']} | {r['skipped']} | | | | | | | |")
            continue
        ratio = r["synthetic_over_real"]
        inside = ratio["low"] <= 1.0 <= ratio["high"]
        rates = lambda xs: "/".join(f"{x:.2f}" for x in xs)  # noqa: E731
        lines.append(f"| {r['target']} | {r['drafter']} | {r['np']} | {r['k']} | {rates(r['requested_rates'])} | "
                     f"{rates(r['real_rates'])} | {rates(r['synthetic_rates'])} | {r['real_alpha']:.3f} / "
                     f"{r['synthetic_alpha']:.3f} | {fmt_iv(r['speedup_real'])} | {fmt_iv(r['speedup_synthetic'])} | "
                     f"{fmt_iv(ratio)} | {'yes' if inside else '**no**'} |")
    lines += ["", "Realised rates are pooled over the timed repeats (accepted_at / drafted_at). An n-gram "
              "drafter's draft lengths follow the text: keeping drafts at random changes the text, so its reach "
              "(rounds that drafted position j) can differ between the real and the synthetic runs; the json "
              "file beside this one has both reaches and every repeat's tokens/s.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=None)
    p.add_argument("-m", "--target", type=Path, default=None)
    p.add_argument("-md", "--draft", type=Path, default=None)
    p.add_argument("--drafter", default="model")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("-np", "--concurrency", default="1")
    p.add_argument("-n", "--n-predict", type=int, default=64)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.preset:
        preset = load_preset(args.preset)
        target, draft = Path(preset.targets[0]), Path(preset.draft) if preset.draft else None
    else:
        target, draft = args.target, args.draft
    args.label = args.preset or target.name
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    drafters = args.drafter.split(",")
    command = "python bench/synthetic_match.py " + " ".join(sys.argv[1:] if argv is None else argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    t0 = time.time()
    start_load = os.getloadavg()[0]
    results = []
    cfg = SweepConfig(targets=[target], draft=draft, n_predict=args.n_predict, threads=args.threads)
    with Engine(target, draft, n_ctx=8192, n_batch=512, n_threads=args.threads,
                n_seq_max=max(concurrencies)) as engine:
        for conc in concurrencies:
            prompts = build_prompts(engine, Cell(target, 0, conc, 0.0), cfg)
            for drafter in drafters:
                print(f"{args.label} np={conc} {drafter} ...", file=sys.stderr)
                r = measure(engine, prompts, drafter, args.k, args.n_predict, args.repeats)
                r.update(target=target.name, np=conc, k=args.k)
                results.append(r)
                if "skipped" not in r:
                    print(f"  synthetic / real {fmt_iv(r['synthetic_over_real'])}", file=sys.stderr)
    args.loads = (start_load, os.getloadavg()[0])
    text = report(results, args, command, commit, time.time() - t0)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
