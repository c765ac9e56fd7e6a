"""A run's settings as the shared flags resolve them (run/options.py spec_from_args), in small typed
parts that a sweep's configuration (sweep/config.py SweepConfig.from_spec) and a serve run's
(serving/cli.py config_from) are composed from: neither verb reads the other's settings.

Lists are the values the flags gave, in their order (an axis: one cell or level per value).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specnative.record import shards

# rejection cells: emitted tokens the distributional test pools at least: every planted
# rejection-rule fault fails at it with >= 95 % on the tiny pairs and Gemma 3 270M (the residual
# drawn from p on Gemma needs it: 74-79 % at 2048; bench/results/rejection-power-gemma*.md)
DIST_POSITIONS = 4096


@dataclass(frozen=True)
class ModelsSpec:
    """Which files run: the targets (one per quantization), the draft model, the hidden-state
    drafters' files by name, and the preset they came from with its notes."""
    targets: list
    draft: Path | None
    drafter_files: dict = field(default_factory=dict)
    preset: str | None = None
    notes: list = field(default_factory=list)


@dataclass(frozen=True)
class PlacementSpec:
    """Where and how the models run: threads, offloaded layers, flash attention, the batch size, the
    KV budget, and the device placement (Engine keyword arguments; empty: llama.cpp's defaults)."""
    threads: int
    gpu_layers: int = 0
    flash_attn: bool = False
    n_batch: int = 512
    max_kv_gib: float = 8.0
    devices: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DecodingSpec:
    """How tokens are chosen: the temperatures, the acceptance rule, tokens per sequence, the seed."""
    temperatures: list
    accept_rule: str
    n_predict: int
    seed: int = 0


@dataclass(frozen=True)
class DrafterSpec:
    """What drafts: the drafters, their options, the chain lengths k, the draft shapes and the
    synthetic acceptance profiles (the sweep's factors, the draft model's stop rule among them, are
    record/factors.py's rows)."""
    drafters: list
    ks: list
    drafter_options: dict = field(default_factory=dict)
    draft_shapes: list = field(default_factory=lambda: ["chain"])
    synthetic: list = field(default_factory=list)


@dataclass(frozen=True)
class WorkloadSpec:
    """What the sequences write: task categories, the prompts (None: the built-in suite), a public
    set's record, the shared context's lengths and file, and the prefix cache's modes."""
    tasks: list
    prompts: list | None
    prompts_source: str
    dataset: dict | None
    ctx_lens: list
    context_file: Path | None = None
    prefix_caches: list = field(default_factory=lambda: [True])


@dataclass(frozen=True)
class MeasureSpec:
    """How a measurement is made and when it stops: warm-up, repeats, intervals, the distributional
    test's size, the which-k curve and its check."""
    warmup: int
    repeats: int
    max_repeats: int
    ci_level: float
    ci_width: float
    warmup_tol: float
    dist_positions: int
    which_k: bool = False
    check_k: bool = False


@dataclass(frozen=True)
class LoadSpec:
    """How many sequences decode together (the sweep's axis; a serve run's slots)."""
    concurrencies: list


@dataclass(frozen=True)
class OutputSpec:
    """Where the run goes and what it writes: the folder, resume, the report, the results database,
    this run's share of a sharded grid and the command as typed."""
    out_dir: Path
    command: str
    resume: bool = False
    report: bool = True
    db: Path | None = None
    shard: shards.Shard | None = None


@dataclass(frozen=True)
class RunSpec:
    models: ModelsSpec
    placement: PlacementSpec
    decoding: DecodingSpec
    drafter: DrafterSpec
    workload: WorkloadSpec
    measure: MeasureSpec
    load: LoadSpec
    output: OutputSpec
