"""The closed-batch sweep (`specnative sweep`, `python -m specnative.sweep`): speculative decoding
measured over a grid of regimes.

For every cell (target quantization x ctx_len x concurrency x temperature x task x drafter) the
sweep
  1. checks losslessness (checks.py): spec output against the baseline's (greedy: token equality
     or the numeric verdict; `match`: per seed; `rejection`: in distribution, with `match` at the
     same seed as a proxy);
  2. warms up until two runs agree, then times spec off and on interleaved until the speedup's
     confidence interval decides (measure.py, stats.py);
  3. appends one `off` row and one `on` row per k to traces.csv and flushes it (runner.py).
Ctrl-C stops after writing every finished cell; `--resume` skips cells already in the file.

Memory: the ctx_len documents are a prefix common to all sequences; with the prefix cache on its
cells are computed once, shared and kept between runs and cells. A cell whose prompt does not fit
the model's training context, or whose KV cache would exceed --max-kv-gib, is refused with the
reason (grid.py).
"""
from specnative.sweep.cli import build_parser, config_from_args, main
from specnative.sweep.config import Cell, SweepConfig
from specnative.sweep.runner import run_sweep

__all__ = ["Cell", "SweepConfig", "build_parser", "config_from_args", "main", "run_sweep"]
