"""The open-loop streaming client of llama-server: each request of a trace sent at its arrival time
on its own connection and streamed (TTFT and ITL per chunk, as our engine stamps its emissions),
and the level summary of one replay by specnative's own definitions (specnative.serving.metrics).

serve_table.py (the parity run) and serve_parity.py (its runners) both use it; it imports neither.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

from .server import LlamaServer


def replay_open_loop(server: LlamaServer, trace: list, ignore_eos: bool = True) -> list[dict]:
    """Every request sent at its arrival time (its own thread and connection), streamed."""
    t0 = time.perf_counter()

    def send(request):
        delay = request.arrival_s - (time.perf_counter() - t0)
        if delay > 0:
            time.sleep(delay)
        return server.stream(list(request.prompt), request.output_len, ignore_eos, t0)

    with ThreadPoolExecutor(max_workers=len(trace)) as pool:
        return list(pool.map(send, trace))


def server_level(records: list[dict], slo: dict) -> dict:
    """The level summary of one replay, by specnative's own definitions."""
    from specnative.serving import metrics as serve_metrics
    metrics = [serve_metrics.request_metrics(r) for r in records]
    summary = serve_metrics.level_summary(metrics, max(r["finish_ms"] for r in records), slo)
    drafted = sum(r["counts"]["drafted"] for r in records)
    accepted = sum(r["counts"]["accepted"] for r in records)
    summary["draft_accept_rate"] = accepted / drafted if drafted else math.nan
    return summary
