"""A sweep's settings and its cells: SweepConfig (the grid and how to measure it) and Cell (one
regime of the grid), with the cell id every traces.csv row carries."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from pathlib import Path

from specnative.engine import HIDDEN_DRAFTERS, TREE_DRAFTERS, default_threads, native, parse_draft_shape
from specnative.record import shards
from specnative.record.factors import FACTORS, factor_named
from specnative.run import workloads
from specnative.run.spec import DIST_POSITIONS, RunSpec
from specnative.sweep import axes

# tokens per sequence a sweep needs at least: the first comes from the prefill and a round's last is
# the target's own (its correction or bonus), so a round drafts only from the third token on (with 1
# there is no decode step at all; with 2 one that drafts nothing, every acceptance rate undefined)
MIN_N_PREDICT = 3


@dataclass
class SweepConfig:
    targets: list
    draft: Path
    ctx_lens: list = field(default_factory=lambda: [0, 8192, 32768])
    concurrencies: list = field(default_factory=lambda: [1, 4, 8])
    ks: list = field(default_factory=lambda: [4])
    temperatures: list = field(default_factory=lambda: [0.0])
    accept_rule: str = "greedy"
    n_predict: int = 32
    warmup: int = 3          # most discarded warm-up runs; fewer once timings settle
    repeats: int = 2         # fewest timed runs; more until the speedup's interval decides
    max_repeats: int = 10
    ci_level: float = 0.95
    ci_width: float = 0.05   # relative width of an interval that is decided even around 1.0
    warmup_tol: float = 0.10
    seed: int = 0
    threads: int = field(default_factory=default_threads)
    gpu_layers: int = 0
    flash_attn: bool = False
    n_batch: int = 512
    max_kv_gib: float = 8.0
    out_dir: Path = Path("runs/latest")
    resume: bool = False
    report: bool = True
    preset: str | None = None
    notes: list = field(default_factory=list)
    command: str = ""
    # Workload: task categories (or workloads.MIXED) as a grid axis; the user's prompts and
    # context documents (None: the built-in suite and documents)
    tasks: list = field(default_factory=lambda: [workloads.MIXED])
    prompts: list | None = None
    prompts_source: str = "built-in"
    dataset: dict | None = None  # --dataset: the public set's record (public_sets.load), prompts in `prompts`
    context_file: Path | None = None
    # Testing aid: run the lossless check's spec run with another seed, which must fail it (the
    # way real comparisons go wrong: two runs that differ in seed).
    check_seed_offset: int = 0
    # --shard i/N: this run measures the grid cells whose index is i mod N (shards.py)
    shard: "shards.Shard | None" = None
    # Placement across devices and RPC hosts: Engine keyword arguments (split_mode, tensor_split,
    # main_gpu, devices, draft_devices, n_gpu_layers_draft, rpc_servers); empty: defaults
    placement: dict = field(default_factory=dict)
    # --drafter: a grid axis; "model" is the draft GGUF, the others llama.cpp's n-gram types
    drafters: list = field(default_factory=lambda: ["model"])
    drafter_options: dict = field(default_factory=dict)  # n-gram options set on the command line
    check_k: bool = False  # --check-k: measure the best predicted k of each on row (pick_k.py)
    # --which-k: the verify-cost curve and the speedup predicted at every k' <= k (pick_k.py); off by
    # default since it times (k+1) extra decode shapes per cell, most of a long-context cell's cost
    which_k: bool = False
    dist_positions: int = DIST_POSITIONS  # rejection cells: the distributional test's size (run/spec.py)
    # --drafter-file NAME=PATH: the file of a hidden-state drafter (dflash, dspark, eagle3);
    # unnamed ones use -md (hidden_drafters.py)
    drafter_files: dict = field(default_factory=dict)
    # --prefix-cache on,off: a grid axis (True: the shared context's cells computed once and shared)
    prefix_caches: list = field(default_factory=lambda: [True])
    # --synthetic-acceptance: profiles (specnative.engine.synthetic) each drafter is also timed with, drafts
    # kept at random at that acceptance (rows with verdict "synthetic"; empty: off)
    synthetic: list = field(default_factory=list)
    # the results database the run folder is synced into after every cell (record/database.py); None: none
    db: Path | None = None
    # --draft-shape: what the on rows of the draft model and an EAGLE-3 head draft: "chain" (every --k) and draft trees by
    # their spelling (engine/draft_shape.py), each an on row of the same cell, timed in the same
    # repeats as the chains (paired intervals)
    draft_shapes: list = field(default_factory=lambda: ["chain"])
    # the grid's factors (record/factors.py): name -> the values its flag gave (absent: its default)
    factors: dict = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: RunSpec) -> SweepConfig:
        """The sweep's configuration from the run's settings (the shared flags, run/options.py)."""
        m, p, d, r, w, x, o = (spec.models, spec.placement, spec.decoding, spec.drafter, spec.workload, spec.measure,
                               spec.output)
        return cls(
            targets=m.targets, draft=m.draft, drafter_files=m.drafter_files, preset=m.preset, notes=m.notes,
            threads=p.threads, gpu_layers=p.gpu_layers, flash_attn=p.flash_attn, n_batch=p.n_batch,
            max_kv_gib=p.max_kv_gib, placement=p.devices,
            temperatures=d.temperatures, accept_rule=d.accept_rule, n_predict=d.n_predict, seed=d.seed,
            drafters=r.drafters, ks=r.ks, drafter_options=r.drafter_options, draft_shapes=r.draft_shapes,
            synthetic=r.synthetic,
            tasks=w.tasks, prompts=w.prompts, prompts_source=w.prompts_source, dataset=w.dataset,
            ctx_lens=w.ctx_lens, context_file=w.context_file, prefix_caches=w.prefix_caches,
            warmup=x.warmup, repeats=x.repeats, max_repeats=x.max_repeats, ci_level=x.ci_level,
            ci_width=x.ci_width, warmup_tol=x.warmup_tol, dist_positions=x.dist_positions, which_k=x.which_k,
            check_k=x.check_k, concurrencies=spec.load.concurrencies,
            out_dir=o.out_dir, command=o.command, resume=o.resume, report=o.report, db=o.db, shard=o.shard)


def drafter_options_of(cfg: SweepConfig, drafter: str) -> dict:
    """The llama.cpp options a cell's n-gram drafter runs with: those of the command line that
    belong to it (none for the draft model; drafter_options_problem refuses the others)."""
    return {} if drafter == "model" else {name: value for name, value in cfg.drafter_options.items()
                                          if native.drafter_of_option(name) == drafter}


def on_kinds(cfg: SweepConfig, drafter: str, cell: Cell | None = None) -> list:
    """A cell's on rows, in order: every k of the chain (an int), then every draft tree's spelling
    (a str; the draft model and an EAGLE-3 head only). Without "chain" among the draft shapes only
    the trees run. A cell whose factor applies to chains only (record/factors.py) has only chains."""
    trees = [s for s in cfg.draft_shapes if s != "chain"] if drafter in TREE_DRAFTERS else []
    chains = list(cfg.ks) if "chain" in cfg.draft_shapes or not trees else []
    if cell is not None and cell.chains_only:
        return list(cfg.ks)
    return chains + trees


def factor_combinations(cfg: SweepConfig, drafter: str, placed: bool | None = None) -> list[tuple]:
    """Each combination of the grid's factor values that applies to `drafter`'s cells, as a Cell's
    factors (the values other than the default, by name); ((),) where every factor is at its default.
    `placed`: only the factors with (True) or without (False) a place among the cell's axes."""
    chosen = [[(f.name, v) for v in cfg.factors.get(f.name, [f.default]) if v == f.default or f.drafters(drafter)]
              for f in FACTORS if placed is None or (f.key_after is not None) == placed]
    return [tuple((name, v) for name, v in combo if v != factor_named(name).default)
            for combo in itertools.product(*chosen)]


def tree_ids_per_sequence(cfg: SweepConfig) -> int:
    """KV sequence ids one sequence needs for the grid's largest draft tree (1: chains only)."""
    return max([parse_draft_shape(s).ids_per_sequence for s in cfg.draft_shapes], default=1)


def lookahead(cfg: SweepConfig) -> int:
    """KV cells a round holds beyond the pending token at most: the largest k or tree (a split
    tree's last step may pass its budget by a branch's siblings; a topk tree's draft feeds up to
    topk nodes per level)."""
    trees = [parse_draft_shape(s) for s in cfg.draft_shapes if s != "chain"]
    return max([*cfg.ks] + [t.cells_per_round for t in trees])


def grid_problems(cfg: SweepConfig) -> list[str]:
    """What no cell of the grid could run, one line each, from the settings alone (run_sweep checks
    them before the run folder is made): too few tokens for a decode step, the draft model's stop
    rule with draft trees, a tree's verify batch past --batch-size, more sequence ids than
    llama.cpp holds."""
    problems = []
    if cfg.n_predict < MIN_N_PREDICT:
        problems.append(f"-n/--n-predict {cfg.n_predict}: a sweep needs at least {MIN_N_PREDICT} tokens per "
                        f"sequence (the first comes from the prefill and a round's last is the target's own, so "
                        f"only from {MIN_N_PREDICT} on does a decode step draft a token)")
    for factor in FACTORS:  # what a factor's values cannot run with (record/factors.py)
        values = cfg.factors.get(factor.name, [factor.default])
        problems += factor.problems(values, cfg)
        if factor.chains_only and values != [factor.default] and "chain" not in cfg.draft_shapes:
            problems.append(f"{factor.flag}: applies to chains, and --draft-shape has none (add chain)")
    trees = [parse_draft_shape(s) for s in cfg.draft_shapes if s != "chain"]
    if not trees or not set(TREE_DRAFTERS) & set(cfg.drafters):
        return problems
    conc = max(cfg.concurrencies)
    for tree in trees:
        per_sequence = tree.batch_per_sequence
        if conc * per_sequence > cfg.n_batch:
            problems.append(f"draft tree {tree} puts up to {per_sequence} tokens per sequence through one batch "
                            f"(its nodes and the pending token): at concurrency {conc} that is "
                            f"{conc * per_sequence}, over --batch-size {cfg.n_batch}")
    widest = max(trees, key=lambda t: t.ids_per_sequence)
    ids = conc * widest.ids_per_sequence
    what = (f"draft tree {widest} has up to {widest.ids_per_sequence} branches per sequence, each its own "
            f"sequence id (docs/trees.md): at concurrency {conc} that is {ids} sequence ids")
    if ids > native.max_parallel_sequences:
        problems.append(f"{what}, over llama.cpp's most sequences per context ({native.max_parallel_sequences})")
    elif ids > cfg.n_batch:
        problems.append(f"{what}, over --batch-size {cfg.n_batch} (every step decodes a token of each sequence "
                        f"id in one batch)")
    return problems


def kind_args(kind) -> dict:
    """generate()'s arguments for an on row's kind: k for a chain, draft_shape for a tree."""
    return {"draft_shape": kind} if isinstance(kind, str) else {"k": kind}


def kind_budget(kind) -> int:
    """Tokens an on row's kind verifies per round at most beside the pending one: k, or the
    tree's node budget (the noise control's chunk and the k column)."""
    if isinstance(kind, str):
        return parse_draft_shape(kind).budget
    return kind


@dataclass(frozen=True)
class Cell:
    target: Path
    ctx_len: int
    concurrency: int
    temperature: float
    task: str = workloads.MIXED
    drafter: str = "model"
    batch: int = 0  # a public set's cells: which batch of the task's items (workloads.batches_of)
    prefix_cache: bool = True  # the shared context's cells computed once and shared (False: each sequence's own)
    factors: tuple = ()  # (name, value) of each factor (record/factors.py) not at its default

    def factor(self, name: str):
        return dict(self.factors).get(name, factor_named(name).default)

    @property
    def factor_args(self) -> dict:
        """generate()'s keywords for the cell's speculative runs (nothing at the defaults: those
        cells run exactly as before the factors)."""
        return dict(self.factors)

    @property
    def chains_only(self) -> bool:
        return any(factor_named(name).chains_only for name, _ in self.factors)

    @property
    def lengths_vary(self) -> bool:
        """Whether a factor makes the draft length vary from round to round (no fixed-k prediction)."""
        return any(factor_named(name).lengths_vary(value) for name, value in self.factors)

    @property
    def shares_prefix(self) -> bool:
        """Whether the sequences share the context's KV cells: the prefix cache on, and a drafter that
        keeps no per-sequence state from each sequence's own prefill (hidden-state drafters do)."""
        return self.prefix_cache and self.drafter not in HIDDEN_DRAFTERS

    def key(self, target_sha: str, rule: str, k: int | str | None = None, synthetic: str | None = None) -> str:
        """The cell id (axes.py); with k an on row's (a chain's k or a tree's spelling), with
        `synthetic` (a profile's text) a synthetic row's."""
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        return axes.cell_key(target_sha, {**values, "accept_rule": rule}, k, synthetic)
