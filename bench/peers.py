#!/usr/bin/env python3
"""specnative against llama.cpp's own tools, side by side, in one run.

Builds `llama-bench` and `llama-speculative-simple` from the same vendored llama.cpp tree with the
same ggml flags as the installed specnative, then interleaves both sides on the same models,
threads and prompt, greedy, repeated R times, and writes a markdown table with provenance to
bench/results/peers-<backend>-<date>.md.

    python bench/peers.py                          # tiny and gemma sets, 3 repeats
    python bench/peers.py --models tiny -r 5 -n 256
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
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "vendor" / "llama.cpp"
WORK = ROOT / "bench" / "work"
BUILD = WORK / "llama-build"
RESULTS = ROOT / "bench" / "results"
TOOLS = ("llama-bench", "llama-speculative-simple")

# x86 options our CMake sets from /proc/cpuinfo; those absent from build_flags were OFF in our build.
X86_OPTIONS = ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX_VNNI",
               "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
               "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")

DEFAULT_PROMPT = "Photosynthesis is the process by which"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------
def cmake_defines(info: dict) -> tuple[dict, list]:
    """-D options for llama.cpp's tools that reproduce our ggml configuration."""
    notes = []
    flags = {}
    for tok in info.get("build_flags", "").split():
        if "=" in tok:
            key, value = tok.split("=", 1)
            flags[key] = value
    if flags.get("GGML_NATIVE", "OFF").upper() in ("ON", "1", "TRUE"):
        raise SystemExit("error: our build reports GGML_NATIVE=ON; refusing to build the peers natively "
                         "(AMX kernels trap with SIGILL on these VMs)")
    defines = {"CMAKE_BUILD_TYPE": "Release", "BUILD_SHARED_LIBS": "ON", "GGML_NATIVE": "OFF",
               "LLAMA_BUILD_TESTS": "OFF", "LLAMA_OPENSSL": "OFF", "LLAMA_BUILD_SERVER": "OFF"}
    if any(k in flags for k in X86_OPTIONS):
        defines.update({k: "OFF" for k in X86_OPTIONS})
    elif platform.machine() in ("x86_64", "AMD64"):
        notes.append("our build_flags name no x86 options (SPECNATIVE_CPU_AUTO=OFF?): the peers use ggml's "
                     "defaults with GGML_NATIVE=OFF, which may differ from our build")
    defines.update(flags)
    defines["GGML_NATIVE"] = "OFF"
    if info.get("backend", "CPU").upper() == "CUDA":
        defines["GGML_CUDA"] = "ON"
        defines.setdefault("CMAKE_CUDA_ARCHITECTURES", "native")
    return defines, notes


def tool_path(build_dir: Path, name: str) -> Path:
    return build_dir / "bin" / name


def build_tools(info: dict, build_dir: Path, rebuild: bool) -> dict:
    defines, notes = cmake_defines(info)
    stamp = build_dir / "specnative-peers.json"
    have = all(tool_path(build_dir, t).exists() for t in TOOLS)
    old = json.loads(stamp.read_text()) if stamp.exists() else None
    configure = ["cmake", "-S", str(VENDOR), "-B", str(build_dir)]
    if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja"]
    configure += [f"-D{k}={v}" for k, v in defines.items()]
    build = ["cmake", "--build", str(build_dir), "--target", *TOOLS, "-j", str(os.cpu_count() or 2)]
    record = {"defines": defines, "configure": shlex.join(configure), "build": shlex.join(build),
              "llama_commit": info.get("llama_commit"), "notes": notes}
    if have and not rebuild:
        if old is not None and old.get("defines") != defines:
            log("note: the existing peer build used other flags than our build reports now; rebuilding")
        else:
            log(f"reusing {build_dir}/bin ({', '.join(TOOLS)}); --rebuild to force")
            return old or record
    if not (VENDOR / "CMakeLists.txt").exists():
        raise SystemExit(f"error: {VENDOR} is missing (pip install the project once, it fetches the pinned tree)")
    if rebuild and (build_dir / "CMakeCache.txt").exists():
        (build_dir / "CMakeCache.txt").unlink()
    build_dir.mkdir(parents=True, exist_ok=True)
    for note in notes:
        log("note: " + note)
    log("$ " + record["configure"])
    subprocess.run(configure, check=True)
    log("$ " + record["build"])
    t0 = time.time()
    subprocess.run(build, check=True)
    log(f"built {', '.join(TOOLS)} in {time.time() - t0:.0f} s")
    stamp.write_text(json.dumps(record, indent=1))
    return record


# ---------------------------------------------------------------------------------------------
# Quiet machine
# ---------------------------------------------------------------------------------------------
def busy_cores(interval: float = 1.0) -> float:
    """CPU cores busy (all processes) over `interval` seconds, from /proc/stat."""
    def read():
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
        idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
        return sum(parts), idle
    t0, i0 = read()
    time.sleep(interval)
    t1, i1 = read()
    total = max(t1 - t0, 1)
    return (1.0 - (i1 - i0) / total) * (os.cpu_count() or 1)


class Quiet:
    """Waits before each measurement until other processes leave the CPUs alone (we are idle while
    it samples, so whatever it sees is someone else). Keeps the worst value it accepted."""

    def __init__(self, max_busy: float, max_wait: float):
        self.max_busy, self.max_wait = max_busy, max_wait
        self.worst = 0.0
        self.waited = 0.0
        self.gave_up = 0

    def wait(self) -> None:
        start = time.time()
        while True:
            busy = busy_cores(0.5)
            if busy <= self.max_busy:
                self.worst = max(self.worst, busy)
                return
            if time.time() - start > self.max_wait:
                log(f"warning: {busy:.2f} cores busy elsewhere after waiting {self.max_wait:.0f} s; measuring anyway")
                self.worst = max(self.worst, busy)
                self.gave_up += 1
                return
            log(f"  {busy:.2f} cores busy elsewhere (load {os.getloadavg()[0]:.2f}); waiting")
            time.sleep(10)
            self.waited += 10


# ---------------------------------------------------------------------------------------------
# The two sides
# ---------------------------------------------------------------------------------------------
def ours_baseline(engine, prompt, n):
    r = engine.generate(prompt, n_predict=n, stop_at_eos=False)
    return {"tps": r.tps, "step_ms": r.step_ms, "tokens": r.decode_tokens, "steps": r.steps,
            "decode_ms": r.times["decode"]}


def ours_spec(engine, prompt, n, k):
    s = engine.generate(prompt, n_predict=n, spec=True, k=k, accept_rule="greedy")
    tot = s.totals
    return {"tps": s.tps, "alpha": s.draft_accept_rate, "tau": s.mean_accept_len, "round_ms": s.round_ms,
            "tokens": s.decode_tokens, "rounds": int(tot["rounds"]), "drafted": int(tot["drafted"]),
            "accepted": int(tot["accepted"]), "draft_ms": s.times["draft"], "verify_ms": s.times["verify"],
            "resample_ms": s.times["resample"], "text": s.texts[0], "token_ids": [int(t) for t in s.tokens[0]],
            "per_pos": [round(float(x), 3) for x in s.per_position_accept_rate],
            "hist": [int(x) for x in tot["accept_len_hist"]]}


def run_tool(cmd, timeout=900):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def bench_cmd(tools, model, n, a):
    return [str(tools["llama-bench"]), "-m", str(model), "-p", "0", "-n", str(n), "-t", str(a.threads),
            "-fa", "1" if a.flash_attn == "on" else "0", "-ngl", str(a.ngl), "-r", "1", "-o", "json"]  # < 0: all layers


def theirs_bench(cmd):
    p = run_tool(cmd)
    rows = json.loads(p.stdout)
    row = rows[0]
    return {"tps": float(row["avg_ts"]), "cpu_info": row.get("cpu_info", ""),
            "build_commit": row.get("build_commit", "")}


def ngl_arg(n: int) -> str:
    """common/arg.cpp reads -1 as 'auto' (fit to memory); all layers is 'all'. llama-bench and the
    llama API read any negative number as all layers."""
    return "all" if n < 0 else str(n)


def spec_cmd(tools, target, draft, prompt, n, k, a, swa_full):
    cmd = [str(tools["llama-speculative-simple"]), "-m", str(target), "-md", str(draft),
           "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", "0", "-p", prompt, "-n", str(n), "--temp", "0", "-t", str(a.threads),
           "-fa", a.flash_attn, "-c", str(a.ctx), "-ngl", ngl_arg(a.ngl), "-ngld", ngl_arg(a.ngl)]
    if swa_full:
        cmd.append("--swa-full")  # ours keeps swa_full=true for rollback; the same cache for both
    return cmd


def parse_spec_output(out: str, err: str, prompt: str) -> dict:
    both = out + "\n" + err

    def grab(pattern):
        m = re.search(pattern, both)
        if not m:
            raise RuntimeError(f"llama-speculative-simple output lacks /{pattern}/:\n{both[-3000:]}")
        return m.groups()

    n_dec, secs, speed = grab(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
    n_dec, secs, speed = int(n_dec), float(secs), float(speed)
    drafted = int(grab(r"n_drafted\s*=\s*(\d+)")[0])
    accepted = int(grab(r"n_accept\s*=\s*(\d+)")[0])
    i = out.find(prompt)
    rounds = n_dec - accepted  # each round emits its accepted drafts plus one target token
    return {"tps": speed, "tokens": n_dec, "seconds": secs, "alpha": accepted / drafted if drafted else float("nan"),
            "drafted": drafted, "accepted": accepted, "rounds": rounds,
            "n_prompt": int(grab(r"encoded\s+(\d+) tokens")[0]),
            "round_ms": secs * 1000.0 / rounds if rounds else float("nan"),
            "text": out[i + len(prompt):] if i >= 0 else out}


def theirs_spec(cmd, prompt, attempts=3):
    """One timed llama-speculative-simple run. Now and then (about 1 run in 10 here) it ends
    without its closing statistics (exit code logged); such a run is retried, not counted."""
    for attempt in range(1, attempts + 1):
        p = run_tool(cmd)
        try:
            return parse_spec_output(p.stdout, p.stderr, prompt)
        except RuntimeError:
            if attempt == attempts:
                raise
            log(f"  llama-speculative-simple ended without its statistics (exit {p.returncode}); retrying")


def theirs_debug(cmd, prompt) -> dict:
    """An extra, untimed run of speculative-simple with debug logging (-lv 5): per round how many
    drafts it accepted and, at each rejection, the index of the generated token there (0 = the
    first token after the prompt) and its draft's top candidates with their probabilities."""
    p = run_tool(cmd + ["-lv", "5"])
    res = parse_spec_output(p.stdout, p.stderr, prompt)
    cand = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \(\s*([\d.]+)\) '(.*)'$")
    done = re.compile(r"accepted (\d+)/(\d+) draft tokens")
    rounds, current = [], {}
    for line in (p.stdout + "\n" + p.stderr).splitlines():
        m = cand.search(line)
        if m:
            rank, pos = int(m.group(1)), int(m.group(2))
            current.setdefault(pos, []).append((rank, m.group(5), float(m.group(4))))
            continue
        m = done.search(line)
        if m:
            rounds.append((int(m.group(1)), int(m.group(2)), current))
            current = {}
    misses, emitted = [], 0
    for i, (acc, n, cands) in enumerate(rounds):
        if acc < n:
            top = sorted(cands.get(acc, []))[:3]
            misses.append({"round": i + 1, "position": acc + 1, "drafted": n, "index": emitted + acc,
                           "top": [(piece, prob) for _, piece, prob in top]})
        emitted += acc + 1
    hist = [0] * (max((n for _, n, _ in rounds), default=0) + 1)
    for acc, _, _ in rounds:
        hist[acc] += 1
    res.update({"misses": misses, "hist": hist, "n_rounds_logged": len(rounds)})
    return res


def aligned_prompt(engine, prompt: str, first_token: int):
    """The prompt text extended by our first generated token, if it tokenizes back to exactly
    prompt tokens + that token. speculative-simple drafts from the last prompt token (its first
    round yields the first generated token), we draft from the first generated token (prefill
    samples it): with this prompt its rounds start where ours do."""
    tokens = [int(t) for t in engine.tokenize(prompt)]
    full, base = engine.detokenize(tokens + [first_token]), engine.detokenize(tokens)
    if not full.startswith(base):
        return None
    text = prompt + full[len(base):]
    again = [int(t) for t in engine.tokenize(text)]
    return text if again == tokens + [first_token] else None


# ---------------------------------------------------------------------------------------------
# Model sets
# ---------------------------------------------------------------------------------------------
def model_sets(names):
    sets = []
    for name in names:
        if name == "tiny":
            from specnative.models import tiny_pair
            target, draft = tiny_pair(WORK / "models", "deep", extra_layers=30)
            sets.append({"name": "tiny", "title": "tiny deep (2+30 layers, f32) / 2-layer draft",
                         "target": target, "draft": draft, "extra_baselines": []})
        elif name == "gemma":
            from specnative.presets import gemma_files
            files = gemma_files()
            sets.append({"name": "gemma", "title": "gemma3-270m Q8_0 target / Q4_K_M draft",
                         "target": files["Q8_0"], "draft": files["Q4_K_M"], "extra_baselines": [files["Q4_K_M"]]})
        else:
            raise SystemExit(f"error: unknown model set {name!r} (tiny, gemma)")
    return sets


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(x, nd=1):
    return "n/a" if x is None or x != x else f"{x:.{nd}f}"


def vals(xs, nd=1):
    return ", ".join(fmt(x, nd) for x in xs)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def pad256(n: int) -> int:
    return (n + 255) // 256 * 256


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,gemma", help="comma list of model sets: tiny, gemma")
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
    ap.add_argument("--rebuild", action="store_true", help="rebuild llama.cpp's tools")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--build-dir", type=Path, default=BUILD)
    ap.add_argument("--tools-dir", type=Path, default=None,
                    help="use llama-bench and llama-speculative-simple from here instead of building them "
                         "(e.g. our own build with SPECNATIVE_PEER_TOOLS=ON, which shares our ggml)")
    ap.add_argument("--max-busy", type=float, default=None,
                    help="CPU cores other processes may keep busy before a measurement, else wait "
                         "(default: what leaves our threads their cores, at least 0.25)")
    ap.add_argument("--max-wait", type=float, default=900, help="seconds to wait for a quiet machine")
    ap.add_argument("-o", "--out", type=Path, default=None,
                    help="markdown file, or a folder for peers-<backend>-<date>.md (default bench/results)")
    a = ap.parse_args(argv)

    from specnative.engine import Engine, build_info
    import specnative

    info = build_info()
    backend = info.get("backend", "CPU")
    if a.ngl is None:
        a.ngl = -1 if backend.upper() == "CUDA" else 0
    if a.max_busy is None:
        a.max_busy = max(0.25, (os.cpu_count() or 1) - a.threads - 0.75)
    if a.tools_dir is not None:
        tools = {t: a.tools_dir / t for t in TOOLS}
        missing = [str(p) for p in tools.values() if not p.exists()]
        if missing:
            raise SystemExit(f"error: not found: {', '.join(missing)}")
        build = {"prebuilt": str(a.tools_dir), "notes": []}
    else:
        build = build_tools(info, a.build_dir, a.rebuild)
        tools = {t: tool_path(a.build_dir, t) for t in TOOLS}
    if a.build_only:
        return 0
    sets = model_sets([m.strip() for m in a.models.split(",") if m.strip()])
    quiet = Quiet(a.max_busy, a.max_wait)
    loadavg = open("/proc/loadavg").read().split()[:3]
    log(f"load average: {' '.join(loadavg)}")
    started = dt.datetime.now()
    fa = a.flash_attn == "on"
    results = []
    for ms in sets:
        log(f"== {ms['title']}")
        swa_full = "gemma" in ms["name"]
        res = {"set": ms, "cmds": {}, "base": {}, "spec": {"ours": [], "theirs": []}, "ours_step_ctx_ms": []}
        # speculative engine at context -c; its baseline step is T_step for c = T_round / T_step - 1
        eng = Engine(ms["target"], ms["draft"], n_ctx=a.ctx, n_batch=512, n_threads=a.threads,
                     n_gpu_layers=a.ngl, n_seq_max=1, flash_attn=fa)
        n_prompt = len(eng.tokenize(a.prompt))
        res["n_prompt_ours"] = n_prompt
        base_ctx = pad256(n_prompt + a.n_predict)
        res["base_ctx"] = base_ctx
        targets = [ms["target"], *ms["extra_baselines"]]
        base_engines = {}
        for t in targets:
            base_engines[t] = Engine(t, None, n_ctx=base_ctx, n_batch=512, n_threads=a.threads,
                                     n_gpu_layers=a.ngl, n_seq_max=1, flash_attn=fa)
            res["base"][t] = {"ours": [], "theirs": [], "ours_step_ms": []}
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
                    else:
                        r = theirs_bench(res["cmds"][("bench", t)])
                        b["theirs"].append(r["tps"])
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
    out = a.out or RESULTS
    if out.suffix != ".md":
        out = out / f"peers-{backend.lower()}-{started:%Y-%m-%d}.md"
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


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_model() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        return "; ".join(out.splitlines())
    except (OSError, subprocess.TimeoutExpired):
        return ""


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src", "csrc"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def rel(p) -> str:
    p = Path(p)
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def show_cmd(cmd) -> str:
    return shlex.join(rel(c) if os.sep in str(c) and Path(c).exists() else str(c) for c in cmd)


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
    L.append(f"- load average at start {' '.join(loadavg)}; before every measurement at most {quiet.worst:.2f} "
             f"cores were busy elsewhere (limit {a.max_busy}, waited {quiet.waited:.0f} s"
             + (f", gave up waiting {quiet.gave_up}x" if quiet.gave_up else "") + ")")
    for note in build.get("notes", []):
        L.append(f"- note: {note}")
    L.append("")
    L.append("| set | measure | ours | llama.cpp | ours/theirs | goal |")
    L.append("|---|---|---|---|---|---|")
    for res in results:
        ms = res["set"]
        for t, b in res["base"].items():
            mo, mt = med(b["ours"]), med(b["theirs"])
            L.append(f"| {ms['name']} | baseline t/s, {Path(t).name} | {fmt(mo)} ({vals(b['ours'])}) | "
                     f"{fmt(mt)} ({vals(b['theirs'])}) | {fmt(mo / mt, 3)} | >= 0.98 |")
        so, st = res["spec"]["ours"], res["spec"]["theirs"]
        mo, mt = med([x["tps"] for x in so]), med([x["tps"] for x in st])
        L.append(f"| {ms['name']} | speculative t/s, k={a.k} | {fmt(mo)} ({vals([x['tps'] for x in so])}) | "
                 f"{fmt(mt)} ({vals([x['tps'] for x in st])}) | {fmt(mo / mt, 3)} | >= 1.1 |")
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
    if build.get("prebuilt"):
        L.append(f"Peer tools: prebuilt, from `{rel(build['prebuilt'])}` (--tools-dir).")
    else:
        L.append("Peers built with:")
        L.append("")
        L.append(f"    {build.get('configure', '')}".replace(str(ROOT) + "/", ""))
        L.append(f"    {build.get('build', '')}".replace(str(ROOT) + "/", ""))
    L.append("")
    L.append(f"Command: `python bench/peers.py {' '.join(shlex.quote(x) for x in sys.argv[1:])}`")
    L.append("")
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
