"""A written head measured two ways on the same prompts: by specnative, and by the trainer's metric.

specnative runs the head in llama.cpp (draft-eagle3 or draft-dflash, greedy, T = 0) and counts what the target
accepted at each draft position; the trainer's metric scores the torch head, teacher-forced, on
the very tokens that run emitted (greedy speculation is lossless, so they are the target's own
continuation). Position 1 of both is the same event: the head's first draft from the features of
the last accepted position. A gap between them beyond noise means the torch graph, the features or
the file differ from what llama.cpp runs; a gap between the held-out split and these prompts is a
difference of text.
"""
from __future__ import annotations

import numpy as np

from .batches import t2d_table
from .deps import engine_class
from .deps import torch as _torch
from .dflash_trainer import evaluate as evaluate_blocks
from .distill import Sequence
from .gguf_target import TorchLlama
from .trainer import evaluate, simulate_rounds
from .writer import read_drafter

TIMERS = ("prefill_target", "prefill_draft", "draft", "draft_ingest", "verify", "resample", "decode", "total")


def speculative(target, head_file, prompts, *, n_predict: int, k: int, threads: int, n_seq: int = 8,
                baseline: bool = True, drafter: str = "eagle3") -> tuple[dict, list]:
    """specnative's counts and timers for the head (`drafter`: eagle3 or dflash) on `prompts`
    (TokenPrompt), all batches summed, and the emitted sequences (prompt + output) for the
    teacher-forced comparison."""
    Engine = engine_class()
    longest = max(len(p.tokens) for p in prompts) + n_predict + k + 1
    sums = {"drafted": 0, "accepted": 0, "rounds": 0, "emitted": 0}
    drafted_at, accepted_at = np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
    times = dict.fromkeys(TIMERS, 0.0)
    base_ms = base_steps = 0.0
    sequences = []
    with Engine(target, head_file, n_ctx=n_seq * longest + 256, n_batch=512, n_seq_max=n_seq,
                n_threads=threads) as engine:
        for start in range(0, len(prompts), n_seq):
            batch = prompts[start:start + n_seq]
            tokens = [list(p.tokens) for p in batch]
            r = engine.generate(tokens, n_predict=n_predict, temperature=0.0, spec=True, k=k, drafter=drafter)
            for key in sums:
                sums[key] += int(r.totals[key])
            drafted_at += r.totals["drafted_at"]
            accepted_at += r.totals["accepted_at"]
            for key in TIMERS:
                times[key] += float(r.times.get(key, 0.0))
            sequences += [Sequence(p.ident, np.concatenate([np.asarray(p.tokens), np.asarray(out)]).astype(np.int64),
                                   len(p.tokens)) for p, out in zip(batch, r.tokens)]
            if baseline:
                b = engine.generate(tokens, n_predict=n_predict, temperature=0.0)
                base_ms += b.times["decode"]
                base_steps += b.steps
    rounds = max(sums["rounds"], 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        by_position = np.where(drafted_at > 0, accepted_at / np.maximum(drafted_at, 1), np.nan)
    record = {"prompts": len(prompts), "n_predict": n_predict, "k": k, "temperature": 0.0, **sums,
              "alpha": sums["accepted"] / sums["drafted"] if sums["drafted"] else float("nan"),
              "alpha_by_position": by_position.round(4).tolist(),
              "drafted_at": drafted_at.tolist(), "accepted_at": accepted_at.tolist(),
              "tau": sums["emitted"] / rounds, "times_ms": {key: round(v, 1) for key, v in times.items()},
              "draft_ms_per_round": times["draft"] / rounds,
              "draft_ingest_ms_per_round": times["draft_ingest"] / rounds,
              "verify_ms_per_round": times["verify"] / rounds}
    if baseline and base_steps:
        record["baseline_step_ms"] = base_ms / base_steps
    return record, sequences


def teacher_forced(target, head_file, sequences, *, k: int, n_predict: int, threads: int) -> dict:
    """The trainer's metric for the written head on `sequences`: teacher-forced and chained top-1 over
    every continuation anchor, and ("rounds") the counts of a greedy speculative run with draft
    length k simulated from it, anchor for anchor as specnative's engine advances."""
    torch = _torch()
    torch.set_num_threads(threads)
    model = TorchLlama(target)
    head, d2t, layers = read_drafter(head_file, model.tok_embd)
    features = [model.forward(s.tokens, layers)[0] for s in sequences]
    row_len = max(512, max(len(s.tokens) for s in sequences))
    t2d = t2d_table(d2t, model.info.n_vocab)
    if head.arch == "dflash":  # llama.cpp decodes a block of k + 1 tokens for a draft of k
        out = evaluate_blocks(head, sequences, features, t2d, block_len=k + 1, row_len=row_len, per_sequence=True)
    else:
        out = evaluate(head, sequences, features, t2d, steps=k, row_len=row_len, rows_per_batch=4, per_sequence=True)
    out["rounds"] = simulate_rounds(sequences, out.pop("correct"), k, n_predict)
    return out
