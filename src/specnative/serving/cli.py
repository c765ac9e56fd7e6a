"""`specnative serve`: serving under load. Seeded request traces at each request rate replayed
through the engine's continuous-batching loop, spec off and on on the same trace; its own flags
(rates, slots, requests, SLOs, a trace file) on top of the shared ones (sweep/options.py)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from specnative.serving import arrivals
from specnative.serving import metrics as serve_metrics
from specnative.serving.report import write_report
from specnative.serving.runner import ServeConfig, run_serve_sweep
from specnative.sweep import options

DESCRIPTION = ("Serving under load: replay seeded request traces at each --request-rate through continuous "
               "batching, spec off and on on the same trace (-r traces per rate), and write traces.csv, "
               "requests.jsonl and a report with the crossover rate. With no model arguments it runs the "
               "embedded tiny preset.")


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    serving = p.add_argument_group("serving under load (continuous batching)")
    serving.add_argument("--request-rate", default="1,2,4,8,inf", metavar="R,R,...",
                         help="requests per second (Poisson; 'inf': all at t=0)")
    serving.add_argument("--max-concurrency", type=int, default=8, help="slots decoding together (llama-server -np)")
    serving.add_argument("--num-requests", type=int, default=32, help="requests per trace")
    serving.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps (1: Poisson)")
    serving.add_argument("--slo", default=None, metavar="ttft:MS,tpot:MS", help="goodput targets (also e2el:MS)")
    serving.add_argument("--trace", type=Path, default=None, metavar="FILE",
                         help="replay this trace file (JSON lines: arrival_s, prompt token ids, output_len) instead "
                              "of --request-rate")
    serving.add_argument("-r", "--repeats", type=int, default=2, help="seeded traces per request rate")


def build_parser(prog: str = "specnative serve") -> argparse.ArgumentParser:
    p = options.new_parser(prog, DESCRIPTION)
    options.add_model_flags(p, "target model (one)")
    options.add_drafter_flags(p, axis=False)
    options.add_sampling_flags(p, axis=False)
    options.add_workload_flags(p)
    add_serving_flags(p)
    options.add_run_flags(p)
    options.add_placement_flags(p)
    options.add_output_flags(p)
    # the closed loop's grid and measuring settings, fixed: a serve run's axis is the request rate
    p.set_defaults(ctx_len=[0], concurrency=None, draft_p_min=[0.0], dist_positions=4096, warmup=0, warmup_tol=0.1,
                   max_repeats=None, ci_level=0.95, ci_width=0.05, which_k=False, check_k=False, shard=None)
    return p


def config_from(sweep_cfg, args) -> ServeConfig:
    """The load sweep's settings: models, n_predict, threads, k etc. from the sweep's own flags
    (already checked by sweep.config_from_args), the serving flags from `args`."""
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
        errors.append("serve takes one target (a preset: its first), one -k, one --drafter and one --temp "
                      "(the request rate is its axis)")
    if sweep_cfg.resume:
        errors.append("serve does not resume: a load level is one replay of a trace (run it again with another --out)")
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


def main(argv: list[str] | None = None, prog: str = "specnative serve") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    args.concurrency = [max(args.max_concurrency, 1)]  # the batch-size check of the shared flags
    cfg = config_from(options.config_from_args(args, argv, verb="serve"), args)
    lengths = (f"output lengths from the set's replies, at most {cfg.n_predict} tokens" if cfg.dataset
               and cfg.dataset.get("name") == "sharegpt" else f"{cfg.n_predict} tokens each")
    print(f"specnative serve -> {cfg.out_dir}\n  target {cfg.target.name}, draft {cfg.draft.name if cfg.draft else '-'}, "
          f"drafter {cfg.drafter}, k {cfg.k}\n  rates {[arrivals.rate_label(r) for r in cfg.rates]} req/s x "
          f"{cfg.repeats} seeded traces of {cfg.n_requests} requests ({lengths}), "
          f"max concurrency {cfg.max_concurrency}", file=sys.stderr)
    try:
        traces = run_serve_sweep(cfg)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished levels are in {cfg.out_dir / 'traces.csv'}", file=sys.stderr)
        return 130
    if cfg.report:
        print(f"report: {write_report(cfg.out_dir)}", file=sys.stderr)
    print(traces)
    return 0
