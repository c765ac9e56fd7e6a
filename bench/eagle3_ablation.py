"""Which training choices move an EAGLE-3 head's first-position agreement, at equal data and passes.

A 30-minute training run is too long to try one choice at a time, so this script separates the
two halves of `specnative models train-drafter`: `cache` self-distills once (the target's greedy
continuations, top-16 soft labels, and the inputs of every layer any variant may read, stored as
float16 to fit in memory), and `train` trains one variant on that cache for a fixed number of
sequence tokens and prints one JSON line: teacher-forced top-1 by draft position on the held-out
split of the training sources and on a second cache of prompts never trained on (MT-Bench).
Every variant sees the same tokens in the same order (seed 0), so the differences are the choice's.

    python bench/eagle3_ablation.py cache T.gguf sharegpt,humaneval,builtin 9 train.pt
    python bench/eagle3_ablation.py cache T.gguf mt-bench:16 3 mtb.pt
    python bench/eagle3_ablation.py train T.gguf train.pt mtb.pt --name ttt1 --ttt 1

`read` caches the other kind of data train-drafter can use (--read-share): ShareGPT prompts with
their recorded replies, read by the target in one pass (its features and top-16 soft labels at
every position, nothing continued); `train --read-cache` adds a share of them to the training split.

    python bench/eagle3_ablation.py read T.gguf sharegpt 9 read.pt
    python bench/eagle3_ablation.py train T.gguf train.pt mtb.pt --name half --ttt 1 \
        --data-fraction 0.5 --read-cache read.pt --read-fraction 0.5
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from specnative.models.train.batches import choose_draft_vocab, coverage, t2d_table
from specnative.models.train.distill import distill, read_replies
from specnative.models.train.gguf_target import TorchLlama, load_weights
from specnative.models.train.pipeline import held_out_split, new_head
from specnative.models.train.prompts import load_prompts
from specnative.models.train.target_check import read_target
from specnative.models.train.trainer import TrainSettings, evaluate, train

CACHED_LAYERS = "2,15,27,29"   # SmolLM2's default low/mid/high inputs and its last layer's input


def cache(args) -> None:
    torch.set_num_threads(args.threads)
    prompts, _ = load_prompts(args.data, args.target, n_predict=args.n_predict, max_prompt_tokens=384)
    prompts = [prompts[i] for i in np.random.RandomState(0).permutation(len(prompts))]
    started = time.perf_counter()
    data = distill(args.target, prompts, layers=args.layers, n_predict=args.n_predict, threads=args.threads,
                   deadline=started + args.minutes * 60, top_k=16, quiet=True)
    torch.save({"sequences": data.sequences, "features": [f.half() for f in data.features], "layers": args.layers,
                "record": data.record}, args.out)
    print(json.dumps({"out": args.out, "sequences": len(data.sequences), "tokens": data.n_tokens,
                      "seconds": round(time.perf_counter() - started)}))


def read(args) -> None:
    """The recorded replies of `args.data`'s ShareGPT prompts, in a seeded order, read by the torch
    target until `args.minutes` have passed."""
    torch.set_num_threads(args.threads)
    prompts, _ = load_prompts(args.data, args.target, n_predict=args.n_predict, max_prompt_tokens=384, replies=True)
    prompts = [prompts[i] for i in np.random.RandomState(1).permutation(len(prompts))]
    started = time.perf_counter()
    sequences, features = read_replies(TorchLlama(args.target), prompts, layers=args.layers, top_k=16,
                                       deadline=started + args.minutes * 60, quiet=True)
    if not sequences:
        raise SystemExit(f"{args.data}: no prompt with a recorded reply (only ShareGPT records them)")
    torch.save({"sequences": sequences, "features": [f.half() for f in features], "layers": args.layers}, args.out)
    print(json.dumps({"out": args.out, "sequences": len(sequences), "tokens": int(sum(len(s.tokens) for s in sequences)),
                      "seconds": round(time.perf_counter() - started)}))


def _layer_list(text: str) -> tuple:
    """'2,15,27' -> (2, 15, 27), for argparse."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"layers are comma-separated integers, not {text!r}") from None


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a fraction is in [0, 1], not {value}")
    return value


def _load(path, layers, width):
    """(sequences, features of `layers` as float32) from a cache."""
    data = torch.load(path, weights_only=False)
    missing = [l for l in layers if l not in data["layers"]]
    if missing:
        raise SystemExit(f"{path} holds the inputs of layers {data['layers']}, not of {missing}")
    columns = torch.cat([torch.arange(data["layers"].index(l) * width, (data["layers"].index(l) + 1) * width)
                         for l in layers])
    return data["sequences"], [f.float()[:, columns].contiguous() for f in data["features"]]


def _start_decoder_as_layer(head, weights, layer: int, width: int) -> None:
    """The head's attention and FFN start as target layer `layer` acting on the fused features
    (the token-embedding half of q/k/v scaled down), instead of random."""
    w = lambda name: torch.from_numpy(weights[f"blk.{layer}.{name}"])
    with torch.no_grad():
        for mine, theirs in (("wq", "attn_q.weight"), ("wk", "attn_k.weight"), ("wv", "attn_v.weight")):
            getattr(head, mine)[:, width:] = w(theirs)
            getattr(head, mine)[:, :width] *= 0.1
        head.attn_norm_2.copy_(w("attn_norm.weight"))
        for mine, theirs in (("wo", "attn_output.weight"), ("ffn_norm", "ffn_norm.weight"),
                             ("ffn_gate", "ffn_gate.weight"), ("ffn_up", "ffn_up.weight"),
                             ("ffn_down", "ffn_down.weight")):
            getattr(head, mine).copy_(w(theirs))


def train_variant(args) -> None:
    torch.set_num_threads(args.threads)
    reader, info = read_target(args.target)
    layers = args.layers
    if args.decoder_from_layer is not None and not 0 <= args.decoder_from_layer < info.n_layer:
        raise SystemExit(f"--decoder-from-layer {args.decoder_from_layer}: the target has layers 0..{info.n_layer - 1}")
    if args.data_fraction == 0 and not args.read_cache:
        raise SystemExit("--data-fraction 0 trains on nothing without --read-cache")
    seqs, feats = _load(args.train_cache, layers, info.n_embd)
    unseen = _load(args.unseen_cache, layers, info.n_embd)
    train_idx, held_idx = held_out_split(len(seqs), 0.1, 0)
    train_idx = train_idx[:int(len(train_idx) * args.data_fraction)]
    train_set = ([seqs[i] for i in train_idx], [feats[i] for i in train_idx])
    held_set = ([seqs[i] for i in held_idx], [feats[i] for i in held_idx])
    if args.read_cache:  # read replies train only: the held-out split stays the target's own text
        read_seqs, read_feats = _load(args.read_cache, layers, info.n_embd)
        n_read = int(len(read_seqs) * args.read_fraction)
        train_set = (train_set[0] + read_seqs[:n_read], train_set[1] + read_feats[:n_read])
    row_len = max(512, max(len(s.tokens) for s in train_set[0] + held_set[0] + unseen[0]))
    d2t = choose_draft_vocab(train_set[0], info.n_vocab, args.draft_vocab)
    t2d = t2d_table(d2t, info.n_vocab)
    weights = load_weights(reader)  # all of them: a decoder may start as one of the target's layers
    head = new_head(info, weights, d2t, layers, seed=0)
    if args.decoder_from_layer is not None:
        _start_decoder_as_layer(head, weights, args.decoder_from_layer, info.n_embd)
    settings = TrainSettings(seed=0, steps=args.ttt, lr=args.lr, row_len=row_len, max_tokens=args.tokens,
                             rows_per_batch=args.batch_rows, quiet=True)
    started = time.perf_counter()
    train(head, train_set, ([], []), t2d, settings)
    train_s = time.perf_counter() - started
    top1 = lambda s: evaluate(head, *s, t2d, steps=args.ttt, row_len=row_len, rows_per_batch=4)["top1_by_position"]
    print(json.dumps({"name": args.name, "train_s": round(train_s), "train_sequences": len(train_set[0]),
                      "train_tokens": int(sum(len(s.tokens) for s in train_set[0])),
                      "held_out_top1": top1(held_set), "unseen_top1": top1(unseen),
                      "unseen_vocabulary_coverage": round(coverage(unseen[0], d2t), 3),
                      "settings": {k: v for k, v in vars(args).items() if k not in ("func",)}}), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(required=True)
    for name, func, what, data_help, n_predict_help in (
            ("cache", cache, "self-distill once and store the data", "train-drafter's --data spec",
             "continuation tokens per prompt (default 128)"),
            ("read", read, "read ShareGPT's recorded replies with the target once and store the data",
             "a --data spec with ShareGPT in it", "reply tokens read at most (default 128)")):
        v = verbs.add_parser(name, help=what)
        v.add_argument("target")
        v.add_argument("data", help=data_help)
        v.add_argument("minutes", type=float, help="time budget")
        v.add_argument("out")
        v.add_argument("--layers", type=_layer_list, default=CACHED_LAYERS,
                       help=f"target layers whose inputs to keep ({CACHED_LAYERS})")
        v.add_argument("--n-predict", type=int, default=128, help=n_predict_help)
        v.add_argument("-t", "--threads", type=int, default=2)
        v.set_defaults(func=func)
    t = verbs.add_parser("train", help="train one variant on a cache and print its agreement")
    t.add_argument("target")
    t.add_argument("train_cache")
    t.add_argument("unseen_cache")
    t.add_argument("--name", default="default")
    t.add_argument("--layers", type=_layer_list, default="2,15,27", help="three of the cache's layers (default 2,15,27)")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--batch-rows", type=int, default=4, help="packed rows per optimizer step (default 4, as the "
                   "committed rows were trained; train-drafter's default is 2)")
    t.add_argument("--ttt", type=int, default=3, help="training-time-test steps")
    t.add_argument("--tokens", type=int, default=150_000, help="sequence tokens through the head")
    t.add_argument("--draft-vocab", type=int, default=8192)
    t.add_argument("--data-fraction", type=_fraction, default=1.0, help="train on this share of the training split")
    t.add_argument("--read-cache", help="a `read` cache: its replies join the training split")
    t.add_argument("--read-fraction", type=_fraction, default=1.0, help="the share of the read cache used")
    t.add_argument("--decoder-from-layer", type=int, help="start the head's decoder as this target layer")
    t.add_argument("-t", "--threads", type=int, default=2)
    t.set_defaults(func=train_variant)
    args = parser.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
