"""specnative against llama-server, the deployment path people measure with two servers, at concurrency N.

For each model set and each N (default 1, 4, 8) the benchmark starts two llama-servers built from
the same vendored tree with the same ggml flags, on 127.0.0.1 only: one with the draft model
(`--spec-type draft-simple --spec-draft-n-max k`, no minimum draft length or probability) and
one without (the baseline), both with N slots (`-np N`) over one unified KV cache of `-c` cells,
greedy, prompt cache off (`--no-cache-prompt --cache-ram 0`, `cache_prompt: false`), `--metrics`.
Our engine gets the same files, threads, batch size, KV cache size and flash-attention setting.

The prompts are the sweep's at ctx_len 0 (BOS + one of its openings per sequence; --prompt-set
code: code openings instead), sent to the server as token ids, so both sides see identical tokens; the server's
prompt_n per request is checked against our count. N requests go out at once, one connection each.

What is compared (medians over -r repeats, ours and the server's interleaved, order alternating):
  alpha      accepted / drafted. Server: the delta of llamacpp:spec_decode_num_accepted_tokens_total
             over ..._num_draft_tokens_total across the N requests (and the per-request timings'
             draft_n_accepted / draft_n, which must agree).
  tau        server's definition: 1 + accepted / verification steps (rounds that drafted),
             ..._num_drafts_total; ours the same from exact counts (and our own emitted / rounds).
  per-pos    accepted at draft position i / rounds that drafted (the server's counter
             ..._accepted_tokens_per_pos_total{position=i}); ours from accepted_at.
  tokens/s   aggregate decode throughput, the first token of every sequence (sampled from the
             prefill's logits) excluded on both sides. Ours: GenerationResult.tps. Server:
             sum over requests of (predicted_n - 1) / the longest request's predicted_ms (its
             generation window; the N slots start generating together since their prompts are
             batched together); the sum of per-request predicted_per_second is shown beside it.
  speedup    spec-on t/s / spec-off t/s, each side against its own baseline.
  texts      generated token ids, per sequence: server vs ours (spec on and off), and spec on vs
             off within each side (the lossless check).

    python bench/peers.py server --models tiny,qwen -np 1,4,8 -n 64 -k 4 -r 3
                                             # writes bench/results/server-peer/tiny-qwen-cpu.md
"""
from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
import time
from pathlib import Path

from .common import (
    RESULTS,
    WORK,
    Quiet,
    add_build_args,
    build_lines,
    cpu_model,
    default_max_busy,
    find_tools,
    fmt,
    git_rev,
    gpu_model,
    log,
    med,
    model_sets,
    set_names,
    show_cmd,
    vals,
)
from .ours import ours_baseline, ours_spec
from .server import NAME, LlamaServer, install_sigterm_handler, metrics_delta, server_cmd


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python bench/peers.py server", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,qwen", help="comma list of model sets: tiny, gemma, qwen")
    ap.add_argument("-np", "--concurrency", default="1,4,8", help="comma list of concurrencies N")
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--prompt-set", choices=("prose", "code"), default="prose",
                    help="prose: the sweep's openings (ctx_len 0); code: code openings for code models")
    ap.add_argument("-n", "--n-predict", type=int, default=64, help="tokens generated per sequence")
    ap.add_argument("-k", type=int, default=4, help="draft length")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096, help="KV cache cells, both sides (shared by the N sequences)")
    ap.add_argument("-b", "--n-batch", type=int, default=512, help="batch size, both sides")
    ap.add_argument("--flash-attn", choices=("off", "on"), default="off")
    ap.add_argument("--gpu-layers", "--ngl", dest="ngl", type=int, default=None,
                    help="layers on the GPU, both sides; -1 = all (default: -1 with CUDA, else 0)")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="let sequences end at an end-of-generation token, as deployed (default: exactly -n "
                         "tokens; the server gets ignore_eos, which masks EOG tokens in the target's sampler but "
                         "not in draft-simple's, so EOG drafts are rejected there while ours decodes past EOG: "
                         "fine for the tiny models, use this flag for real ones)")
    ap.add_argument("--start-timeout", type=float, default=300, help="seconds a server may take to load")
    ap.add_argument("--request-timeout", type=float, default=600, help="seconds per HTTP request")
    add_build_args(ap)
    ap.add_argument("--max-busy", type=float, default=None,
                    help="CPU cores other processes may keep busy before a measurement, else wait "
                         "(default: what leaves our threads their cores, at least 0.25)")
    ap.add_argument("--max-wait", type=float, default=120, help="seconds to wait for a quiet machine")
    ap.add_argument("-o", "--out", type=Path, default=None,
                    help="markdown file, or a folder for <sets>-<backend>.md (default: bench/results/server-peer)")
    return ap.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------
# Code openings for code models (written for this benchmark), one per sequence like the sweep's.
CODE_PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import json\n\n\ndef load_config(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "def is_prime(n: int) -> bool:\n",
    "# Read a CSV file and print the sum of the second column\nimport csv\n\n",
    "def binary_search(items, target):\n",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
    "def word_count(text):\n",
)


def build_prompts(engine, n: int, prompt_set: str) -> list:
    """One prompt per sequence, as token ids: BOS where the model wants one, then an opening
    (cycled). `prose`: the sweep's openings at ctx_len 0; `code`: CODE_PROMPTS."""
    if prompt_set == "code":
        openings = CODE_PROMPTS
    else:
        from specnative.run.workloads import SEQUENCE_PROMPTS as openings
    head = engine.tokenize("", add_special=True).tolist()
    return [head + engine.tokenize(openings[i % len(openings)], add_special=False).tolist() for i in range(n)]


# ---------------------------------------------------------------------------------------------
# One measurement on each side
# ---------------------------------------------------------------------------------------------
def server_run(server: LlamaServer, prompts, a, spec: bool) -> dict:
    before = server.metrics()
    answers, wall = server.complete_concurrently(prompts, a.n_predict, ignore_eos=not a.stop_at_eos)
    after = server.metrics()
    delta = metrics_delta(before, after)
    timings = [ans["timings"] for ans in answers]
    gen = [t["predicted_n"] for t in timings]
    window_ms = max(t["predicted_ms"] for t in timings)
    res = {"tps": sum(n - 1 for n in gen) / (window_ms / 1000.0) if window_ms > 0 else float("nan"),
           "tps_sum_rates": sum(t["predicted_per_second"] for t in timings),
           "client_tps": sum(gen) / wall, "wall_s": wall,
           "token_ids": [[int(x) for x in ans.get("tokens", [])] for ans in answers],
           "prompt_n": [int(t["prompt_n"]) for t in timings], "cache_n": [int(t.get("cache_n", 0)) for t in timings],
           "predicted_n": gen, "stop": [ans.get("stop_type", "") for ans in answers],
           "busy_slots_per_decode": after.get("n_busy_slots_per_decode", float("nan"))}
    if spec:
        drafted = delta.get("spec_decode_num_draft_tokens_total", 0.0)
        accepted = delta.get("spec_decode_num_accepted_tokens_total", 0.0)
        drafts = delta.get("spec_decode_num_drafts_total", 0.0)
        per_pos = delta.get("spec_decode_num_accepted_tokens_per_pos_total", {})
        res.update({
            "drafted": int(drafted), "accepted": int(accepted), "rounds_drafting": int(drafts),
            "alpha": accepted / drafted if drafted else float("nan"),
            "tau": 1.0 + accepted / drafts if drafts else float("nan"),
            "per_pos_of_rounds": [per_pos[p] / drafts if drafts else float("nan") for p in sorted(per_pos)],
            # the same counts from the per-request timings: a cross-check of the counters
            "timings_drafted": sum(int(t.get("draft_n", 0)) for t in timings),
            "timings_accepted": sum(int(t.get("draft_n_accepted", 0)) for t in timings)})
    return res


def ours_run(engine, prompts, a, spec: bool) -> dict:
    if not spec:
        return ours_baseline(engine, prompts, a.n_predict, stop_at_eos=a.stop_at_eos)
    r = ours_spec(engine, prompts, a.n_predict, a.k, stop_at_eos=a.stop_at_eos)
    r["tau_rounds_drafting"] = 1.0 + r["accepted"] / r["rounds_drafting"] if r["rounds_drafting"] else float("nan")
    r["token_ids"] = r.pop("all_token_ids")
    return r


def compare_tokens(a_seqs, b_seqs) -> dict:
    """Sequences identical over the common length, and the first differing index of the others."""
    same, first = 0, []
    for a, b in zip(a_seqs, b_seqs):
        n = min(len(a), len(b))
        diff = next((i for i in range(n) if a[i] != b[i]), None)
        if diff is None:
            same += 1
        else:
            first.append(diff)
    return {"same": same, "n": len(a_seqs), "first_diff": first}


def describe_cmp(c: dict) -> str:
    if c["same"] == c["n"]:
        return f"{c['same']}/{c['n']} identical"
    return f"{c['same']}/{c['n']} identical; others part at token {', '.join(str(i) for i in sorted(c['first_diff']))}"


# ---------------------------------------------------------------------------------------------
# One model set at one concurrency
# ---------------------------------------------------------------------------------------------
def measure(ms, n_par, a, tools, quiet) -> dict:
    from specnative.engine import Engine

    fa = a.flash_attn == "on"
    engine = Engine(ms["target"], ms["draft"], n_ctx=a.ctx, n_batch=a.n_batch, n_threads=a.threads,
                    n_gpu_layers=a.ngl, n_seq_max=n_par, flash_attn=fa, kv_unified=True)
    prompts = build_prompts(engine, n_par, a.prompt_set)
    res = {"n": n_par, "prompt_tokens": [len(p) for p in prompts], "cmds": {},
           "ours": {"spec": [], "base": []}, "server": {"spec": [], "base": []}}
    logs = WORK / "server-logs"
    servers = {}
    try:
        for side, draft in (("spec", ms["draft"]), ("base", None)):
            cmd = server_cmd(tools, ms["target"], draft, a.k, n_par, a.ctx, a, ms["swa_full"])
            servers[side] = LlamaServer(cmd, logs / f"{ms['name']}-np{n_par}-{side}.log",
                                        a.start_timeout, a.request_timeout).start()
            res["cmds"][side] = servers[side].cmd
        # warm-up, discarded: page cache, first graphs, thread pools, on every side
        short = argparse.Namespace(**{**vars(a), "n_predict": min(a.n_predict, 16)})
        for spec in (True, False):
            ours_run(engine, prompts, short, spec)
            server_run(servers["spec" if spec else "base"], prompts, short, spec)
        for rep in range(a.repeats):
            order = ("ours", "server") if rep % 2 == 0 else ("server", "ours")
            for spec in (False, True):
                kind = "spec" if spec else "base"
                for side in order:
                    quiet.wait()
                    if side == "ours":
                        res["ours"][kind].append(ours_run(engine, prompts, a, spec))
                    else:
                        res["server"][kind].append(server_run(servers[kind], prompts, a, spec))
            so, ss = res["ours"]["spec"][-1], res["server"]["spec"][-1]
            bo, bs = res["ours"]["base"][-1], res["server"]["base"][-1]
            log(f"  [{rep + 1}/{a.repeats}] N={n_par}: ours {bo['tps']:.1f} -> {so['tps']:.1f} t/s "
                f"alpha {so['alpha']:.3f}; server {bs['tps']:.1f} -> {ss['tps']:.1f} t/s alpha {ss['alpha']:.3f}")
    finally:
        for server in servers.values():
            server.stop()
        engine.close()
    return res


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    a = parse_args(argv)
    import specnative
    from specnative.engine import build_info

    install_sigterm_handler()
    info = build_info()
    backend = info.get("backend", "CPU")
    if a.ngl is None:
        a.ngl = -1 if backend.upper() == "CUDA" else 0
    if a.max_busy is None:
        a.max_busy = default_max_busy(a.threads)
    names = set_names(a.models)
    try:
        concurrencies = [int(x) for x in a.concurrency.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: -np: comma-separated integers, not {a.concurrency!r}") from None
    if not concurrencies or any(n < 1 for n in concurrencies):
        raise SystemExit("error: concurrencies must be >= 1")
    tools, build = find_tools(a, info, (NAME,))
    if a.build_only:
        return 0
    sets = model_sets(names)
    quiet = Quiet(a.max_busy, a.max_wait)
    loadavg = open("/proc/loadavg").read().split()[:3]
    started = dt.datetime.now()
    t0 = time.time()
    results = []
    for ms in sets:
        for n_par in concurrencies:
            log(f"== {ms['title']}, N = {n_par}")
            results.append((ms, measure(ms, n_par, a, tools, quiet)))
    md = render(a, info, build, results, quiet, started, specnative.__version__, loadavg, time.time() - t0)
    out = a.out or RESULTS / "server-peer"
    if out.suffix != ".md":
        out = out / f"{'-'.join(names)}-{backend.lower()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(md)
    log(f"wrote {out}")
    return 0


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def _pos(xs) -> str:
    return "[" + ", ".join(fmt(x, 3) for x in xs) + "]"


def speedup_interval(on, off):
    """95 % interval of the speedup from the paired repeats (on[i] and off[i] measured in the same
    repeat), from specnative.analysis.stats where this specnative has it; None otherwise."""
    try:
        from specnative.analysis import stats
        iv = stats.speedup_interval(on=on, off=off)
    except (ImportError, AttributeError, ValueError):
        return None
    return iv if iv.low == iv.low else None  # NaN bounds: too few repeats


def fmt_speedup(m: dict) -> str:
    iv = m.get("speedup_iv")
    return fmt(m["speedup"], 2) + (f" [{iv.low:.2f}, {iv.high:.2f}]" if iv is not None else "")


def summarize(res: dict) -> dict:
    """Medians of the repeats, and the token comparisons of the last repeat (greedy: every repeat
    generates the same tokens on one side; the lossless lines below check that too)."""
    o, s = res["ours"], res["server"]
    m = {side: {kind: {"tps": med([x["tps"] for x in runs[kind]])} for kind in ("spec", "base")}
         for side, runs in (("ours", o), ("server", s))}
    for side, runs in (("ours", o), ("server", s)):
        m[side]["speedup"] = m[side]["spec"]["tps"] / m[side]["base"]["tps"]
        m[side]["speedup_iv"] = speedup_interval([x["tps"] for x in runs["spec"]], [x["tps"] for x in runs["base"]])
        last = runs["spec"][-1]
        m[side]["alpha"] = med([x["alpha"] for x in runs["spec"]])
        m[side]["per_pos"] = last["per_pos_of_rounds"]
        m[side]["counts"] = (last["drafted"], last["accepted"], last["rounds_drafting"])
    m["ours"]["tau"] = med([x["tau_rounds_drafting"] for x in o["spec"]])
    m["ours"]["tau_own"] = med([x["tau"] for x in o["spec"]])
    m["server"]["tau"] = med([x["tau"] for x in s["spec"]])
    m["server"]["tps_sum_rates"] = {k: med([x["tps_sum_rates"] for x in s[k]]) for k in ("spec", "base")}
    m["server"]["client_tps"] = {k: med([x["client_tps"] for x in s[k]]) for k in ("spec", "base")}
    m["cmp"] = {
        "server spec vs ours spec": compare_tokens(s["spec"][-1]["token_ids"], o["spec"][-1]["token_ids"]),
        "server base vs ours base": compare_tokens(s["base"][-1]["token_ids"], o["base"][-1]["token_ids"]),
        "ours spec vs ours base (lossless)": compare_tokens(o["spec"][-1]["token_ids"], o["base"][-1]["token_ids"]),
        "server spec vs server base (lossless)": compare_tokens(s["spec"][-1]["token_ids"], s["base"][-1]["token_ids"]),
    }
    m["stable"] = {side: all(r["token_ids"] == runs[k][0]["token_ids"] for k in ("spec", "base") for r in runs[k])
                   for side, runs in (("ours", o), ("server", s))}
    return m


def render(a, info, build, results, quiet, started, version, loadavg, elapsed) -> str:
    L = [f"# specnative vs llama-server ({info.get('backend')}, {started:%Y-%m-%d %H:%M})", ""]
    gpu = gpu_model() if info.get("backend", "CPU").upper() == "CUDA" else ""
    L.append(f"- specnative {version} (git {git_rev()}); llama.cpp {info.get('llama_commit', '?')[:10]} (vendored "
             f"tree) for both sides; ggml flags `{info.get('build_flags', '').strip()}`")
    L.append(f"- CPU: {cpu_model()}, {__import__('os').cpu_count()} cores; " + (f"GPU: {gpu}; " if gpu else "")
             + f"threads {a.threads}; batch {a.n_batch}; KV cache {a.ctx} cells, unified; flash-attn {a.flash_attn}; "
               f"GPU layers {a.ngl}")
    L.append(f"- greedy, draft-simple with k = {a.k} (no minimum draft length or probability), {a.n_predict} tokens "
             f"per sequence, {a.prompt_set} prompts" + ("" if a.stop_at_eos else " (server: ignore_eos; ours: decodes past EOG)")
             + f"; {a.repeats} repeats after a discarded warm-up, ours and the server's interleaved; medians")
    L.append(f"- load average at start {' '.join(loadavg)}; {quiet.describe()}; {elapsed / 60:.1f} min in all")
    for note in build.get("notes", []):
        L.append(f"- note: {note}")
    L.append("")
    L.append("| set | N | alpha ours / server | tau ours / server | tau ratio | t/s off ours / server | "
             "t/s on ours / server | speedup ours / server | tokens: server vs ours (on; off) |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    sums = []
    for ms, res in results:
        m = summarize(res)
        sums.append((ms, res, m))
        o, s = m["ours"], m["server"]
        L.append(f"| {ms['name']} | {res['n']} | {fmt(o['alpha'], 3)} / {fmt(s['alpha'], 3)} "
                 f"({100 * (o['alpha'] - s['alpha']):+.1f} pts) | {fmt(o['tau'], 2)} / {fmt(s['tau'], 2)} | "
                 f"{fmt(o['tau'] / s['tau'], 3)} | {fmt(o['base']['tps'])} / {fmt(s['base']['tps'])} | "
                 f"{fmt(o['spec']['tps'])} / {fmt(s['spec']['tps'])} | {fmt_speedup(o)} / {fmt_speedup(s)} | "
                 f"{m['cmp']['server spec vs ours spec']['same']}/{res['n']}; "
                 f"{m['cmp']['server base vs ours base']['same']}/{res['n']} |")
    L.append("")
    L.append("Goals: alpha within 2 points, tau within 5 %. Speedup: ratio of the medians, with the 95 % "
             "interval of the paired repeats in brackets (specnative.analysis.stats: t interval of log ratios). tau on both sides = 1 + accepted / rounds that drafted "
             "(llama-server's `mean len`); t/s = decode throughput of all N sequences, first token excluded "
             "(module docstring: bench/peerkit/server_table.py).")
    L.append("")
    L.append("Per concurrency: per-position acceptance (accepted at position i / rounds that drafted), exact "
             "counts of the last repeat, the other throughput views, and token equality.")
    L.append("")
    for ms, res, m in sums:
        o, s = m["ours"], m["server"]
        so, ss = res["ours"]["spec"], res["server"]["spec"]
        L.append(f"**{ms['name']}, N = {res['n']}** ({ms['title']})")
        L.append("")
        L.append(f"- per-position acceptance 1..k: ours {_pos(o['per_pos'])}, server {_pos(s['per_pos'])}")
        L.append(f"- drafted / accepted / rounds that drafted: ours {o['counts'][0]} / {o['counts'][1]} / "
                 f"{o['counts'][2]}; server (metrics delta) {s['counts'][0]} / {s['counts'][1]} / {s['counts'][2]}, "
                 f"per-request timings {ss[-1]['timings_drafted']} / {ss[-1]['timings_accepted']}")
        L.append(f"- ours: tau as emitted / rounds (our own definition, every round) {fmt(o['tau_own'], 2)}; "
                 f"rounds by accepted length 0..k {so[-1]['hist']}")
        L.append(f"- t/s off (individual): ours {vals([x['tps'] for x in res['ours']['base']])}; server "
                 f"{vals([x['tps'] for x in res['server']['base']])}")
        L.append(f"- t/s on (individual): ours {vals([x['tps'] for x in so])}; server {vals([x['tps'] for x in ss])}")
        L.append(f"- server, other views (off / on): sum of per-request predicted_per_second "
                 f"{fmt(s['tps_sum_rates']['base'])} / {fmt(s['tps_sum_rates']['spec'])}; client wall "
                 f"(all tokens incl. prefill and HTTP) {fmt(s['client_tps']['base'])} / {fmt(s['client_tps']['spec'])}; "
                 f"busy slots per decode (cumulative gauge) {fmt(res['server']['base'][-1]['busy_slots_per_decode'], 2)} / "
                 f"{fmt(ss[-1]['busy_slots_per_decode'], 2)}")
        pn = res["server"]["spec"][-1]["prompt_n"]
        L.append(f"- prompt tokens: ours {res['prompt_tokens']}; server prompt_n {pn} "
                 f"({'equal' if pn == res['prompt_tokens'] else 'DIFFERENT'}), cached "
                 f"{sum(res['server']['spec'][-1]['cache_n'])}")
        for label, c in m["cmp"].items():
            L.append(f"- tokens, {label}: {describe_cmp(c)}")
        L.append(f"- the same tokens in every repeat: ours {m['stable']['ours']}, server {m['stable']['server']}")
        for side in ("spec", "base"):
            L.append(f"- `{show_cmd(res['cmds'][side])}`")
        L.append("")
    L.extend(build_lines(build))
    L.append("")
    L.append(f"Command: `python bench/peers.py {' '.join(shlex.quote(x) for x in sys.argv[1:])}`")
    L.append("")
    return "\n".join(L)
