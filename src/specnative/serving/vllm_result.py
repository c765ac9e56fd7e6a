"""A serve run's results in `vllm bench serve`'s names: one result object per replayed level (rate,
trace seed, prefix-cache mode, spec off/on), computed from the run's records (traces.csv rows and
requests.jsonl lines), with the keys and definitions of vLLM's vllm/benchmarks/serve.py.

- vllm_results.jsonl beside requests.jsonl: one object per line, as `vllm bench serve
  --append-result` writes a file of several runs; always written.
- `--save-result`: one JSON file per level as well, in --result-dir (default vllm_results/ in the
  run folder), named as vLLM names its files ({label}-{rate}qps-concurrency{N}-{model}-{date}.json).

vLLM's definitions, which the numbers here follow: TTFT, TPOT (requests with more than one output
token), ITL (the gaps between a request's streamed chunks, pooled: a speculative round's tokens
come in one chunk, so one gap) and E2EL as mean, median, std (population) and the
--metric-percentiles (99 by default) of numpy over the requests, empty lists counting as 0;
p{N}_{metric}_ms as vLLM's result keys and percentiles_{metric}_ms as its metrics' [[pct, value]]
lists; throughputs over the duration; request_goodput null without an SLO. The speculative block
(spec-on levels only, as vLLM has it only when the server reports drafts): num_drafts = rounds
that drafted at least one token, draft and accepted tokens, acceptance rate = accepted / draft
tokens x 100 (percent), acceptance length = 1 + accepted / num_drafts, per-position rate =
rounds that accepted position i / num_drafts. specnative's own numbers whose definitions differ
(alpha as a fraction, tau = emitted / rounds, the queueing delay) are under "specnative".
"""
from __future__ import annotations

import json
import math
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from specnative.record.run_folder import read_run
from specnative.record.schema import real_rows
from specnative.serving import metrics as serve_metrics

RESULTS_FILE = "vllm_results.jsonl"
RESULT_DIR = "vllm_results"
# vLLM's metric names -> requests.jsonl's; all four get percentiles (vLLM's default list is
# ttft,tpot,itl: `--percentile-metrics ttft,tpot,itl,e2el`)
PERCENTILE_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
METRIC_PERCENTILES = (99.0,)  # vLLM's --metric-percentiles default
ROUND_FIELDS = ("rounds", "drafts", "drafted_at", "accepted_at", "accept_len_hist")


def _finite(value) -> float:
    """A recorded number, NaN where it is missing (None, NaN, a blank CSV cell)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value


def _plain(value):
    """JSON as vLLM writes it: numpy scalars as Python numbers, NaN as null, inf as "inf"."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return None if math.isnan(value) else ("inf" if math.isinf(value) else value)
    return value


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def metric_stats(name: str, values, percentiles=METRIC_PERCENTILES) -> dict:
    """mean, median, std, p{N} and the percentiles list of one metric (ms), as vLLM computes them:
    numpy over the values, an empty list counting as [0]."""
    values = [v for v in (_finite(x) for x in values) if not math.isnan(v)] or [0.0]
    pcts = [[float(p), float(np.percentile(values, p))] for p in percentiles]
    out = {f"mean_{name}_ms": float(np.mean(values)), f"median_{name}_ms": float(np.median(values)),
           f"std_{name}_ms": float(np.std(values))}
    out.update({f"p{_p_word(p)}_{name}_ms": v for p, v in pcts})
    out[f"percentiles_{name}_ms"] = pcts
    return out


def _metric_values(lines: list[dict], name: str) -> list:
    key = PERCENTILE_METRICS[name]
    if name == "itl":
        return [gap for line in lines for gap in line.get(key) or []]
    if name == "tpot":  # vLLM: requests with more than one output token
        return [line[key] for line in lines if int(line["output_len"]) > 1]
    return [line[key] for line in lines]


def peaks(lines: list[dict]) -> tuple[float, int]:
    """vLLM's max_output_tokens_per_s and max_concurrent_requests: streamed chunks (the first token
    and one per ITL gap) counted in one-second buckets from the first arrival, the most in one
    bucket; and the most requests between arrival and last token at once."""
    if not lines:
        return 0.0, 0
    start = [float(line["arrival_ms"]) / 1000 for line in lines]
    end = [s + float(line["e2e_ms"]) / 1000 for s, line in zip(start, lines)]
    first = min(start)
    buckets = np.zeros(math.ceil(max(end) - first) + 1)
    for s, line in zip(start, lines):
        times = s + (float(line["ttft_ms"]) + np.concatenate([[0.0], np.cumsum(line.get("itl_ms") or [])])) / 1000
        for t in times:
            if 0 <= int(t - first) < len(buckets):
                buckets[int(t - first)] += 1
    events = sorted([(s, 1) for s in start] + [(e, -1) for e in end])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return float(buckets.max()), int(peak)


def _has_rounds(lines: list[dict]) -> bool:
    return bool(lines) and all(all(f in line for f in ROUND_FIELDS) for line in lines)


def _sum_lists(lists) -> np.ndarray:
    width = max((len(x) for x in lists), default=0)
    total = np.zeros(width, dtype=np.int64)
    for x in lists:
        total[:len(x)] += np.asarray(x, dtype=np.int64)
    return total


def by_draft_length(line: dict) -> list[int]:
    """Rounds by the number of tokens they drafted (index 0: rounds that drafted none; vLLM's
    num_drafts_by_draft_length from index 1): drafted_at[n-1] - drafted_at[n]."""
    at = list(line["drafted_at"]) + [0]
    return [int(line["rounds"]) - int(at[0])] + [int(at[n - 1]) - int(at[n]) for n in range(1, len(at))]


def spec_block(lines: list[dict]) -> dict:
    """vLLM's spec_decode_* keys of one level from its requests' round counts; {} where nothing was
    drafted (vLLM writes none then)."""
    drafts = sum(int(line["drafts"]) for line in lines)
    drafted = sum(int(line["drafted"]) for line in lines)
    accepted = sum(int(line["accepted"]) for line in lines)
    if drafted <= 0:
        return {}
    at = _sum_lists([line["accepted_at"] for line in lines])
    return {"spec_decode_acceptance_rate": 100.0 * accepted / drafted,
            "spec_decode_acceptance_length": 1.0 + accepted / drafts if drafts > 0 else 0.0,
            "spec_decode_num_drafts": drafts, "spec_decode_draft_tokens": drafted,
            "spec_decode_accepted_tokens": accepted,
            "spec_decode_per_position_acceptance_rates": [float(a) / drafts for a in at] if drafts > 0 else []}


def per_request_summary(lines: list[dict], k) -> dict:
    """Acceptance per request (vLLM's per-request `summary` level: mean acceptance length, draft
    acceptance rate and the rounds by draft length), the histogram of the requests' acceptance
    lengths (bins of 0.5 from 1 to k + 1) and the level's rounds by draft length."""
    requests = []
    for line in lines:
        drafts, drafted, accepted = int(line["drafts"]), int(line["drafted"]), int(line["accepted"])
        requests.append({"request": int(line["request"]), "num_drafts": drafts, "num_draft_tokens": drafted,
                         "num_accepted_tokens": accepted,
                         "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
                         "draft_acceptance_rate": accepted / drafted if drafted else None,
                         "num_drafts_by_draft_length": by_draft_length(line)})
    k = int(k) if not math.isnan(_finite(k)) else max(len(line["drafted_at"]) for line in lines)
    edges = np.arange(1.0, k + 1.0 + 1e-9, 0.5)
    lengths = [r["mean_acceptance_length"] for r in requests if r["mean_acceptance_length"] is not None]
    counts, _ = np.histogram(lengths, bins=edges)
    return {"num_speculative_tokens": k, "requests": requests,
            "acceptance_length_histogram": {"bin_edges": edges.tolist(), "counts": counts.tolist()},
            "num_drafts_by_draft_length": _sum_lists([r["num_drafts_by_draft_length"] for r in requests]).tolist()}


def label_of(row: dict) -> str:
    """The result's label (vLLM's --label): the level's spec setting, trace seed and prefix cache."""
    prefix = "-prefix-cache" if row.get("prefix_cache") == "on" else ""
    return f"specnative-spec-{row.get('spec_decode')}-seed{int(_finite(row.get('seed')) or 0)}{prefix}"


def level_result(lines: list[dict], row: dict, percentiles=METRIC_PERCENTILES, date: str | None = None) -> dict:
    """One level's result object in vLLM's names from its requests.jsonl lines and traces.csv row."""
    lines = sorted(lines, key=lambda line: int(line["request"]))
    duration = _finite(row.get("duration_s"))
    if math.isnan(duration):
        duration = max(float(line["finish_ms"]) for line in lines) / 1000.0
    n_in = sum(int(line["prompt_len"]) for line in lines)
    n_out = sum(int(line["output_len"]) for line in lines)
    slo_text = row.get("slo") if isinstance(row.get("slo"), str) else ""
    slo = serve_metrics.parse_slo(slo_text)
    per = [{name: _finite(line[name]) for name in ("ttft_ms", "tpot_ms", "e2e_ms")} for line in lines]
    good = sum(serve_metrics.meets_slo(m, slo) for m in per)
    rate = _finite(row.get("request_rate"))
    model = str(row.get("target_model") or "")
    result = {"date": date, "endpoint_type": "specnative", "backend": "specnative", "label": label_of(row),
              "model_id": model, "tokenizer_id": model, "num_prompts": int(_finite(row.get("n_requests")) or len(lines)),
              "request_rate": "inf" if math.isinf(rate) else rate, "burstiness": _finite(row.get("burstiness")),
              "max_concurrency": int(_finite(row.get("concurrency"))),
              "duration": duration, "completed": len(lines), "failed": 0, "total_input_tokens": n_in,
              "total_output_tokens": n_out, "request_throughput": len(lines) / duration,
              "request_goodput": good / duration if slo else None, "output_throughput": n_out / duration,
              "total_token_throughput": (n_in + n_out) / duration}
    result["max_output_tokens_per_s"], result["max_concurrent_requests"] = peaks(lines)
    for name in PERCENTILE_METRICS:
        result.update(metric_stats(name, _metric_values(lines, name), percentiles))
    ours = {"run_id": row.get("run_id"), "cell_id": row.get("cell_id"), "spec_decode": row.get("spec_decode"),
            "seed": row.get("seed"), "prefix_cache": row.get("prefix_cache"), "drafter": row.get("drafter"),
            "k": row.get("k"), "draft_shape": row.get("draft_shape"), "slo": slo_text or None,
            "lossless_ok": row.get("lossless_ok"), "verdict": row.get("verdict"),
            "draft_accept_rate": row.get("draft_accept_rate"), "mean_accept_len": row.get("mean_accept_len"),
            "rounds": row.get("rounds"), **metric_stats("queue", [line["queue_ms"] for line in lines], percentiles),
            "definitions": "docs/serving.md, section \"In vLLM's names\""}
    if row.get("spec_decode") == "on":
        if _has_rounds(lines):
            result.update(spec_block(lines))
            result["spec_decode_per_request"] = per_request_summary(lines, row.get("k"))
        else:
            ours["note"] = ("requests.jsonl has no per-request drafts (rounds that drafted a token; recorded "
                            "by newer runs): vLLM's spec_decode_* keys are left out")
    result["specnative"] = {k: v for k, v in ours.items() if not (isinstance(v, float) and math.isnan(v))}
    return _plain(result)


def _row_dict(row) -> dict:
    """A traces.csv row as plain values: missing cells (NaN, pandas' NA) None."""
    return {k: (None if not isinstance(v, (list, tuple)) and pd.isna(v) else v) for k, v in row.items()}


def run_results(run_dir) -> list[dict]:
    """Every real level of a serve run folder (synthetic acceptance replays left out), in the
    order traces.csv holds them."""
    record = read_run(run_dir)
    lines: dict = {}
    for _, cell_id, text in record.requests:
        lines.setdefault(cell_id, []).append(json.loads(text))
    rows = real_rows(record.traces) if len(record.traces) else record.traces
    rows = rows.drop_duplicates("cell_id", keep="last") if len(rows) else rows
    date = vllm_date(record.provenance.get("date"))
    return [level_result(lines[row["cell_id"]], _row_dict(row), date=date)
            for _, row in rows.iterrows() if lines.get(row["cell_id"])]


def vllm_date(iso) -> str | None:
    """provenance.json's date in vLLM's form (%Y%m%d-%H%M%S); None where it is not recorded."""
    try:
        return datetime.fromisoformat(str(iso)).strftime("%Y%m%d-%H%M%S")
    except ValueError:
        return None


def result_file_name(result: dict) -> str:
    """vLLM's name for a result file: {label}-{rate}qps-concurrency{N}-{model}-{date}.json."""
    rate = result["request_rate"]
    rate_text = "inf" if rate == "inf" else f"{float(rate)}"
    model = Path(result["model_id"] or "model").stem
    model = re.sub(r"[^0-9A-Za-z._-]+", "_", model)
    return f"{result['label']}-{rate_text}qps-concurrency{result['max_concurrency']}-{model}-{result.get('date') or 'nodate'}.json"


def result_dir_problem(result_dir) -> str | None:
    """Where --result-dir cannot take the files: one line, else None."""
    path = Path(result_dir)
    if path.exists() and not path.is_dir():
        return f"--result-dir {path}: not a directory"
    return None


def write_results(run_dir, result_dir=None) -> Path:
    """vllm_results.jsonl in the run folder (one result per line) and, given result_dir, one file
    per level there; returns the .jsonl's path."""
    run_dir = Path(run_dir)
    results = run_results(run_dir)
    path = run_dir / RESULTS_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in results))
    tmp.replace(path)
    if result_dir is not None:
        result_dir = Path(result_dir)
        result_dir.mkdir(parents=True, exist_ok=True)
        for result in results:
            (result_dir / result_file_name(result)).write_text(json.dumps(result, allow_nan=False) + "\n")
    return path
