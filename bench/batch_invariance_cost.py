"""What the batch-invariant build costs: tg t/s, verify ms per k+1=5-token batch and prefill t/s,
the default build and the invariant one side by side.

Each build is NAME=DIR, a folder the package was installed into (`pip install --target DIR`), or
NAME= for whatever `python` imports. A DIR build runs under `python -S` with DIR first on
PYTHONPATH, so the editable install's import hook (a .pth file in site-packages) cannot shadow it.
The first build is the reference of the ratios. The builds run as child processes, interleaved
(A B A B ...), and the table gives medians over the repeats.

    python bench/batch_invariance_cost.py --model M.gguf --build default= --build invariant=/tmp/inv-site
"""
from __future__ import annotations

import argparse
import json
import os
import site
import statistics
import subprocess
import sys

PROMPT = ("The history of the printing press begins in the fifteenth century, when a goldsmith in "
          "Mainz combined movable metal type, an oil-based ink and a screw press adapted from wine "
          "making. ")


def measure(model: str, threads: int, n_predict: int, k: int) -> dict:
    """One child's figures for one model (the first generate of each kind warms up)."""
    from specnative import Engine, build_info

    with Engine(model, model, n_ctx=2048, n_threads=threads, n_seq_max=1) as engine:
        long_prompt = engine.tokenize(PROMPT * 8).tolist()[:256]
        short_prompt = engine.tokenize(PROMPT).tolist()
        for _ in range(2):  # warm-up, then the measured run
            base = engine.generate([long_prompt], n_predict=n_predict, stop_at_eos=False)
            spec = engine.generate([short_prompt], n_predict=n_predict, spec=True, k=k,
                                   stop_at_eos=False)
    return {"build_flags": build_info()["build_flags"],
            "tg_tps": base.tps,
            "prefill_tps": len(long_prompt) / (base.times["prefill_target"] / 1000.0),
            "verify_ms": spec.times["verify"] / spec.steps,
            "step_ms": base.step_ms}


def child_command(build_dir: str | None) -> tuple[list, dict]:
    env = dict(os.environ)
    if not build_dir:
        return [sys.executable], env
    env["PYTHONPATH"] = os.pathsep.join([build_dir, *site.getsitepackages()])
    return [sys.executable, "-S"], env


def run_child(build_dir, args) -> dict:
    command, env = child_command(build_dir)
    command += [__file__, "--child", "--model", args.model, "--threads", str(args.threads),
                "--n-predict", str(args.n_predict), "--k", str(args.k)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--build", action="append", default=[], help="NAME=DIR (repeatable)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-predict", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="append the per-build medians as JSON lines")
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(measure(args.model, args.threads, args.n_predict, args.k)))
        return 0

    builds = {}
    for spec in args.build or ["default="]:
        name, _, directory = spec.partition("=")
        builds[name] = directory or None
    reference = next(iter(builds))
    samples = {name: [] for name in builds}
    for _ in range(args.repeats):
        for name, directory in builds.items():  # interleaved, so load drifts hit both alike
            samples[name].append(run_child(directory, args))

    keys = ("tg_tps", "verify_ms", "prefill_tps")
    medians = {name: {key: statistics.median(s[key] for s in runs) for key in keys}
               for name, runs in samples.items()}
    print(f"# {os.path.basename(args.model)}  threads={args.threads} repeats={args.repeats} "
          f"n_predict={args.n_predict} k+1={args.k + 1}")
    print(f"{'build':10} {'tg t/s':>8} {'verify ms':>10} {'prefill t/s':>12}   (median; min-max)")
    for name, runs in samples.items():
        m = medians[name]
        spread = "  ".join(f"{key} {min(s[key] for s in runs):.4g}-{max(s[key] for s in runs):.4g}"
                           for key in keys)
        print(f"{name:10} {m['tg_tps']:8.2f} {m['verify_ms']:10.2f} {m['prefill_tps']:12.1f}   {spread}")
    for name in list(builds)[1:]:
        ratios = {key: medians[name][key] / medians[reference][key] for key in keys}
        print(f"{name}/{reference}: tg {ratios['tg_tps']:.3f}x  verify {ratios['verify_ms']:.3f}x  "
              f"prefill {ratios['prefill_tps']:.3f}x")
    if args.json:
        with open(args.json, "a") as out:
            for name, runs in samples.items():
                out.write(json.dumps({"model": os.path.basename(args.model), "build": name,
                                      "flags": runs[0]["build_flags"], "medians": medians[name],
                                      "samples": runs}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
