#!/usr/bin/env python3
"""Two builds of the C++ extension, timed interleaved on the same host: did a change to the core
make the speculative rounds slower?

    python bench/extension_ab.py DIR_A DIR_B [--rounds 8] [--reps 2] [-o OUT.md]

DIR_A and DIR_B each hold a build's `_core*.so` with the llama.cpp libraries beside it (a copy
of site-packages/specnative/ after `pip install`, before and after the change). Each round runs
one worker process per side, in alternating order (A B, B A, ...), so that host drift and other
jobs' load hit both alike. A worker loads its build's `_core` directly (none of specnative's
Python), and on the tiny deep pair (peers.py's tiny set: 2+30 layers f32 target, 2-layer draft),
greedy, k = 4, 128 tokens, n_ctx 4096, decodes three workloads `--reps` times each after a
warm-up: a chain on one sequence (peers.py's speculative run), a chain on four sequences, and a
topk=3, depth=4, budget=8 tree on one sequence. Reported per workload: tokens/s of decoding
(GenerateResult.tps) per round and side, the ratio B / A as the geometric mean of the per-round
ratios with its 95 % t interval (specnative.analysis.stats.speedup_interval, as peers.py pairs its
repeats), the median round time, the engine's own time per round (the decoding buckets less the
time inside llama.cpp calls: all a change to the round loop can move, less exposed to other jobs'
load than the round itself), and whether both builds emitted the same tokens.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

PROMPT = "Photosynthesis is the process by which"
WORKLOADS = (("chain, 1 sequence", 1, None), ("chain, 4 sequences", 4, None),
             ("tree topk=3,depth=4,budget=8, 1 sequence", 1, (3, 4, 8)))


def load_core(directory: str):
    so = sorted(Path(directory).glob("_core*.so"))
    if not so:
        raise SystemExit(f"error: no _core*.so in {directory}")
    spec = importlib.util.spec_from_file_location("specnative._core", so[0])
    core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core)
    return core


def generate(core, engine, prompts, n, tree):
    """One greedy speculative run; the generate binding takes a GenerateParams, or (older builds)
    its fields as keywords."""
    if hasattr(core, "GenerateParams"):
        p = core.GenerateParams()
        p.n_predict, p.spec, p.k, p.rule, p.stop_at_eog = n, True, 4, core.AcceptRule.greedy, True
        d = core.DrafterParams()
        d.type = "model"
        p.drafter = d
        if tree:
            shape = core.TreeShape()
            shape.kind = core.TreeKind.topk
            shape.topk, shape.depth, shape.budget = tree
            p.tree = shape
        return engine.generate(prompts, p)
    kw = {"n_predict": n, "temperature": 0.0, "seed": 0, "spec": True, "k": 4, "accept_rule": "greedy",
          "stop_at_eog": True, "record_margins": False}
    if tree:
        kw.update(tree_kind="topk", tree={"topk": tree[0], "depth": tree[1], "budget": tree[2]})
    return engine.generate(prompts, **kw)


def worker(directory: str, target: str, draft: str, reps: int, threads: int) -> dict:
    core = load_core(directory)
    out = {}
    for name, n_seq, tree in WORKLOADS:
        engine = core.Engine(target=target, draft=draft, n_ctx=4096, n_batch=512, n_threads=threads,
                             n_gpu_layers=0, n_seq_max=16, flash_attn=0, kv_unified=True)
        tokens = list(engine.tokenize(PROMPT, True))
        prompts = [tokens + [7 + s] for s in range(n_seq)] if n_seq > 1 else [tokens]
        generate(core, engine, prompts, 16, tree)  # warm-up
        runs = []
        for _ in range(reps):
            r = generate(core, engine, prompts, 128, tree)
            t = r.times
            own = t["draft"] + t["draft_ingest"] + t["verify"] + t["resample"] - t["llama"]
            runs.append({"tps": r.tps, "round_ms": r.round_ms, "own_ms": own / r.steps,
                         "tokens": [[int(x) for x in seq] for seq in r.tokens]})
        out[name] = runs
        engine.close()
    return out


def render(a, results, started, loads) -> str:
    from specnative.analysis.stats import speedup_interval

    lines = [f"# Two builds of the extension, interleaved ({started:%Y-%m-%d %H:%M} UTC)", "",
             f"- A: `{a.dir_a}`; B: `{a.dir_b}`",
             f"- host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; threads {a.threads}",
             f"- {a.rounds} rounds, order alternating, {a.reps} runs per workload per side and round (median)",
             (f"- load average before each worker: min {min(loads):.2f}, median {statistics.median(loads):.2f}, "
              f"max {max(loads):.2f}"), "",
             ("| workload | A tokens/s (median) | B tokens/s (median) | B / A, paired (95 % CI) | A ms/round | "
              "B ms/round | A engine's own ms/round | B engine's own ms/round | tokens identical |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for name, _, _ in WORKLOADS:
        med = {side: [statistics.median(x["tps"] for x in rnd[name]) for rnd in results[side]] for side in "AB"}
        rms = {side: statistics.median(x["round_ms"] for rnd in results[side] for x in rnd[name]) for side in "AB"}
        own = {side: statistics.median(x["own_ms"] for rnd in results[side] for x in rnd[name]) for side in "AB"}
        same = all(x["tokens"] == y["tokens"] for ra, rb in zip(results["A"], results["B"])
                   for x, y in zip(ra[name], rb[name]))
        i = speedup_interval(med["B"], med["A"])
        lines.append(f"| {name} | {statistics.median(med['A']):.1f} | {statistics.median(med['B']):.1f} | "
                     f"{i.estimate:.3f} ({i.low:.3f}-{i.high:.3f}) | {rms['A']:.3f} | {rms['B']:.3f} | {own['A']:.4f} | "
                     f"{own['B']:.4f} | "
                     f"{'yes' if same else 'NO'} |")
    lines += ["", "Per round, tokens/s (A, B):", ""]
    for name, _, _ in WORKLOADS:
        pairs = ", ".join(f"({statistics.median(x['tps'] for x in ra[name]):.0f}, "
                          f"{statistics.median(x['tps'] for x in rb[name]):.0f})"
                          for ra, rb in zip(results["A"], results["B"]))
        lines.append(f"- {name}: {pairs}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir_a")
    ap.add_argument("dir_b")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path)
    a = ap.parse_args(argv)
    for d in (a.dir_a, a.dir_b):
        if not sorted(Path(d).glob("_core*.so")):
            raise SystemExit(f"error: no _core*.so in {d}")
    if a.rounds < 2 or a.reps < 1:
        raise SystemExit("error: --rounds must be >= 2 (a paired interval) and --reps >= 1")
    from specnative.models import tiny_pair  # the pair peers.py's tiny set uses

    target, draft = tiny_pair(Path(__file__).resolve().parent / "scratch" / "models", "deep", extra_layers=30)
    started = dt.datetime.now(dt.timezone.utc)
    results = {"A": [], "B": []}
    loads = []
    for i in range(a.rounds):
        for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
            loads.append(os.getloadavg()[0])
            d = a.dir_a if side == "A" else a.dir_b
            cmd = [sys.executable, __file__, "--worker", d, str(target), str(draft), str(a.reps), str(a.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"error: the worker for {d} failed:\n{done.stderr[-2000:]}")
            results[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"round {i + 1}/{a.rounds} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    text = render(a, results, started, loads)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))))
        sys.exit(0)
    sys.exit(main())
