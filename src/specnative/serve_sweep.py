"""The load sweep (`python -m specnative.sweep --serve`): replay seeded traces at each request
rate through the continuous-batching engine, spec off and on on the same trace, and write one
traces.csv row per (rate, trace seed, spec) plus one requests.jsonl line per request.

Per rate and repeat r the trace is drawn with seed + r (arrivals.build_trace over the workload's
prompts, n_predict tokens each), so the repeats give intervals and the off and on runs pair
request by request. Each run's greedy outputs are judged against every request decoded alone
(serving_verdict: lossless under continuous batching, numeric-noise verdict where batches mix).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specnative import arrivals, lossless, rundir, schema, workloads
from specnative.arrivals import Request
from specnative.engine import Engine
from specnative.provenance import environment, model_record, now_iso, write_json
from specnative.serve import ServeRun, serve
from specnative.sweep import drafter_options_text


@dataclass
class ServeConfig:
    target: Path
    draft: Path | None          # None: an n-gram drafter alone
    rates: list                 # requests per second; inf = all at t=0
    max_concurrency: int = 8
    n_requests: int = 32
    burstiness: float = 1.0
    repeats: int = 2            # traces per rate (seeds seed .. seed+repeats-1)
    k: int = 4
    drafter: str = "model"
    drafter_options: dict = field(default_factory=dict)
    temperature: float = 0.0
    accept_rule: str = "greedy"
    n_predict: int = 64
    slo: dict = field(default_factory=dict)
    slo_text: str = ""
    seed: int = 0
    threads: int = 2
    n_batch: int = 512
    gpu_layers: int = 0
    flash_attn: bool = False
    tasks: list = field(default_factory=lambda: [workloads.MIXED])
    prompts: list | None = None
    prompts_source: str = "built-in"
    dataset: dict | None = None  # --dataset: the public set's record (package, version, sha256, item ids)
    trace_file: Path | None = None
    check_lossless: bool = True
    out_dir: Path = Path("runs/serve")
    report: bool = True
    preset: str | None = None
    command: str = ""


# ---------------------------------------------------------------------------------------------
# Losslessness under continuous batching
# ---------------------------------------------------------------------------------------------
_ALONE: dict = {}  # (engine id, prompt, output_len) -> tokens of the request decoded alone


def decoded_alone(engine, request: Request) -> list:
    key = (id(engine), request.prompt, request.output_len)
    if key not in _ALONE:
        result = engine.generate([list(request.prompt)], n_predict=request.output_len, stop_at_eos=False)
        _ALONE[key] = result.tokens[0]
    return _ALONE[key]


def serving_noise(engine, prompts: list, base: list, k: int) -> lossless.NoiseControl:
    """The batch-shape control for serving: the target's noise between 1-token steps and the
    widest batch serving builds. A decode or verify token there shares its llama_decode with
    other slots' prompt chunks, up to n_batch tokens, and CPU kernels change with the batch size,
    so the verify shape (k+1 per sequence) alone can understate it; the larger of the two stands."""
    control = lossless.measure_noise(engine, prompts, base, k)
    widest = engine.context_info()["n_batch"] // len(prompts)
    if widest > k + 1:
        wide = lossless.measure_noise(engine, prompts, base, widest - 1)
        if wide.max_spread > control.max_spread:
            return wide
    return control


def layout_spread(engine, prompts: list, base: list) -> float:
    """The cache-layout control: how far the logits after the same tokens move when a sequence's
    cells sit beside other sequences' in the unified cache (in the group's order and reversed)
    rather than alone. Attention sums run over the buffer with the others' cells masked, so where
    a sequence's cells sit changes the vector lanes its sums are grouped in; serving moves cells
    around as slots empty and refill. Measured up to 0.15 logits on the tiny Q4_0 target, where
    the batch-shape control reads 0."""
    alone = [engine._core.replay([p], [b], 0.0, 0)["final_logits"][0] for p, b in zip(prompts, base)]
    spread = 0.0
    for order in (list(range(len(prompts))), list(range(len(prompts)))[::-1]):
        together = engine._core.replay([prompts[i] for i in order], [base[i] for i in order], 0.0, 0)["final_logits"]
        for at, i in enumerate(order):
            delta = np.asarray(together[at], np.float64) - np.asarray(alone[i], np.float64)
            spread = max(spread, float(delta.max() - delta.min()))
    return spread


def serving_verdict(engine, requests: list[Request], tokens: list, k: int) -> lossless.Verdict:
    """Greedy outputs of a serving run against each request decoded alone: exact, numeric (every
    difference within the target's measured noise on forced replay) or fail. Judged in groups of
    at most the engine's sequences; the worst group's verdict stands. The noise is the larger of
    each group's batch-shape control (serving_noise) and the cache-layout spread pooled over all
    groups (layout_spread: a property of the model and the cache, not of one prompt)."""
    n_seq = engine.context_info()["n_seq_max"]
    groups = []
    for start in range(0, len(requests), n_seq):
        group = requests[start:start + n_seq]
        groups.append(([list(r.prompt) for r in group], [list(map(int, decoded_alone(engine, r))) for r in group],
                       [list(map(int, t)) for t in tokens[start:start + n_seq]]))
    if all(b == t for _, base, served in groups for b, t in zip(base, served)):
        return lossless.Verdict(lossless.EXACT, "token-identical to every request decoded alone", -1, 0, math.nan,
                                0.0, sum(len(t) for t in tokens))
    layout = max(layout_spread(engine, prompts, base) for prompts, base, _ in groups)
    order = {lossless.FAIL: 2, lossless.NUMERIC: 1, lossless.EXACT: 0}
    worst = None
    for prompts, base, served in groups:
        control = serving_noise(engine, prompts, base, k)
        if layout > control.max_spread:
            control = dataclasses.replace(control, max_spread=layout)
        if layout > (control.max_candidate_spread or 0.0):  # a full spread bounds the candidates' too
            control = dataclasses.replace(control, max_candidate_spread=layout)
        verdict = lossless.judge(engine, prompts, base, served, 0.0, 0, control)
        if worst is None or order[verdict.verdict] > order[worst.verdict]:
            worst = verdict
    return worst


# ---------------------------------------------------------------------------------------------
# Requests and rows
# ---------------------------------------------------------------------------------------------
def workload_requests(cfg: ServeConfig) -> tuple[list, list, list]:
    """(token prompts, labels, output lengths) of the workload: the built-in suite, --prompts or a
    --dataset, filtered by task; a prompt's recorded reply length where the set gives one
    (ShareGPT), else n_predict. Turns that need the model's own earlier answer (MT-Bench turn 2)
    are left out: a request here stands alone."""
    workload = workloads.Workload(cfg.target, cfg.prompts, None, cfg.prompts_source)
    chosen = [p for p in workload.prompts if (workloads.MIXED in cfg.tasks or p.category in cfg.tasks)
              and p.answer_of is None]
    if not chosen:
        raise ValueError(f"no prompts of tasks {cfg.tasks}")
    return ([workload.tokenize(workload.text_of(p), True) for p in chosen], [p.ident for p in chosen],
            [p.output_len or cfg.n_predict for p in chosen])


def trace_sha256(trace: list[Request]) -> str:
    text = json.dumps([[r.arrival_s, list(r.prompt), r.output_len] for r in trace])
    return hashlib.sha256(text.encode()).hexdigest()


def offered_rate(trace: list[Request]) -> float:
    last = trace[-1].arrival_s
    return len(trace) / last if last > 0 else math.inf


def level_row(run: ServeRun, trace: list[Request], rate: float, seed: int, cfg: ServeConfig) -> dict:
    """One traces.csv row of one replay (without identity columns and the on/off pairing)."""
    t = run.times
    row = {"spec_decode": "on" if run.speculative else "off", "concurrency": run.max_concurrency, "ctx_len": 0,
           "tps": run.summary["output_throughput"], "seed": seed, "temperature": cfg.temperature,
           "n_predict": cfg.n_predict, "repeats": cfg.repeats, "drafter": cfg.drafter,
           "prefill_target_ms": t["prefill_target"], "prefill_draft_ms": t["prefill_draft"], "draft_ms": t["draft"],
           "verify_ms": t["verify"], "resample_ms": t["resample"], "decode_ms": t["decode"], "total_ms": t["total"],
           **run.engine_own, "occupancy": run.mean_occupancy / run.max_concurrency,
           "mean_occupancy": run.mean_occupancy, "request_rate": rate,
           "burstiness": cfg.burstiness if cfg.trace_file is None else math.nan, "n_requests": len(trace),
           "trace_sha256": trace_sha256(trace), "slo": cfg.slo_text or None, "iteration_ms": run.iteration_ms,
           "mixed_step_frac": run.mixed_steps / run.decode_steps if run.decode_steps else math.nan,
           "kv_cells_left": run.kv_cells_left, **run.summary}
    if run.speculative:
        totals = run.totals
        row.update({"k": cfg.k, "accept_rule": cfg.accept_rule, "draft_accept_rate": run.draft_accept_rate,
                    "drafter_options": drafter_options_text(cfg.drafter, cfg.drafter_options),
                    "mean_accept_len": run.mean_accept_len, "round_ms": run.iteration_ms,
                    **{name: int(totals[name]) for name in ("drafted", "accepted", "rounds", "emitted", "rejected")},
                    "accept_at_pos": ";".join(f"{a / d:.4f}" if d else "" for a, d in
                                              zip(totals["accepted_at"], totals["drafted_at"])),
                    "accept_len_hist": ";".join(str(int(h)) for h in totals["accept_len_hist"])})
    else:
        row["step_ms"] = run.iteration_ms
    return row


def pair_rows(off: dict, on: dict) -> None:
    """The on row's comparison with the off row of the same trace."""
    off.update({"tps_baseline": off["tps"], "speedup": 1.0})
    on.update({"tps_baseline": off["tps"], "speedup": on["tps"] / off["tps"] if off["tps"] else math.nan,
               "step_ms": off["iteration_ms"],
               "verify_cost_c": on["iteration_ms"] / off["iteration_ms"] - 1 if off["iteration_ms"] else math.nan})


def request_lines(run: ServeRun, trace: list[Request], row: dict) -> list[dict]:
    """requests.jsonl: one line per request of one replay, keyed like its traces.csv row."""
    lines = []
    for i, (req, rec, m) in enumerate(zip(trace, run.records, run.metrics)):
        lines.append({"run_id": row["run_id"], "cell_id": row["cell_id"], "spec_decode": row["spec_decode"],
                      "request_rate": row["request_rate"], "seed": row["seed"], "request": i, "label": req.label,
                      "prompt_len": len(req.prompt), "slot": rec["slot"], "arrival_ms": rec["arrival_ms"],
                      "admitted_ms": rec["admitted_ms"], "first_token_ms": rec["first_token_ms"],
                      "finish_ms": rec["finish_ms"], **{k: v for k, v in m.items()},
                      "emit_tokens": rec["emit_tokens"].tolist()})
    return lines


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    raise TypeError(f"not JSON: {value!r}")


def append_requests(path: Path, lines: list[dict]) -> None:
    with path.open("a") as f:
        for line in lines:
            f.write(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in line.items()},
                               default=str) + "\n")


# ---------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------
def traces_for(cfg: ServeConfig, prompts: list, labels: list, output_lens: list) -> list[tuple[float, int, list]]:
    """(rate, seed, trace) of every replay, in the order they run."""
    if cfg.trace_file is not None:
        trace = arrivals.read_trace(cfg.trace_file)
        return [(offered_rate(trace), cfg.seed + r, trace) for r in range(cfg.repeats)]
    return [(rate, cfg.seed + r, arrivals.build_trace(prompts, output_lens, rate, cfg.n_requests, cfg.burstiness,
                                                      cfg.seed + r, labels))
            for rate in cfg.rates for r in range(cfg.repeats)]


def trace_file_path(out: Path, rate: float, seed: int) -> Path:
    """Where the run keeps the trace it replayed at `rate` with `seed`."""
    folder = Path(out) / "trace_files"
    folder.mkdir(exist_ok=True)
    return folder / f"rate={arrivals.rate_label(rate)}-seed={seed}.jsonl"


def engine_for(cfg: ServeConfig, traces: list) -> Engine:
    need = max(len(r.prompt) + r.output_len for _, _, trace in traces for r in trace) + cfg.k + 1
    n_ctx = max(256, need * cfg.max_concurrency + 64)
    n_batch = max(cfg.n_batch, cfg.max_concurrency * (cfg.k + 1))
    return Engine(cfg.target, cfg.draft, n_ctx=n_ctx, n_batch=n_batch, n_threads=cfg.threads,
                  n_gpu_layers=cfg.gpu_layers, n_seq_max=max(cfg.max_concurrency, 1), flash_attn=cfg.flash_attn)


def replay(engine, trace: list[Request], cfg: ServeConfig, spec: bool) -> ServeRun:
    return serve(engine, trace, max_concurrency=cfg.max_concurrency, spec=spec, k=cfg.k,
                 temperature=cfg.temperature, seed=cfg.seed, accept_rule=cfg.accept_rule, drafter=cfg.drafter,
                 drafter_options=cfg.drafter_options or None, slo=cfg.slo)


def verdict_columns(engine, trace, run: ServeRun, cfg: ServeConfig) -> dict:
    if not cfg.check_lossless or cfg.temperature > 0:
        return {"lossless_ok": None, "lossless_method": None}
    v = serving_verdict(engine, trace, run.tokens, cfg.k)
    return {"lossless_ok": v.lossless_ok, "lossless_method": "alone-greedy", "verdict": v.verdict,
            "verdict_reason": v.reason, "first_divergence": v.first_divergence}


def run_serve_sweep(cfg: ServeConfig) -> Path:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with rundir.locked(out):
        traces_path, requests_path = out / "traces.csv", out / "requests.jsonl"
        if traces_path.exists() and traces_path.stat().st_size > 0:
            raise SystemExit(f"error: {traces_path} exists; choose another --out (a --serve run does not resume)")
        requests_path.write_text("")
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        replays = traces_for(cfg, *workload_requests(cfg))
        for rate, seed, trace in replays:  # replayable elsewhere (--trace, bench/peerkit/serve_table.py)
            arrivals.write_trace(trace_file_path(out, rate, seed), trace)
        provenance = {**environment(), "date": now_iso(), "run_id": run_id, "command": cfg.command,
                      "preset": cfg.preset, "mode": "serve", "n_threads": cfg.threads,
                      "serve": {"request_rate": [arrivals.rate_label(r) for r in cfg.rates],
                                "max_concurrency": cfg.max_concurrency, "n_requests": cfg.n_requests,
                                "burstiness": cfg.burstiness, "repeats": cfg.repeats, "k": cfg.k,
                                "drafter": cfg.drafter, "temperature": cfg.temperature, "n_predict": cfg.n_predict,
                                "slo": cfg.slo, "trace_file": str(cfg.trace_file) if cfg.trace_file else None,
                                "tasks": cfg.tasks, "warmup": "one replay of the first trace, off and on, discarded",
                                # llama.cpp's option names: the llama-server replay passes them as they are
                                "drafter_options": dict(cfg.drafter_options)},
                      "workload": {"source": cfg.prompts_source, "dataset": cfg.dataset},  # as the sweep's
                      "models": [], "completed": False}
        with engine_for(cfg, replays) as engine:
            target_rec = model_record(engine.target_info, "target")
            draft_rec = model_record(engine.draft_info, "draft") if engine.draft_info else None
            provenance["models"] = [r for r in (target_rec, draft_rec) if r]
            write_json(out / "provenance.json", provenance)
            identity = {"quant_bits": target_rec["quant_bits"], "target_model": target_rec["name"],
                        "target_type": target_rec["type"], "target_sha256": target_rec["sha256"],
                        "draft_model": draft_rec["name"] if draft_rec else None,
                        "draft_type": draft_rec["type"] if draft_rec else None,
                        "draft_sha256": draft_rec["sha256"] if draft_rec else None,
                        "backend": provenance["backend"], "n_threads": cfg.threads, "flash_attn": cfg.flash_attn,
                        "run_id": run_id, "task": ",".join(cfg.tasks), "warmup": 1}
            for spec in (False, True):  # warm-up: caches, allocator, first graphs
                replay(engine, replays[0][2], cfg, spec)
            for n, (rate, seed, trace) in enumerate(replays, 1):
                rows, lines = [], []
                for spec in (False, True):
                    run = replay(engine, trace, cfg, spec)
                    row = {**identity, **level_row(run, trace, rate, seed, cfg),
                           "cell_id": f"serve/rate={arrivals.rate_label(rate)}/seed={seed}/np={cfg.max_concurrency}"
                                      f"/k={cfg.k}/{cfg.drafter}/{'on' if spec else 'off'}"}
                    row.update(verdict_columns(engine, trace, run, cfg))
                    rows.append(row)
                    lines += request_lines(run, trace, row)
                pair_rows(*rows)
                schema.append_rows(traces_path, rows)
                append_requests(requests_path, lines)
                print(f"[{n}/{len(replays)}] rate {arrivals.rate_label(rate)} seed {seed}: output tok/s off "
                      f"{rows[0]['tps']:.1f} on {rows[1]['tps']:.1f}, TPOT p50 off {rows[0]['tpot_p50_ms']:.1f} "
                      f"on {rows[1]['tpot_p50_ms']:.1f} ms, alpha {rows[1]['draft_accept_rate']:.2f}",
                      file=sys.stderr)
        provenance["completed"] = True
        write_json(out / "provenance.json", provenance)
    return traces_path


def config_from(sweep_cfg, args) -> ServeConfig:
    """The load sweep's settings: models, n_predict, threads, k etc. from the sweep's own flags
    (already checked by sweep.config_from_args), the serving flags from `args`."""
    from specnative import serve_metrics
    errors = []
    try:
        rates = [arrivals.parse_rate(r) for r in args.request_rate.split(",")]
    except ValueError as error:
        rates, errors = [], [f"--request-rate: {error}"]
    if len(set(rates)) != len(rates):
        errors.append("--request-rate has duplicates")
    try:
        slo = serve_metrics.parse_slo(args.slo)
    except ValueError as error:
        slo, errors = {}, errors + [str(error)]
    if args.max_concurrency < 1:
        errors.append("--max-concurrency must be >= 1")
    if args.num_requests < 1:
        errors.append("--num-requests must be >= 1")
    if not (args.burstiness > 0 and math.isfinite(args.burstiness)):
        errors.append("--burstiness must be a finite number > 0")
    if (len(sweep_cfg.targets) != 1 and sweep_cfg.preset is None) or len(sweep_cfg.ks) != 1 \
            or len(sweep_cfg.drafters) != 1 or len(sweep_cfg.temperatures) != 1:
        errors.append("--serve takes one target (a preset: its first), one -k, one --drafter and one --temp "
                      "(the request rate is its axis)")
    if sweep_cfg.resume:
        errors.append("--serve does not resume: a load level is one replay of a trace (run it again with another --out)")
    if args.trace is not None and not Path(args.trace).is_file():
        errors.append(f"--trace: no such file {args.trace}")
    if errors:
        raise SystemExit("error: " + "\n       ".join(errors))
    drafter = sweep_cfg.drafters[0]
    return ServeConfig(
        target=Path(sweep_cfg.targets[0]), draft=Path(sweep_cfg.draft) if sweep_cfg.draft else None,  # n-gram: none
        rates=sorted(rates),
        max_concurrency=args.max_concurrency, n_requests=args.num_requests, burstiness=args.burstiness,
        repeats=sweep_cfg.repeats, k=sweep_cfg.ks[0], drafter=drafter,
        drafter_options=sweep_cfg.drafter_options if drafter != "model" else {},
        temperature=sweep_cfg.temperatures[0], accept_rule=sweep_cfg.accept_rule, n_predict=sweep_cfg.n_predict,
        slo=slo, slo_text=args.slo or "", seed=sweep_cfg.seed, threads=sweep_cfg.threads, n_batch=sweep_cfg.n_batch,
        gpu_layers=sweep_cfg.gpu_layers, flash_attn=sweep_cfg.flash_attn, tasks=sweep_cfg.tasks,
        prompts=sweep_cfg.prompts, prompts_source=sweep_cfg.prompts_source, dataset=sweep_cfg.dataset,
        trace_file=args.trace, out_dir=sweep_cfg.out_dir, report=sweep_cfg.report, preset=sweep_cfg.preset,
        command=sweep_cfg.command)


def main(sweep_cfg, args) -> int:
    """sweep.py's --serve: run the load sweep, then its report."""
    cfg = config_from(sweep_cfg, args)
    lengths = (f"output lengths from the set's replies, at most {cfg.n_predict} tokens" if cfg.dataset
               and cfg.dataset.get("name") == "sharegpt" else f"{cfg.n_predict} tokens each")
    print(f"specnative serve sweep -> {cfg.out_dir}\n  target {cfg.target.name}, draft {cfg.draft.name if cfg.draft else '-'}, drafter "
          f"{cfg.drafter}, k {cfg.k}\n  rates {[arrivals.rate_label(r) for r in cfg.rates]} req/s x "
          f"{cfg.repeats} seeded traces of {cfg.n_requests} requests ({lengths}), "
          f"max concurrency {cfg.max_concurrency}", file=sys.stderr)
    try:
        traces = run_serve_sweep(cfg)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished levels are in {cfg.out_dir / 'traces.csv'}", file=sys.stderr)
        return 130
    if cfg.report:
        from specnative.report import write_report
        print(f"report: {write_report(cfg.out_dir)}", file=sys.stderr)
    print(traces)
    return 0
