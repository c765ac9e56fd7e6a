"""Serving metrics, defined once: per request and per load level, as vLLM's benchmark_serving
reports them, from the exact timestamps the engine recorded in-process (serve.py).

Per request (ms): queueing delay = admitted - arrival; TTFT = first token - arrival (queueing
included, as a client sees it); E2E = finish - arrival; TPOT = (E2E - TTFT) / (output tokens - 1),
the mean time per output token after the first; ITL = the gaps between consecutive emissions.
ITL and TPOT differ under speculation: a round emits its accepted drafts and the correction
together, so one gap carries several tokens (ITL counts the gap once, TPOT divides by tokens).
Each request also keeps its round counts (round_counts), from which vllm_result.py computes
vLLM's acceptance metrics per request and per level.

Per level: mean, p50, p90, p99 of each (ITL pooled over all gaps of all requests); request and
output throughput over the run's duration (start to last completion); goodput under an SLO
(DistServe's definition, as vLLM): requests per second that met every target.
"""
from __future__ import annotations

import math

import numpy as np

SLO_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}  # vLLM's --goodput names
LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue")
PERCENTILES = (50, 90, 99)


def parse_slo(text: str | None) -> dict:
    """'ttft:500,tpot:50' -> {'ttft': 500.0, 'tpot': 50.0} (ms); None or '' -> {}."""
    if not text:
        return {}
    slo = {}
    for part in str(text).split(","):
        name, sep, value = part.strip().partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"--slo takes NAME:MS pairs with NAME in {', '.join(SLO_METRICS)}, not {part!r}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--slo {name}: {value!r} is not a number of milliseconds") from None
        if not (ms > 0 and math.isfinite(ms)):
            raise ValueError(f"--slo {name}: the target must be a positive number of ms, not {value!r}")
        if name in slo:
            raise ValueError(f"--slo names {name} twice")
        slo[name] = ms
    return slo


def request_metrics(record: dict) -> dict:
    """One request's latencies (ms) from the engine's record (arrival/admitted/first/finish ms,
    emit_ms, tokens, counts)."""
    n_out = len(record["tokens"])
    ttft = record["first_token_ms"] - record["arrival_ms"]
    e2e = record["finish_ms"] - record["arrival_ms"]
    emit = np.asarray(record["emit_ms"], dtype=float)
    counts = record.get("counts", {})
    return {
        "queue_ms": record["admitted_ms"] - record["arrival_ms"],
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "tpot_ms": (e2e - ttft) / (n_out - 1) if n_out > 1 else math.nan,
        "itl_ms": np.diff(emit).tolist(),
        "output_len": n_out,
        "emissions": int(len(emit)),
        "drafted": int(counts.get("drafted", 0)),
        "accepted": int(counts.get("accepted", 0)),
        **round_counts(counts),
    }


def round_counts(counts: dict) -> dict:
    """A request's rounds as vLLM's acceptance metrics read them: rounds, drafts (rounds that drafted
    at least one token: vLLM's num_drafts), rounds that drafted / accepted draft position j+1, and
    rounds that accepted exactly m drafts. Plain ints (a requests.jsonl line)."""
    drafted_at = [int(v) for v in counts.get("drafted_at", [])]
    return {"rounds": int(counts.get("rounds", 0)), "drafts": drafted_at[0] if drafted_at else 0,
            "drafted_at": drafted_at, "accepted_at": [int(v) for v in counts.get("accepted_at", [])],
            "accept_len_hist": [int(v) for v in counts.get("accept_len_hist", [])]}


def meets_slo(metrics: dict, slo: dict) -> bool:
    """Every target met; a one-token reply has no TPOT and meets that target (as vLLM counts it)."""
    for name, limit in slo.items():
        value = metrics[SLO_METRICS[name]]
        if not math.isnan(value) and value > limit:
            return False
    return True


def _stats(values) -> dict:
    values = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if values.size == 0:
        return {"mean": math.nan, **{f"p{q}": math.nan for q in PERCENTILES}}
    return {"mean": float(values.mean()), **{f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}}


def level_summary(per_request: list[dict], duration_ms: float, slo: dict) -> dict:
    """Percentiles, throughputs and goodput of one run at one load level. Keys are traces.csv
    column names (schema.py: serve columns)."""
    duration_s = duration_ms / 1000.0
    out = {}
    for name in LATENCIES:
        if name == "itl":
            values = [gap for m in per_request for gap in m["itl_ms"]]
        else:
            values = [m[f"{name}_ms"] for m in per_request]
        for stat, value in _stats(values).items():
            out[f"{name}_{stat}_ms"] = value
    n_tokens = sum(m["output_len"] for m in per_request)
    good = sum(meets_slo(m, slo) for m in per_request) if slo else len(per_request)
    out.update({
        "completed": len(per_request),
        "duration_s": duration_s,
        "request_throughput": len(per_request) / duration_s if duration_s > 0 else math.nan,
        "output_throughput": n_tokens / duration_s if duration_s > 0 else math.nan,
        "goodput": good / duration_s if duration_s > 0 else math.nan,
        "slo_met": good / len(per_request) if per_request else math.nan,
    })
    return out
