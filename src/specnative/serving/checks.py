"""What `specnative serve` refuses before anything is loaded or written, each problem one line:
drafters the serving loop does not run yet, arrival processes that would wait past any sensible
run, trace files that cannot be replayed (unreadable, ids outside the vocabulary, arrivals
spread over days), and requests the models cannot hold (the closed loop's refusals: training
context and --max-kv-gib, sweep/grid.py)."""
from __future__ import annotations

import math
from pathlib import Path

from specnative.engine import gguf_checks
from specnative.serving import arrivals
from specnative.run import hidden_drafters, model_checks
from specnative.run.capacity import context_refusal, gguf_shape, kv_refusal

# The serving loop (csrc/core/serve_loop.cpp) runs the hidden-state drafters as llama-server does
# (their reading of every mixed batch, per-slot draft cells): this is the only place serve would
# refuse them.
SERVE_RUNS_HIDDEN_DRAFTERS = True

# A trace whose arrivals spread over more than this is refused (the loop waits on the real clock):
# a rate of 1e-300 req/s would otherwise wait for ever with nothing printed.
MAX_ARRIVAL_SPAN_S = 24 * 3600.0


def hidden_drafter_refusal(drafter: str) -> str | None:
    """Why serve refuses `drafter` (None: it runs it)."""
    if hidden_drafters.is_hidden(drafter) and not SERVE_RUNS_HIDDEN_DRAFTERS:
        return (f"--drafter {drafter}: serve does not run the hidden-state drafters (dflash, dspark, eagle3, mtp) "
                f"under load yet; measure {drafter} with specnative sweep")
    return None


def hidden_prefix_refusal(drafter: str, prefix_caches) -> str | None:
    """Why serve refuses --prefix-cache on with `drafter` (None: it pairs like with like). A
    hidden-state drafter reads the target's features from each slot's prefill of its whole prompt,
    so its speculative replay shares no prefix while the replay without speculation would: their
    TTFT, throughput and the levers would compare different prefills."""
    if hidden_drafters.is_hidden(drafter) and any(prefix_caches):
        return (f"--prefix-cache on: --drafter {drafter} prefills every whole prompt (it reads the target's "
                f"features from each request's own prefill), so speculation on could not share the prefix that "
                f"the run without it shares; use --prefix-cache off")
    return None


def expected_span_s(rate: float, n_requests: int) -> float:
    """Seconds from the first to the last arrival of a seeded trace at `rate`, on average."""
    return 0.0 if math.isinf(rate) else (n_requests - 1) / rate


def rate_problem(rate: float, n_requests: int) -> str | None:
    span = expected_span_s(rate, n_requests)
    if span > MAX_ARRIVAL_SPAN_S:
        return (f"--request-rate {arrivals.rate_label(rate)}: {n_requests} requests would arrive over about "
                f"{span:.3g} s, more than {MAX_ARRIVAL_SPAN_S / 3600:g} h (the replay waits for each arrival)")
    return None


def read_trace_file(path: Path) -> list:
    """The requests of a --trace file, or SystemExit naming the file (and line) in one line."""
    try:
        trace = arrivals.read_trace(path)
    except ValueError as error:
        raise SystemExit(f"error: --trace {error}") from None
    if trace[-1].arrival_s > MAX_ARRIVAL_SPAN_S:
        raise SystemExit(f"error: --trace {path}: its arrivals spread over {trace[-1].arrival_s:.3g} s, more than "
                         f"{MAX_ARRIVAL_SPAN_S / 3600:g} h (the replay waits for each arrival on the real clock)")
    return trace


def trace_summary(trace: list) -> dict:
    """What a --trace file holds, as the run prints and records it."""
    lens = [r.output_len for r in trace]
    return {"requests": len(trace), "arrival_span_s": trace[-1].arrival_s,
            "offered_rate": arrivals.rate_label(len(trace) / trace[-1].arrival_s if trace[-1].arrival_s > 0
                                                else math.inf),
            "output_len": {"min": min(lens), "max": max(lens), "mean": sum(lens) / len(lens)},
            "prompt_len": {"min": min(len(r.prompt) for r in trace), "max": max(len(r.prompt) for r in trace)}}


def vocabulary_problem(trace: list, n_vocab: int, path) -> str | None:
    """The first request whose prompt holds a token id outside the target's vocabulary."""
    for i, request in enumerate(trace):
        bad = [t for t in request.prompt if not 0 <= t < n_vocab]
        if bad:
            return (f"--trace {path}: request {i} has token id {bad[0]} outside the "
                    f"target's vocabulary of {n_vocab} tokens")
    return None


def check_models(cfg, replays: list, n_ctx: int) -> None:
    """The model files as the closed loop checks them (llama.cpp's vocabulary load, the header
    fields it would abort on, the draft's vocabulary against the target's), the trace's token ids
    against the vocabulary, then the closed loop's refusals for the longest request (training
    context) and the engine's caches (--max-kv-gib). SystemExit before anything is written."""
    target_vocab = model_checks.vocab_model(cfg.target, "target")
    files = [(cfg.target, "target")] + ([(cfg.draft, "draft")] if cfg.draft else [])
    for path, role in files:
        model_checks.header_checked(path, role)
    if cfg.draft is not None and cfg.drafter == "model":
        model_checks.check_vocabularies(model_checks.vocab_model(cfg.draft, "draft"), {cfg.target: target_vocab})
    if cfg.trace is not None:
        n_vocab = gguf_checks.read_header(cfg.target).n_vocab()
        if n_vocab and (problem := vocabulary_problem(cfg.trace, n_vocab, cfg.trace_file)):
            raise SystemExit(f"error: {problem}")
    shapes = [model_checks.header_shape(gguf_shape, path, role) for path, role in files]
    longest = max((len(r.prompt) + r.output_len for _, _, trace in replays for r in trace))
    reason = (context_refusal(longest + cfg.k + 1, shapes, "the longest request's prompt + output length + k + 1")
              or kv_refusal(n_ctx, shapes, cfg.max_kv_gib))
    if reason:
        raise SystemExit(f"error: serve refuses this run: {reason}")
