"""The load sweep (`specnative serve`): replay seeded traces at each request rate through the
continuous-batching engine, spec off and on on the same trace, and write one traces.csv row per
(rate, trace seed, spec) plus one requests.jsonl line per request.

Per rate and repeat r the trace is drawn with seed + r (arrivals.build_trace over the workload's
prompts, n_predict tokens each), so the repeats give intervals and the off and on runs pair
request by request; a --trace file is replayed as it is, once per repeat. Each run is judged as
the closed loop judges a cell (verdict.py): at temperature 0 every request's output against the
request decoded alone (exact, or numeric where batches mix), at T > 0 per seed with each request's
own keys, and under the rejection rule by the distributional test beside the match proxy.

Refused before anything is written, with the closed loop's reasons (sweep/grid.py): requests
longer than the models' training context, KV caches over --max-kv-gib. A run folder is kept whole
as a sweep's (record/rundir.py): locked while written, resumed with the same settings only, a
level (the off and on rows of one rate and trace seed) kept when all its rows are in traces.csv,
its requests.jsonl lines written before its rows (the rows are the commit point).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from specnative import lossless
from specnative.engine import DraftShape, Engine, drafter_options_text, parse_draft_shape
from specnative.record import database, rundir, schema
from specnative.record.provenance import environment, model_record, now_iso, sha256_file, write_json
from specnative.run import hidden_drafters, workloads
from specnative.engine.spec_policy import choice_columns
from specnative.run.row_columns import synthetic_columns, tree_count_columns
from specnative.serving import arrivals, checks
from specnative.serving.arrivals import Request
from specnative.serving.loop import ServeRun, serve
from specnative.serving.verdict import (
    LOSSLESS_METHODS,
    rejection_distribution,
    sampled_serving_verdict,
    serving_verdict,
)


@dataclass
class ServeConfig:
    target: Path
    draft: Path | None          # None: an n-gram drafter alone (or mtp: the target's own head)
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
    trace: list | None = None   # the --trace file's requests (read and checked up front)
    ctx_len: int = 0            # tokens of shared documents ahead of every request's own prompt
    # --prefix-cache on,off: True computes the requests' common prefix once and copies its cells into
    # each admitted slot; False prefills every prompt whole (as serve always did, and the default)
    prefix_caches: list = field(default_factory=lambda: [False])
    db: Path | None = None      # the results database synced after every level (record/database.py)
    check_lossless: bool = True
    dist_positions: int = 4096  # the rejection rule's distributional test: emitted tokens pooled
    max_kv_gib: float = 8.0
    placement: dict = field(default_factory=dict)  # Engine keyword arguments (-sm, -ts, -dev, --rpc, ...)
    resume: bool = False
    mtp: bool = False           # --drafter mtp: the target loaded with its nextn (MTP) layers
    # --draft-shape: what the on runs draft: "chain" (k tokens) or a draft tree's spelling (docs/trees.md; k is
    # then its node budget)
    draft_shape: str = "chain"
    # --spec-policy: how many tokens each request drafts per round (engine/spec_policy.py; static: k every round)
    spec_policy: str = "static"
    # --synthetic-acceptance: profiles (specnative.engine.synthetic) replayed spec on beside each level, drafts
    # kept at random at that acceptance (rows with verdict "synthetic", paired with the level's off run)
    synthetic: list = field(default_factory=list)
    out_dir: Path = Path("runs/serve")
    report: bool = True
    preset: str | None = None
    command: str = ""


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
    return (workload.context_prompts(chosen, cfg.ctx_len), [p.ident for p in chosen],
            [p.output_len or cfg.n_predict for p in chosen])


def trace_sha256(trace: list[Request]) -> str:
    text = json.dumps([[r.arrival_s, list(r.prompt), r.output_len] for r in trace])
    return hashlib.sha256(text.encode()).hexdigest()


def offered_rate(trace: list[Request]) -> float:
    last = trace[-1].arrival_s
    return len(trace) / last if last > 0 else math.inf


def n_predict_of(cfg: ServeConfig, trace: list[Request]) -> int:
    """What a row's n_predict says: the most tokens a request of the trace generates (a --trace
    file's own output lengths; otherwise -n, which caps a set's recorded reply lengths)."""
    return max(r.output_len for r in trace) if cfg.trace is not None else cfg.n_predict


def level_row(run: ServeRun, trace: list[Request], rate: float, seed: int, cfg: ServeConfig) -> dict:
    """One traces.csv row of one replay (without identity columns and the on/off pairing)."""
    t = run.times
    row = {"spec_decode": "on" if run.speculative else "off", "concurrency": run.max_concurrency,
           "ctx_len": cfg.ctx_len, "prefix_cache": "on" if run.prefix_cache else "off",
           "prefill_tokens": run.prefill_tokens,
           "tps": run.summary["output_throughput"], "seed": seed, "temperature": cfg.temperature,
           "n_predict": n_predict_of(cfg, trace), "repeats": cfg.repeats, "drafter": cfg.drafter,
           "prefill_target_ms": t["prefill_target"], "prefill_draft_ms": t["prefill_draft"], "draft_ms": t["draft"],
           "verify_ms": t["verify"], "resample_ms": t["resample"], "decode_ms": t["decode"], "total_ms": t["total"],
           "draft_ingest_ms": t["draft_ingest"],
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
        if shape_of(cfg).is_tree:
            row.update(tree_count_columns(cfg.draft_shape, totals))
        row.update(choice_columns(cfg.spec_policy, totals, t, run.decode_steps))
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
    if cfg.trace is not None:
        return [(offered_rate(cfg.trace), cfg.seed + r, cfg.trace) for r in range(cfg.repeats)]
    return [(rate, cfg.seed + r, arrivals.build_trace(prompts, output_lens, rate, cfg.n_requests, cfg.burstiness,
                                                      cfg.seed + r, labels))
            for rate in cfg.rates for r in range(cfg.repeats)]


def planned_replays(cfg: ServeConfig) -> list[tuple[float, int, list]]:
    """The replays of the run (a --trace file's, or seeded traces over the workload)."""
    if cfg.trace is not None:
        return traces_for(cfg, [], [], [])
    return traces_for(cfg, *workload_requests(cfg))


def trace_file_path(out: Path, rate: float, seed: int) -> Path:
    """Where the run keeps the trace it replayed at `rate` with `seed`."""
    folder = Path(out) / "trace_files"
    folder.mkdir(exist_ok=True)
    return folder / f"rate={arrivals.rate_label(rate)}-seed={seed}.jsonl"


def shape_of(cfg: ServeConfig) -> DraftShape:
    return parse_draft_shape(cfg.draft_shape)


def engine_size(cfg: ServeConfig, traces: list) -> tuple[int, int]:
    """(n_ctx, n_batch) of the serving engine: every slot can hold the longest request's prompt,
    output and look-ahead; a batch holds every slot's verify tokens (a draft tree's nodes)."""
    shape = shape_of(cfg)
    need = max(len(r.prompt) + r.output_len for _, _, trace in traces for r in trace) + max(cfg.k, shape.cells_per_round) + 1
    per_slot = max(cfg.k + 1, shape.batch_per_sequence)
    return max(256, need * cfg.max_concurrency + 64), max(cfg.n_batch, cfg.max_concurrency * per_slot)


def engine_for(cfg: ServeConfig, traces: list) -> Engine:
    n_ctx, n_batch = engine_size(cfg, traces)
    holder = 1 if any(cfg.prefix_caches) else 0  # the prefix cache keeps the prefix in a sequence of its own
    try:
        return Engine(cfg.target, cfg.draft, n_ctx=n_ctx, n_batch=n_batch, n_threads=cfg.threads,
                      n_gpu_layers=cfg.gpu_layers,
                      n_seq_max=max(cfg.max_concurrency, 1) * shape_of(cfg).ids_per_sequence + holder,
                      flash_attn=cfg.flash_attn,
                      mtp=cfg.mtp, **cfg.placement)
    except ValueError as error:  # a placement only the load can check (an unknown -dev): one line
        raise SystemExit(f"error: cannot load {cfg.target} with draft {cfg.draft}: {error}") from None


def replay(engine, trace: list[Request], cfg: ServeConfig, spec: bool, accept_rule: str | None = None,
           prefix_cache: bool = False, synthetic=None) -> ServeRun:
    return serve(engine, trace, max_concurrency=cfg.max_concurrency, spec=spec, k=cfg.k,
                 temperature=cfg.temperature, seed=cfg.seed, accept_rule=accept_rule or cfg.accept_rule,
                 drafter=cfg.drafter, drafter_options=cfg.drafter_options or None, slo=cfg.slo,
                 prefix_cache=prefix_cache, synthetic=synthetic,
                 draft_shape=cfg.draft_shape if shape_of(cfg).is_tree and synthetic is None else None,
                 spec_policy=cfg.spec_policy if synthetic is None else None)


def verdict_columns(engine, trace, run: ServeRun, cfg: ServeConfig) -> dict:
    """How the serving run is judged: as the closed loop judges a cell (verdict.py)."""
    if not cfg.check_lossless:
        return {"lossless_ok": None, "lossless_method": None}
    per = shape_of(cfg).ids_per_sequence  # a draft tree's engine holds a sequence id per branch
    if cfg.temperature == 0:
        v, method = serving_verdict(engine, trace, run.tokens, cfg.k, per), "alone-greedy"
    else:
        v = sampled_serving_verdict(engine, trace, run.tokens, cfg.k, cfg.temperature, cfg.seed, per)
        method = "alone-seed"
    columns = {}
    if run.speculative and cfg.temperature > 0 and cfg.accept_rule == "rejection":
        method = "distribution"
        proxy_run = replay(engine, trace, cfg, True, accept_rule="match", prefix_cache=run.prefix_cache)
        proxy = sampled_serving_verdict(engine, trace, proxy_run.tokens, cfg.k, cfg.temperature, cfg.seed, per)
        dist = rejection_distribution(engine, trace, cfg.temperature, cfg.seed, cfg.k, cfg.dist_positions,
                                      cfg.drafter, cfg.drafter_options, shape_of(cfg))
        ok = dist.passed and proxy.lossless_ok
        v = lossless.Verdict(lossless.EXACT_DIST if ok else lossless.FAIL,
                             f"{dist.reason}; match proxy on the serving loop: {proxy.verdict} ({proxy.reason})",
                             proxy.first_divergence, proxy.mismatches, proxy.max_mismatch_gap, proxy.tolerance,
                             proxy.positions)
        columns = {"dist_statistic": dist.statistic, "dist_p_value": dist.p_value, "dist_positions": dist.positions,
                   "dist_runs": dist.runs, "proxy_verdict": proxy.verdict}
    return {**columns, "lossless_ok": v.lossless_ok, "lossless_method": method, "verdict": v.verdict,
            "verdict_reason": v.reason, "first_divergence": v.first_divergence, "mismatches": v.mismatches}


def level_cell_ids(cfg: ServeConfig, rate: float, seed: int) -> list[str]:
    """The cell_id of each row of one level (per prefix-cache mode: off, on): what a resume looks
    for in traces.csv. Levels without the prefix cache and context keep their old ids."""
    base = f"serve/rate={arrivals.rate_label(rate)}/seed={seed}/np={cfg.max_concurrency}/k={cfg.k}/{cfg.drafter}"
    if shape_of(cfg).is_tree:
        base += f"/shape={cfg.draft_shape}"
    if cfg.spec_policy != "static":
        base += f"/policy={cfg.spec_policy}"
    if cfg.ctx_len:
        base += f"/ctx={cfg.ctx_len}"
    return ([base + ("/prefix=on" if prefix else "") + f"/{spec}" for prefix in cfg.prefix_caches for spec in ("off", "on")]
            + [base + ("/prefix=on" if prefix else "") + f"/synthetic={p.text}/on" for prefix in cfg.prefix_caches
               for p in cfg.synthetic])


def run_settings(cfg: ServeConfig) -> dict:
    """What a resume must repeat beyond the serving settings, build and hardware: the models, the
    prompts and the trace file by content, the batch and the placement."""
    return {"seed": cfg.seed, "n_batch": cfg.n_batch, "accept_rule": cfg.accept_rule,
            "target_sha256": sha256_file(cfg.target), "draft_sha256": sha256_file(cfg.draft) if cfg.draft else None,
            "prompts_source": cfg.prompts_source,
            "prompts_sha256": workloads.prompts_sha256(cfg.prompts or workloads.builtin_prompts()),
            "trace_sha256": trace_sha256(cfg.trace) if cfg.trace is not None else None,
            "dist_positions": cfg.dist_positions, "placement": cfg.placement, "max_kv_gib": cfg.max_kv_gib}


def serve_record(cfg: ServeConfig, replays: list) -> dict:
    """provenance.json's "serve" part: the settings the run applies, a --trace file's as it holds them."""
    trace = cfg.trace
    record = {"request_rate": [arrivals.rate_label(r) for r in sorted({rate for rate, _, _ in replays})],
              "max_concurrency": cfg.max_concurrency,
              "n_requests": len(trace) if trace is not None else cfg.n_requests,
              "burstiness": cfg.burstiness if trace is None else None, "repeats": cfg.repeats, "k": cfg.k,
              "drafter": cfg.drafter, "temperature": cfg.temperature, "accept_rule": cfg.accept_rule,
              "n_predict": n_predict_of(cfg, trace) if trace is not None else cfg.n_predict,
              "slo": cfg.slo, "trace_file": str(cfg.trace_file) if cfg.trace_file else None,
              "tasks": cfg.tasks if trace is None else None,
              "warmup": "one replay of the first trace, off and on, discarded",
              # llama.cpp's option names: the llama-server replay passes them as they are
              "drafter_options": dict(cfg.drafter_options),
              "lossless": LOSSLESS_METHODS["alone-greedy" if cfg.temperature == 0 else "distribution"
                                           if cfg.accept_rule == "rejection" else "alone-seed"]}
    if trace is not None:
        record["trace"] = checks.trace_summary(trace)
    if cfg.synthetic:  # only when set: older run folders still resume
        record["synthetic_acceptance"] = [p.text for p in cfg.synthetic]
    if shape_of(cfg).is_tree:  # likewise
        record["draft_shape"] = cfg.draft_shape
    if cfg.spec_policy != "static":  # likewise
        record["spec_policy"] = cfg.spec_policy
    return record


def resume_plan(cfg: ServeConfig, out: Path, replays: list, provenance: dict) -> tuple:
    """What a resume keeps (rundir.plan_resume over the levels) and the recorded provenance;
    refuses other settings or a damaged file. Changes nothing."""
    traces = out / "traces.csv"
    recorded = None
    if (traces.exists() and traces.stat().st_size > 0) or (out / "provenance.json").exists():
        recorded = rundir.check_resume(out, provenance)
    keys = {(rate, seed): level_cell_ids(cfg, rate, seed) for rate, seed, _ in replays}
    return rundir.plan_resume(traces, keys), recorded


def keep_requests(path: Path, kept_cell_ids: set) -> int:
    """requests.jsonl without the lines of levels a resume measures again (and a line torn by a
    crash), replaced atomically; returns the lines dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            keep = json.loads(line).get("cell_id") in kept_cell_ids
        except (ValueError, AttributeError):
            keep = False
        if keep:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)
    return dropped


def run_serve_sweep(cfg: ServeConfig) -> Path:
    out = Path(cfg.out_dir)
    if problem := checks.hidden_prefix_refusal(cfg.drafter, cfg.prefix_caches):  # the CLI says it first
        raise SystemExit(f"error: {problem}")
    try:
        replays = planned_replays(cfg)
    except ValueError as error:  # the workload cannot give these prompts (no prompts, documents too short)
        raise SystemExit(f"error: {error}") from None
    checks.check_models(cfg, replays, engine_size(cfg, replays)[0])  # refusals before anything is written
    with rundir.locked(out):
        traces_path, requests_path = out / "traces.csv", out / "requests.jsonl"
        if traces_path.exists() and traces_path.stat().st_size > 0 and not cfg.resume:
            raise SystemExit(f"error: {traces_path} exists; pass --resume to continue it or choose another --out")
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        provenance = {**environment(), "date": now_iso(), "run_id": run_id, "command": cfg.command,
                      "preset": cfg.preset, "mode": "serve", "n_threads": cfg.threads,
                      "serve": serve_record(cfg, replays), "settings": run_settings(cfg),
                      "workload": {"source": cfg.prompts_source, "dataset": cfg.dataset},  # as the sweep's
                      "models": [], "completed": False,
                      "levels_planned": len(replays)}  # a report of an unfinished run counts what is missing
        plan, recorded = resume_plan(cfg, out, replays, provenance) if cfg.resume else (
            rundir.ResumePlan(traces_path), None)
        if recorded is not None:  # the run's history goes on
            provenance = rundir.continued_provenance(recorded, provenance, plan.kept_rows())
        rundir.apply_resume(plan)
        kept = {row["cell_id"] for row in plan.kept_rows()}
        if cfg.resume and (dropped := keep_requests(requests_path, kept)):
            print(f"warning: {requests_path}: removed {dropped} line(s) of levels measured again", file=sys.stderr)
        if not cfg.resume or not requests_path.exists():
            requests_path.write_text("")
        for rate, seed, trace in replays:  # replayable elsewhere (--trace, bench/peerkit/serve_table.py)
            arrivals.write_trace(trace_file_path(out, rate, seed), trace)
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
                        "run_id": run_id, "task": ",".join(cfg.tasks) if cfg.trace is None else "trace",
                        "warmup": 1}
            todo = [(rate, seed, trace) for rate, seed, trace in replays if (rate, seed) not in plan.done]
            if todo:
                for spec in (False, True):  # warm-up: caches, allocator, first graphs
                    replay(engine, todo[0][2], cfg, spec)
            for n, (rate, seed, trace) in enumerate(replays, 1):
                if (rate, seed) in plan.done:
                    continue
                rows, lines = [], []
                modes = [(prefix, spec) for prefix in cfg.prefix_caches for spec in (False, True)]
                for (prefix, spec), cell_id in zip(modes, level_cell_ids(cfg, rate, seed)):
                    run = replay(engine, trace, cfg, spec, prefix_cache=prefix)
                    row = {**identity, **level_row(run, trace, rate, seed, cfg), "cell_id": cell_id}
                    if spec and hidden_drafters.is_hidden(cfg.drafter):  # its file and what it was inferred to be
                        row.update(hidden_drafters.draft_columns(cfg.drafter, engine))
                    row.update(verdict_columns(engine, trace, run, cfg))
                    rows.append(row)
                    lines += request_lines(run, trace, row)
                for off_on in zip(rows[::2], rows[1::2]):
                    pair_rows(*off_on)
                synthetic_ids = level_cell_ids(cfg, rate, seed)[len(modes):]
                for (prefix, profile), cell_id in zip([(pc, p) for pc in cfg.prefix_caches for p in cfg.synthetic],
                                                      synthetic_ids):
                    run = replay(engine, trace, cfg, True, prefix_cache=prefix, synthetic=profile)
                    row = {**identity, **level_row(run, trace, rate, seed, cfg), "cell_id": cell_id,
                           **synthetic_columns(profile, cfg.k)}
                    pair_rows(rows[2 * cfg.prefix_caches.index(prefix)], row)  # that mode's off run
                    rows.append(row)
                    lines += request_lines(run, trace, row)
                append_requests(requests_path, lines)  # first: a level's rows are its commit point
                schema.append_rows(traces_path, rows)
                if cfg.db is not None:  # derived from the folder, after the level is whole in it
                    database.sync_or_warn(cfg.db, out)
                print(f"[{n}/{len(replays)}] rate {arrivals.rate_label(rate)} seed {seed}: output tok/s off "
                      f"{rows[0]['tps']:.1f} on {rows[1]['tps']:.1f}, TPOT p50 off {rows[0]['tpot_p50_ms']:.1f} "
                      f"on {rows[1]['tpot_p50_ms']:.1f} ms, alpha {rows[1]['draft_accept_rate']:.2f}, "
                      f"{rows[1].get('verdict') or 'unchecked'}", file=sys.stderr)
        provenance["completed"] = True
        write_json(out / "provenance.json", provenance)
        if cfg.db is not None and traces_path.exists():
            database.sync_or_warn(cfg.db, out, final=True)
    return traces_path
