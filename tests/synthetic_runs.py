"""Synthetic run folders: traces.csv with the real header and provenance.json, from a noise model
whose truth is known (log-normal repeat noise around a set tokens/s and speedup per regime)."""
from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

from specnative.analysis.stats import geometric_interval, paired_ratios, speedup_interval
from specnative.record.schema import COLUMN_NAMES

# The per-repeat columns, until the schema has them: written after the schema's own.
REPEAT_COLUMNS = tuple(c for c in ("tps_repeats", "speedup_repeats") if c not in COLUMN_NAMES)
TARGET, DRAFT = "ab" * 32, "cd" * 32
REGIMES = tuple((ctx, conc) for ctx in (0, 8192) for conc in (1, 4, 8))


def provenance(run_id: str, **changes) -> dict:
    record = {
        "specnative_version": "0.1.0", "llama_cpp_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        "build_flags": "GGML_NATIVE=OFF GGML_AVX2=ON", "backend": "CPU", "cpu_model": "Synthetic CPU",
        "cpu_count": 2, "gpu": None, "date": "2026-12-01T10:00:00+00:00", "run_id": run_id,
        "command": "python -m specnative.sweep -o runs/synthetic", "preset": "tiny", "repeats": 5,
        "grid": {"ctx_len": [0, 8192], "concurrency": [1, 4, 8], "k": [4], "temperature": [0.0]},
        "models": [{"role": "target", "name": "t.gguf", "sha256": TARGET, "type": "Q4_0", "quant_bits": 4},
                   {"role": "draft", "name": "d.gguf", "sha256": DRAFT, "type": "Q8_0", "quant_bits": 8}],
        "completed": True}
    record.update(changes)
    return record


def _noisy(rng: random.Random, value: float, noise: float, n: int) -> list[float]:
    return [value * math.exp(rng.gauss(0.0, noise)) for _ in range(n)]


def regime_rows(run_id: str, ctx: int, conc: int, rng: random.Random, *, slower: float = 1.0, decoding: float = 1.0,
                repeats: int = 5,
                noise: float = 0.01, verdict: str = "exact", target: str = TARGET, draft: str = DRAFT,
                quant: int = 4, n_threads: int = 2, k: int = 4) -> list[dict]:
    """The off row and the on row of one regime; `slower` scales spec-on tokens/s (0.8: 20 % slower),
    `decoding` both sides' (a slower machine or build: the speedup stays)."""
    base_tps, speedup = decoding * 400.0 / conc / (1 + ctx / 8192), 1.6 / (1 + conc / 8)
    off = _noisy(rng, base_tps, noise, repeats)
    on = [t * speedup * slower * math.exp(rng.gauss(0.0, noise)) for t in off]
    off_iv, on_iv, ratio_iv = geometric_interval(off), geometric_interval(on), speedup_interval(on, off)
    key = f"{target[:16]}|ctx{ctx}|c{conc}|T0|greedy|task=mixed"
    common = dict(quant_bits=quant, concurrency=conc, ctx_len=ctx, seed=0, temperature=0.0, n_predict=32,
                  repeats=repeats, repeats_used=repeats, ci_level=0.95, target_model="t.gguf", target_type="Q4_0",
                  target_sha256=target, backend="CPU", n_threads=n_threads, flash_attn="false", run_id=run_id,
                  task="mixed", drafter="model", prompt_ids="chat/0")
    off_row = dict(common, spec_decode="off", tps=off_iv.estimate, tps_baseline=off_iv.estimate, speedup=1.0,
                   lossless_ok="true", tps_ci_low=off_iv.low, tps_ci_high=off_iv.high, cell_id=key,
                   tps_repeats=";".join(f"{v:.6g}" for v in off))
    on_row = dict(common, spec_decode="on", tps=on_iv.estimate, tps_baseline=off_iv.estimate,
                  speedup=on_iv.estimate / off_iv.estimate, speedup_ci_low=ratio_iv.low, speedup_ci_high=ratio_iv.high,
                  tps_ci_low=on_iv.low, tps_ci_high=on_iv.high, k=k, accept_rule="greedy",
                  draft_accept_rate=0.7, verify_cost_c=0.4, draft_model="d.gguf", draft_sha256=draft,
                  lossless_ok="false" if verdict == "fail" else "true", verdict=verdict,
                  verdict_reason="planted" if verdict == "fail" else "token-identical", cell_id=f"{key}|k{k}",
                  tps_repeats=";".join(f"{v:.6g}" for v in on),
                  speedup_repeats=";".join(f"{v:.6g}" for v in paired_ratios(on, off)))
    return [off_row, on_row]


def sweep_rows(run_id: str, seed: int, regimes=REGIMES, changes: dict | None = None, **common) -> list[dict]:
    """Rows of every regime; changes[(ctx, conc)] = keyword overrides for that regime only."""
    rng, rows = random.Random(seed), []
    for ctx, conc in regimes:
        rows += regime_rows(run_id, ctx, conc, rng, **{**common, **(changes or {}).get((ctx, conc), {})})
    return rows


def write_traces(path: Path, rows: list[dict], with_repeats: bool = True, mode: str = "w") -> None:
    header = COLUMN_NAMES + (REPEAT_COLUMNS if with_repeats else ())
    if not with_repeats:  # a run from before the per-repeat columns
        rows = [{k: v for k, v in row.items() if k not in ("tps_repeats", "speedup_repeats")} for row in rows]
    new = mode == "w" or not path.exists()
    with open(path, mode, newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=header, restval="")
        if new:
            writer.writeheader()
        writer.writerows(rows)


def write_run(directory, run_id: str, rows: list[dict], with_repeats: bool = True, **provenance_changes) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_traces(directory / "traces.csv", rows, with_repeats)
    (directory / "provenance.json").write_text(json.dumps(provenance(run_id, **provenance_changes)))
    return directory
