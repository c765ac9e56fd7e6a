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
            "build_commit": row.get("build_commit", "")}
