"""`specnative sweep` (also `python -m specnative.sweep`): the closed-batch grid's own flags on top
of the shared ones (run/options.py), checked together before any work, then the run and its report."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specnative.record import shards
from specnative.record.factors import FACTORS
from specnative.report import write_report
from specnative.run import options
from specnative.run.options import (
    add_synthetic_flag,
    draft_shape_list,
    float_list,
    int_list,
    on_off_list,
)
from specnative.run.resume_args import resume_argv, resume_command
from specnative.run.spec import DIST_POSITIONS
from specnative.sweep.config import SweepConfig
from specnative.sweep.runner import run_sweep

DESCRIPTION = ("Measure speculative decoding (spec on vs off) over concurrency x context length x target "
               "quantization, check it is lossless, and write traces.csv + provenance.json + a report. With no "
               "model arguments it runs the embedded tiny preset (no GPU, no network).")


def add_grid_flags(p: argparse.ArgumentParser) -> None:
    grid = p.add_argument_group("grid (each value one cell)")
    grid.add_argument("--ctx-len", type=int_list, default=None, metavar="N,N,...",
                      help="tokens of shared context (documents) ahead of each sequence's own prompt "
                           "(default 0,8192,32768; the gemma3-270m preset: 0,2048; qwen2.5-coder: 0)")
    grid.add_argument("-np", "--concurrency", type=int_list, default=None, metavar="N,N,...",
                      help="sequences decoded together (default 1,4,8)")
    grid.add_argument("--draft-shape", dest="draft_shape", type=draft_shape_list, default=["chain"],
                      metavar="chain,tree:...",
                      help="what the on rows of the draft model and an EAGLE-3 head draft: chain (every --k) and draft trees verified in "
                           "one batch, e.g. tree:topk=4,depth=5,budget=8 (EAGLE-2 / SGLang) or "
                           "tree:branches=4,p_split=0.1,budget=8 (llama.cpp's examples/speculative); each an on "
                           "row of the same cell, timed in the same repeats (docs/trees.md)")
    grid.add_argument("--prefix-cache", type=on_off_list, default=[True], metavar="on,off",
                      help="on: the shared context is prefilled once, its cells shared by the sequences and kept "
                           "between runs; off: every sequence prefills its own copy every run (a server without "
                           "prompt caching); both: one cell each")
    add_synthetic_flag(grid)
    for factor in FACTORS:  # record/factors.py: each a row of its own
        grid.add_argument(factor.flag, dest=factor.name, type=factor_list(factor), default=[factor.default],
                          metavar=factor.metavar, help=f"{factor.help} (default {factor.default})")


def factor_list(factor):
    """argparse's type for a factor's flag: its comma list, a bad value one line naming the flag."""
    def parse(text: str) -> list:
        try:
            return factor.values_from(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    parse.__name__ = factor.flag  # argparse names the type in its message
    return parse


def add_measuring_flags(p: argparse.ArgumentParser, runs: argparse._ArgumentGroup) -> None:
    runs.add_argument("--warmup", type=int, default=3,
                      help="most discarded warm-up runs per cell; warm-up ends earlier at the first run "
                           "whose tps is within --warmup-tol of the run before (that run is timed)")
    runs.add_argument("--warmup-tol", type=float, default=0.10, help="relative tps difference of two "
                      "consecutive runs that counts as warmed up")
    runs.add_argument("-r", "--repeats", type=int, default=2, help="fewest timed runs per cell (spec off and on "
                      "interleaved); more follow until the speedup's interval decides")
    runs.add_argument("--max-repeats", type=int, default=None, help="most timed runs per cell (default: the "
                      "preset's, else 10); a cell that needs more stays undecided (advice: measure-more)")
    runs.add_argument("--ci-level", type=float, default=0.95, help="confidence level of the intervals")
    runs.add_argument("--ci-width", type=float, default=0.05, help="stop once the speedup's interval is "
                      "narrower than this share of the speedup, even if it contains 1")
    runs.add_argument("--dist-positions", type=int, default=DIST_POSITIONS, metavar="N",
                      help="rejection cells: emitted tokens the distributional lossless test pools at least, "
                           "over seeded runs, every other one drafting hotter (its power per size: "
                           "bench/results/rejection-power/)")
    runs.add_argument("--which-k", action="store_true", help="time the verify-cost curve of each draft-model cell "
                      "and predict the speedup at every k' <= k (the summary's which-k table)")
    runs.add_argument("--check-k", action="store_true", help="measure each on row's best predicted draft length "
                      "to check the pick; implies --which-k")


def build_parser(prog: str = "specnative sweep") -> argparse.ArgumentParser:
    p = options.new_parser(prog, DESCRIPTION)
    options.add_model_flags(p, "target model; repeat once per quantization (e.g. a Q4_K_M and a Q8_0 file)")
    add_grid_flags(p)
    options.add_drafter_flags(p, axis=True)
    options.add_sampling_flags(p, axis=True)
    options.add_workload_flags(p)
    runs = options.add_run_flags(p)
    add_measuring_flags(p, runs)
    options.add_placement_flags(p)
    output = options.add_output_flags(p)
    output.add_argument("--shard", type=shards.parse_shard, default=None, metavar="i/N",
                        help="measure only the grid cells whose index is i mod N (0 <= i < N), e.g. one "
                             "Slurm array task each; join the run directories with specnative merge")
    options.add_database_flags(output)
    return p


def describe(cfg: SweepConfig) -> str:
    return (f"specnative sweep -> {cfg.out_dir}\n  targets: {', '.join(Path(t).name for t in cfg.targets)}\n"
            f"  draft: {Path(cfg.draft).name if cfg.draft else '-'}\n  ctx_len {cfg.ctx_lens} x concurrency "
            f"{cfg.concurrencies} x k {cfg.ks} x temperature {cfg.temperatures} ({cfg.accept_rule}), n_predict "
            f"{cfg.n_predict}, warm-up <= {cfg.warmup} (tol {cfg.warmup_tol:g}), repeats {cfg.repeats}-"
            f"{cfg.max_repeats} (until the {cfg.ci_level:.0%} interval decides), threads {cfg.threads}")


def config_from_args(args: argparse.Namespace, argv: list[str]) -> SweepConfig:
    """The sweep's configuration from its parsed flags, checked together before any work."""
    cfg = SweepConfig.from_spec(options.spec_from_args(args, argv, "sweep"))
    cfg.factors = {f.name: getattr(args, f.name) for f in FACTORS if getattr(args, f.name) != [f.default]}
    return cfg


def main(argv: list[str] | None = None, prog: str = "specnative sweep") -> int:
    argv = resume_argv("sweep", sys.argv[1:] if argv is None else list(argv))
    args = build_parser(prog).parse_args(argv)
    if args.no_db and args.db is not None:
        raise SystemExit("error: --db and --no-db: give one of them")
    cfg = config_from_args(args, argv)
    print(describe(cfg), file=sys.stderr)
    try:
        traces = run_sweep(cfg)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished cells are in {cfg.out_dir / 'traces.csv'}; "
              f"continue with: {resume_command('sweep', cfg.out_dir)}", file=sys.stderr)
        return 130
    if cfg.report and traces.exists():  # a shard may have no cells of its own
        print(f"report: {write_report(cfg.out_dir)}", file=sys.stderr)
    print(traces)
    return 0
