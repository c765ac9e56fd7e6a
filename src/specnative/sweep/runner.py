"""Running a sweep: one engine per target and context length, cell by cell, rows appended and
flushed as each cell finishes, provenance.json kept current, resume and the run-folder lock."""
from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

from specnative.engine import Engine, drafter_options_text
from specnative.lossless.noise_summary import record_noise
from specnative.record import database, rundir
from specnative.record.provenance import environment, model_record, now_iso, sha256_file, write_json
from specnative.record.schema import append_rows
from specnative.run import hidden_drafters, workloads
from specnative.sweep import axes
from specnative.sweep import progress as progress_display
from specnative.sweep.checks import dist_runs
from specnative.sweep.config import (
    Cell,
    SweepConfig,
    drafter_options_of,
    grid_problems,
    on_kinds,
    tree_ids_per_sequence,
)
from specnative.sweep.grid import (
    by_ctx_len,
    cells_of,
    checked_grid,
    kv_cells_needed,
    placement_tag,
    shard_cells,
    shard_record,
)
from specnative.sweep.measure import measure_cell
from specnative.sweep.prompts import cell_config, prompt_columns, workload_for


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
        keys[cell] = ([cell.key(sha, cfg.accept_rule)] + [cell.key(sha, cfg.accept_rule, k) for k in on_kinds(cfg, cell.drafter, cell)]
                      + [cell.key(sha, cfg.accept_rule, k, p.text) for k in cfg.ks for p in cfg.synthetic])
    return rundir.plan_resume(traces, keys), recorded


def engine_for(cfg: SweepConfig, target: Path, cells: list[Cell], own_tokens: int = 64) -> Engine:
    """One engine for `cells` (one target and context length, by_ctx_len), sized for the largest
    of them, so the shared prefix stays cached from cell to cell."""
    n_ctx = max(kv_cells_needed(cfg, c.ctx_len, c.concurrency, own_tokens, c.shares_prefix) for c in cells)
    draft, mtp = hidden_drafters.engine_draft(cells[0].drafter, cfg.draft, cfg.drafter_files)
    try:
        return Engine(target, draft, n_ctx=n_ctx, n_batch=cfg.n_batch, n_threads=cfg.threads,
                      n_gpu_layers=cfg.gpu_layers, n_seq_max=max(cfg.concurrencies) * tree_ids_per_sequence(cfg),
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
        "prefix_cache": "on" if cell.shares_prefix else "off",
        **prompt_columns(cfg, cell),
    }


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
                                  (row.get("draft_shape") or row["k"]) if row["spec_decode"] == "on" else None,
                                  row.get("synthetic_acceptance"))
    append_rows(traces, rows)
    progress.finish(cell, rows)
    provenance["sweep_timing"] = progress.timing_record()
    provenance["workload"] = workload_for(cfg, cell.target).record()
    record_noise(provenance.setdefault("noise_control", {}), target_rec["name"], backend,
                          [r for r in rows if r["spec_decode"] == "on"])
    write_json(traces.parent / "provenance.json", provenance)
    if cfg.db is not None:  # derived from the folder, after it is whole: a kill leaves both consistent
        database.sync_or_warn(cfg.db, traces.parent)


def run_sweep(cfg: SweepConfig) -> Path:
    """Runs the grid; returns the traces.csv path. KeyboardInterrupt propagates after the
    finished cells are on disk. The run directory is locked for the whole run (rundir.py); a grid
    no cell of which could run (config.grid_problems) is refused before it is made."""
    if problems := grid_problems(cfg):
        raise SystemExit("error: " + "\n       ".join(problems))
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
    synthetic_runs = len(cfg.synthetic) * len(cfg.ks) * (cfg.repeats + 1)  # per cell, beside its own (estimate)
    progress = progress_display.SweepProgress(cells, progress_display.works_of(cells, cfg.n_predict,
                                                                               extra_runs=lambda c: dist_runs(cfg, c) + synthetic_runs))
    provenance = {**env, "date": now_iso(), "run_id": run_id, "command": cfg.command,
                  "preset": cfg.preset, "warmup": cfg.warmup, "repeats": cfg.repeats,
                  "max_repeats": cfg.max_repeats, "ci_level": cfg.ci_level, "ci_width": cfg.ci_width,
                  "warmup_tol": cfg.warmup_tol, "dist_positions": cfg.dist_positions, "which_k": cfg.which_k,
                  "n_threads": cfg.threads, "n_gpu_layers": cfg.gpu_layers, "flash_attn": cfg.flash_attn,
                  "grid": axes.grid_record(cfg),
                  "drafter_options": {d: drafter_options_text(d, drafter_options_of(cfg, d))
                                      for d in cfg.drafters if d != "model"},
                  "models": [], "notes": list(cfg.notes) + hidden_drafters.prefix_note(cfg.prefix_caches, cfg.drafters),
                  "refused_cells": [], "completed": False}
    provenance["settings"] = run_settings(cfg)
    provenance["cells_planned"] = len(cells)  # this shard's: a report of an unfinished run counts what is missing
    if cfg.drafter_files:  # only when set: older run directories still resume
        provenance["settings"]["drafter_files_sha256"] = {d: sha256_file(p) for d, p in cfg.drafter_files.items()}
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
    if cfg.db is not None and traces.exists():
        database.sync_or_warn(cfg.db, out, final=True)
    if (not traces.exists() or traces.stat().st_size == 0) and cfg.shard is None:
        raise SystemExit(f"error: every cell was refused (reasons above and in {out / 'provenance.json'}): "
                         f"nothing was measured")
    return traces
