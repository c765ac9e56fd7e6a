"""`specnative serve`: serving under load. Seeded request traces at each request rate replayed
through the engine's continuous-batching loop, spec off and on on the same trace; its own flags
(rates, slots, requests, SLOs, a trace file) on top of the shared ones (run/options.py).

Every flag the parser takes is applied and recorded, or refused: a --trace file holds its own
arrivals, prompts and output lengths, so the flags that would set them are errors beside it; serve
has no shared context (--context is the sweep's), and the closed loop's grid and measuring
settings are fixed (set_defaults) since no flag of serve's sets them."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from specnative.engine import drafter_name, native, parse_draft_shape, parse_spec_policy
from specnative.serving import arrivals, checks, vllm_result
from specnative.serving import metrics as serve_metrics
from specnative.serving.report import write_report
from specnative.serving.runner import ServeConfig, offered_rate, run_serve_sweep
from specnative.run import hidden_drafters, options
from specnative.run.options import int_list, on_off_list
from specnative.run.resume_args import resume_argv, resume_command
from specnative.run.spec import DIST_POSITIONS, RunSpec

DESCRIPTION = ("Serving under load: replay seeded request traces at each --request-rate through continuous "
               "batching, spec off and on on the same trace (-r traces per rate), and write traces.csv, "
               "requests.jsonl and a report with the crossover rate. With no model arguments it runs the "
               "embedded tiny preset.")
DEFAULT_RATES, DEFAULT_REQUESTS, DEFAULT_BURSTINESS = "1,2,4,8,inf", 32, 1.0
# Flags a --trace file replaces: it holds its own arrivals, prompts and output lengths
TRACE_REPLACES = (("request_rate", "--request-rate"), ("num_requests", "--num-requests"),
                  ("burstiness", "--burstiness"), ("n_predict", "-n/--n-predict"), ("prompts", "--prompts"),
                  ("dataset", "--dataset"), ("tasks", "--tasks"))


def slot_count(text: str) -> int:
    """-np/--max-concurrency: one slot count (a sweep's -np takes a list: its grid's axis)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected one number of slots, e.g. 8, not {text!r} (serve's axis is --request-rate; sweep takes "
            f"-np 1,4,8 for a grid of batch sizes)") from None


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    serving = p.add_argument_group("serving under load (continuous batching)")
    serving.add_argument("--request-rate", default=None, metavar="R,R,...",
                         help=f"requests per second (Poisson; 'inf': all at t=0; default {DEFAULT_RATES})")
    serving.add_argument("-np", "--max-concurrency", type=slot_count, default=8,
                         help="slots decoding together (llama-server's -np; one number: the load is the request "
                              "rate's axis; default 8)")
    serving.add_argument("--num-requests", type=int, default=None,
                         help=f"requests per trace (default {DEFAULT_REQUESTS})")
    serving.add_argument("--burstiness", type=float, default=None,
                         help=f"gamma shape of the arrival gaps (1: Poisson; default {DEFAULT_BURSTINESS:g})")
    options.add_synthetic_flag(serving)
    serving.add_argument("--slo", default=None, metavar="ttft:MS,tpot:MS", help="goodput targets (also e2el:MS)")
    serving.add_argument("--trace", type=Path, default=None, metavar="FILE",
                         help="replay this trace file (JSON lines: arrival_s, prompt token ids, output_len) -r "
                              "times instead of seeded traces: its arrivals, prompts and output lengths replace "
                              "--request-rate, --num-requests, --burstiness, -n, --prompts, --dataset and --tasks")
    serving.add_argument("-r", "--repeats", type=int, default=2, help="seeded traces per request rate")
    serving.add_argument("--ctx-len", type=int_list, default=[0], metavar="N",
                         help="tokens of shared documents ahead of every request's own prompt (one value)")
    serving.add_argument("--draft-shape", type=one_draft_shape, default="chain", metavar="chain|tree:...",
                         help="what the on runs draft: chain (-k tokens) or one draft tree verified in one batch, "
                              "e.g. tree:topk=4,depth=5,budget=8 (its node budget is then k; the draft model or "
                              "an EAGLE-3 head; docs/trees.md)")
    serving.add_argument("--spec-policy", type=one_spec_policy, default="static",
                         metavar="static|adaptive|by-batch:...",
                         help="how many tokens each request drafts per round: static (-k every round), adaptive "
                              "(chosen every round from the measured verify cost and each request's acceptance), "
                              "by-batch:[[lo,hi,k],...] or by-batch:RUN/advice.json (a load sweep's schedule); "
                              "-k is the most a round drafts (docs/adaptive.md)")
    serving.add_argument("--save-result", action="store_true",
                         help="also write each level's `vllm bench serve` result as its own JSON file, named as "
                              "vLLM names them, in --result-dir (vllm_results.jsonl, one result a line, is always "
                              "written beside requests.jsonl; docs/serving.md)")
    serving.add_argument("--result-dir", type=Path, default=None, metavar="DIR",
                         help=f"where --save-result writes (default: {vllm_result.RESULT_DIR}/ in the run folder)")
    serving.add_argument("--prefix-cache", type=on_off_list, default=[False], metavar="on,off",
                         help="on: the requests' common prefix (the shared documents, the chat template's head) "
                              "computed once and copied into each admitted slot; off: every request prefills its "
                              "whole prompt; both: each trace replayed both ways")


def one_draft_shape(text: str) -> str:
    """--draft-shape: one shape (a sweep's --draft-shape takes a list: its grid's axis)."""
    try:
        return parse_draft_shape(text).spelling
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def one_spec_policy(text: str) -> str:
    """--spec-policy: one policy, as its spelling in traces.csv (a schedule inline, not its file)."""
    try:
        return parse_spec_policy(text).text
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def tree_problems(args) -> list[str]:
    """Where serve cannot run a draft tree: one line each."""
    if not parse_draft_shape(args.draft_shape).is_tree:
        return []
    errors = []  # the drafter: options.config_from_args checks it for sweep and serve alike
    if args.spec_policy != "static":
        errors.append("--spec-policy: a draft tree drafts its whole shape every round; a policy applies to chains")
    if any(args.prefix_cache):
        errors.append("--draft-shape: a slot's branches take the sequence ids the prefix cache keeps its prefix "
                      "in: use --prefix-cache off with a draft tree")
    if getattr(args, "synthetic_acceptance", None):
        errors.append("--draft-shape: synthetic acceptance applies to chains")
    tree, slots = parse_draft_shape(args.draft_shape), args.max_concurrency
    ids = slots * tree.ids_per_sequence
    if ids > native.max_parallel_sequences:  # each slot's branches are sequence ids of its own
        errors.append(f"draft tree {tree} has up to {tree.ids_per_sequence} branches per slot, each its own "
                      f"sequence id (docs/trees.md): at --max-concurrency {slots} that is {ids} sequence ids, over "
                      f"llama.cpp's most sequences per context ({native.max_parallel_sequences})")
    if args.batch_size is not None and slots * tree.batch_per_sequence > args.batch_size:
        errors.append(f"draft tree {tree} puts up to {tree.batch_per_sequence} tokens per slot through one batch "
                      f"(its nodes and the pending token): at --max-concurrency {slots} that is "
                      f"{slots * tree.batch_per_sequence}, over --batch-size {args.batch_size}")
    return errors


def build_parser(prog: str = "specnative serve") -> argparse.ArgumentParser:
    p = options.new_parser(prog, DESCRIPTION)
    options.add_model_flags(p, "target model (one)")
    options.add_drafter_flags(p, axis=False)
    options.add_sampling_flags(p, axis=False)
    options.add_workload_flags(p, context=False)
    add_serving_flags(p)
    options.add_run_flags(p)
    options.add_placement_flags(p)
    options.add_database_flags(options.add_output_flags(p))
    # the closed loop's grid and measuring settings, fixed (no flag of serve's sets them): a serve
    # run's axis is the request rate, its repeats are seeded traces; the rejection rule's
    # distributional test pools the sweep's default number of tokens (recorded in provenance)
    p.set_defaults(concurrency=None, dist_positions=DIST_POSITIONS,
                   warmup=0, warmup_tol=0.1, max_repeats=None, ci_level=0.95, ci_width=0.05, which_k=False,
                   check_k=False, shard=None, context=None)
    return p


def serve_problems(args) -> list[str]:
    """serve's own flags, checked before the shared ones (which may fetch a public set): one line
    each."""
    errors = []
    if args.trace is not None:
        given = [flag for name, flag in TRACE_REPLACES if getattr(args, name) is not None]
        if given:
            errors.append(f"--trace replays the file's own arrivals, prompts and output lengths: {', '.join(given)} "
                          f"would not apply")
        if not Path(args.trace).exists():
            errors.append(f"--trace: no such file {args.trace}")
    rates = []
    try:
        rates = [arrivals.parse_rate(r) for r in (args.request_rate or DEFAULT_RATES).split(",")]
    except ValueError as error:
        errors.append(f"--request-rate: {error}")
    if len(set(rates)) != len(rates):
        errors.append("--request-rate has duplicates")
    n_requests = DEFAULT_REQUESTS if args.num_requests is None else args.num_requests
    burstiness = DEFAULT_BURSTINESS if args.burstiness is None else args.burstiness
    if n_requests < 1:
        errors.append("--num-requests must be >= 1")
    elif args.trace is None:
        errors += [p for p in (checks.rate_problem(r, n_requests) for r in rates) if p]
    try:
        serve_metrics.parse_slo(args.slo)
    except ValueError as error:
        errors.append(str(error))
    if args.result_dir is not None and not args.save_result:
        errors.append("--result-dir is where --save-result writes: give --save-result too")
    elif args.result_dir is not None and (problem := vllm_result.result_dir_problem(args.result_dir)):
        errors.append(problem)
    if not 1 <= args.max_concurrency <= native.max_parallel_sequences:
        errors.append(f"--max-concurrency must be in [1, {native.max_parallel_sequences}] (llama.cpp's most "
                      f"sequences per context), not {args.max_concurrency}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        errors.append("--burstiness must be a finite number > 0")
    if len(args.ctx_len) != 1 or args.ctx_len[0] < 0:
        errors.append("--ctx-len takes one number of tokens >= 0 (the shared context of every request)")
    if args.trace is not None and args.ctx_len != [0]:
        errors.append("--trace replays the file's own prompts: --ctx-len would not apply")
    if any(args.prefix_cache) and args.max_concurrency >= native.max_parallel_sequences:
        errors.append(f"--prefix-cache on keeps the shared prefix in a sequence beside the slots: --max-concurrency "
                      f"must be below {native.max_parallel_sequences}")
    for drafter in args.drafter or []:
        try:
            problem = checks.hidden_drafter_refusal(drafter_name(drafter))
        except ValueError:
            continue  # an unknown name: the shared check says so
        problem = problem or checks.hidden_prefix_refusal(drafter_name(drafter), args.prefix_cache)
        if problem:
            errors.append(problem)
    return errors + tree_problems(args)


def config_from(spec: RunSpec, args, trace: list | None = None) -> ServeConfig:
    """The load sweep's settings: models, n_predict, threads, k etc. from the run's settings (the
    shared flags, already checked by options.spec_from_args), the serving flags from `args`
    (serve_problems), a --trace file's requests from `trace`."""
    models, decoding, drafting, workload = spec.models, spec.decoding, spec.drafter, spec.workload
    if (len(models.targets) != 1 and models.preset is None) or len(drafting.ks) != 1 \
            or len(drafting.drafters) != 1 or len(decoding.temperatures) != 1:
        raise SystemExit("error: serve takes one target (a preset: its first), one -k, one --drafter and one --temp "
                         "(the request rate is its axis)")
    rates = sorted(arrivals.parse_rate(r) for r in (args.request_rate or DEFAULT_RATES).split(","))
    drafter = drafting.drafters[0]
    # the engine's draft: the draft model, a hidden-state drafter's file (-md or --drafter-file),
    # the target's own nextn head (mtp), or none (an n-gram drafter)
    draft, mtp = hidden_drafters.engine_draft(drafter, models.draft, models.drafter_files)
    return ServeConfig(
        target=Path(models.targets[0]), draft=Path(draft) if draft else None, mtp=mtp,
        rates=[offered_rate(trace)] if trace is not None else rates,
        max_concurrency=args.max_concurrency,
        n_requests=len(trace) if trace is not None else (args.num_requests or DEFAULT_REQUESTS),
        burstiness=math.nan if trace is not None else (args.burstiness or DEFAULT_BURSTINESS),
        repeats=spec.measure.repeats, draft_shape=args.draft_shape, spec_policy=args.spec_policy,
        k=parse_draft_shape(args.draft_shape).budget or drafting.ks[0], drafter=drafter,
        drafter_options=drafting.drafter_options if drafter != "model" else {},
        temperature=decoding.temperatures[0], accept_rule=decoding.accept_rule, n_predict=decoding.n_predict,
        slo=serve_metrics.parse_slo(args.slo), slo_text=args.slo or "", seed=decoding.seed,
        threads=spec.placement.threads, n_batch=spec.placement.n_batch, gpu_layers=spec.placement.gpu_layers,
        flash_attn=spec.placement.flash_attn, tasks=workload.tasks, prompts=workload.prompts,
        prompts_source=workload.prompts_source, dataset=workload.dataset, trace_file=args.trace, trace=trace,
        out_dir=spec.output.out_dir, report=spec.output.report, preset=models.preset, command=spec.output.command,
        dist_positions=spec.measure.dist_positions, max_kv_gib=spec.placement.max_kv_gib,
        placement=spec.placement.devices, resume=spec.output.resume, ctx_len=workload.ctx_lens[0],
        prefix_caches=args.prefix_cache, synthetic=drafting.synthetic, db=spec.output.db)


def describe(cfg: ServeConfig) -> str:
    """What the run will do, as it applies it (a --trace file's own contents)."""
    head = (f"specnative serve -> {cfg.out_dir}\n  target {cfg.target.name}, draft "
            f"{cfg.draft.name if cfg.draft else '-'}, drafter {cfg.drafter}, "
            f"{cfg.draft_shape if cfg.draft_shape != 'chain' else f'k {cfg.k}'}"
            f"{f', policy {cfg.spec_policy}' if cfg.spec_policy != 'static' else ''}, T {cfg.temperature:g} "
            f"({cfg.accept_rule}), max concurrency {cfg.max_concurrency}")
    if cfg.trace is not None:
        t = checks.trace_summary(cfg.trace)
        return (f"{head}\n  trace {cfg.trace_file}: {t['requests']} requests arriving over {t['arrival_span_s']:.3g} s "
                f"(offered rate {t['offered_rate']} req/s), output lengths {t['output_len']['min']}-"
                f"{t['output_len']['max']} (mean {t['output_len']['mean']:.1f}), prompts "
                f"{t['prompt_len']['min']}-{t['prompt_len']['max']} tokens; replayed {cfg.repeats} time(s)")
    lengths = (f"output lengths from the set's replies, at most {cfg.n_predict} tokens" if cfg.dataset
               and cfg.dataset.get("name") == "sharegpt" else f"{cfg.n_predict} tokens each")
    spans = ", ".join(f"{arrivals.rate_label(r)}: ~{checks.expected_span_s(r, cfg.n_requests):.3g} s"
                      for r in cfg.rates)
    return (f"{head}\n  rates {[arrivals.rate_label(r) for r in cfg.rates]} req/s x {cfg.repeats} seeded traces of "
            f"{cfg.n_requests} requests ({lengths}); arrivals spread over (rate: span) {spans}")


def main(argv: list[str] | None = None, prog: str = "specnative serve") -> int:
    argv = resume_argv("serve", sys.argv[1:] if argv is None else list(argv))
    args = build_parser(prog).parse_args(argv)
    if args.no_db and args.db is not None:
        raise SystemExit("error: --db and --no-db: give one of them")
    if problems := serve_problems(args):
        raise SystemExit("error: " + "\n       ".join(problems))
    trace = checks.read_trace_file(args.trace) if args.trace is not None else None
    args.concurrency = [args.max_concurrency]  # the batch-size check of the shared flags
    cfg = config_from(options.spec_from_args(args, argv, verb="serve"), args, trace)
    print(describe(cfg), file=sys.stderr)
    try:
        traces = run_serve_sweep(cfg)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished levels are in {cfg.out_dir / 'traces.csv'}; continue with: "
              f"{resume_command('serve', cfg.out_dir)}", file=sys.stderr)
        return 130
    result_dir = (args.result_dir or cfg.out_dir / vllm_result.RESULT_DIR) if args.save_result else None
    print(f"vllm bench serve results: {vllm_result.write_results(cfg.out_dir, result_dir)}"
          + (f" and {result_dir}/" if result_dir else ""), file=sys.stderr)
    if cfg.report:
        print(f"report: {write_report(cfg.out_dir)}", file=sys.stderr)
    print(traces)
    return 0
