"""Serving under load, in-process: replay a list of requests (arrivals.Request: arrival time,
prompt tokens, output length) through the engine's continuous-batching loop (csrc/serve.cpp)
with speculation on or off, and get each request's exact timestamps, tokens and draft counts.

The loop: up to `max_concurrency` slots; a free slot admits the next arrived request (first come,
first served); its prompt is prefilled in chunks inside the same llama_decode batches as the other
slots' decode or verify tokens (at most n_batch tokens a batch, as llama-server); a finished
request frees its KV cells. The clock is real wall time (llama_synchronize before each stop);
`virtual_clock=True` skips the idle waits between arrivals (tests, traces with long gaps).

Every drafter serves: the draft model, llama.cpp's n-gram drafters, and its hidden-state drafters
(dflash, dspark, eagle3, mtp), which read the features of every mixed batch and keep per-slot draft
cells as llama-server runs them. `prefix_cache=True` computes the requests' common prompt prefix
(a shared context ahead of each request's own prompt) once, in a sequence of its own beside the
slots (the engine needs n_seq_max > max_concurrency), and copies its cells into every admitted
slot, which then prefills only its own part; off, every request prefills its whole prompt (a server
without prompt caching). With a hidden-state drafter the prefix is not shared (shared_prefix 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from specnative.engine import DecodeSpec, decoding_ms, engine_own_time
from specnative.serving import metrics as serve_metrics
from specnative.serving.arrivals import Request


@dataclass
class ServeRun:
    """One replay of a trace. Times are ms on the serving clock (0 = start of the run)."""

    speculative: bool
    max_concurrency: int
    records: list          # per request, in trace order: the engine's record (tokens, timestamps, counts)
    metrics: list          # per request: serve_metrics.request_metrics
    admission_order: list  # request indices in the order slots admitted them
    times: dict            # step buckets (prefill_target, prefill_draft, draft, draft_ingest, verify,
                           # resample, decode, policy, total), llama, kv_removal and
                           # policy_startup as in generate(); a
                           # hidden-state drafter's reading of a batch with decode or verify tokens
                           # is draft_ingest, of prompt chunks alone prefill_draft
    idle_ms: float         # waited with every slot free for the next arrival
    skipped_ms: float      # virtual clock: idle time jumped over
    duration_ms: float     # until the last completion
    steps: int             # iterations, one target llama_decode each
    decode_steps: int      # with decode/verify tokens (the rest prefilled prompts alone)
    mixed_steps: int       # decode/verify and prompt tokens in one batch
    prefill_tokens: int    # prompt tokens the target fed, all requests (each record's prefill_tokens)
    busy_sum: int          # slots holding a request, summed over iterations
    decoding_sum: int      # slots decoding, summed over iterations
    kv_cells_left: int     # target + draft KV cells held after the run (0: nothing leaked)
    totals: dict           # drafted, accepted, rounds, ... summed over requests
    shared_prefix: int = 0  # prefix tokens the prefix cache shared (0: none shared)
    prefix_cache: bool = False  # the run asked for the prefix cache (shared_prefix: what it found to share)
    draft_accept_rate: float = math.nan  # alpha = accepted / drafted
    mean_accept_len: float = math.nan    # tau = emitted / rounds
    summary: dict = field(default_factory=dict)  # serve_metrics.level_summary

    @property
    def tokens(self) -> list:
        return [r["tokens"] for r in self.records]

    @property
    def iteration_ms(self) -> float:
        """Mean wall time of an iteration that decoded (T_round with speculation, T_step without)."""
        return decoding_ms(self.times) / self.decode_steps if self.decode_steps else math.nan

    @property
    def mean_occupancy(self) -> float:
        """Slots holding a request (prefilling or decoding), mean over iterations."""
        return self.busy_sum / self.steps if self.steps else math.nan

    @property
    def engine_own(self) -> dict:
        return engine_own_time(decoding_ms(self.times), self.times["llama"], self.times["kv_removal"])


def serve(engine, requests: list[Request], *, max_concurrency: int, spec: bool = False, k: int = 4,
          temperature: float = 0.0, seed: int = 0, accept_rule: str = "greedy", drafter: str = "model",
          drafter_options: dict | None = None, draft_p_min: float = 0.0, ignore_eos: bool = True,
          virtual_clock: bool = False, slo: dict | None = None, prefix_cache: bool = False,
          synthetic=None, draft_shape: str | None = None, spec_policy=None) -> ServeRun:
    """Replays `requests` (in arrival order) through `engine` (specnative.Engine). ignore_eos:
    every request generates its output_len tokens (as a benchmark with recorded reply lengths
    wants); False stops a request at an end-of-generation token. slo: serve_metrics.parse_slo.
    prefix_cache: share the requests' common prompt prefix (module docstring); each record's
    prefill_tokens says what its request fed. synthetic: a synthetic acceptance profile
    (Engine.generate's), drafts kept at random at its rates (benchmarking only). draft_shape: a
    draft tree's spelling (docs/trees.md; the draft model or an EAGLE-3 head), None: chains of k.
    spec_policy: how many tokens each request may draft per round (engine/spec_policy.py; None:
    static k); an adaptive policy pools acceptance by the requests' labels. The decoding
    settings are checked as generate()'s are (DecodeSpec)."""
    if not requests:
        raise ValueError("no requests to serve")
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
        raise ValueError(f"max_concurrency must be an integer, not {max_concurrency!r}")
    decode = DecodeSpec(n_predict=1, temperature=temperature, seed=seed, spec=bool(spec), k=k,
                        accept_rule=accept_rule, stop_at_eos=not ignore_eos, drafter=drafter,
                        drafter_options=drafter_options or {}, draft_p_min=draft_p_min,
                        prefix_cache=bool(prefix_cache), synthetic=synthetic,
                        draft_shape=draft_shape if spec else None, spec_policy=spec_policy if spec else None)
    label_ids: dict[str, int] = {}
    raw = engine._core.serve(
        arrival_ms=[r.arrival_s * 1000.0 for r in requests], prompts=[list(r.prompt) for r in requests],
        n_predict=[int(r.output_len) for r in requests],
        labels=[label_ids.setdefault(r.label, len(label_ids)) for r in requests],
        max_concurrency=max_concurrency, virtual_clock=bool(virtual_clock), params=decode.core_params())
    metrics = [serve_metrics.request_metrics(record) for record in raw["requests"]]
    return ServeRun(
        speculative=raw["speculative"], max_concurrency=raw["max_concurrency"], records=raw["requests"],
        metrics=metrics, admission_order=raw["admission_order"].tolist(), times=raw["times"],
        idle_ms=raw["idle_ms"], skipped_ms=raw["skipped_ms"], duration_ms=raw["duration_ms"], steps=raw["steps"],
        decode_steps=raw["decode_steps"], mixed_steps=raw["mixed_steps"], prefill_tokens=raw["prefill_tokens"],
        busy_sum=raw["busy_sum"], decoding_sum=raw["decoding_sum"], kv_cells_left=raw["kv_cells_left"],
        totals=raw["totals"], shared_prefix=raw["shared_prefix"], prefix_cache=bool(prefix_cache),
        draft_accept_rate=raw["draft_accept_rate"], mean_accept_len=raw["mean_accept_len"],
        summary=serve_metrics.level_summary(metrics, raw["duration_ms"], slo or {}))
