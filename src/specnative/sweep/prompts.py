"""What a cell's sequences read, tokenized for the cell's target (workloads), and the traces.csv
columns that say so."""
from __future__ import annotations

import dataclasses
import statistics

from specnative.engine import Engine
from specnative.run import workloads
from specnative.sweep.config import Cell, SweepConfig

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
