"""The interleaved serving comparison: on every trace, specnative's serving loop (in-process, one
Engine kept open) and llama-server (one process per spec setting, started once and kept warm)
replay the same requests back to back, so that whatever the machine does to one side in that
minute it does to the other, and the per-trace ratios pair.

The order within a trace: ours off, server off, ours on, server on; the next trace runs it
reversed (server on, ours on, server off, ours off), so each side goes first in half of the pairs
and a linear drift over two traces cancels (an ABBA design).

`measure` takes a `run(side, spec, trace)` callable and is independent of what runs: the real
sides are `ours_runner` (specnative.serving.runner.replay on the open Engine) and
`server_runner` (the open-loop streaming client of open_loop.replay_open_loop against the
server of that setting, with its /metrics read before and after).
"""
from __future__ import annotations

import math
import os
import time
from typing import Callable

from .common import busy_cores, log
from .open_loop import replay_open_loop, server_level
from .serve_paired import OURS, SERVER
from .server import metrics_delta

ORDER = ((OURS, "off"), (SERVER, "off"), (OURS, "on"), (SERVER, "on"))


def schedule(index: int) -> list[tuple[str, str]]:
    """(side, spec) in the order trace `index` runs them: ORDER, reversed on odd traces."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"a trace index is an integer >= 0, not {index!r}")
    return list(ORDER) if index % 2 == 0 else list(reversed(ORDER))


def same_requests(ours: list, theirs: list) -> list[int]:
    """Indices of the requests whose generated tokens are the same on both sides (trace order).
    Greedy outputs can differ where a near-tie flips between batch shapes (which requests share
    an iteration depends on timing), and α then counts drafts against other text."""
    return [i for i, (a, b) in enumerate(zip(ours, theirs)) if list(a) == list(b)]


def host_state() -> dict:
    """Cores busy elsewhere over half a second (we are idle while it samples) and the load average."""
    return {"busy_cores": busy_cores(0.5), "loadavg_1m": os.getloadavg()[0]}


def measure(traces: list, run: Callable[[str, bool, list], dict], before: Callable[[], dict] = host_state,
            progress: Callable[[str], None] = log) -> list[dict]:
    """Every trace (rate, seed, requests) on both sides, off and on, in the order of schedule().
    `run(side, spec, requests)` returns the run's level metrics and its "tokens" (per request);
    `before()` is called before each run (a quiet-machine wait, the load) and its dict kept in the
    row; a run may also return "request_counts", (drafted, accepted) per request. One row per run,
    without the tokens; "identical" counts the requests whose output the two sides of one spec
    setting agree on, drafted_identical / accepted_identical sum the counts over those requests."""
    from specnative.serving import arrivals
    from specnative.serving.runner import trace_sha256

    rows = []
    for index, (rate, seed, trace) in enumerate(traces):
        tokens, counts, mine = {}, {}, []
        for position, (side, spec) in enumerate(schedule(index)):
            state = before()
            started = time.time()
            result = dict(run(side, spec == "on", trace))
            tokens[(side, spec)] = result.pop("tokens")
            counts[(side, spec)] = result.pop("request_counts", None)
            row = {"side": side, "spec_decode": spec, "request_rate": rate, "seed": seed, "trace_index": index,
                   "position": position, "trace_sha256": trace_sha256(trace), "n_requests": len(trace),
                   "started": started, **state, **result}
            mine.append(row)
            got = {name: row.get(name, math.nan) for name in ("output_throughput", "tpot_p50_ms", "ttft_p50_ms",
                                                              "draft_accept_rate")}
            progress(f"  trace {index + 1}/{len(traces)} (rate {arrivals.rate_label(rate)}, seed {seed}) {side} "
                     f"spec {spec}: {got['output_throughput']:.1f} tok/s, TPOT p50 {got['tpot_p50_ms']:.1f} ms, "
                     f"TTFT p50 {got['ttft_p50_ms']:.0f} ms" + (f", alpha {got['draft_accept_rate']:.3f}"
                                                                if spec == "on" else ""))
        for row in mine:
            spec = row["spec_decode"]
            same = same_requests(tokens[(OURS, spec)], tokens[(SERVER, spec)])
            row["identical"] = len(same)
            mine_counts = counts[(row["side"], spec)]
            if mine_counts is not None:  # drafted and accepted over the requests both sides generated alike
                row["drafted_identical"] = sum(mine_counts[i][0] for i in same)
                row["accepted_identical"] = sum(mine_counts[i][1] for i in same)
        rows += mine
    return rows


# ---------------------------------------------------------------------------------------------
# The two sides
# ---------------------------------------------------------------------------------------------
def ours_runner(engine, cfg) -> Callable[[bool, list], dict]:
    """specnative's serving loop on the open engine (runner.replay: the settings of `cfg`)."""
    from specnative.engine.engine import decoding_ms
    from specnative.serving.runner import replay

    profile = cfg.synthetic[0] if getattr(cfg, "synthetic", []) else None  # the spec-on side kept at random

    def run(spec: bool, trace: list) -> dict:
        r = replay(engine, trace, cfg, spec, synthetic=profile if spec else None)
        decoding = decoding_ms(r.times)
        drafted, accepted = (int(r.totals["drafted"]), int(r.totals["accepted"])) if r.speculative else (0, 0)
        return {**r.summary, "drafted": drafted, "accepted": accepted,
                "draft_accept_rate": accepted / drafted if drafted else math.nan,
                "iterations": r.steps, "decode_iterations": r.decode_steps, "mixed_iterations": r.mixed_steps,
                "prefill_tokens": r.prefill_tokens,
                "ms_per_iteration": r.duration_ms / r.steps if r.steps else math.nan,
                "idle_ms": r.idle_ms, "mean_occupancy": r.mean_occupancy, "decoding_ms": decoding,
                "prefill_ms": r.times["prefill_target"] + r.times["prefill_draft"],
                **{f"{name}_ms": r.times[name] for name in ("draft", "verify", "resample", "decode")},
                **r.engine_own, "kv_cells_left": r.kv_cells_left, "tokens": [list(map(int, t)) for t in r.tokens],
                "request_counts": [(int(rec["counts"]["drafted"]), int(rec["counts"]["accepted"]))
                                   for rec in r.records]}
    return run


def server_runner(servers: dict, slo: dict) -> Callable[[bool, list], dict]:
    """The open-loop streaming client against servers[spec] (a started LlamaServer each), with
    the server's own counters over the run (/metrics before and after: llama_decode calls,
    prompt tokens)."""

    def run(spec: bool, trace: list) -> dict:
        server = servers[spec]
        before = server.metrics()
        records = replay_open_loop(server, trace)
        delta = metrics_delta(before, server.metrics())
        level = server_level(records, slo)
        iterations = delta.get("n_decode_total", math.nan)
        drafted = sum(r["counts"]["drafted"] for r in records)
        accepted = sum(r["counts"]["accepted"] for r in records)
        own = [r["timings"].get("predicted_per_token_ms") for r in records]
        own = [v for v in own if isinstance(v, (int, float)) and math.isfinite(v)]
        return {**level, "drafted": drafted, "accepted": accepted, "iterations": iterations,
                # its own per-token time (timings.predicted_per_token_ms, mean over requests): the
                # client's TPOT minus this is what streaming over HTTP adds
                "server_tpot_mean_ms": sum(own) / len(own) if own else math.nan,
                "prefill_tokens": delta.get("prompt_tokens_total", math.nan),
                "ms_per_iteration": level["duration_s"] * 1000.0 / iterations if iterations else math.nan,
                "tokens": [r["tokens"] for r in records],
                "request_counts": [(r["counts"]["drafted"], r["counts"]["accepted"]) for r in records]}
    return run


def both(ours: Callable, server: Callable) -> Callable[[str, bool, list], dict]:
    """The run(side, spec, trace) of measure() over the two sides' runners."""
    def run(side: str, spec: bool, trace: list) -> dict:
        if side == OURS:
            return ours(spec, trace)
        if side == SERVER:
            return server(spec, trace)
        raise ValueError(f"unknown side {side!r}")
    return run


def warm_up(run: Callable[[str, bool, list], dict], trace: list, n: int) -> None:
    """One discarded replay of the first n requests of `trace` per side and setting (caches,
    allocator, first graphs, the servers' threads), in the order of schedule(0)."""
    for side, spec in schedule(0):
        run(side, spec == "on", trace[:n])
