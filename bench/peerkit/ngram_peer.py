"""llama.cpp's n-gram drafters in its own llama-speculative-simple beside ours, one sequence, greedy:

    python bench/peerkit/ngram_peer.py -m TARGET.gguf [--drafter ngram-simple,ngram-mod] [-k 4] [-n 64] [-r 5]

Writes bench/results/drafters/ngram-peer.json (--out elsewhere; the kept Gemma run is
bench/results/drafters/gemma-ngram-peer.json).

Both run the same drafter through common/speculative.h with the same options: for ngram-simple
the draft length is --spec-ngram-simple-size-m, set to k on both sides (ours caps drafts at k).
Prints alpha (accepted / drafted), drafted, accepted and tokens/s per drafter and prompt, and the
ratios ours/theirs. Where they differ and why: llama-speculative-simple keeps the last prompt token
out of its prefill and drafts once before its first generated token (history = prompt minus one
token); ours prefills the whole prompt and drafts from the first generated token on. The first
round differs, the rest follow the same lookups. Their tokens/s includes their first draft round.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from peerkit.common import BUILD, RESULTS, log, rel, tool_path  # noqa: E402
from peerkit.spec_simple import theirs_spec  # noqa: E402

# Prompts that copy: n-gram drafters pay where the output repeats its input.
PROMPTS = {
    "code-edit": ("Rename the variable total to result in this function and print the whole function:\n"
                  "def add_all(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
                  "    return total\n\nThe function with the variable renamed:\n"),
    "list-repeat": ("Copy this list exactly: apples, oranges, pears, plums, cherries, apples, oranges, pears, "
                    "plums, cherries, apples, oranges, pears.\nCopy: apples, oranges,"),
}


def options_for(drafter: str, k: int) -> dict:
    """Short n-grams for short prompts; the draft length at k for ngram-simple (its size-m)."""
    if drafter == "ngram-simple":
        return {"spec-ngram-simple-size-n": 3, "spec-ngram-simple-size-m": k}
    if drafter == "ngram-mod":
        return {"spec-ngram-mod-n-match": 4, "spec-ngram-mod-n-min": 1, "spec-ngram-mod-n-max": k}
    raise SystemExit(f"error: no peer settings for drafter {drafter}")


def theirs(tool, target, prompt, drafter, options, n, threads) -> dict:
    cmd = [str(tool), "-m", str(target), "--spec-type", drafter, "-p", prompt, "-n", str(n), "--temp", "0",
           "-t", str(threads), "-c", "4096", "--swa-full"]
    for name, value in options.items():
        cmd += [f"--{name}", str(value)]
    return theirs_spec(cmd, prompt)  # retried when it ends without its statistics


def ours(engine, prompt, drafter, options, n, k) -> dict:
    r = engine.generate(prompt, n_predict=n, spec=True, k=k, drafter=drafter, drafter_options=options,
                        stop_at_eos=False)
    t = r.totals
    return {"tps": r.tps, "alpha": r.draft_accept_rate, "drafted": int(t["drafted"]), "accepted": int(t["accepted"]),
            "rounds": int(t["rounds"]), "empty_rounds": r.empty_draft_rounds}


def main(argv=None) -> int:
    from specnative import Engine
    from specnative.analysis.stats import speedup_interval

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--target", type=Path, required=True)
    ap.add_argument("--drafter", default="ngram-simple,ngram-mod")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=1,
                    help="runs per side, interleaved (order alternating); t/s: medians and the paired ratio's interval")
    ap.add_argument("--build", type=Path, default=BUILD, help="llama.cpp build dir with llama-speculative-simple")
    ap.add_argument("--out", type=Path, default=RESULTS / "drafters" / "ngram-peer.json")
    a = ap.parse_args(argv)
    tool = tool_path(a.build, "llama-speculative-simple")
    if not tool.exists():
        raise SystemExit(f"error: {rel(tool)} not found: build llama.cpp's tools (python bench/peers.py --build-only, "
                         f"into bench/scratch/llama-build) or pass --build")
    if not a.target.is_file():
        raise SystemExit(f"error: -m {a.target}: no such file")
    for drafter in a.drafter.split(","):
        options_for(drafter, a.k)  # an unknown drafter is refused before anything loads
    rows = []
    with Engine(a.target, n_ctx=4096, n_threads=a.threads, n_seq_max=1) as engine:
        for drafter in a.drafter.split(","):
            options = options_for(drafter, a.k)
            for name, prompt in PROMPTS.items():
                log(f"{drafter} {name}")
                row = {"drafter": drafter, "prompt": name, "options": options}
                runs_ours, runs_theirs = [], []
                try:
                    for i in range(a.repeats):  # interleaved, the order alternating: drift hits both sides
                        sides = [("ours", lambda: ours(engine, prompt, drafter, options, a.n, a.k)),
                                 ("theirs", lambda: {k: v for k, v in theirs(tool, a.target, prompt, drafter, options,
                                                                             a.n, a.threads).items() if k != "text"})]
                        for side, run in (sides if i % 2 == 0 else sides[::-1]):
                            (runs_ours if side == "ours" else runs_theirs).append(run())
                except RuntimeError as error:  # it ended without statistics three times
                    row["theirs"] = {"error": str(error).splitlines()[0]}
                    row["ours"] = {**runs_ours[-1], "tps_runs": [r["tps"] for r in runs_ours]} if runs_ours else {}
                    rows.append(row)
                    print(f"{drafter:13s} {name:12s} theirs failed: {row['theirs']['error'][:120]}")
                    continue
                row["ours"], row["theirs"] = runs_ours[-1], runs_theirs[-1]  # counts: the same every run (greedy)
                row["ours"]["tps_runs"] = [r["tps"] for r in runs_ours]
                row["theirs"]["tps_runs"] = [r["tps"] for r in runs_theirs]
                o, t = row["ours"], row["theirs"]
                o["tps"], t["tps"] = statistics.median(o["tps_runs"]), statistics.median(t["tps_runs"])
                row["alpha_points"] = 100 * (o["alpha"] - t["alpha"])
                row["tps_ratio"] = o["tps"] / t["tps"] if t["tps"] else float("nan")
                interval = ""
                if a.repeats > 1 and all(x > 0 for x in o["tps_runs"] + t["tps_runs"]):  # 0 or NaN: medians only
                    ci = speedup_interval(o["tps_runs"], t["tps_runs"])
                    row["tps_ratio_paired"] = {"estimate": ci.estimate, "low": ci.low, "high": ci.high, "level": ci.level}
                    interval = f" (paired {ci.estimate:.2f}, 95% CI {ci.low:.2f}-{ci.high:.2f})"
                rows.append(row)
                print(f"{drafter:13s} {name:12s} alpha ours {o['alpha']:.3f} theirs {t['alpha']:.3f} "
                      f"({row['alpha_points']:+.1f} pts); drafted {o['drafted']}/{t['drafted']}, "
                      f"accepted {o['accepted']}/{t['accepted']}; t/s ours/theirs {row['tps_ratio']:.2f}{interval}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"command": " ".join(["python bench/peerkit/ngram_peer.py"] + (argv or sys.argv[1:])),
                                 "target": str(a.target), "k": a.k, "n": a.n, "repeats": a.repeats,
                                 "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
