"""specnative against llama.cpp's own tools, side by side, in one run.

Builds `llama-bench` and `llama-speculative-simple` from the same vendored llama.cpp tree with the
same ggml flags as the installed specnative, then interleaves both sides on the same models,
threads and prompt, greedy, repeated R times, and writes a markdown table with provenance to
bench/results/peers-closed-loop/<sets>-<backend>.md (the model sets joined by '-', e.g.
tiny-gemma-cpu.md; a run with other -r, -n or --baseline-prompt than the default deserves its own
name, given with -o).

    python bench/peers.py                          # tiny and gemma sets, 3 repeats
    python bench/peers.py --models tiny -r 15 -n 512 -o bench/results/peers-closed-loop/tiny-cpu-r15-n512.md
    python bench/peers.py --build-only [--rebuild]
    python bench/peers.py --models tiny --gpu-layers -1 --tools-dir build/<tag>/bin --out DIR

What each side times (tokens/s = tokens / seconds of that interval):
  ours baseline      Engine(target, n_ctx=pad256(prompt+N)).generate(prompt, n_predict=N,
                     stop_at_eos=False).tps: N-1 tokens over the N-1 single-token decode steps after
                     prefill (each: llama_decode, llama_synchronize, argmax over the vocabulary).
                     Prefill excluded. The context matches llama-bench's (it uses n_ctx = N, padded
                     to 256): without flash attention V is stored transposed with a row stride of
                     n_ctx, so a larger context costs a few % per step even with few tokens in it.
                     Our baseline step at the speculative runs' context (-c) is reported apart.
  llama-bench tg     avg_ts of `-p 0 -n N`: N single-token decodes from an empty cache (random
                     tokens, no sampling), after its own warm-up.
  draft model alone  the same pair of measurements on the draft file, and our draft step inside the
                     speculative rounds (draft time / drafted positions: one draft decode per
                     position for one sequence, plus its argmax): c_draft = draft step / target
                     step on our side against llama.cpp's (llama-bench's two tg figures).
  contexts           our contexts as llama.cpp set them up (Engine.context_info) beside
                     llama-bench's (its JSON row and to_llama_cparams at the vendored commit), with
                     llama.cpp's graph reuse over our timed baseline runs and our engine's own share.
  ours speculative   Engine.generate(prompt, n_predict=N, spec=True, k=K).tps: the tokens emitted
                     after the first one (which prefill samples) over draft + verify + resample.
  speculative-simple "decoded N tokens in S seconds": every round from the first, which is the
                     one that turns the last prompt token into the first generated token, and all
                     tokens it emitted (it stops only once it has more than N, so N+1..N+K+1).
  alpha              ours accepted/drafted; theirs n_accept/n_drafted (the same definition).
                     Their first round drafts from the last prompt token, ours from the first
                     generated token, so their rounds are one token out of phase with ours: a
                     disagreement of draft and target can fall on a drafted position on one side
                     and on the bonus position on the other. An untimed run of theirs on the prompt
                     plus our first token (phase-aligned) and a debug run (-lv 5: the token index of
                     each rejection and its draft's top-3 candidates) show this in the report.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import subprocess
import sys
from pathlib import Path

from specnative.analysis.stats import speedup_interval

from .common import (
    RESULTS,
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
    pad256,
    rel,
    set_names,
    show_cmd,
    vals,
)
from .llama_bench import bench_cmd, theirs_bench
from .ours import context_params, ours_baseline, ours_spec
from .spec_simple import aligned_prompt, spec_cmd, theirs_debug, theirs_spec

TOOLS = ("llama-bench", "llama-speculative-simple")
DEFAULT_PROMPT = "Photosynthesis is the process by which"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,gemma", help="comma list of model sets: tiny, gemma, qwen")
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-k", type=int, default=4, help="draft length")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096, help="context size of both sides' speculative runs")
    ap.add_argument("--flash-attn", choices=("off", "on"), default="off")
    ap.add_argument("--gpu-layers", "--ngl", dest="ngl", type=int, default=None,
                    help="layers on the GPU, both sides; -1 = all (default: -1 with CUDA, else 0)")
    ap.add_argument("-p", "--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--baseline-prompt", choices=("prompt", "bos"), default="prompt",
                    help="our baseline's prompt: the same short prompt (default) or the BOS token alone, "
                         "which is where llama-bench's tg starts (matters with flash attention, whose CPU "
                         "kernel skips masked cells, so a longer prefix costs more per step)")
    add_build_args(ap)
    ap.add_argument("--max-busy", type=float, default=None,
                    help="CPU cores other processes may keep busy before a measurement, else wait "
                         "(default: what leaves our threads their cores, at least 0.25)")
    ap.add_argument("--max-wait", type=float, default=900, help="seconds to wait for a quiet machine")
    ap.add_argument("-o", "--out", type=Path, default=None,
                    help="markdown file, or a folder for <sets>-<backend>.md "
                         "(default: bench/results/peers-closed-loop)")
    a = ap.parse_args(argv)

    import specnative
    from specnative.engine import Engine, build_info

    info = build_info()
    backend = info.get("backend", "CPU")
    if a.ngl is None:
        a.ngl = -1 if backend.upper() == "CUDA" else 0
    if a.max_busy is None:
        a.max_busy = default_max_busy(a.threads)
    names = set_names(a.models)
    tools, build = find_tools(a, info, TOOLS)
    if a.build_only:
        return 0
    sets = model_sets(names)
    quiet = Quiet(a.max_busy, a.max_wait)
    loadavg = open("/proc/loadavg").read().split()[:3]
    log(f"load average: {' '.join(loadavg)}")
    started = dt.datetime.now()
    fa = a.flash_attn == "on"
    results = []
    for ms in sets:
        log(f"== {ms['title']}")
        swa_full = ms["swa_full"]
        res = {"set": ms, "cmds": {}, "base": {}, "spec": {"ours": [], "theirs": []}, "ours_step_ctx_ms": []}
        # speculative engine at context -c; its baseline step is T_step for c = T_round / T_step - 1
        eng = Engine(ms["target"], ms["draft"], n_ctx=a.ctx, n_batch=512, n_threads=a.threads,
                     n_gpu_layers=a.ngl, n_seq_max=1, flash_attn=fa)
        n_prompt = len(eng.tokenize(a.prompt))
        res["n_prompt_ours"] = n_prompt
        base_ctx = pad256(n_prompt + a.n_predict)
        res["base_ctx"] = base_ctx
        # the draft model alone too: our decode of the draft file vs llama-bench's, so that c_draft
        # (our draft step / our target step) can be checked against llama.cpp's own figure
        targets = list(dict.fromkeys([ms["target"], *ms["extra_baselines"], ms["draft"]]))
        base_engines = {}
        res["ctx_params"], res["bench_params"] = {}, {}
        for t in targets:
            base_engines[t] = Engine(t, None, n_ctx=base_ctx, n_batch=512, n_threads=a.threads,
                                     n_gpu_layers=a.ngl, n_seq_max=1, flash_attn=fa)
            res["base"][t] = {"ours": [], "theirs": [], "ours_step_ms": [], "reused": [], "own_share": []}
            res["ctx_params"][t] = context_params(base_engines[t])
            res["cmds"][("bench", t)] = bench_cmd(tools, t, a.n_predict, a)
        res["cmds"]["spec"] = spec_cmd(tools, ms["target"], ms["draft"], a.prompt, a.n_predict, a.k, a, swa_full)
        # warm-up (discarded): page cache, first graphs, OpenMP threads
        base_prompt = a.prompt
        if a.baseline_prompt == "bos":
            with_bos, without = eng.tokenize(a.prompt, True), eng.tokenize(a.prompt, False)
            if len(with_bos) == len(without):
                raise SystemExit("error: this model adds no BOS token; use --baseline-prompt prompt")
            base_prompt = [int(with_bos[0])]
        for e in base_engines.values():
            ours_baseline(e, base_prompt, min(a.n_predict, 16))
        ours_spec(eng, a.prompt, min(a.n_predict, 16), a.k)
        for rep in range(a.repeats):
            order = ("ours", "theirs") if rep % 2 == 0 else ("theirs", "ours")  # alternate against drift
            for t in targets:
                b = res["base"][t]
                for side in order:
                    quiet.wait()
                    if side == "ours":
                        r = ours_baseline(base_engines[t], base_prompt, a.n_predict)
                        b["ours"].append(r["tps"])
                        b["ours_step_ms"].append(r["step_ms"])
                        b["reused"].append((r["graphs_reused"], r["single_decodes"]))
                        b["own_share"].append(r["engine_own_share"])
                    else:
                        r = theirs_bench(res["cmds"][("bench", t)])
                        b["theirs"].append(r["tps"])
                        res["bench_params"][t] = r["params"]
                        res["cpu_info"] = r["cpu_info"]
                        res["bench_commit"] = r["build_commit"]
                log(f"  [{rep + 1}/{a.repeats}] baseline {Path(t).name}: ours {b['ours'][-1]:.1f} t/s, "
                    f"llama-bench {b['theirs'][-1]:.1f} t/s")
            quiet.wait()
            res["ours_step_ctx_ms"].append(ours_baseline(eng, a.prompt, a.n_predict)["step_ms"])
            for side in order:
                quiet.wait()
                if side == "ours":
                    res["spec"]["ours"].append(ours_spec(eng, a.prompt, a.n_predict, a.k))
                else:
                    res["spec"]["theirs"].append(theirs_spec(res["cmds"]["spec"], a.prompt))
            so, st = res["spec"]["ours"][-1], res["spec"]["theirs"][-1]
            log(f"  [{rep + 1}/{a.repeats}] speculative k={a.k}: ours {so['tps']:.1f} t/s alpha {so['alpha']:.3f}; "
                f"speculative-simple {st['tps']:.1f} t/s alpha {st['alpha']:.3f}")
        # untimed diagnostics: theirs with debug logging, on the same prompt and phase-aligned
        so = res["spec"]["ours"][-1]
        res["debug"] = []
        try:
            res["debug"].append(("same prompt", theirs_debug(res["cmds"]["spec"], a.prompt)))
            ap_text = aligned_prompt(eng, a.prompt, so["token_ids"][0])
            if ap_text is None:
                log("note: prompt + our first token does not tokenize back to itself; no phase-aligned run")
            else:
                cmd = spec_cmd(tools, ms["target"], ms["draft"], ap_text, a.n_predict - 1, a.k, a, swa_full)
                dbg = theirs_debug(cmd, ap_text)
                res["debug"].append(("prompt + our first token", dbg))
                res["aligned_prompt"] = ap_text
                res["aligned_divergence"] = divergence(eng, so, ap_text[len(a.prompt):] + dbg["text"], a.prompt)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            log(f"warning: a debug run of speculative-simple failed: {exc}")
        # where the two texts part: our target's top-1 minus top-2 logit there (a near-tie?)
        res["divergence"] = divergence(eng, so, res["spec"]["theirs"][-1]["text"], a.prompt)
        for e in [eng, *base_engines.values()]:
            e.close()
        results.append(res)

    md = render(a, info, build, results, quiet, started, specnative.__version__, loadavg)
    out = a.out or RESULTS / "peers-closed-loop"
    if out.suffix != ".md":
        out = out / f"{'-'.join(names)}-{backend.lower()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(md)
    log(f"wrote {out}")
    return 0


def divergence(engine, ours: dict, theirs_text: str, prompt: str) -> dict:
    """First character where the generated texts differ (leading whitespace ignored: our
    detokenizer drops the first token's leading space), our token there and its logit margin."""
    a, b = ours["text"].lstrip(), theirs_text.lstrip()
    b = b.rstrip()  # speculative-simple ends its output with blank lines
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    out = {"chars_same": n, "chars_ours": len(a), "chars_theirs": len(b), "same": n >= min(len(a), len(b))}
    if not out["same"]:
        skip = len(ours["text"]) - len(ours["text"].lstrip())
        tokens = ours["token_ids"]
        # margins cost a pass over the vocabulary per token: an untimed greedy run records them
        margins = engine.generate(prompt, n_predict=len(tokens), stop_at_eos=False,
                                  record_margins=True).margins[0]
        for i in range(1, len(tokens) + 1):
            if len(engine.detokenize(tokens[:i])) > n + skip:
                out["token_index"] = i - 1
                out["token"] = engine.detokenize(tokens[i - 1:i])
                out["margin"] = float(margins[i - 1]) if i - 1 < len(margins) else float("nan")
                break
        out["ours_at"] = a[max(0, n - 30):n + 20]
        out["theirs_at"] = b[max(0, n - 30):n + 20]
    return out


def paired(ours, theirs) -> str:
    """How sure a ratio is: repeat i of ours against repeat i of theirs (measured back to back), the
    geometric mean of those ratios with its 95 % t interval (specnative.analysis.stats, as the sweep does)."""
    if len(ours) != len(theirs) or len(ours) < 2:
        return ""
    try:
        i = speedup_interval(ours, theirs)
    except ValueError:  # a failed run's 0 or NaN: the medians above still stand
        return ""
    return f"; paired {fmt(i.estimate, 3)}, 95% CI {fmt(i.low, 3)}–{fmt(i.high, 3)}"


def render(a, info, build, results, quiet, started, version, loadavg) -> str:
    L = []
    L.append(f"# specnative vs llama.cpp's tools ({info.get('backend')}, {started:%Y-%m-%d %H:%M})")
    L.append("")
    L.append(f"- specnative {version} (git {git_rev()}); llama.cpp {info.get('llama_commit', '?')[:10]} "
             f"(vendored tree) for both sides")
    L.append(f"- ggml flags, ours and the peers' -D options: `{info.get('build_flags', '').strip()}`")
    gpu = gpu_model() if info.get("backend", "CPU").upper() == "CUDA" else ""
    L.append(f"- CPU: {cpu_model()}, {os.cpu_count()} cores; " + (f"GPU: {gpu}; " if gpu else "")
             + f"threads {a.threads}; flash-attn {a.flash_attn}; GPU layers {a.ngl}")
    L.append(f"- greedy (temperature 0), N = {a.n_predict}, k = {a.k}, speculative context {a.ctx} on both sides; "
             f"{a.repeats} repeats, ours and theirs interleaved (order alternating); median (individual values)")
    L.append(f"- prompt: `{a.prompt}`; our baseline's prompt: "
             + ("the same" if a.baseline_prompt == "prompt" else "the BOS token alone (like llama-bench's tg)"))
    L.append(f"- load average at start {' '.join(loadavg)}; {quiet.describe()}")
    for note in build.get("notes", []):
        L.append(f"- note: {note}")
    L.append("")
    L.append("| set | measure | ours | llama.cpp | ours/theirs | goal |")
    L.append("|---|---|---|---|---|---|")
    for res in results:
        ms = res["set"]
        for t, b in res["base"].items():
            mo, mt = med(b["ours"]), med(b["theirs"])
            what = ("draft model alone t/s" if t == ms["draft"] and t != ms["target"] else "baseline t/s")
            L.append(f"| {ms['name']} | {what}, {Path(t).name} | {fmt(mo)} ({vals(b['ours'])}) | "
                     f"{fmt(mt)} ({vals(b['theirs'])}) | {fmt(mo / mt, 3)}{paired(b['ours'], b['theirs'])} | >= 0.98 |")
        so, st = res["spec"]["ours"], res["spec"]["theirs"]
        mo, mt = med([x["tps"] for x in so]), med([x["tps"] for x in st])
        L.append(f"| {ms['name']} | speculative t/s, k={a.k} | {fmt(mo)} ({vals([x['tps'] for x in so])}) | "
                 f"{fmt(mt)} ({vals([x['tps'] for x in st])}) | {fmt(mo / mt, 3)}"
                 f"{paired([x['tps'] for x in so], [x['tps'] for x in st])} | >= 1.1 |")
        ao, at = med([x["alpha"] for x in so]), med([x["alpha"] for x in st])
        L.append(f"| {ms['name']} | alpha = accepted/drafted | {fmt(ao, 3)} ({vals([x['alpha'] for x in so], 3)}) | "
                 f"{fmt(at, 3)} ({vals([x['alpha'] for x in st], 3)}) | {100 * (ao - at):+.1f} pts | within 2 pts |")
        aligned = [dbg for label, dbg in res.get("debug", []) if label != "same prompt"]
        if aligned:
            al = aligned[0]["alpha"]
            L.append(f"| {ms['name']} | alpha, theirs phase-aligned (prompt + our first token) | {fmt(ao, 3)} | "
                     f"{fmt(al, 3)} ({aligned[0]['accepted']}/{aligned[0]['drafted']}) | {100 * (ao - al):+.1f} pts | "
                     f"within 2 pts |")
    L.append("")
    L.append("Baseline: ours = decode steps after prefill, context padded to 256 like llama-bench's; llama-bench = "
             "`-p 0 -n N` (avg_ts). Speculative: ours = tokens after the first (which prefill samples) over "
             "draft+verify+resample time; speculative-simple = its `decoded N tokens in S seconds` (all rounds, "
             "including the one that yields the first token; it runs to N+1..N+k+1 tokens).")
    L.append("")
    L.append("Per round (medians). Ours from its step timers; speculative-simple from its totals "
             "(rounds = tokens - accepted, ms/round = decode time / rounds). Baseline step: ours at the "
             "speculative context, theirs 1000/llama-bench t/s.")
    L.append("")
    L.append("| set | side | tokens | rounds | drafted / accepted | tokens/round | ms/round | draft | verify | "
             "resample | baseline step ms | c = round/step - 1 |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for res in results:
        ms = res["set"]
        so, st = res["spec"]["ours"], res["spec"]["theirs"]
        step = med(res["ours_step_ctx_ms"])
        bench_step = 1000.0 / med(res["base"][ms["target"]]["theirs"])
        o, t = so[len(so) // 2], st[len(st) // 2]
        ro, rt = med([x["round_ms"] for x in so]), med([x["round_ms"] for x in st])
        L.append(f"| {ms['name']} | ours | {o['tokens']} | {o['rounds']} | {o['drafted']} / {o['accepted']} | "
                 f"{fmt(o['tokens'] / o['rounds'], 2)} | {fmt(ro, 2)} | "
                 f"{fmt(med([x['draft_ms'] / x['rounds'] for x in so]), 2)} | "
                 f"{fmt(med([x['verify_ms'] / x['rounds'] for x in so]), 2)} | "
                 f"{fmt(med([x['resample_ms'] / x['rounds'] for x in so]), 3)} | {fmt(step, 2)} | "
                 f"{fmt(ro / step - 1, 2)} |")
        L.append(f"| {ms['name']} | speculative-simple | {t['tokens']} | {t['rounds']} | {t['drafted']} / {t['accepted']} | "
                 f"{fmt(t['tokens'] / t['rounds'], 2)} | {fmt(rt, 2)} | - | - | - | {fmt(bench_step, 2)} | "
                 f"{fmt(rt / bench_step - 1, 2)} |")
    L.extend(draft_alone_lines(a, results))
    L.extend(context_lines(results))
    L.append("")
    for res in results:
        ms = res["set"]
        so, st = res["spec"]["ours"], res["spec"]["theirs"]
        d = res["divergence"]
        L.append(f"**{ms['name']}**: {ms['title']}; target `{rel(ms['target'])}`, draft `{rel(ms['draft'])}`.")
        L.append("")
        L.append(f"- prompt tokens: ours {res['n_prompt_ours']}, theirs {st[-1]['n_prompt']}; our baseline context "
                 f"{res['base_ctx']}, llama-bench's {pad256(a.n_predict)}")
        if d["same"]:
            L.append(f"- generated text: identical over the common length ({d['chars_same']} characters; "
                     f"ours {len(so[-1]['token_ids'])} tokens, theirs {st[-1]['tokens']})")
        else:
            L.append(f"- generated text: the same for {d['chars_same']} characters, then ours "
                     f"`{d.get('ours_at', '')!r}` vs theirs `{d.get('theirs_at', '')!r}`; our token there "
                     f"#{d.get('token_index')} {d.get('token')!r} with target top-1 minus top-2 logit "
                     f"{fmt(d.get('margin', float('nan')), 3)}")
        L.append(f"- ours: acceptance per draft position 1..k {so[-1]['per_pos']}; rounds by accepted length "
                 f"0..k {so[-1]['hist']} (last repeat)")
        for label, dbg in res.get("debug", []):
            L.append(f"- theirs, untimed debug run (-lv 5), {label}: alpha {fmt(dbg['alpha'], 3)} "
                     f"({dbg['accepted']}/{dbg['drafted']}); rounds by accepted length 0..k {dbg['hist']}; "
                     f"rejections (generated token index, its draft's top-3 candidates with probability):")
            for miss in dbg["misses"][:12]:
                top = ", ".join(f"{piece!r} {prob:.3f}" for piece, prob in miss["top"])
                L.append(f"  - round {miss['round']}, draft position {miss['position']} of {miss['drafted']}, "
                         f"token #{miss['index']}: {top}")
            if len(dbg["misses"]) > 12:
                L.append(f"  - ... {len(dbg['misses']) - 12} more")
        if res.get("aligned_prompt"):
            d2 = res["aligned_divergence"]
            L.append(f"- phase-aligned prompt: `{res['aligned_prompt']}` (-n {a.n_predict - 1}); generated text vs ours: "
                     + ("identical over the common length" if d2["same"] else
                        f"the same for {d2['chars_same']} characters, then ours `{d2.get('ours_at', '')!r}` vs "
                        f"theirs `{d2.get('theirs_at', '')!r}` (our target's top-1 minus top-2 logit there "
                        f"{fmt(d2.get('margin', float('nan')), 3)})"))
        for cmd in res["cmds"].values():
            L.append(f"- `{show_cmd(cmd)}`")
        L.append("")
    L.extend(build_lines(build))
    L.append("")
    L.append(f"Command: `python bench/peers.py {' '.join(shlex.quote(x) for x in sys.argv[1:])}`")
    L.append("")
    return "\n".join(L)




def draft_alone_lines(a, results) -> list:
    """Our draft step (one draft decode for one sequence, in the speculative rounds) beside
    llama-bench's tg of the draft file, and c_draft = draft step / target step on both sides."""
    L = ["", "Draft model alone (medians): our draft step = draft time / drafted positions of the speculative "
         "runs (one sequence: one draft decode per position, plus its argmax); our baseline step of the draft "
         "file; llama-bench's step = 1000 / its tg t/s of the draft file. c_draft = draft step / target "
         "baseline step, ours against llama.cpp's.", "",
         "| set | draft | our draft step in rounds, ms | our baseline step of the draft, ms | llama-bench step "
         "of the draft, ms | ours in rounds / llama-bench | c_draft ours | c_draft llama.cpp |",
         "|---|---|---|---|---|---|---|---|"]
    for res in results:
        ms = res["set"]
        so = res["spec"]["ours"]
        ours_draft = med([x["draft_ms"] / x["drafted"] for x in so if x["drafted"]])
        d, t = res["base"][ms["draft"]], res["base"][ms["target"]]
        bench_draft, bench_target = 1000.0 / med(d["theirs"]), 1000.0 / med(t["theirs"])
        L.append(f"| {ms['name']} | {Path(ms['draft']).name} | {fmt(ours_draft, 3)} | {fmt(med(d['ours_step_ms']), 3)} | "
                 f"{fmt(bench_draft, 3)} | {fmt(ours_draft / bench_draft, 3)} | "
                 f"{fmt(ours_draft / med(t['ours_step_ms']), 3)} | {fmt(bench_draft / bench_target, 3)} |")
    return L


def context_lines(results) -> list:
    """Our contexts' parameters (as llama.cpp set them) beside llama-bench's, and llama.cpp's graph
    reuse on our side: the first things to compare when a baseline ratio is off."""
    keys = ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "kv_unified", "swa_full", "n_threads")
    L = ["", "Baseline contexts, ours beside llama-bench's; graphs reused = llama_perf_context's n_reused over "
         "our timed baseline runs / their single-token decodes; engine's own = our decoding time outside "
         "llama.cpp calls (median share).", "",
         "| set | model | side | " + " | ".join(keys) + " | threadpool | graphs reused | engine's own |",
         "|---|---|---|" + "---|" * len(keys) + "---|---|---|"]
    for res in results:
        ms = res["set"]
        for t, b in res["base"].items():
            ours = res["ctx_params"][t]
            reused = sum(r for r, _ in b["reused"])
            decodes = sum(n for _, n in b["reused"])
            L.append(f"| {ms['name']} | {Path(t).name} | ours | " + " | ".join(str(ours[k]) for k in keys)
                     + f" | OpenMP, ggml's per-graph | {reused} / {decodes} | {med(b['own_share']):.2%} |")
            theirs = res["bench_params"].get(t, {})
            L.append(f"| {ms['name']} | {Path(t).name} | llama-bench | "
                     + " | ".join(str(theirs.get(k, "?")) for k in keys)
                     + f" | {theirs.get('threadpool', '?')} | - | - |")
    return L
