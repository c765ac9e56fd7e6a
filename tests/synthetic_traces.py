"""Synthetic traces.csv rows for the report and advisor tests: one spec-off baseline and one
spec-on row per cell, self-consistent enough that every derived number can be computed by hand."""
from __future__ import annotations

import json
import re
from pathlib import Path

from specnative.record import schema

BASE_TPS = 40.0


def iid_accept(alpha: float, k: int, rounds: int = 1000):
    """(accept_at_pos, accept_len_hist) strings of exactly i.i.d. acceptance alpha per position."""
    at_pos = [alpha ** i for i in range(1, k + 1)]
    hist = [rounds * alpha ** j * (1 - alpha) for j in range(k)] + [rounds * alpha ** k]
    return ";".join(f"{a:.6g}" for a in at_pos), ";".join(f"{h:.6g}" for h in hist)


def off_row(quant=4, ctx=0, conc=1, temperature=0.0, tps=BASE_TPS, spread=0.02, repeats=3, **extra):
    step_ms = 1000.0 * conc / tps
    row = dict(quant_bits=quant, spec_decode="off", concurrency=conc, ctx_len=ctx, tps=tps,
               lossless_ok=True, seed=42, tps_baseline=tps, temperature=temperature,
               n_predict=64, warmup=1, repeats=repeats, tps_std=tps * spread / 2,
               tps_min=tps * (1 - spread), tps_max=tps * (1 + spread), step_ms=step_ms,
               prefill_target_ms=5.0 + ctx / 100, decode_ms=64 * step_ms,
               total_ms=5.0 + ctx / 100 + 64 * step_ms + 1.0, target_model="t.gguf",
               target_type="Q4_K - Medium", target_sha256="ab" * 32, backend="CPU", n_threads=2,
               flash_attn=False, cell_id=f"q{quant}-c{ctx}-n{conc}-T{temperature}-off",
               run_id="synthetic")
    row.update(extra)
    return row


def on_row(quant=4, ctx=0, conc=1, temperature=0.0, k=4, speedup=1.5, alpha=0.8, c=0.6,
           c_draft=0.1, lossless=True, tps_off=BASE_TPS, spread=0.02, repeats=3, **extra):
    """alpha: per-position acceptance of an i.i.d. draft; draft_accept_rate is accepted/drafted."""
    at_pos, hist = iid_accept(alpha, k)
    tps = tps_off * speedup
    step_ms = 1000.0 * conc / tps_off
    rate = sum(float(a) for a in at_pos.split(";")) / k
    row = dict(quant_bits=quant, spec_decode="on", draft_accept_rate=rate, token_accept_rate=alpha,
               verify_cost_c=c,
               concurrency=conc, ctx_len=ctx, tps=tps, lossless_ok=lossless, seed=42,
               tps_baseline=tps_off, speedup=speedup, k=k, temperature=temperature,
               accept_rule="greedy", n_predict=64, warmup=1, repeats=repeats,
               tps_std=tps * spread / 2, tps_min=tps * (1 - spread), tps_max=tps * (1 + spread),
               mean_accept_len=speedup * (1 + c), c_draft=c_draft, verify_ratio=1.1,
               round_ms=(1 + c) * step_ms, step_ms=step_ms,
               **_spec_times(ctx, 64 * step_ms / speedup),
               accept_at_pos=at_pos, accept_len_hist=hist,
               lossless_method="exact-greedy", first_divergence=-1 if lossless is not False else 17,
               divergence_margin=0.0 if lossless is not False else 0.03, target_model="t.gguf",
               target_type="Q4_K - Medium", target_sha256="ab" * 32, draft_model="d.gguf",
               draft_type="Q4_K - Medium", draft_sha256="cd" * 32, backend="CPU", n_threads=2,
               flash_attn=False, cell_id=f"q{quant}-c{ctx}-n{conc}-T{temperature}-k{k}",
               run_id="synthetic")
    row.update(extra)
    return row


def _spec_times(ctx: int, generation_ms: float) -> dict:
    """Step timers of one spec run whose generation takes generation_ms: draft 30 %, verify 60 %,
    resample 8 %, and 2 % plus 1 ms left to 'other'."""
    times = dict(prefill_target_ms=5.0 + ctx / 100, prefill_draft_ms=1.0 + ctx / 1000,
                 draft_ms=0.3 * generation_ms, verify_ms=0.6 * generation_ms,
                 resample_ms=0.08 * generation_ms)
    times["total_ms"] = sum(times.values()) + 0.02 * generation_ms + 1.0
    return times


def cell(quant=4, ctx=0, conc=1, temperature=0.0, **on):
    """The off and on rows of one regime."""
    return [off_row(quant, ctx, conc, temperature), on_row(quant, ctx, conc, temperature, **on)]


PROVENANCE = dict(
    specnative_version="0.1.0", llama_cpp_commit="0c1e57098", build_flags="-DGGML_NATIVE=OFF",
    backend="CPU", system_info="AVX2 = 1", cpu_model="Synthetic CPU", cpu_count=2, memory_gb=8,
    gpu=None, os="Linux", python="3.11", date="2025-01-01T00:00:00", run_id="synthetic",
    command="python -m specnative.sweep --out runs/synthetic", warmup=1, repeats=3, n_threads=2,
    n_gpu_layers=0, flash_attn=False, grid={"ctx_len": [0, 8192], "concurrency": [1, 4, 8]},
    models=[{"role": "target", "path": "/m/t.gguf", "name": "t", "sha256": "ab" * 32,
             "type": "Q4_K_M", "quant_bits": 4, "n_params": 1000, "size_bytes": 2000},
            {"role": "draft", "path": "/m/d.gguf", "name": "d", "sha256": "cd" * 32,
             "type": "Q4_K_M", "quant_bits": 4, "n_params": 100, "size_bytes": 200}],
    notes=["A same-family draft costs about as much as the target: speculation does not pay."])


def write_run(directory: Path, rows: list, provenance: dict | None = PROVENANCE) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    schema.append_rows(directory / "traces.csv", rows)
    if provenance is not None:
        (directory / "provenance.json").write_text(json.dumps(provenance))
    return directory


def grid_rows(quant=4, speedups=None, c_by_ctx=None, **on):
    """A 2 ctx x 3 concurrency grid; speedups[(ctx, conc)] and c_by_ctx[ctx] override."""
    speedups = speedups or {}
    c_by_ctx = c_by_ctx or {}
    rows = []
    for ctx in (0, 8192):
        for conc in (1, 4, 8):
            rows += cell(quant, ctx, conc, speedup=speedups.get((ctx, conc), 1.5),
                         c=c_by_ctx.get(ctx, 0.6), **on)
    return rows


def assert_tables_well_formed(markdown: str) -> None:
    """Every markdown table row has as many cells as its header (a misaligned column puts each
    number under another heading)."""
    width = None
    for number, line in enumerate(markdown.splitlines(), 1):
        if not line.startswith("|"):
            width = None
            continue
        cells = len(re.split(r"(?<!\\)\|", line.strip())) - 2
        if width is None:
            width = cells
        assert cells == width, f"line {number} has {cells} cells, its table's header {width}: {line}"
