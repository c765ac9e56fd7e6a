"""llama-bench: llama.cpp's baseline decode speed (tg), the peer of our spec-off runs."""
from __future__ import annotations

import json

from .common import run_tool

NAME = "llama-bench"


def bench_cmd(tools, model, n, a):
    return [str(tools[NAME]), "-m", str(model), "-p", "0", "-n", str(n), "-t", str(a.threads),
            "-fa", "1" if a.flash_attn == "on" else "0", "-ngl", str(a.ngl), "-r", "1", "-o", "json"]  # < 0: all layers


def theirs_bench(cmd):
    p = run_tool(cmd)
    rows = json.loads(p.stdout)
    row = rows[0]
    return {"tps": float(row["avg_ts"]), "cpu_info": row.get("cpu_info", ""),
            "build_commit": row.get("build_commit", ""), "params": bench_context_params(row)}


def bench_context_params(row) -> dict:
    """llama-bench's llama_context for a tg test, from its JSON row and its source at the vendored
    commit (tools/llama-bench/llama-bench.cpp, to_llama_cparams): n_ctx = n_prompt + n_gen (+ depth;
    llama.cpp pads it to 256), n_seq_max and kv_unified llama.cpp's defaults (1, false), swa_full
    false; its own ggml threadpool (poll, cpu_strict) attached to the context."""
    n_ctx = int(row.get("n_prompt", 0)) + int(row.get("n_gen", 0)) + int(row.get("n_depth", 0))
    return {"n_ctx": f"{n_ctx} (padded to 256)", "n_batch": row.get("n_batch"), "n_ubatch": row.get("n_ubatch"),
            "n_seq_max": 1, "kv_unified": False, "swa_full": False, "n_threads": row.get("n_threads"),
            "threadpool": f"own, poll {row.get('poll')}, cpu_strict {row.get('cpu_strict')}"}
