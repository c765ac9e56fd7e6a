"""What the batch-invariant build costs: tg t/s, verify ms per k+1=5-token batch and prefill t/s,
the default build and the invariant one side by side.

Each build is NAME=DIR, a folder the package was installed into (`pip install --target DIR`), or
NAME= for whatever `python` imports. A DIR build runs under `python -S` with DIR first on
PYTHONPATH, so the editable install's import hook (a .pth file in site-packages) cannot shadow it.
The first build is the reference of the ratios. The builds run as child processes, interleaved
(A B A B ...), and the table gives medians over the repeats.

    python bench/batch_invariance_cost.py --model M.gguf --build default= --build invariant=$TMPDIR/inv-site \
        --json bench/results/batch-invariance/cost.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import site
import statistics
import subprocess
import sys
import time

PROMPT = ("The history of the printing press begins in the fifteenth century, when a goldsmith in "
          "Mainz combined movable metal type, an oil-based ink and a screw press adapted from wine "
          "making. ")


def _timed(work) -> tuple:
    """(wall seconds, CPU seconds of this process) of work(). With one thread the CPU time is the
    kernels' work, which a busy machine stretches much less than the wall clock."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(model: str, threads: int, n_predict: int, k: int) -> dict:
    """One child's figures for one model: tg (1-token steps), a k+1-token batch (the verify
    shape, on an empty cache), and a 128-token prefill; each as wall and CPU time."""
    from specnative import Engine, build_info

    with Engine(model, n_ctx=1024, n_threads=threads, n_seq_max=1) as engine:
        prefill_tokens = engine.tokenize(PROMPT * 8).tolist()[:128]
        verify_tokens = prefill_tokens[:k + 1]
        start = engine.tokenize("Hello").tolist()
        engine.generate([start], n_predict=4, stop_at_eos=False)   # warm-up
        out = {"build_flags": build_info()["build_flags"]}
        wall, cpu = _timed(lambda: engine.generate([start], n_predict=n_predict, stop_at_eos=False))
        out.update(tg_tps=n_predict / wall, tg_tps_cpu=n_predict / cpu)
        reps = 8
        wall, cpu = _timed(lambda: [engine.prompt_logits(verify_tokens) for _ in range(reps)])
        out.update(verify_ms=1000 * wall / reps, verify_ms_cpu=1000 * cpu / reps)
        wall, cpu = _timed(lambda: engine.prompt_logits(prefill_tokens))
        out.update(prefill_tps=len(prefill_tokens) / wall, prefill_tps_cpu=len(prefill_tokens) / cpu)
    return out


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
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: the build in {build_dir or 'this interpreter'} failed on {args.model}: {last}")
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

    if not os.path.isfile(args.model):
        parser.error(f"--model {args.model}: no such file")
    builds = {}
    for spec in args.build or ["default="]:
        name, _, directory = spec.partition("=")
        if not name or name in builds:
            parser.error(f"--build {spec!r}: NAME=DIR with a NAME of its own")
        if directory and not os.path.isdir(directory):
            parser.error(f"--build {spec!r}: {directory} is not a folder")
        builds[name] = directory or None
    reference = next(iter(builds))
    samples = {name: [] for name in builds}
    for _ in range(args.repeats):
        for name, directory in builds.items():  # interleaved, so load drifts hit both alike
            samples[name].append(run_child(directory, args))

    keys = ("tg_tps", "verify_ms", "prefill_tps", "tg_tps_cpu", "verify_ms_cpu", "prefill_tps_cpu")
    medians = {name: {key: statistics.median(s[key] for s in runs) for key in keys}
               for name, runs in samples.items()}
    print(f"# {os.path.basename(args.model)}  threads={args.threads} repeats={args.repeats} "
          f"n_predict={args.n_predict} k+1={args.k + 1}")
    print("median (min-max); *_cpu: per CPU second of the process, wall: per wall-clock second")
    print(f"{'build':10} " + " ".join(f"{key:>22}" for key in keys))
    for name, runs in samples.items():
        print(f"{name:10} " + " ".join(
            f"{medians[name][key]:>8.4g} ({min(r[key] for r in runs):.3g}-{max(r[key] for r in runs):.3g})".rjust(22)
            for key in keys))
    for name in list(builds)[1:]:
        print(f"{name}/{reference}: " + "  ".join(
            f"{key} {medians[name][key] / medians[reference][key]:.3f}x" for key in keys))
    if args.json:
        with open(args.json, "a") as out:
            for name, runs in samples.items():
                out.write(json.dumps({"model": os.path.basename(args.model), "build": name,
                                      "flags": runs[0]["build_flags"], "medians": medians[name],
                                      "samples": runs}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
