"""Local vs over RPC on loopback: the same target/draft pair with the target's layers on this
process's CPU, on one rpc-server, and split across two (llama.cpp's RPC backend, CPU devices on
127.0.0.1; the draft stays local). Side by side per placement: T_step, T_round, c = T_round/T_step
- 1, tau and the speedup with its interval; every placement's greedy output is checked against the
local baseline under the lossless verdict.

All engines stay open and each repeat runs every placement (spec off, then on), so machine load
hits them alike; figures are medians over the repeats (speedup: geometric mean of the paired
ratios with its 95 % interval, stats.speedup_interval).

    python bench/rpc_bench.py --preset gemma3-270m --target-index 1 -r 5 -n 32 --out bench/results/rpc-loopback/gemma3-270m-q8.md

Prints the table; --out also writes it, by convention to bench/results/rpc-loopback/<preset>[-q8][-np<N>].md.
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from specnative import Engine, lossless
from specnative.analysis import stats, theory
from specnative.engine.rpc_servers import find_rpc_server, local_rpc_servers
from specnative.models.registry import load_preset
from specnative.record.provenance import environment
from specnative.run.workloads import SEQUENCE_PROMPTS


def placements(endpoints: list[str]) -> dict:
    """Engine keyword arguments per placement: target on the CPU here, on one server, on two."""
    remote = dict(n_gpu_layers=-1, draft_devices="none", n_gpu_layers_draft=0)
    return {"local": {}, "rpc x1": {**remote, "rpc_servers": endpoints[:1]},
            "rpc x2": {**remote, "rpc_servers": endpoints[:2], "tensor_split": [1, 1]}}


def measure(engines: dict, prompts: list, args) -> dict:
    """{placement: {"off": [runs], "on": [runs]}}, interleaved placement by placement."""
    runs = {name: {"off": [], "on": []} for name in engines}
    common = dict(n_predict=args.n_predict)
    for engine in engines.values():  # warm-up, discarded
        engine.generate(prompts, **common)
        engine.generate(prompts, spec=True, k=args.k, **common)
    for repeat in range(args.repeats):
        for name, engine in engines.items():
            runs[name]["off"].append(engine.generate(prompts, **common))
            runs[name]["on"].append(engine.generate(prompts, spec=True, k=args.k, **common))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)
    return runs


def verdicts(engines: dict, prompts: list, args) -> dict:
    """Each placement's spec output judged against the local baseline (greedy)."""
    local_base = engines["local"].generate(prompts, n_predict=args.n_predict)
    out = {}
    for name, engine in engines.items():
        spec = engine.generate(prompts, n_predict=args.n_predict, spec=True, k=args.k)
        control = lossless.measure_noise(engine, prompts, local_base.tokens, args.k)
        out[name] = lossless.judge(engine, prompts, local_base.tokens, spec.tokens, 0.0, 0, control).verdict
    return out


def row(name: str, off: list, on: list, verdict: str) -> list:
    step_ms = statistics.median(r.step_ms for r in off)
    round_ms = statistics.median(r.round_ms for r in on)
    speedup = stats.speedup_interval([r.tps for r in on], [r.tps for r in off])
    tau = statistics.median(r.mean_accept_len for r in on)
    return [name, f"{statistics.median(r.tps for r in off):.1f}", f"{step_ms:.2f}", f"{round_ms:.2f}",
            f"{theory.verify_cost_c(round_ms, step_ms):.2f}", f"{tau:.2f}",
            f"{speedup.estimate:.2f} [{speedup.low:.2f}, {speedup.high:.2f}]", verdict]


def table(rows: list) -> str:
    head = ["placement", "base t/s", "T_step ms", "T_round ms", "c", "tau", "speedup [95% CI]", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", help="model pair (specnative.models.presets): tiny or gemma3-270m")
    p.add_argument("--target-index", type=int, default=0,
                   help="which of the preset's targets (gemma3-270m: 0 Q4_K_M, the draft's own file; 1 Q8_0)")
    p.add_argument("-np", "--concurrency", type=int, default=1)
    p.add_argument("-n", "--n-predict", type=int, default=48)
    p.add_argument("-k", type=int, default=4)
    p.add_argument("-r", "--repeats", type=int, default=5)
    p.add_argument("-t", "--threads", type=int, default=1, help="CPU threads, here and in each rpc-server")
    p.add_argument("--out", type=Path, help="write the markdown table here too")
    args = p.parse_args(argv)
    binary, how = find_rpc_server()
    if binary is None:
        raise SystemExit(f"error: {how}")
    preset = load_preset(args.preset)
    target, draft = preset.targets[args.target_index], preset.draft
    prompts = list(SEQUENCE_PROMPTS[:args.concurrency])
    kw = dict(n_ctx=1024, n_batch=256, n_seq_max=args.concurrency, n_threads=args.threads)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as logs, \
            local_rpc_servers(2, binary, threads=args.threads, log_dir=Path(logs)) as endpoints:
        engines = {name: Engine(target, draft, **kw, **extra) for name, extra in placements(endpoints).items()}
        try:
            runs = measure(engines, prompts, args)
            judged = verdicts(engines, prompts, args)
        finally:
            for engine in engines.values():
                engine.close()
    env = environment()
    root = Path(__file__).resolve().parent.parent
    shown = Path(binary).resolve()
    shown = shown.relative_to(root) if shown.is_relative_to(root) else Path(binary).name  # no host paths
    text = "\n\n".join([
        f"# Local vs RPC on loopback: {Path(target).name} / {Path(draft).name}",
        f"Command: `python bench/rpc_bench.py {' '.join(shlex.quote(a) for a in (argv or sys.argv[1:]))}`",
        f"{started}; {env['cpu_model']} ({env['cpu_count']} cores, shared with other jobs), "
        f"backend {env['backend']}, llama.cpp {env['llama_cpp_commit'][:12]}; rpc-server: {shown} ({how}); "
        f"concurrency {args.concurrency}, n_predict {args.n_predict}, k {args.k}, {args.repeats} repeats, "
        f"{args.threads} thread(s) here and per server. Target layers: local CPU / one rpc-server / two "
        f"(layer split 1:1); draft always local. c = T_round / T_step - 1 per placement; the verdict "
        f"judges each placement's spec output against the local baseline.",
        table([row(name, r["off"], r["on"], judged[name]) for name, r in runs.items()])])
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
