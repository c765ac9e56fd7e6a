"""specnative's serving loop against llama-server, measured interleaved on the same traces.

For every seeded trace (arrival times, prompt token ids, output lengths) both sides replay the
same requests back to back, spec off and on, the order alternating (serve_parity.schedule):
ours in-process (specnative.serving.loop.serve on one Engine kept open, as `specnative serve`
replays), theirs against llama-server started once per setting and kept warm (`-np` = the max
concurrency; spec off: the target alone; on: `-md` with draft-simple, `--spec-draft-n-max k`, no
minimum draft length or probability, or the n-gram drafter `--spec-type ngram-*` with its
options under llama.cpp's names), greedy, ignore_eos, prompt cache off, on 127.0.0.1 only. Both
sides get the same batch settings: n_ctx (every slot can hold the longest request), n_batch =
n_ubatch, slots, one unified KV cache, the full-size SWA cache, threads, flash attention.

The client of llama-server is open loop: each request is sent at its arrival time on its own
connection and streamed, so TTFT and ITL are taken per chunk the way our engine stamps its
emissions; both sides' metrics come from the same code (specnative.serving.metrics). α: ours
accepted / drafted, theirs the final chunk's timings.draft_n_accepted / draft_n.

The table (serve_paired.py): per rate, spec setting and metric, the paired ratio ours / server
(geometric mean of the per-trace ratios with its 95 % t interval, specnative.analysis.stats, as the
closed-loop table pairs its repeats), α on each side and their paired difference in points,
speculation's benefit on each side, and per-iteration figures (llama_decode calls, ms per
iteration, prompt tokens) that say where a difference comes from.

    python bench/peers.py serve [specnative serve's flags] [-o DIR]
    python bench/peers.py serve --preset gemma3-270m --drafter ngram-simple --spec-ngram-simple-size-n 3 \\
        --spec-ngram-simple-size-m 4 -k 4 --request-rate 1,inf --max-concurrency 4 -r 3 --num-requests 12 \\
        -n 32 -t 2 -o bench/results/serving-parity/gemma3-270m-ngram-simple
    python bench/peers.py serve RUN_DIR [-t N] [-o DIR]   the trace files and settings of a
                                                           `specnative serve` run folder

Writes DIR/parity.md (the tables), DIR/runs.csv (one row per measured run), DIR/provenance.json
and DIR/trace_files/ (what both sides replayed). Default DIR:
bench/results/serving-parity/<target>-<drafter>-<backend>.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from . import serve_paired, serve_parity
from .common import (
    RESULTS,
    WORK,
    Quiet,
    add_build_args,
    build_lines,
    cpu_model,
    default_max_busy,
    find_tools,
    git_rev,
    log,
    rel,
    show_cmd,
)
from .server import NAME, LlamaServer, install_sigterm_handler, server_cmd

PROG = "python bench/peers.py serve"
TRACE_NAME = re.compile(r"rate=([^-]+)-seed=(\d+)\.jsonl$")
# Flags a run folder's own settings replace (everything but these, the peer flags and -o)
RUN_DIR_KEEPS = {"run_dir", "threads", "batch_size", "flash_attn", "gpu_layers", "out", "rebuild", "build_only",
                 "build_dir", "tools_dir", "start_timeout", "request_timeout", "max_busy", "max_wait"}


# ---------------------------------------------------------------------------------------------
# Command line and settings
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """`specnative serve`'s flags (the same models, drafter, workload and traces), the peer
    build's flags and the waiting for a quiet machine."""
    from specnative.serving import cli
    p = cli.build_parser(PROG)
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("run_dir", nargs="?", type=Path, default=None,
                   help="a `specnative serve` run folder: its trace files and settings instead of the flags")
    p.set_defaults(threads=None)  # the run folder's unless given
    for action in p._actions:
        if action.dest == "out":
            action.help = "folder for parity.md, runs.csv, provenance.json and trace_files/ (default: " \
                          "bench/results/serving-parity/<target>-<drafter>-<backend>)"
    peer = p.add_argument_group("llama-server and the machine")
    add_build_args(peer)
    peer.add_argument("--start-timeout", type=float, default=300, help="seconds for a server to come up")
    peer.add_argument("--request-timeout", type=float, default=600, help="seconds for one streamed request")
    peer.add_argument("--max-busy", type=float, default=None,
                      help="CPU cores other processes may keep busy before a run, else wait (default: what leaves "
                           "our threads their cores, at least 0.25)")
    peer.add_argument("--report-only", type=Path, default=None, metavar="DIR",
                      help="write DIR/parity.md again from its runs.csv and provenance.json (after a change to the "
                           "tables), measuring nothing")
    peer.add_argument("--max-wait", type=float, default=120,
                      help="seconds to wait for a quiet machine before each run (then it measures anyway: the "
                           "pairing is what protects the ratios)")
    return p


def given_flags(p: argparse.ArgumentParser, args: argparse.Namespace, keep: set) -> list[str]:
    """The flags set away from their defaults, other than `keep`."""
    defaults = p.parse_args([])
    names = {a.dest: (a.option_strings[-1] if a.option_strings else a.dest) for a in p._actions}
    return [names.get(dest, dest) for dest, value in vars(args).items()
            if dest not in keep and value != getattr(defaults, dest, None)]


def config_from_flags(p: argparse.ArgumentParser, args: argparse.Namespace, argv: list):
    """(ServeConfig, replays) from `specnative serve`'s flags, checked as that command checks them."""
    from specnative.run import options
    from specnative.run.options import default_threads
    from specnative.serving import checks, cli
    from specnative.serving.runner import planned_replays

    args.threads = args.threads or default_threads()
    if problems := cli.serve_problems(args):
        raise SystemExit("error: " + "\n       ".join(problems))
    trace = checks.read_trace_file(args.trace) if args.trace is not None else None
    args.concurrency = [args.max_concurrency]  # the batch-size check of the shared flags
    cfg = cli.config_from(options.config_from_args(args, argv, verb="serve"), args, trace)
    return cfg, planned_replays(cfg)


def config_of_run(p: argparse.ArgumentParser, args: argparse.Namespace):
    """(ServeConfig, replays) of a `specnative serve` run folder: its models, serving settings
    (provenance.json) and trace files; -t, -b, -fa and -ngl may differ from the run's."""
    from specnative.serving import arrivals
    from specnative.serving.runner import ServeConfig

    run_dir = args.run_dir
    if not (run_dir / "provenance.json").is_file():
        raise SystemExit(f"error: {run_dir} is not a run folder (no provenance.json)")
    if extra := given_flags(p, args, RUN_DIR_KEEPS):
        raise SystemExit(f"error: {run_dir}: the run folder's own settings and traces apply; "
                         f"{', '.join(extra)} would not")
    prov = json.loads((run_dir / "provenance.json").read_text())
    if "serve" not in prov:
        raise SystemExit(f"error: {run_dir} is not a serve run (provenance.json has no 'serve' record)")
    serve, settings = prov["serve"], prov.get("settings", {})
    models = {m["role"]: Path(m["path"]) for m in prov.get("models", [])}
    if "target" not in models:
        raise SystemExit(f"error: {run_dir}/provenance.json names no target model")
    for path in models.values():
        if not path.is_file():
            raise SystemExit(f"error: the run's model {path} is not on this machine")
    found = trace_files(run_dir)
    replays = []
    for rate, seed, path in found:
        try:
            replays.append((rate, seed, arrivals.read_trace(path)))
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
    if "drafter_options" not in serve and serve.get("drafter", "model") != "model":
        raise SystemExit("error: provenance.json records no drafter_options (a serve run of an older specnative); "
                         "run it again to compare its n-gram drafter")
    cfg = ServeConfig(
        target=models["target"], draft=models.get("draft"), rates=sorted({rate for rate, _, _ in replays}),
        max_concurrency=serve["max_concurrency"], n_requests=serve.get("n_requests", len(replays[0][2])),
        repeats=serve.get("repeats", 1), k=serve["k"], drafter=serve.get("drafter", "model"),
        drafter_options=dict(serve.get("drafter_options") or {}), temperature=serve.get("temperature", 0.0),
        accept_rule=serve.get("accept_rule", "greedy"), n_predict=serve.get("n_predict", 64),
        slo=serve.get("slo") or {}, seed=settings.get("seed", 0), threads=args.threads or prov.get("n_threads", 2),
        n_batch=args.batch_size or settings.get("n_batch", 512), gpu_layers=args.gpu_layers,
        flash_attn=args.flash_attn == "on", placement=settings.get("placement") or {},
        command=prov.get("command", ""))
    return cfg, replays


def comparable(cfg):
    """What both sides can run alike, refused otherwise; an n-gram drafter's engine loads no draft."""
    if cfg.temperature != 0:
        raise SystemExit("error: the comparison runs greedy (--temp 0): llama-server samples with its own RNG, so "
                         "sampled outputs and α would differ by chance alone")
    if cfg.drafter != "model" and not cfg.drafter.startswith("ngram-") and cfg.drafter not in HIDDEN:
        raise SystemExit(f"error: llama-server is compared with the draft model, the n-gram drafters and "
                         f"{', '.join(HIDDEN)}, not {cfg.drafter}")
    if cfg.drafter == "model" and cfg.draft is None:
        raise SystemExit("error: the draft model's comparison needs -md/--draft (or an n-gram --drafter)")
    if cfg.drafter in HIDDEN and cfg.drafter != "mtp" and cfg.draft is None:
        raise SystemExit(f"error: the {cfg.drafter} comparison needs its drafter file as -md/--draft")
    if len(getattr(cfg, "synthetic", [])) > 1 or (getattr(cfg, "synthetic", []) and cfg.drafter != "model"):
        raise SystemExit("error: the comparison takes one --synthetic-acceptance profile, with the draft model "
                         "(llama-server's --spec-synth-rates holds one per-position profile of k rates)")
    if cfg.placement:
        raise SystemExit(f"error: placement flags ({', '.join(cfg.placement)}) are not passed to llama-server; "
                         f"compare with the defaults")
    return dataclasses.replace(cfg, draft=cfg.draft if cfg.drafter == "model" or cfg.drafter in HIDDEN else None)


def server_record(cfg) -> dict:
    """What replay_cmd needs of the serving settings (provenance.json's 'serve' names)."""
    return {"drafter": cfg.drafter, "k": cfg.k, "max_concurrency": cfg.max_concurrency,
            "drafter_options": dict(cfg.drafter_options),
            "synthetic_acceptance": [p.text for p in getattr(cfg, "synthetic", [])]}


# llama.cpp's hidden-state drafters, served by llama-server with --spec-type draft-<name>
HIDDEN = ("dflash", "dspark", "eagle3", "mtp")

_LLAMA_CONTEXT = re.compile(r"llama_context:\s+(n_seq_max|n_ctx|n_batch|n_ubatch|flash_attn|kv_unified)\s+=\s+(\S+)")
_THREADS = re.compile(r"system_info: n_threads = (\d+) \(n_threads_batch = (\d+)\)")
_POOL = re.compile(r"llama threadpool init, n_threads = (\d+)")


def server_settings(log_text: str) -> dict:
    """The target context llama.cpp set up in llama-server, from its log (the first context
    created is the target's): n_seq_max, n_ctx, n_batch, n_ubatch, flash_attn, kv_unified,
    swa_full, threads."""
    out = {}
    for name, value in _LLAMA_CONTEXT.findall(log_text):
        out.setdefault(name, value)
    if m := _THREADS.search(log_text):
        out["n_threads"], out["n_threads_batch"] = m.group(1), m.group(2)
    elif m := _POOL.search(log_text):
        out["n_threads"] = m.group(1)
    out["swa_full"] = "true" if "using full-size SWA cache" in log_text else "false (or no SWA)"
    return out


def probe_settings(cmd: list, log_path: Path, a) -> dict:
    """llama-server's target context as llama.cpp set it up: the same command started once more
    at log verbosity 4 (which prints llama_context's parameters; the measured servers keep the
    default verbosity), stopped as soon as it is up."""
    with LlamaServer(cmd + ["-lv", "4"], log_path, a.start_timeout, a.request_timeout):
        pass
    return server_settings(log_path.read_text(errors="replace"))


def trace_files(run_dir: Path) -> list[tuple[float, int, Path]]:
    """(rate, seed, path) of the run's traces, by rate then seed."""
    found = []
    for path in sorted((run_dir / "trace_files").glob("*.jsonl")):
        m = TRACE_NAME.search(path.name)
        if m:
            found.append((float(m.group(1)), int(m.group(2)), path))
    if not found:
        raise SystemExit(f"error: {run_dir}/trace_files has no traces (a serve run of an older specnative?)")
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# llama-server's side: the command (its open-loop streaming client: open_loop.py)
# ---------------------------------------------------------------------------------------------
def replay_cmd(tools: dict, models: dict, serve: dict, spec: bool, n_ctx: int, a) -> list:
    """llama-server for one setting of the comparison (`serve`: the serving settings under
    provenance.json's names):
    the target alone (spec off), with the draft model (draft-simple), or with the run's n-gram
    drafter and the options it ran with, passed under llama.cpp's own flag names. For ngram-simple
    the draft length is its size-m (llama.cpp's n-gram drafters ignore --spec-draft-n-max; it is
    passed for the record, as k)."""
    cmd = _replay_cmd(tools, models, serve, spec, n_ctx, a)
    if spec and serve.get("synthetic_acceptance"):  # the same per-position rates, llama.cpp's benchmarking mode
        from specnative.engine import synthetic
        rates = synthetic.parse_profile(serve["synthetic_acceptance"][0]).rates(int(serve["k"]))
        cmd += ["--spec-synth-rates", ",".join(f"{r:.6g}" for r in rates)]
    return cmd


def _replay_cmd(tools: dict, models: dict, serve: dict, spec: bool, n_ctx: int, a) -> list:
    drafter, k, n_par = serve.get("drafter", "model"), serve["k"], serve["max_concurrency"]
    # swa_full: our engine keeps the whole SWA cache (rollback); a no-op on models without SWA
    if not spec or drafter == "model":
        return server_cmd(tools, models["target"], models["draft"] if spec else None, k, n_par, n_ctx, a,
                          swa_full=True)
    if drafter in HIDDEN:  # llama.cpp's own hidden-state drafter, reading the target's features
        cmd = server_cmd(tools, models["target"], None, k, n_par, n_ctx, a, swa_full=True)
        cmd += ([] if drafter == "mtp" else ["-md", str(models["draft"])])
        return cmd + ["--spec-type", f"draft-{drafter}", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
                      "--spec-draft-p-min", "0"]
    if not drafter.startswith("ngram-"):
        raise SystemExit(f"error: llama-server is compared with the draft model, the n-gram drafters and "
                         f"{', '.join(HIDDEN)}, not {drafter}")
    if "drafter_options" not in serve:  # its options are unknown: llama.cpp's defaults might not be what ran
        raise SystemExit("error: provenance.json records no drafter_options (a serve run of an older specnative); "
                         "run it again to replay its n-gram drafter")
    cmd = server_cmd(tools, models["target"], None, k, n_par, n_ctx, a, swa_full=True)
    cmd += ["--spec-type", drafter, "--spec-draft-n-max", str(k)]
    for name, value in sorted(serve["drafter_options"].items()):
        cmd += [f"--{name}", str(value)]
    return cmd


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def default_out(cfg, backend: str) -> Path:
    tag = "-synthetic" if getattr(cfg, "synthetic", []) else ""
    return RESULTS / "serving-parity" / f"{cfg.target.stem}-{cfg.drafter}{tag}-{backend.lower()}"


def measure_both(cfg, replays: list, tools: dict, a, out: Path) -> dict:
    """Opens both sides (the engine, one server per setting), warms them up and runs the
    interleaved schedule; returns the rows and what each side ran with."""
    from specnative.serving.runner import engine_for, engine_size

    n_ctx, n_batch = engine_size(cfg, replays)
    peer_args = SimpleNamespace(threads=cfg.threads, n_batch=n_batch, flash_attn="on" if cfg.flash_attn else "off",
                                ngl=cfg.gpu_layers)
    models = {"target": cfg.target, "draft": cfg.draft}
    cmds = {spec: replay_cmd(tools, models, server_record(cfg), spec, n_ctx, peer_args) for spec in (False, True)}
    quiet = Quiet(a.max_busy if a.max_busy is not None else default_max_busy(cfg.threads), a.max_wait)

    def before() -> dict:
        quiet.wait()
        return serve_parity.host_state()

    logs = {spec: WORK / "server-logs" / f"parity-{out.name}-{'on' if spec else 'off'}.log" for spec in (False, True)}
    contexts = {("on" if spec else "off"): probe_settings(cmds[spec], logs[spec].with_suffix(".settings.log"), a)
                for spec in (False, True)}
    rev, date = git_rev(), time.strftime("%Y-%m-%d %H:%M")  # the source the engine was loaded from
    with engine_for(cfg, replays) as engine, \
            LlamaServer(cmds[False], logs[False], a.start_timeout, a.request_timeout) as off, \
            LlamaServer(cmds[True], logs[True], a.start_timeout, a.request_timeout) as on:
        run = serve_parity.both(serve_parity.ours_runner(engine, cfg),
                                serve_parity.server_runner({False: off, True: on}, cfg.slo))
        log("warm-up (discarded): the first requests of the first trace, each side, off and on")
        serve_parity.warm_up(run, replays[0][2], cfg.max_concurrency)
        load_start = os.getloadavg()
        rows = serve_parity.measure(replays, run, before)
        return {"rows": rows, "ours_context": engine.context_info(), "quiet": quiet.describe(), "specnative_git": rev, "date": date,
                "server_context": contexts,
                "server_cmds": {("on" if spec else "off"): show_cmd(s.cmd) for spec, s in ((False, off), (True, on))},
                "loadavg_start": load_start, "loadavg_end": os.getloadavg()}


SETTING_KEYS = ("n_seq_max", "n_ctx", "n_batch", "n_ubatch", "kv_unified", "swa_full", "flash_attn", "n_threads",
                "n_threads_batch")


def settings_md(got: dict) -> str:
    ours = dict(got["ours_context"])
    # llama_flash_attn_type by llama.cpp's names, as its log prints them
    ours["flash_attn"] = {-1: "auto", 0: "disabled", 1: "enabled"}.get(ours.get("flash_attn"), ours.get("flash_attn"))
    lines = ["| side | " + " | ".join(SETTING_KEYS) + " |", "|---|" + "---|" * len(SETTING_KEYS),
             "| specnative (both settings, one engine) | "
             + " | ".join(str(ours.get(k, "?")).lower() for k in SETTING_KEYS) + " |"]
    for spec, theirs in got["server_context"].items():
        lines.append(f"| llama-server spec {spec} | " + " | ".join(str(theirs.get(k, "?")) for k in SETTING_KEYS)
                     + " |")
    return "\n".join(lines)


def home(text: str) -> str:
    """A command as its reader would type it: the home folder as ~ (the model cache lives there)."""
    return text.replace(str(Path.home()) + os.sep, "~" + os.sep)


def render(cfg, replays: list, got: dict, frame: pd.DataFrame, build: dict, argv: list) -> str:
    from specnative.serving import arrivals
    ratios = serve_paired.ratio_table(frame)
    alphas = serve_paired.alpha_table(frame)
    verdict = serve_paired.verdict(ratios, alphas)
    per_rate = pd.Series([rate for rate, _, _ in replays]).value_counts().sort_index()
    options = ", ".join(f"--{k} {v}" for k, v in sorted(cfg.drafter_options.items())) or "its defaults"
    drafter = f"draft model {cfg.draft.name}" if cfg.drafter == "model" else f"{cfg.drafter} ({options})"
    (l1, l5, l15), (e1, e5, e15) = got["loadavg_start"], got["loadavg_end"]
    busy = pd.to_numeric(frame["busy_cores"], errors="coerce")
    n_requests = len(replays[0][2])
    host = (f"Self-measured on CPU {cpu_model()} ({os.cpu_count()} cores), specnative {got['specnative_git']}, "
            f"{got['date']}; load average {l1:.2f} {l5:.2f} {l15:.2f} at the start, "
            f"{e1:.2f} {e5:.2f} {e15:.2f} at the end; cores busy elsewhere before a run: median {busy.median():.2f}, "
            f"max {busy.max():.2f} ({got['quiet']}).")
    design = (f"Traces: {', '.join(f'{n} at {arrivals.rate_label(r)} req/s' for r, n in per_rate.items())}, "
              f"{n_requests} requests each; max concurrency {cfg.max_concurrency}, k {cfg.k}, greedy, ignore_eos, "
              f"{cfg.threads} threads. Per trace both sides ran back to back, off and on, in the order ours off, "
              f"server off, ours on, server on (reversed on every second trace), after one discarded warm-up each; "
              f"the servers were started once per setting and kept warm.")
    legend = ("Ratios: ours / llama-server of the same trace, the geometric mean over the traces with its 95 % "
              "Student t interval on the logs (specnative.analysis.stats.speedup_interval). Latencies in ms: a ratio below 1 "
              "is ours faster. Outcome, oriented so that ours better is > 1: the interval contains 1, lies above 1 "
              f"('ours better'), or below 1 within {serve_paired.TOLERANCE:.0%} ('ours lower, within 5 %') or beyond. "
              "llama-server streams one chunk per token, so its ITL within a speculative round is ~0, where our "
              "engine stamps one emission per round: ITL compares spec off only.")
    if verdict["parity"]:
        decided = ("**Parity**: every spec-off ratio of throughput, TPOT p50 and TTFT p50 contains 1 or lies above "
                   "0.95 (oriented), and spec-on α is within 2 points of llama-server's.")
    else:
        decided = "**Not at parity**:\n\n" + "\n".join(f"- {f}" for f in verdict["failing"])
    where = ("Iterations: ours one target llama_decode per iteration; llama-server's n_decode_total (its "
             "llama_decode calls outside speculative drafting) over the run. ms / iteration: duration / iterations "
             "on both sides (idle time between arrivals included). Engine's own share: our decoding time outside "
             "llama.cpp calls (batch building, sampling, bookkeeping).")
    parts = [
        f"# specnative serving vs llama-server, interleaved: {cfg.target.name}, {drafter}", host, design, legend,
        "## Verdict", decided,
        "## Paired ratios, ours / llama-server", serve_paired.ratio_md(ratios),
        "## α = accepted / drafted", serve_paired.alpha_md(alphas) if not alphas.empty else "(no spec-on runs)",
        "## Speculation's benefit on each side (on/off for rates, off/on for latencies; > 1 pays)",
        serve_paired.benefit_md(serve_paired.benefit_table(frame)),
        "## Where the time goes (means over the traces)", where, serve_paired.diagnostics_md(frame),
        "## Batch settings on both sides (as llama.cpp set them up)", settings_md(got),
        "## Commands", "```\n" + home(PROG + " " + " ".join(shlex.quote(x) for x in argv)) + "\n```",
        "llama-server, spec off: `" + home(got["server_cmds"]["off"]) + "`",
        "llama-server, spec on: `" + home(got["server_cmds"]["on"]) + "`",
        *build_lines(build)]
    return "\n\n".join(parts) + "\n"


def report_again(out: Path) -> Path:
    """out/parity.md from out/runs.csv and out/provenance.json, as main() wrote it after measuring."""
    try:
        prov = json.loads((out / "provenance.json").read_text())
        frame = pd.read_csv(out / "runs.csv")
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: {out} holds no comparison to report ({error})") from None
    if "server_cmds" not in prov or "serve" not in prov:
        raise SystemExit(f"error: {out}/provenance.json is not a serving comparison's")
    serve = prov["serve"]
    models = {m["role"]: Path(m["path"]) for m in prov["models"]}
    cfg = SimpleNamespace(target=models["target"], draft=models.get("draft"), drafter=serve["drafter"],
                          drafter_options=serve.get("drafter_options") or {}, k=serve["k"],
                          max_concurrency=serve["max_concurrency"], threads=prov["n_threads"])
    traces = frame.drop_duplicates("trace_index").sort_values("trace_index")
    replays = [(r.request_rate, r.seed, [None] * int(r.n_requests)) for r in traces.itertuples()]
    got = {key: prov.get(key) for key in ("ours_context", "server_context", "server_cmds", "loadavg_start",
                                          "loadavg_end", "specnative_git")}
    got["quiet"] = prov.get("quiet", "the quiet-machine record is not kept in this folder")
    got["date"] = prov.get("date", "?")[:16].replace("T", " ")
    argv = shlex.split(prov["command"])[len(shlex.split(PROG)):]
    (out / "parity.md").write_text(render(cfg, replays, got, frame, prov.get("peer_build", {}), argv))
    return out / "parity.md"


def main(argv=None) -> int:
    from specnative import build_info
    from specnative.record.provenance import environment, now_iso, write_json
    from specnative.serving import arrivals
    from specnative.serving.runner import serve_record, trace_file_path

    argv = sys.argv[1:] if argv is None else list(argv)
    p = build_parser()
    args = p.parse_args(argv)
    if args.report_only is not None:
        if extra := given_flags(p, args, {"report_only"}):
            raise SystemExit(f"error: --report-only measures nothing; {', '.join(extra)} would not apply")
        print(report_again(args.report_only))
        return 0
    if args.resume or args.no_report:
        raise SystemExit("error: --resume and --no-report belong to `specnative serve`; the comparison always "
                         "measures anew and writes its table")
    cfg, replays = config_of_run(p, args) if args.run_dir is not None else config_from_flags(p, args, argv)
    cfg = comparable(cfg)
    info = build_info()
    out = args.out or default_out(cfg, info.get("backend", "CPU"))
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: -o {out} is a file, not a folder")
    per_rate = pd.Series([rate for rate, _, _ in replays]).value_counts()
    if per_rate.min() < 3:
        log(f"warning: {per_rate.min()} trace(s) at some rate: a ratio needs 2 for an interval, 3 or more for a "
            f"useful one (-r)")
    install_sigterm_handler()
    tools, build = find_tools(args, info, [NAME])
    if args.build_only:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for rate, seed, trace in replays:  # what both sides replay, kept beside the table
        arrivals.write_trace(trace_file_path(out, rate, seed), trace)
    started = now_iso()
    log(f"{len(replays)} traces x 2 sides x spec off/on -> {rel(out)}")
    got = measure_both(cfg, replays, tools, args, out)
    frame = pd.DataFrame(got["rows"])
    frame.to_csv(out / "runs.csv", index=False)
    write_json(out / "provenance.json", {
        **environment(), "date": started, "finished": now_iso(), "command": f"{PROG} {shlex.join(argv)}",
        "specnative_git": got["specnative_git"], "serve": serve_record(cfg, replays), "n_threads": cfg.threads,
        "models": [{"role": role, "path": str(path), "name": path.name}
                   for role, path in (("target", cfg.target), ("draft", cfg.draft)) if path is not None],
        "ours_context": got["ours_context"], "server_context": got["server_context"],
        "server_cmds": got["server_cmds"], "loadavg_start": got["loadavg_start"], "loadavg_end": got["loadavg_end"],
        "quiet": got["quiet"],
        "peer_build": {k: v for k, v in build.items() if k != "notes"}})
    text = render(cfg, replays, got, frame, build, argv)
    (out / "parity.md").write_text(text)
    print(out / "parity.md")
    return 0
