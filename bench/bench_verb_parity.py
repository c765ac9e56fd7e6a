#!/usr/bin/env python3
"""`specnative bench` without speculation against the vendored llama-bench: the same flags, the
same tests, interleaved pair by pair (ours, then theirs, then ours, ...), paired ratios ours /
theirs with their geometric-mean t interval per test.

    python bench/bench_verb_parity.py [--model tiny|PATH] [-p 64] [-n 32] [-t 1] [--pairs 10] [-r 3] [--tag NAME]

llama-bench is built once into bench/scratch/llama-build with our build's ggml flags (bench/peers.py's
machinery); writes bench/results/bench-verb/parity-<model>.md and .json.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peerkit import common

from specnative.analysis import stats
from specnative.bench_verb import cli as bench_cli
from specnative.engine import build_info
from specnative.models import tiny_pair

OUT = common.RESULTS / "bench-verb"


def flags(a, model) -> list[str]:
    return ["-m", str(model), "-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-b", str(a.b), "-ub", str(a.b),
            "-r", str(a.r), "-o", "json"]


def ours(a, model) -> dict:
    out = io.StringIO()
    if bench_cli.main(flags(a, model), out=out) != 0:
        raise SystemExit("specnative bench failed")
    return {(r["n_prompt"], r["n_gen"]): r for r in json.loads(out.getvalue())}


def theirs(a, tool, model) -> dict:
    p = common.run_tool([str(tool), *flags(a, model)])
    return {(r["n_prompt"], r["n_gen"]): r for r in json.loads(p.stdout)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (the test suite's generated model) or a GGUF path")
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-t", type=int, default=1)
    ap.add_argument("-b", type=int, default=512)
    ap.add_argument("-r", type=int, default=3, help="llama-bench repetitions inside each run")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--tag", default=None, help="the result files' name: parity-TAG (default: tiny or the model's stem)")
    common.add_build_args(ap)
    a = ap.parse_args(argv)
    info = build_info()
    tools, build = common.find_tools(a, info, ["llama-bench"])
    if a.build_only:
        return 0
    model = tiny_pair(common.WORK / "models", "noisy", noise=0.03)[0] if a.model == "tiny" else Path(a.model)
    load = [os.getloadavg()[0]]
    pairs: dict = {}
    for i in range(a.pairs):
        first, second = (ours, theirs) if i % 2 == 0 else (theirs, ours)  # alternate who goes first
        got = {}
        for side in (first, second):
            got[side.__name__] = side(a, model) if side is ours else side(a, tools["llama-bench"], model)
        for key in got["ours"]:
            pairs.setdefault(key, []).append((got["ours"][key]["avg_ts"], got["theirs"][key]["avg_ts"]))
        load.append(os.getloadavg()[0])
        common.log(f"pair {i + 1}/{a.pairs}: " + ", ".join(f"{k}: {got['ours'][k]['avg_ts']:.0f} / "
                                                          f"{got['theirs'][k]['avg_ts']:.0f}" for k in got["ours"]))
    rows = []
    for (p, n), values in pairs.items():
        iv = stats.speedup_interval([o for o, _ in values], [t for _, t in values])
        name = f"pp{p}" if n == 0 else f"tg{n}"
        rows.append({"test": name, "ours_median_ts": common.med([o for o, _ in values]),
                     "llama_bench_median_ts": common.med([t for _, t in values]),
                     "ratio": iv.estimate, "low": iv.low, "high": iv.high, "pairs": len(values)})
    tag = a.tag or ("tiny" if a.model == "tiny" else Path(a.model).stem)
    OUT.mkdir(parents=True, exist_ok=True)
    record = {"command": "python bench/bench_verb_parity.py " + " ".join(argv or sys.argv[1:]),
              "commit": common.git_rev(), "llama_commit": info["llama_commit"], "cpu": common.cpu_model(),
              "cores": os.cpu_count(), "load_1min": {"min": min(load), "max": max(load)}, "rows": rows,
              "build": build}
    (OUT / f"parity-{tag}.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = ["| test | specnative bench t/s (median) | llama-bench t/s (median) | ours / theirs [95 % CI] | pairs |",
             "| --- | ---: | ---: | --- | ---: |"]
    lines += [f"| {r['test']} | {r['ours_median_ts']:.0f} | {r['llama_bench_median_ts']:.0f} | "
              f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}] | {r['pairs']} |" for r in rows]
    (OUT / f"parity-{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
