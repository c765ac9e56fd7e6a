#!/usr/bin/env python3
"""specnative against llama.cpp's own tools, side by side, in one run.

Builds `llama-bench` and `llama-speculative-simple` from the same vendored llama.cpp tree with the
same ggml flags as the installed specnative, then interleaves both sides on the same models,
threads and prompt, greedy, repeated R times, and writes a markdown table with provenance to
bench/results/peers-<backend>-<date>.md.

    python bench/peers.py                          # tiny and gemma sets, 3 repeats
    python bench/peers.py --models tiny -r 5 -n 256
    python bench/peers.py --build-only [--rebuild]

What each side times (tokens/s = tokens / seconds of that interval):
  ours baseline      Engine.generate(prompt, n_predict=N, stop_at_eos=False).tps: N-1 tokens over
                     the N-1 single-token decode steps after prefill (each step: llama_decode,
                     llama_synchronize, argmax over the vocabulary). Prefill excluded.
  llama-bench tg     avg_ts of `-p 0 -n N`: N single-token decodes from an empty cache (random
                     tokens, no sampling), after its own warm-up.
  ours speculative   Engine.generate(prompt, n_predict=N, spec=True, k=K).tps: the tokens emitted
                     after the first one (which prefill samples) over draft + verify + resample.
  speculative-simple "decoded N tokens in S seconds": every round from the first, which is the
                     one that turns the last prompt token into the first generated token, and all
                     tokens it emitted (it stops only once it has more than N, so N+1..N+K+1).
  alpha              ours accepted/drafted; theirs n_accept/n_drafted (the same definition).
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

DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small town by the sea,"


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
def norm_text(s: str) -> str:
    return " ".join(s.split())


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
            "resample_ms": s.times["resample"], "text": s.texts[0],
            "per_pos": [round(float(x), 3) for x in s.per_position_accept_rate]}


def run_tool(cmd, timeout=900):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def bench_cmd(tools, model, n, a):
    return [str(tools["llama-bench"]), "-m", str(model), "-p", "0", "-n", str(n), "-t", str(a.threads),
            "-fa", "1" if a.flash_attn == "on" else "0", "-ngl", str(a.ngl), "-r", "1", "-o", "json"]


def theirs_bench(cmd):
    p = run_tool(cmd)
    rows = json.loads(p.stdout)
    row = rows[0]
    return {"tps": float(row["avg_ts"]), "cpu_info": row.get("cpu_info", ""),
            "build_commit": row.get("build_commit", "")}


def spec_cmd(tools, target, draft, prompt, n, k, a, swa_full):
    cmd = [str(tools["llama-speculative-simple"]), "-m", str(target), "-md", str(draft),
           "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", "0", "-p", prompt, "-n", str(n), "--temp", "0", "-t", str(a.threads),
           "-fa", a.flash_attn, "-c", str(a.ctx), "-ngl", str(a.ngl), "-ngld", str(a.ngl)]
    if swa_full:
        cmd.append("--swa-full")  # ours keeps swa_full=true for rollback; the same cache for both
    return cmd


def theirs_spec(cmd, prompt):
    p = run_tool(cmd)
    err = p.stdout + "\n" + p.stderr

    def grab(pattern, cast=float):
        m = re.search(pattern, err)
        if not m:
            raise RuntimeError(f"llama-speculative-simple output lacks /{pattern}/:\n{err[-3000:]}")
        return cast(m.group(1)) if m.lastindex == 1 else tuple(cast(g) for g in m.groups())

    n_dec, secs, speed = grab(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
    n_enc = int(grab(r"encoded\s+(\d+) tokens"))
    drafted = int(grab(r"n_drafted\s*=\s*(\d+)"))
    accepted = int(grab(r"n_accept\s*=\s*(\d+)"))
    out = p.stdout
    i = out.find(prompt)
    text = out[i + len(prompt):] if i >= 0 else out
    rounds = int(n_dec) - accepted  # each round emits its accepted drafts plus one target token
    return {"tps": speed, "tokens": int(n_dec), "seconds": secs, "alpha": accepted / drafted if drafted else float("nan"),
            "drafted": drafted, "accepted": accepted, "rounds": rounds, "n_prompt": n_enc,
            "round_ms": secs * 1000.0 / rounds if rounds else float("nan"), "text": text}


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


def common_prefix_words(a: str, b: str) -> tuple[int, int]:
    wa, wb = norm_text(a).split(" "), norm_text(b).split(" ")
    n = 0
    while n < min(len(wa), len(wb)) and wa[n] == wb[n]:
        n += 1
    return n, min(len(wa), len(wb))


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,gemma", help="comma list of model sets: tiny, gemma")
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-k", type=int, default=4, help="draft length")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096, help="context size of both sides' speculative runs "
                    "and of our baseline (llama-bench sizes its own to N)")
    ap.add_argument("--flash-attn", choices=("off", "on"), default="off")
    ap.add_argument("--ngl", type=int, default=None, help="GPU layers (default: 99 with CUDA, else 0)")
    ap.add_argument("-p", "--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--rebuild", action="store_true", help="rebuild llama.cpp's tools")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--build-dir", type=Path, default=BUILD)
    ap.add_argument("--max-busy", type=float, default=0.25,
                    help="CPU cores other processes may keep busy before a measurement (else wait)")
    ap.add_argument("--max-wait", type=float, default=900, help="seconds to wait for a quiet machine")
    ap.add_argument("-o", "--out", type=Path, default=None, help="markdown file (default bench/results/...)")
    a = ap.parse_args(argv)

    from specnative.engine import Engine, build_info
    import specnative

    info = build_info()
    backend = info.get("backend", "CPU")
    if a.ngl is None:
        a.ngl = 99 if backend.upper() == "CUDA" else 0
    build = build_tools(info, a.build_dir, a.rebuild)
    if a.build_only:
        return 0
    tools = {t: tool_path(a.build_dir, t) for t in TOOLS}
    sets = model_sets([m.strip() for m in a.models.split(",") if m.strip()])
    quiet = Quiet(a.max_busy, a.max_wait)
    log(f"uptime: {open('/proc/loadavg').read().strip()}")
    started = dt.datetime.now()
    results = []
    for ms in sets:
        log(f"== {ms['title']}")
        swa_full = "gemma" in ms["name"]
        res = {"set": ms, "cmds": {}, "base": {}, "spec": {"ours": [], "theirs": []}}
        targets = [ms["target"], *ms["extra_baselines"]]
        engines = {}
        for t in targets:
            draft = ms["draft"] if t == ms["target"] else None
            engines[t] = Engine(t, draft, n_ctx=a.ctx, n_batch=512, n_threads=a.threads, n_gpu_layers=a.ngl,
                                n_seq_max=1, flash_attn=(a.flash_attn == "on"))
            res["base"][t] = {"ours": [], "theirs": [], "ours_step_ms": []}
            res["cmds"][("bench", t)] = bench_cmd(tools, t, a.n_predict, a)
        eng = engines[ms["target"]]
        res["n_prompt_ours"] = len(eng.tokenize(a.prompt))
        res["cmds"]["spec"] = spec_cmd(tools, ms["target"], ms["draft"], a.prompt, a.n_predict, a.k, a, swa_full)
        # warm-up (discarded): page cache, first graphs, OpenMP threads
        for t, e in engines.items():
            ours_baseline(e, a.prompt, min(a.n_predict, 16))
        ours_spec(eng, a.prompt, min(a.n_predict, 16), a.k)
        for rep in range(a.repeats):
            ours_first = rep % 2 == 0  # alternate the order to cancel drift
            for t in targets:
                b = res["base"][t]
                for side in (("ours", "theirs") if ours_first else ("theirs", "ours")):
                    quiet.wait()
                    if side == "ours":
                        r = ours_baseline(engines[t], a.prompt, a.n_predict)
                        b["ours"].append(r["tps"])
                        b["ours_step_ms"].append(r["step_ms"])
                    else:
                        r = theirs_bench(res["cmds"][("bench", t)])
                        b["theirs"].append(r["tps"])
                        res["cpu_info"] = r["cpu_info"]
                        res["bench_commit"] = r["build_commit"]
                log(f"  [{rep + 1}/{a.repeats}] baseline {Path(t).name}: ours {b['ours'][-1]:.1f} t/s, "
                    f"llama-bench {b['theirs'][-1]:.1f} t/s")
            for side in (("ours", "theirs") if ours_first else ("theirs", "ours")):
                quiet.wait()
                if side == "ours":
                    res["spec"]["ours"].append(ours_spec(eng, a.prompt, a.n_predict, a.k))
                else:
                    res["spec"]["theirs"].append(theirs_spec(res["cmds"]["spec"], a.prompt))
            so, st = res["spec"]["ours"][-1], res["spec"]["theirs"][-1]
            log(f"  [{rep + 1}/{a.repeats}] speculative k={a.k}: ours {so['tps']:.1f} t/s alpha {so['alpha']:.3f}; "
                f"speculative-simple {st['tps']:.1f} t/s alpha {st['alpha']:.3f}")
        for e in engines.values():
            e.close()
        results.append(res)

    md = render(a, info, build, results, quiet, started, specnative.__version__)
    out = a.out or RESULTS / f"peers-{backend.lower()}-{started:%Y-%m-%d}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(md)
    log(f"wrote {out}")
    return 0


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
        return str(p).replace(str(Path.home()), "~")


def show_cmd(cmd) -> str:
    return shlex.join(rel(c) if os.sep in str(c) and Path(c).exists() else str(c) for c in cmd)


def render(a, info, build, results, quiet, started, version) -> str:
    L = []
    L.append(f"# specnative vs llama.cpp tools ({info.get('backend')}, {started:%Y-%m-%d %H:%M})")
    L.append("")
    L.append(f"- specnative {version} (git {git_rev()}); llama.cpp {info.get('llama_commit', '?')[:10]} for both sides")
    L.append(f"- build flags (ours, and the peers' -D options): `{info.get('build_flags', '').strip()}`")
    L.append(f"- CPU: {cpu_model()} ({os.cpu_count()} cores); threads {a.threads}; flash-attn {a.flash_attn}; "
             f"GPU layers {a.ngl}")
    L.append(f"- greedy (temperature 0), N = {a.n_predict} tokens, k = {a.k}, context {a.ctx}; "
             f"{a.repeats} repeats interleaved (ours/theirs order alternating); medians, individual values in ()")
    L.append(f"- prompt: `{a.prompt}`")
    L.append(f"- quiet check before every measurement: at most {quiet.worst:.2f} cores busy elsewhere "
             f"(limit {a.max_busy}); waited {quiet.waited:.0f} s" + (f"; gave up waiting {quiet.gave_up}x" if quiet.gave_up else ""))
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
        L.append(f"| {ms['name']} | alpha (accepted/drafted) | {fmt(ao, 3)} ({vals([x['alpha'] for x in so], 3)}) | "
                 f"{fmt(at, 3)} ({vals([x['alpha'] for x in st], 3)}) | {fmt(100 * (ao - at), 1)} pts | within 2 pts |")
    L.append("")
    L.append("Where the time goes (medians; ours from its step timers, theirs from its totals: "
             "ms/round = decode seconds / (tokens - accepted)):")
    L.append("")
    L.append("| set | side | tokens | rounds | drafted / accepted | tokens/round | ms/round | draft | verify | resample | baseline step ms |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for res in results:
        ms = res["set"]
        so, st = res["spec"]["ours"], res["spec"]["theirs"]
        step = med(res["base"][ms["target"]]["ours_step_ms"])
        bench_step = 1000.0 / med(res["base"][ms["target"]]["theirs"])
        o = so[len(so) // 2] if so else None
        rounds = med([x["rounds"] for x in so])
        L.append(f"| {ms['name']} | ours | {o['tokens']} | {o['rounds']} | {o['drafted']} / {o['accepted']} | "
                 f"{fmt(o['tokens'] / o['rounds'], 2)} | {fmt(med([x['round_ms'] for x in so]), 2)} | "
                 f"{fmt(med([x['draft_ms'] / x['rounds'] for x in so]), 2)} | "
                 f"{fmt(med([x['verify_ms'] / x['rounds'] for x in so]), 2)} | "
                 f"{fmt(med([x['resample_ms'] / x['rounds'] for x in so]), 3)} | {fmt(step, 2)} |")
        t = st[len(st) // 2] if st else None
        L.append(f"| {ms['name']} | speculative-simple | {t['tokens']} | {t['rounds']} | {t['drafted']} / {t['accepted']} | "
                 f"{fmt(t['tokens'] / t['rounds'], 2)} | {fmt(med([x['round_ms'] for x in st]), 2)} | - | - | - | "
                 f"{fmt(bench_step, 2)} (llama-bench) |")
        del rounds
    L.append("")
    for res in results:
        ms = res["set"]
        so, st = res["spec"]["ours"], res["spec"]["theirs"]
        L.append(f"**{ms['name']}**: {ms['title']}. Target `{rel(ms['target'])}`, draft `{rel(ms['draft'])}`.")
        L.append("")
        same, n = common_prefix_words(so[-1]["text"], st[-1]["text"])
        L.append(f"- prompt tokens: ours {res['n_prompt_ours']}, theirs {st[-1]['n_prompt']}; generated text "
                 + ("identical" if same == n else f"identical for the first {same} of {n} words")
                 + f" (ours {so[-1]['tokens'] + 1} tokens, theirs {st[-1]['tokens']})")
        L.append(f"- ours per-position acceptance: {so[-1]['per_pos']}")
        for key, cmd in res["cmds"].items():
            L.append(f"- `{show_cmd(cmd)}`")
        L.append("")
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
