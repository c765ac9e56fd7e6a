"""specnative's serving mode against llama-server under the same arrivals.

Takes a run folder of `specnative serve` and replays each of its trace files
(trace_files/rate=R-seed=S.jsonl: arrival times, prompt token ids, output lengths) against
llama-server started with the run's files: `-np` = the run's max concurrency, spec off (target
alone) and on (`-md` with draft-simple, `--spec-draft-n-max k`, no minimum draft length or
probability; or the run's n-gram drafter, `--spec-type ngram-*` with the llama.cpp options the run
recorded in provenance.json), greedy, ignore_eos, prompt cache off, on 127.0.0.1 only. The client is open loop:
each request is sent at its arrival time on its own connection, whatever the others are doing,
and streamed, so TTFT and ITL are taken per chunk the way our engine stamps its emissions; the
metrics are computed by the same code (specnative.serving.metrics). α comes from the final
chunk's timings.draft_n / draft_n_accepted. The crossover of each side comes from
specnative.serving.crossover on the same rates.

    python bench/peers.py serve bench/results/serving-under-load/tiny-preset [--tools-dir DIR] [-t 2]

Writes RUN_DIR/llama-server-replay.md and .csv beside the run (-o elsewhere).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from .common import WORK, add_build_args, build_lines, cpu_model, find_tools, git_rev, log, show_cmd
from .server import NAME, LlamaServer, install_sigterm_handler, server_cmd

TRACE_NAME = re.compile(r"rate=([^-]+)-seed=(\d+)\.jsonl$")
COMPARED = (("output_throughput", "out tok/s"), ("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"),
            ("tpot_p50_ms", "TPOT p50"), ("tpot_p99_ms", "TPOT p99"), ("itl_p50_ms", "ITL p50"),
            ("draft_accept_rate", "α"))


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python bench/peers.py serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a run folder of `specnative serve`")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads (default: the run's)")
    ap.add_argument("-b", "--n-batch", type=int, default=512)
    ap.add_argument("--flash-attn", choices=("off", "on"), default="off")
    ap.add_argument("--gpu-layers", "--ngl", dest="ngl", type=int, default=0)
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=600)
    add_build_args(ap)
    ap.add_argument("-o", "--out", type=Path, default=None, help="markdown file (default: beside the run)")
    return ap.parse_args(argv)


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


def replay_open_loop(server: LlamaServer, trace: list, ignore_eos: bool = True) -> list[dict]:
    """Every request sent at its arrival time (its own thread and connection), streamed."""
    t0 = time.perf_counter()

    def send(request):
        delay = request.arrival_s - (time.perf_counter() - t0)
        if delay > 0:
            time.sleep(delay)
        return server.stream(list(request.prompt), request.output_len, ignore_eos, t0)

    with ThreadPoolExecutor(max_workers=len(trace)) as pool:
        return list(pool.map(send, trace))


def server_level(records: list[dict], slo: dict) -> dict:
    """The level summary of one replay, by specnative's own definitions."""
    from specnative.serving import metrics as serve_metrics
    metrics = [serve_metrics.request_metrics(r) for r in records]
    summary = serve_metrics.level_summary(metrics, max(r["finish_ms"] for r in records), slo)
    drafted = sum(r["counts"]["drafted"] for r in records)
    accepted = sum(r["counts"]["accepted"] for r in records)
    summary["draft_accept_rate"] = accepted / drafted if drafted else math.nan
    return summary


def replay_cmd(tools: dict, models: dict, serve: dict, spec: bool, n_ctx: int, a) -> list:
    """llama-server for one side of the replay of a serve run (`serve`: its provenance record):
    the target alone (spec off), with the draft model (draft-simple), or with the run's n-gram
    drafter and the options it ran with, passed under llama.cpp's own flag names. For ngram-simple
    the draft length is its size-m (llama.cpp's n-gram drafters ignore --spec-draft-n-max; it is
    passed for the record, as k)."""
    drafter, k, n_par = serve.get("drafter", "model"), serve["k"], serve["max_concurrency"]
    # swa_full: our engine keeps the whole SWA cache (rollback); a no-op on models without SWA
    if not spec or drafter == "model":
        return server_cmd(tools, models["target"], models["draft"] if spec else None, k, n_par, n_ctx, a,
                          swa_full=True)
    if not drafter.startswith("ngram-"):
        raise SystemExit(f"error: the llama-server replay covers the draft model and the n-gram drafters, not {drafter}")
    if "drafter_options" not in serve:  # its options are unknown: llama.cpp's defaults might not be what ran
        raise SystemExit("error: provenance.json records no drafter_options (a serve run of an older specnative); "
                         "run it again to replay its n-gram drafter")
    cmd = server_cmd(tools, models["target"], None, k, n_par, n_ctx, a, swa_full=True)
    cmd += ["--spec-type", drafter, "--spec-draft-n-max", str(k)]
    for name, value in sorted(serve["drafter_options"].items()):
        cmd += [f"--{name}", str(value)]
    return cmd


def measure(a, prov: dict, traces: list, tools: dict) -> pd.DataFrame:
    from specnative.serving import arrivals
    from specnative.serving.runner import trace_sha256

    serve = prov["serve"]
    drafter = serve.get("drafter", "model")
    models = {m["role"]: m["path"] for m in prov["models"]}
    loaded = [(rate, seed, arrivals.read_trace(path)) for rate, seed, path in traces]
    need = max(len(r.prompt) + r.output_len for _, _, trace in loaded for r in trace) + serve["k"] + 1
    n_par = serve["max_concurrency"]
    n_ctx = max(256, need * n_par + 64)
    cmds = {spec: replay_cmd(tools, models, serve, spec, n_ctx, a) for spec in (False, True)}  # refusals first
    rows = []
    for spec, cmd in cmds.items():
        log_path = WORK / "server-logs" / f"serve-{'on' if spec else 'off'}.log"
        with LlamaServer(cmd, log_path, a.start_timeout, a.request_timeout) as server:
            replay_open_loop(server, loaded[0][2][:n_par])  # warm-up, discarded
            for rate, seed, trace in loaded:
                log(f"  llama-server spec {'on' if spec else 'off'}: rate {arrivals.rate_label(rate)} seed {seed}")
                level = server_level(replay_open_loop(server, trace), serve.get("slo") or {})
                rows.append({"side": "llama-server", "request_rate": rate, "seed": seed,
                             "trace_sha256": trace_sha256(trace), "spec_decode": "on" if spec else "off",
                             "concurrency": n_par, "k": serve["k"] if spec else None, "drafter": drafter,
                             "mean_occupancy": math.nan, "cmd": show_cmd(server.cmd), **level})
    return pd.DataFrame(rows)


def ours_frame(run_dir: Path) -> pd.DataFrame:
    from specnative.record import schema
    frame = schema.serve_rows(schema.read_traces(run_dir / "traces.csv")).copy()
    frame["side"] = "specnative"
    return frame


def _fmt(v) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.3g}"


def table_md(ours: pd.DataFrame, theirs: pd.DataFrame) -> str:
    """Per rate and spec: means over the traces, ours | llama-server for each metric."""
    head = ["rate", "spec"] + [f"{label} ours \\| server" for _, label in COMPARED]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (rate, spec), mine in ours.groupby(["request_rate", "spec_decode"], sort=True):
        peer = theirs[(theirs["request_rate"] == rate) & (theirs["spec_decode"] == spec)]
        cells = [f"{_fmt(mine[c].astype(float).mean())} \\| {_fmt(peer[c].astype(float).mean())}" for c, _ in COMPARED]
        lines.append("| " + " | ".join(["inf" if math.isinf(rate) else f"{rate:g}", spec] + cells) + " |")
    return "\n".join(lines)


def crossover_md(ours: pd.DataFrame, theirs: pd.DataFrame) -> str:
    from specnative.serving import crossover
    lines = []
    for side, frame in (("specnative", ours), ("llama-server", theirs)):
        table = crossover.benefit_table(frame)
        for metric, c in crossover.crossovers(table).items():
            rate = "–" if c["rate"] is None or not math.isfinite(c["rate"]) else f"{c['rate']:.3g} req/s"
            lines.append(f"| {side} | {crossover.METRICS[metric][0]} | {c['status']} | {rate} |")
    return "| side | metric | crossover | rate |\n|---|---|---|---|\n" + "\n".join(lines)


def main(argv=None) -> int:
    from specnative import build_info
    a = parse_args(argv)
    if not (a.run_dir / "provenance.json").is_file() or not (a.run_dir / "traces.csv").is_file():
        raise SystemExit(f"error: {a.run_dir} is not a run folder (no provenance.json and traces.csv)")
    install_sigterm_handler()
    prov = json.loads((a.run_dir / "provenance.json").read_text())
    if "serve" not in prov:
        raise SystemExit(f"error: {a.run_dir} is not a serve run (provenance.json has no 'serve' record)")
    a.threads = a.threads or prov.get("n_threads", 2)
    tools, build = find_tools(a, build_info(), [NAME])
    if a.build_only:
        return 0
    traces = trace_files(a.run_dir)
    out = a.out or a.run_dir / "llama-server-replay.md"
    out.parent.mkdir(parents=True, exist_ok=True)  # before the replay, which takes minutes
    theirs = measure(a, prov, traces, tools)
    ours = ours_frame(a.run_dir)
    theirs.to_csv(out.with_suffix(".csv"), index=False)
    text = "\n\n".join([
        f"# specnative serving vs llama-server on the same traces ({a.run_dir.name})",
        f"Self-measured on CPU {cpu_model()}, specnative {git_rev()}, {time.strftime('%Y-%m-%d')}. "
        f"Ours: the run's traces.csv; llama-server: this replay ({len(traces)} traces, open loop, streamed).",
        "Means over the seeded traces; latencies in ms. llama-server streams one chunk per token (ITL within a "
        "speculative round is then ~0 there) where our engine stamps one emission per round.",
        table_md(ours, theirs), "## Crossover on each side", crossover_md(ours, theirs),
        "## Command", "```\npython bench/peers.py serve " + " ".join(sys.argv[2:] if argv is None else argv) + "\n```",
        *build_lines(build)])
    out.write_text(text + "\n")
    print(out)
    return 0
