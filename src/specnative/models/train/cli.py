"""`train-drafter`: the command line over pipeline.train_drafter.

Meant to hang under `specnative models train-drafter`: the caller makes a subparser, passes it to
add_arguments, and calls run(args) with the parsed namespace. `main()` runs it on its own.
"""
from __future__ import annotations

import argparse
import sys

from .deps import MissingTorch
from .target_check import TargetError

DESCRIPTION = ("Train an EAGLE-3 head or a DFlash block drafter for a llama-architecture GGUF target on the "
               "target's own greedy continuations (self-distillation), on CPU with torch, and write it as a GGUF "
               "that llama.cpp's draft-eagle3 or draft-dflash loads (run it with specnative: Engine(target, head) "
               "and drafter='eagle3' or 'dflash').")


def _layers(text: str) -> tuple:
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers takes three comma-separated integers, not {text!r}") from None
    if len(layers) != 3:
        raise argparse.ArgumentTypeError(f"--layers takes exactly three target layers, not {len(layers)}")
    return layers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="the target model (GGUF, llama architecture)")
    parser.add_argument("--kind", default="eagle3", choices=("eagle3", "dflash"),
                        help="the drafter kind: eagle3 (an autoregressive head) or dflash (a block drafter, all its "
                             "drafts in one pass; llama.cpp's draft-dflash); default eagle3")
    parser.add_argument("-o", "--out", required=True, help="the head GGUF to write (a report goes to OUT.train.json)")
    parser.add_argument("--data", default="builtin",
                        help="prompts, comma-separated: builtin, mt-bench[:N], sharegpt[:N], humaneval[:N] or a "
                             "prompt file (default builtin)")
    parser.add_argument("--n-predict", type=int, default=128, help="tokens of the target's continuation per prompt "
                        "(default 128)")
    parser.add_argument("--budget-minutes", type=float, help="wall-clock budget of the whole command (data, training, "
                        "writing); default 30 when no other budget is given")
    parser.add_argument("--max-tokens", type=int,
                        help="training budget in sequence tokens through the head (all epochs); "
                        "with it alone the result is byte-identical for a seed")
    parser.add_argument("--epochs", type=int, help="at most this many passes over the training split")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, initialization and order (default 0)")
    parser.add_argument("-t", "--threads", type=int, default=1, help="CPU threads for llama.cpp and torch (default 1)")
    parser.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary: the N most frequent target "
                        "tokens of the training data, mapped by d2t (default 8192; >= the target's: all)")
    parser.add_argument("--layers", type=_layers, help="the three target layers whose inputs the head reads "
                        "(default EAGLE-3's 2, n/2, n-3)")
    parser.add_argument("--n-embd", type=int, help="the head's width; it must be the target's (the head borrows the "
                        "target's token embeddings); default the target's")
    parser.add_argument("--held-out", type=float, default=0.1, help="share of sequences held out (default 0.1)")
    parser.add_argument("--max-prompt-tokens", type=int, default=384, help="skip longer prompts (default 384)")
    parser.add_argument("--data-share", type=float, default=0.5, help="with --budget-minutes: the share of it that "
                        "generating data may take; prompts not reached are left out (default 0.5)")
    parser.add_argument("--read-share", type=float, default=0.0, help="of the data time, the share spent reading "
                        "ShareGPT's recorded replies (the target's features and next-token distribution at every "
                        "position, one pass per reply: ~2.3x the tokens of continuing prompts on CPU) instead of "
                        "continuing prompts; needs sharegpt in --data (default 0)")
    parser.add_argument("--ttt-steps", type=int, default=3, help="draft positions trained with the head's own states "
                        "fed back (EAGLE-3's training-time test; default 3)")
    parser.add_argument("--soft-top-k", type=int, default=16, help="teach the target's top-k next-token distribution "
                        "at every position (prompt included); 0: only its greedy continuation's tokens (default 16)")
    parser.add_argument("--generator", choices=("torch", "llama.cpp"), default="torch",
                        help="who writes the target's greedy continuations: the torch target, 32 sequences per step "
                             "(default; faster on CPU, near-ties may go the other way), or llama.cpp through "
                             "specnative's engine, 8 at a time (its exact tokens)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    parser.add_argument("--batch-rows", type=int, default=2, help="packed rows per optimizer step, each of the "
                        "longest sequence's length and at least 512 tokens (default 2)")
    parser.add_argument("--eval-data", help="after writing, measure the head with specnative at T = 0 on these prompts "
                        "(same syntax as --data; use prompts not trained on, e.g. mt-bench)")
    parser.add_argument("--eval-k", type=int, default=4, help="draft length of that measurement (default 4)")
    parser.add_argument("--block-size", type=int, default=16, help="dflash: the trained block; drafts of at most "
                        "block-size - 1 tokens (default 16)")
    parser.add_argument("--draft-layers", type=int, default=1, help="dflash: the drafter's decoder layers (default 1)")
    parser.add_argument("--gamma", type=float, default=7.0, help="dflash: the loss of block offset i is weighted "
                        "exp(-(i - 1) / gamma) (default 7, DFlash's for a block of 16)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def options_of(args):
    from .pipeline import Options

    budget = args.budget_minutes
    if budget is None and args.max_tokens is None and args.epochs is None:
        budget = 30.0
    return Options(target=args.target, out=args.out, kind=args.kind, data=args.data, n_predict=args.n_predict,
                   budget_minutes=budget, max_tokens=args.max_tokens, epochs=args.epochs, seed=args.seed,
                   threads=args.threads, draft_vocab=args.draft_vocab, layers=args.layers, n_embd=args.n_embd,
                   held_out=args.held_out, max_prompt_tokens=args.max_prompt_tokens, data_share=args.data_share,
                   read_share=args.read_share, soft_top_k=args.soft_top_k, generator=args.generator,
                   ttt_steps=args.ttt_steps,
                   lr=args.lr, batch_rows=args.batch_rows, quiet=args.quiet, eval_data=args.eval_data, eval_k=args.eval_k,
                   block_size=args.block_size, draft_layers=args.draft_layers, gamma=args.gamma)


def run(args) -> int:
    """0 on success; 2 with one line on stderr for a refused target, option, data or missing torch."""
    from .pipeline import summary, train_drafter

    try:
        report = train_drafter(options_of(args))
    except (TargetError, MissingTorch, ValueError, OSError) as error:  # OSError: a file it cannot read or write
        print(f"train-drafter: {error}", file=sys.stderr)
        return 2
    print(summary(report))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="train-drafter", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
