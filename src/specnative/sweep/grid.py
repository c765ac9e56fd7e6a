"""The grid: its cells in order, a shard's share, and which cells cannot run (training context, KV
budget), checked for the whole grid before anything is measured."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

from specnative.record import shards
from specnative.record.provenance import sha256_file
from specnative.run import hidden_drafters, model_checks, workloads
from specnative.run.capacity import context_refusal, gguf_shape, kv_refusal
from specnative.sweep.config import Cell, SweepConfig, factor_combinations, lookahead
from specnative.sweep.prompts import workload_for


# ---------------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------------
def cells_of(cfg: SweepConfig) -> list[Cell]:
    # ctx ascending per target, one engine per context length (by_ctx_len); tasks innermost:
    # their cells share the same context documents, prefilled once per engine
    # (a public set's task has a cell per batch of its items: workloads.batches_of)
    # (the prefix cache: the on and off cells of a regime are measured side by side; a hidden-state
    # drafter's cells only off, hidden_drafters.prefix_modes)
    # (the factors, record/factors.py: one cell per combination of the values that apply to the
    # drafter, the draft model's stop rule to the draft model alone; innermost, but a factor placed
    # after the drafter sits there, as it did before it was a factor: a shard of an older run holds
    # the same cells)
    return [Cell(Path(t), ctx, conc, temp, task, drafter, batch, prefix_cache, placed + inner)
            for t, ctx, conc, temp, task in itertools.product(cfg.targets, sorted(cfg.ctx_lens),
                                                              sorted(cfg.concurrencies), cfg.temperatures, cfg.tasks)
            for batch in range(len(workloads.batches_of(cfg.prompts, task, conc)))
            for drafter in cfg.drafters
            for placed in factor_combinations(cfg, drafter, placed=True)
            for prefix_cache in hidden_drafters.prefix_modes(cfg.prefix_caches, drafter)
            for inner in factor_combinations(cfg, drafter, placed=False)]


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
    per_sequence = own_tokens + cfg.n_predict + lookahead(cfg) + 1  # own prompt + generation + look-ahead
    return ctx_len + concurrency * per_sequence if shared else concurrency * (ctx_len + per_sequence)


def refusal(cfg: SweepConfig, ctx_len: int, concurrency: int, shapes: list[dict],
            own_tokens: int = 64, shared: bool = True) -> str | None:
    """Why a cell cannot run with these models (target and draft shapes), or None."""
    return (context_refusal(ctx_len + own_tokens + cfg.n_predict + lookahead(cfg) + 1, shapes,
                            f"ctx_len {ctx_len} + prompt + n_predict + k + 1")
            or kv_refusal(kv_cells_needed(cfg, ctx_len, concurrency, own_tokens, shared), shapes, cfg.max_kv_gib))


def checked_grid(cfg: SweepConfig, cells: list, provenance: dict, progress) -> list[tuple]:
    """Every model file through llama.cpp's loader checks, the header reader and the draft's
    vocabulary against every target (model_checks.py), then each cell against the models' shapes;
    for the whole grid before anything is measured. Returns (target, runnable cells, own
    tokens) per target; refused cells are recorded with their reason."""
    vocabs = {target: model_checks.vocab_model(target, "target") for target in map(Path, cfg.targets)}
    for path, role in ([(t, "target") for t in vocabs] + ([(Path(cfg.draft), "draft")] if cfg.draft else [])
                       + [(Path(p), "draft") for p in cfg.drafter_files.values()]):
        model_checks.header_checked(path, role)
    # no -md: only drafters that need no draft model (n-gram, mtp, hidden drafters by --drafter-file)
    # (-md a hidden-state drafter's file: the Engine checks its vocabulary; the draft model's here)
    draft_vocab = model_checks.vocab_model(cfg.draft, "draft") if cfg.draft and "model" in cfg.drafters else None
    draft_shape = model_checks.header_shape(gguf_shape, cfg.draft, "draft") if cfg.draft else None
    if "model" in cfg.drafters:
        provenance["notes"] += [n for n in model_checks.check_vocabularies(draft_vocab, vocabs)
                                if n not in provenance["notes"]]
    planned = []
    for target in vocabs:
        shapes = [shape for shape in (model_checks.header_shape(gguf_shape, target, "target"), draft_shape) if shape]
        workload = workload_for(cfg, target)
        provenance["workload"] = workload.record()  # on disk with the models (an interrupted run keeps it)
        own_tokens = workload.max_own_tokens(cfg.tasks, max(cfg.concurrencies))
        runnable = []
        for cell in (c for c in cells if c.target == target):
            reason = (refusal(cfg, cell.ctx_len, cell.concurrency, shapes, own_tokens,
                              shared=cell.shares_prefix)
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


def by_ctx_len(cells: list[Cell], engine_key=lambda drafter: None) -> list[list[Cell]]:
    """Cells grouped by context length, in order: each group gets its own engine, sized for its
    largest cell. A cache sized for the grid's longest context would make every rollback of the
    short cells slow: llama.cpp's KV removal scans every cell of the cache (O(n_ctx)).
    engine_key(drafter) splits a group further (a hidden-state drafter needs its own engine)."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.ctx_len, engine_key(cell.drafter)), []).append(cell)
    return list(groups.values())
