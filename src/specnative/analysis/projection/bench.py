"""llama-bench for hardware you don't have [projected]: `specnative project --bench TESTS --model MODEL
--hardware NAMES`. Each test is priced on each device by the cost model (cost.py; on CUDA the
and Metal the kernel llama.cpp's vendored source selects per matrix product, cuda.py and metal.py):

- ppN: one prompt of N tokens in forwards of at most n_ubatch rows; avg_ts = N / its time;
  n_rows = the rows of its first forward;
- tgN: N one-token forwards; avg_ts = N / their time; n_rows = 1;
- ppA-B: every ppN for N from A to B (the verify curve: a verify of k + 1 rows is pp(k+1)).

kernel names the family the layer matrices run with at n_rows (CUDA: mmvq, mmq, mmvf, mmf,
cublas, and mmq-dp4a under the early-2024 kernel set; Metal: mul_mv, mul_mv_ext, mul_mm; a CPU:
"cpu"), verify_ratio the forward time of n_rows rows over one row's (both from an empty cache). Nothing here writes a file.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from specnative.analysis.projection import cost
from specnative.analysis.projection.device import Device
from specnative.analysis.projection.shape import ModelShape, from_config, from_gguf, type_size

N_UBATCH = 512     # llama-bench's default -ub
MAX_TOKENS = 65536  # the longest test priced
COLUMNS = ["label", "hardware", "model", "model_type", "type", "test", "n_prompt", "n_gen", "n_rows", "kernel",
           "flash_attn", "avg_ts", "verify_ratio"]
CSV_COLUMNS = ["hardware", "model", "type", "test", "n_rows", "kernel", "avg_ts", "verify_ratio"]


class BenchError(ValueError):
    """A test, a model or a type `project --bench` cannot price (one line)."""


def parse_tests(spec: str) -> list:
    """('pp', N) and ('tg', N) for a comma-separated list: pp512, tg128, pp1-16."""
    tests = []
    for part in (p.strip() for p in str(spec).split(",")):
        m = re.fullmatch(r"(pp|tg)(\d+)(?:-(\d+))?", part)
        if not m:
            raise BenchError(f"cannot price test {part!r}: give ppN, tgN or ppA-B (e.g. pp512,tg128,pp1-16)")
        kind, lo = m.group(1), int(m.group(2))
        hi = int(m.group(3)) if m.group(3) else lo
        if lo < 1 or hi < lo or hi > MAX_TOKENS or (m.group(3) and kind != "pp"):
            raise BenchError(f"cannot price test {part!r}: N from 1 to {MAX_TOKENS}, a range only for pp (ppA-B, A <= B)")
        tests += [(kind, n) for n in range(lo, hi + 1)]
    if not tests:
        raise BenchError("no test named: give --bench pp512,tg128,...")
    return list(dict.fromkeys(tests))


def load_model(path, weight_type: str | None) -> ModelShape:
    """A GGUF file (its own types; --type refused) or an HF config.json with --type."""
    path = Path(path).expanduser()
    if path.suffix == ".json":
        if not weight_type:
            raise BenchError(f"{path.name} is a config.json: give --type (e.g. Q4_0, Q4_K_M, F16)")
        from specnative.analysis.projection.shape import MIXES

        if weight_type.upper() not in MIXES:
            type_size(weight_type)  # a ShapeError naming the unknown type
        return from_config(path, weight_type)
    if weight_type:
        raise BenchError(f"--type applies to a config.json; {path.name}'s types are its own")
    return from_gguf(path)


def main_type(shape: ModelShape) -> str:
    """The type most of the layer matrices' bytes are stored in."""
    layers = [w for w in shape.weights if w.role == "layer"] or list(shape.weights)
    return max(layers, key=lambda w: w.n_bytes).type_name


def model_type(shape: ModelShape, type_label: str) -> str:
    """llama-bench's model_type: architecture, size, type (e.g. 'llama 7B Q4_0')."""
    n = sum(w.n_elements for w in shape.weights)
    size = f"{n / 1e9:.0f}B" if n >= 1e10 else (f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M")
    return f"{shape.arch} {size} {type_label}"


def _kernel(shape: ModelShape, device: Device, rows: int) -> str:
    if device.backend == "cpu":
        return device.backend
    return cost.forward(shape, device, rows).kernel


@dataclass(frozen=True)
class BenchRow:
    hardware: str
    model: str
    model_type: str
    type: str
    test: str
    n_prompt: int
    n_gen: int
    n_rows: int
    kernel: str
    flash_attn: bool
    avg_ts: float
    verify_ratio: float


def bench(shape: ModelShape, devices: list, tests: list, flash_attn: bool = False, type_label: str | None = None,
          n_ubatch: int = N_UBATCH) -> list:
    """One BenchRow per (device, test), in the order given."""
    type_label = type_label or main_type(shape)
    out = []
    for device in devices:
        one = cost.forward_s(shape, device, 1, flash_attn=flash_attn)
        for kind, n in tests:
            if kind == "pp":
                rows = min(n, n_ubatch)
                seconds = cost.prefill_s(shape, device, n, n_ubatch, flash_attn=flash_attn)
            else:
                rows = 1
                seconds = n / cost.decode_rate(shape, device, n, flash_attn=flash_attn)
            ratio = cost.forward_s(shape, device, rows, flash_attn=flash_attn) / one
            tps = n / seconds
            if not math.isfinite(tps):
                raise BenchError(f"{kind}{n} on {device.name} has no finite time")
            out.append(BenchRow(device.name, shape.name, model_type(shape, type_label), type_label, f"{kind}{n}",
                                n if kind == "pp" else 0, n if kind == "tg" else 0, rows,
                                _kernel(shape, device, rows), flash_attn, tps, ratio))
    return out


def table(rows: list):
    import pandas as pd

    return pd.DataFrame([{"label": cost.LABEL, **r.__dict__} for r in rows], columns=COLUMNS)

