"""What models can hold, read from their GGUF headers before anything loads: the training context
and the KV bytes per cell, and why a number of tokens or cells cannot run with them (a sweep's
cells and a serve run's levels are checked with the same rules)."""
from __future__ import annotations

from pathlib import Path

from specnative.engine import gguf_checks


def gguf_shape(path: Path) -> dict:
    """Training context and KV bytes per cell (f16 K and V) from a GGUF header, read before
    any model is loaded so that impossible cells are refused up front."""
    header = gguf_checks.read_header(path)
    arch = header.arch
    value = lambda key, default=None: header.get(f"{arch}.{key}") if header.get(f"{arch}.{key}") is not None \
        else default
    n_head = value("attention.head_count")
    n_head = max(n_head) if isinstance(n_head, list) else n_head
    n_head_kv = value("attention.head_count_kv", n_head)
    n_head_kv = max(n_head_kv) if isinstance(n_head_kv, list) else n_head_kv
    head_dim = value("embedding_length") // n_head
    k_len, v_len = value("attention.key_length", head_dim), value("attention.value_length", head_dim)
    return {"n_ctx_train": int(value("context_length")),
            "kv_bytes_per_cell": 2 * int(value("block_count")) * int(n_head_kv) * (int(k_len) + int(v_len))}


def context_refusal(need: int, shapes: list[dict], what: str) -> str | None:
    """Why `need` tokens of one sequence (`what` says what they add up from) cannot run with
    these models (target and draft shapes, gguf_shape), or None."""
    n_ctx_train = min(s["n_ctx_train"] for s in shapes)
    if need > n_ctx_train:
        return f"{what} = {need} exceeds the models' training context {n_ctx_train}"
    return None


def kv_refusal(cells: int, shapes: list[dict], max_kv_gib: float) -> str | None:
    """Why KV caches of `cells` cells for each model cannot be held within --max-kv-gib, or None."""
    kv_gib = cells * sum(s["kv_bytes_per_cell"] for s in shapes) / 2**30
    if kv_gib > max_kv_gib:
        size = f"{kv_gib:.1f}" if kv_gib >= 0.1 else f"{kv_gib:.2g}"
        return f"its KV caches would take {size} GiB, over --max-kv-gib {max_kv_gib:g}"
    return None
