"""Timing llama-bench's tests with the engine, and the rows they give.

pp: prefill of n_prompt tokens (random ids, the first the vocabulary's BOS, as llama-bench feeds
them) with a fresh cache every repetition; tg: n_gen tokens decoded after a one-token prompt
(the decoding timers: decode, or draft + verify + resample for speculation); pg: both, the
prefill of the target (and the draft, for speculation) plus the decoding. Greedy decoding, EOS
not stopping. Each repetition runs the plain test and then every speculative configuration right
beside it, so the speedup is over pairs measured together; the lossless verdict of each
configuration comes from one more run after the timed ones (specnative.lossless)."""
from __future__ import annotations

import math
import time

import numpy as np

from specnative import lossless
from specnative.analysis import stats
from specnative.bench_verb.fields import FIXED_VALUES
from specnative.bench_verb.grid import MODEL_FREE, Plan, Setting, Spec, Test
from specnative.engine import Engine, build_info, decoding_ms
from specnative.record.provenance import cpu_model, gpu_info


def test_prompt(engine: Engine, test: Test) -> list[int]:
    """The prompt a test feeds: n_prompt seeded random ids after BOS (pp, pg), or BOS alone (tg)."""
    bos = engine.tokenize("", True).tolist()[:1] or [0]
    if test.n_prompt == 0:
        return bos
    n_vocab = int(engine.target_info["n_vocab"])
    rng = np.random.default_rng(test.n_prompt)
    return (bos + rng.integers(0, n_vocab, test.n_prompt - 1).tolist())[:test.n_prompt]


def run_once(engine: Engine, test: Test, prompt: list[int], spec: Spec | None):
    """(ns the test's timed part took, the run): one llama-bench repetition."""
    kw = {"n_predict": test.n_gen + 1 if test.n_gen else 1, "stop_at_eos": False, "prefix_cache": False}
    if spec is not None and test.n_gen:
        run = engine.generate([prompt], spec=True, k=spec.k, drafter=spec.drafter, accept_rule="greedy", **kw)
    else:
        run = engine.generate([prompt], **kw)
    ms = 0.0
    if test.n_prompt:
        ms += run.times["prefill_target"] + run.times.get("prefill_draft", 0.0)
    if test.n_gen:
        ms += decoding_ms(run.times)
    return round(ms * 1e6), run


def _avg(values):
    return sum(values) / len(values) if values else 0.0


def _stdev(values):
    """llama-bench's sample standard deviation (0 for one sample)."""
    n = len(values)
    if n <= 1:
        return 0.0
    mean = _avg(values)
    return math.sqrt(max(sum(v * v for v in values) / (n - 1) - mean * mean * n / (n - 1), 0.0))


def host_values() -> dict:
    info = build_info()
    gpu = gpu_info() if info.get("backend", "CPU") != "CPU" else None
    return {"build_commit": info["llama_commit"][:7], "cpu_info": cpu_model(),
            "gpu_info": (gpu or {}).get("name", ""), "backends": info.get("backend", "CPU") or "CPU"}


def base_row(host: dict, engine: Engine, setting: Setting, test: Test, samples_ns: list[int]) -> dict:
    info = engine.target_info
    ts = [1e9 * (test.n_prompt + test.n_gen) / ns if ns > 0 else 0.0 for ns in samples_ns]
    row = {**host, **FIXED_VALUES, "model_filename": setting.model, "model_type": info["description"],
           "model_size": int(info["size_bytes"]), "model_n_params": int(info["n_params"]),
           "n_batch": setting.n_batch, "n_ubatch": setting.n_ubatch, "n_threads": setting.n_threads,
           "n_gpu_layers": setting.n_gpu_layers,
           "flash_attn": {True: 1, False: 0}.get(setting.flash_attn, -1),
           "n_prompt": test.n_prompt, "n_gen": test.n_gen,
           "test_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "avg_ns": int(_avg(samples_ns)), "stddev_ns": int(_stdev(samples_ns)),
           "avg_ts": _avg(ts), "stddev_ts": _stdev(ts), "samples_ns": list(samples_ns), "samples_ts": ts}
    return row


def draft_columns(plan: Plan, spec: Spec, runs: list, on_ns: list[int], off_ns: list[int], verdict: str) -> dict:
    drafted = sum(int(r.totals["drafted"]) for r in runs)
    accepted = sum(int(r.totals["accepted"]) for r in runs)
    emitted = sum(int(r.totals["emitted"]) for r in runs)
    rounds = sum(int(r.totals["rounds"]) for r in runs)
    # tokens per second are the same tokens over each side's ns: the speedup is off_ns / on_ns per pair
    iv = stats.speedup_interval([1.0 / ns for ns in on_ns], [1.0 / ns for ns in off_ns])
    return {"spec_type": spec.spec_type,
            "draft_model_filename": "" if spec.spec_type in MODEL_FREE or spec.spec_type == "draft-mtp" else plan.draft,
            "n_draft": spec.k, "n_drafted": drafted, "n_accepted": accepted,
            "accept_rate": accepted / drafted if drafted else float("nan"),
            "mean_accept_len": emitted / rounds if rounds else float("nan"),
            "speedup": iv.estimate, "speedup_low": iv.low, "speedup_high": iv.high, "lossless": verdict}


def lossless_verdict(engine: Engine, test: Test, prompt: list[int], spec: Spec, base_tokens: list) -> str:
    """The lossless verdict of one configuration: a speculative run, then the check on the cache
    it left (exact, numeric or fail)."""
    _, run = run_once(engine, test, prompt, spec)
    verdict, _ = lossless.verdict_after_run(engine, [prompt], base_tokens, run.tokens, 0.0, 0, spec.k, spec.drafter)
    return verdict.verdict


def engine_for(plan: Plan, setting: Setting) -> Engine:
    longest = max(t.n_prompt + t.n_gen for t in plan.tests)
    k = max((s.k for s in plan.specs), default=0)
    n_ctx = -(-(longest + k + 8) // 256) * 256
    needs_file = any(s.spec_type.startswith("draft-") and s.spec_type != "draft-mtp" for s in plan.specs)
    return Engine(setting.model, plan.draft if needs_file else None, n_ctx=n_ctx, n_batch=setting.n_batch,
                  n_threads=setting.n_threads, n_gpu_layers=setting.n_gpu_layers, n_seq_max=1,
                  flash_attn=setting.flash_attn, mtp=any(s.spec_type == "draft-mtp" for s in plan.specs))


def run_plan(plan: Plan, on_row, on_progress=lambda msg: None) -> None:
    """Measure every test of the plan; on_row(row) for each row as it is done (plain row first,
    then one per speculative configuration)."""
    host = host_values()
    for setting in plan.settings:
        with engine_for(plan, setting) as engine:
            for test in plan.tests:
                on_progress(f"{setting.model} {test.name}")
                for row in measure_test(plan, host, engine, setting, test):
                    on_row(row)


def measure_test(plan: Plan, host: dict, engine: Engine, setting: Setting, test: Test) -> list[dict]:
    prompt = test_prompt(engine, test)
    specs = plan.specs if test.n_gen else []  # speculation drafts generated tokens: pp tests have no such row
    if plan.warmup:
        run_once(engine, test, prompt, None)
        for spec in specs:
            run_once(engine, test, prompt, spec)
    off_ns, on_ns, on_runs, base_tokens = [], {s: [] for s in specs}, {s: [] for s in specs}, None
    for _ in range(plan.reps):
        ns, run = run_once(engine, test, prompt, None)
        off_ns.append(ns)
        base_tokens = run.tokens
        for spec in specs:
            ns, run = run_once(engine, test, prompt, spec)
            on_ns[spec].append(ns)
            on_runs[spec].append(run)
    rows = [base_row(host, engine, setting, test, off_ns)]
    for spec in specs:
        verdict = lossless_verdict(engine, test, prompt, spec, base_tokens)
        rows.append({**base_row(host, engine, setting, test, on_ns[spec]),
                     **draft_columns(plan, spec, on_runs[spec], on_ns[spec], off_ns, verdict)})
    return rows
