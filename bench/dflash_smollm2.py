"""A trained DFlash block drafter beside the other drafters of one target, on the same prompts, in one run.

One engine per drafter file, the prompts in batches of --n-seq, greedy (T = 0). Per batch the
baseline runs once (its tokens and its step time), then every configuration: the DFlash drafter at
each draft length of --ks (llama.cpp decodes a block of k + 1: k = 3, 7, 15 are blocks of 4, 8, 16),
the n-gram drafters at --ngram-k, and an EAGLE-3 head at --eagle3-k when --eagle3 names one. Each
speculative run is checked against the baseline right away: token-identical sequences are the
`exact` verdict; a batch that differs gets the project's full lossless verdict
(lossless.verdicts.verdict_after_run: the KV state, the noise control, the replay). Per
configuration: α by draft position (accepted / drafted at that position: unconditional from the
block's start) and conditional on the position before, τ (tokens per round), and the timers per
round (`draft`: the drafter's own forward(s); `draft_ingest`: the verified positions' features into
the drafter; `verify`). For the longest DFlash block, the torch drafter's teacher-forced top-1 by
offset on the emitted tokens says where a block's late offsets are right on their own, against the
chained agreement a verify accepts.

    python bench/dflash_smollm2.py -m T.gguf --dflash D.gguf [--eagle3 E.gguf] --data mt-bench \
        --n-predict 128 --ks 3,4,7,15 -t 2 --out bench/results/dflash-smollm2/mt-bench-80.json
"""
from __future__ import annotations

import argparse
import os
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from specnative import Engine
from specnative.lossless.verdicts import verdict_after_run
from specnative.models.train.distill import Sequence
from specnative.models.train.measure import teacher_forced
from specnative.models.train.prompts import load_prompts
from specnative.record.provenance import cpu_model

TIMERS = ("draft", "draft_ingest", "verify", "prefill_target", "prefill_draft", "total")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _empty(drafter: str, k: int) -> dict:
    return {"drafter": drafter, "k": k, "rounds": 0, "emitted": 0, "drafted": 0, "accepted": 0,
            "drafted_at": np.zeros(k, dtype=np.int64), "accepted_at": np.zeros(k, dtype=np.int64),
            "times_ms": dict.fromkeys(TIMERS, 0.0), "verdicts": {"exact": 0, "numeric": 0, "fail": 0},
            "identical_sequences": 0, "sequences": 0, "wall_s": 0.0, "verdict_notes": []}


def _add(acc: dict, r, wall: float, base_tokens: list, engine, tokens_in, k: int, drafter: str) -> None:
    t = r.totals
    for key in ("rounds", "emitted", "drafted", "accepted"):
        acc[key] += int(t[key])
    acc["drafted_at"] += np.asarray(t["drafted_at"][:k], dtype=np.int64)
    acc["accepted_at"] += np.asarray(t["accepted_at"][:k], dtype=np.int64)
    for key in TIMERS:
        acc["times_ms"][key] += float(r.times.get(key, 0.0))
    acc["wall_s"] += wall
    same = [list(a) == list(b) for a, b in zip(base_tokens, r.tokens)]
    acc["identical_sequences"] += sum(same)
    acc["sequences"] += len(same)
    if all(same):
        acc["verdicts"]["exact"] += 1
        return
    verdict, _ = verdict_after_run(engine, tokens_in, base_tokens, r.tokens, 0.0, 0, k, drafter)
    acc["verdicts"][verdict.verdict if verdict.verdict in acc["verdicts"] else "fail"] += 1
    acc["verdict_notes"].append(f"{verdict.verdict}: {verdict.reason}")


def _finish(acc: dict) -> dict:
    rounds = max(acc["rounds"], 1)
    d, a = acc["drafted_at"], acc["accepted_at"]
    with np.errstate(invalid="ignore", divide="ignore"):
        by_pos = np.where(d > 0, a / np.maximum(d, 1), np.nan)
        cond = np.where(np.r_[1, a[:-1]] > 0, a / np.maximum(np.r_[max(d[0], 1), a[:-1]], 1), np.nan)
    out = {k: v for k, v in acc.items() if k not in ("drafted_at", "accepted_at")}
    out.update({"drafted_at": d.tolist(), "accepted_at": a.tolist(),
                "alpha": acc["accepted"] / acc["drafted"] if acc["drafted"] else float("nan"),
                "alpha_by_position": np.round(by_pos, 4).tolist(),
                "alpha_given_previous": np.round(cond, 4).tolist(),
                "tau": acc["emitted"] / rounds,
                "ms_per_round": {key: round(acc["times_ms"][key] / rounds, 3) for key in ("draft", "draft_ingest",
                                                                                          "verify")},
                "times_ms": {key: round(v, 1) for key, v in acc["times_ms"].items()},
                "wall_s": round(acc["wall_s"], 1)})
    return out


def run(args) -> dict:
    prompts, record = load_prompts(args.data, args.target, n_predict=args.n_predict, max_prompt_tokens=384)
    longest = max(len(p.tokens) for p in prompts) + args.n_predict + max(args.ks + [args.ngram_k, args.eagle3_k]) + 2
    kw = {"n_ctx": args.n_seq * longest + 256, "n_batch": 512, "n_seq_max": args.n_seq, "n_threads": args.threads,
          "n_gpu_layers": args.ngl}
    configs = ([("dflash", k) for k in args.ks] if args.dflash else []) + \
        [(d, args.ngram_k) for d in ("ngram-simple", "ngram-mod") if not args.no_ngram]
    acc = {c: _empty(*c) for c in configs}
    if args.eagle3:
        acc[("eagle3", args.eagle3_k)] = _empty("eagle3", args.eagle3_k)
    base_ms = base_steps = 0.0
    emitted_long = []  # the longest DFlash block's emitted sequences, for the teacher-forced view
    started = time.perf_counter()
    batches = [prompts[i:i + args.n_seq] for i in range(0, len(prompts), args.n_seq)]
    base_of = []
    with Engine(args.target, args.dflash, **kw) as engine:
        for b, batch in enumerate(batches):
            tokens = [list(p.tokens) for p in batch]
            base = engine.generate(tokens, n_predict=args.n_predict, temperature=0.0)
            base_ms += base.times["decode"]
            base_steps += base.steps
            base_of.append(base.tokens)
            for drafter, k in configs:
                t0 = time.perf_counter()
                r = engine.generate(tokens, n_predict=args.n_predict, temperature=0.0, spec=True, k=k, drafter=drafter)
                _add(acc[(drafter, k)], r, time.perf_counter() - t0, base.tokens, engine, tokens, k, drafter)
                if drafter == "dflash" and k == max(args.ks):
                    emitted_long += [Sequence(p.ident, np.concatenate([np.asarray(p.tokens), np.asarray(o)])
                                              .astype(np.int64), len(p.tokens)) for p, o in zip(batch, r.tokens)]
            print(f"batch {b + 1}/{len(batches)} done, {time.perf_counter() - started:.0f} s", file=sys.stderr,
                  flush=True)
    if args.eagle3:
        with Engine(args.target, args.eagle3, **kw) as engine:
            for batch, base_tokens in zip(batches, base_of):
                tokens = [list(p.tokens) for p in batch]
                t0 = time.perf_counter()
                r = engine.generate(tokens, n_predict=args.n_predict, temperature=0.0, spec=True, k=args.eagle3_k,
                                    drafter="eagle3")
                _add(acc[("eagle3", args.eagle3_k)], r, time.perf_counter() - t0, base_tokens, engine, tokens,
                     args.eagle3_k, "eagle3")
    out = {"data": args.data, "prompts": record, "n_predict": args.n_predict, "temperature": 0.0, "n_seq": args.n_seq,
           "threads": args.threads, "n_gpu_layers": args.ngl, "baseline_step_ms": base_ms / max(base_steps, 1),
           "files": {"target": Path(args.target).name, "dflash": Path(args.dflash).name if args.dflash else None,
                     "eagle3": Path(args.eagle3).name if args.eagle3 else None},
           "configs": [_finish(a) for a in acc.values()]}
    if emitted_long:
        k = max(args.ks)
        tf = teacher_forced(args.target, args.dflash, emitted_long, k=k, n_predict=args.n_predict,
                            threads=args.threads)
        out["dflash_teacher_forced"] = {"k": k, "block": k + 1, **{key: tf[key] for key in (
            "positions", "top1_by_position", "chained_by_position")}, "predicted_rounds": tf["rounds"],
            "what": "the torch drafter on the tokens the k-block run emitted: top-1 at each offset on its own "
                    "(earlier offsets given) and chained from offset 1 (what the verify accepts)"}
    out["seconds"] = round(time.perf_counter() - started, 1)
    out["host"] = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}
    return out




def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--target", required=True)
    ap.add_argument("--dflash", help="the DFlash drafter file")
    ap.add_argument("--eagle3", help="an EAGLE-3 head for the same target (optional)")
    ap.add_argument("--data", default="mt-bench", help="prompts (train-drafter's --data syntax; default mt-bench)")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--ks", type=_ints, default=[3, 4, 7, 15], help="DFlash draft lengths (default 3,4,7,15)")
    ap.add_argument("--ngram-k", type=int, default=4)
    ap.add_argument("--no-ngram", action="store_true", help="leave the n-gram drafters out")
    ap.add_argument("--eagle3-k", type=int, default=4)
    ap.add_argument("--n-seq", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-ngl", "--n-gpu-layers", dest="ngl", type=int, default=0, help="layers on the GPU (-1: all)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = run(args)
    Path(args.out).write_text(json.dumps(out, indent=1))
    for c in out["configs"]:
        print(f"{c['drafter']:<13} k={c['k']:<2} alpha by position {c['alpha_by_position'][:8]} tau {c['tau']:.3f} "
              f"draft {c['ms_per_round']['draft']:.2f} ms + ingest {c['ms_per_round']['draft_ingest']:.2f} ms "
              f"per round, "
              f"verify {c['ms_per_round']['verify']:.1f} ms; verdicts {c['verdicts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
