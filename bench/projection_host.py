"""Calibrate the projection's cost model on this host, then test it on what it did not see.

measure: the engine's cost curve (Engine cost_curve: median wall ms of one target decode with 1..9
positions per sequence, interleaved repeats) on
  calibration: synthetic random-weight llama files generated here (8 layers, width 512 and 1024;
               F16, Q8_0, Q4_K_M, Q4_0, Q5_0 and Q6_K from one F16 file each (Q4_1 by the gguf
               package's quantizer), a 4-layer width-256 Q8_0,
               and width-32 F16 files of 2 and 8 layers whose forward is all fixed cost) at ctx 0
               (and 2048 for the F16 files), concurrency 1 and 4, 1 thread;
  validation:  the real models of the cache (tiny, Gemma 3 270M, the Qwen2.5-Coder pair, SmolLM2)
               at ctx 0 and concurrency 1 / 4 / 8, the tiny pair at an 8k context, and a subset at
               2 threads (a second "hardware").
  Every cell keeps its engine open and the cells are measured round-robin in PASSES passes, so that
  calibration and validation curves see the same load. Around each cost_curve call the process's
  CPU time (getrusage, user + system) is taken as well as its wall time: at 1 thread ggml computes
  on the calling thread, so CPU time counts the work and not the time the thread waited for a core.
  A call runs (repeats + 1) passes over the 9 shapes plus one re-fed prompt token per sequence (the
  shared prefix stays cached), so its CPU time is (repeats + 1) x sum(T(n)) + T(1); the call's wall
  medians give each shape's share. Every call is one JSON line in curves.jsonl (written as it goes).
membench: the host's streaming-read bandwidth (numpy sums of a 256 MiB array per thread, each thread
  timed by its own CPU time) at 1 thread and at every core, rounds alternating; membench.json holds
  their ratio, bw_threads_max: the memory system's cap on threads streaming together (not fitted).
analyze: per cell, the median over passes of the wall curve and of the CPU curve; fits the host's
  parameters (scipy.optimize.least_squares) on the calibration cells only, once on wall and once on
  CPU time, predicts every validation cell (baseline step; c of k+1 = 3, 5, 9 tokens with the cell's
  draft: the pair's draft model, or none for a model without one) and writes errors.csv (both
  timings), summary.md and fitted_device.toml (CPU time). bw_threads_max comes from membench.json in
  the same folder where there is one (--no-membench: leave it out).

    python bench/projection_host.py measure --out bench/results/projection/host
    python bench/projection_host.py membench --out bench/results/projection/host
    python bench/projection_host.py analyze --out bench/results/projection/host
    python bench/projection_host.py measure --only cal-fixed-l2,cal-fixed-l8 --out ...  (add cells)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "projection" / "host"
K_MAX = 8
PASSES = 3
MIN_CALL_S = 0.3  # repeats per call chosen so that one call holds about this much decoding
TAIL = 1  # each sequence's own prompt token after the shared context (re-fed by every call)


def cache_models() -> dict:
    from specnative.models.presets import cache_dir

    root = cache_dir()
    found = {
        "tiny-Q4_0": "tiny/tiny-llama-v1-extra_layers4-n_embd64-n_ff128-Q4_0.gguf",
        "tiny-Q8_0": "tiny/tiny-llama-v1-extra_layers4-n_embd64-n_ff128-Q8_0.gguf",
        "tiny-draft": "tiny/tiny-llama-v1-n_embd64-n_ff128-Q8_0.gguf",
        "gemma-Q4_K_M": "gemma3-270m/gemma-3-270m-Q4_K_M.gguf",
        "gemma-Q8_0": "gemma3-270m/gemma-3-270m-Q4_K_M-Q8_0.gguf",
        "qwen-0.5b": "qwen2.5-coder/qwen2.5-coder-0.5b-instruct-Q4_K_M.gguf",
        "qwen-1.5b": "qwen2.5-coder/qwen2.5-coder-1.5b-instruct-Q4_K_M.gguf",
        "smollm2": "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }
    return {k: root / v for k, v in found.items() if (root / v).is_file()}


def calibration_models(scratch: Path) -> dict:
    from specnative import quantize
    from specnative.models.tiny import write_tiny_llama

    scratch.mkdir(parents=True, exist_ok=True)
    small = scratch / "cal-w256-l4-Q8_0.gguf"  # a small file: the fixed costs per forward and layer
    if not small.exists():
        f16 = scratch / "cal-w256-l4-F16.gguf"
        write_tiny_llama(f16, n_embd=256, n_layer=4, n_head=4, n_head_kv=1, n_ff=768, dtype="f16")
        quantize(f16, small, "Q8_0")
    out = {"cal-small-Q8_0": small}
    # two files whose bytes and FLOPs are negligible (width 32): their forward is the fixed cost, the
    # 2-layer file's per forward and the difference to the 8-layer file's per layer
    for n_layer in (2, 8):
        fixed = scratch / f"cal-w32-l{n_layer}-F16.gguf"
        if not fixed.exists():
            write_tiny_llama(fixed, n_embd=32, n_layer=n_layer, n_head=2, n_head_kv=2, n_ff=64, dtype="f16")
        out[f"cal-fixed-l{n_layer}"] = fixed
    for width, n_ff, n_head, tag in ((512, 1536, 8, "cal"), (1024, 2816, 16, "cal1k")):
        base = scratch / f"cal-w{width}-l8-F16.gguf"
        if not base.exists():
            write_tiny_llama(base, n_embd=width, n_layer=8, n_head=n_head, n_head_kv=n_head // 4, n_ff=n_ff, dtype="f16")
        out[f"{tag}-F16"] = base
        for t in ("Q8_0", "Q4_K_M", "Q4_0", "Q5_0", "Q6_K"):
            dst = scratch / f"cal-w{width}-l8-{t}.gguf"
            if not dst.exists():
                quantize(base, dst, t)
            out[f"{tag}-{t}"] = dst
        q4_1 = scratch / f"cal-w{width}-l8-Q4_1.gguf"  # SmolLM2's type, which specnative's quantizer lacks
        if not q4_1.exists():
            requantize_with_gguf(base, q4_1, "Q4_1")
        out[f"{tag}-Q4_1"] = q4_1
    return out


def requantize_with_gguf(src: Path, dst: Path, type_name: str) -> None:
    """Every matrix of an F16 file stored as `type_name` by the gguf package's own quantizer (for a type
    specnative's llama.cpp quantizer does not offer); metadata and vectors as they are."""
    import gguf
    import numpy as np

    qtype = gguf.GGMLQuantizationType[type_name]
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        if field.name == "general.file_type":
            value = int(getattr(gguf.LlamaFileType, f"MOSTLY_{type_name}"))
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if len(t.shape) == 2:
            writer.add_tensor(t.name, gguf.quants.quantize(data.astype(np.float32), qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# (model, ctx, concurrencies, threads, role). Calibrated at 1 thread: on a shared, oversubscribed
# 2-core host a 2-thread decode stalls at every barrier whenever one of its threads is descheduled.
CAL_THREADS, OTHER_THREADS = 1, 2


def plan(models: dict, cal: dict) -> list:
    p = [(name, ctx, (1, 4), CAL_THREADS, "calibration") for name in cal
         for ctx in ((0, 2048) if name.endswith("F16") else (0,))]
    main = [("tiny-Q4_0", 0, (1, 4, 8)), ("tiny-Q8_0", 0, (1, 8)), ("tiny-draft", 0, (1, 4, 8)),
            ("smollm2", 0, (1, 4, 8)), ("gemma-Q4_K_M", 0, (1, 4, 8)), ("gemma-Q8_0", 0, (1,)),
            ("qwen-0.5b", 0, (1,)), ("qwen-1.5b", 0, (1,)),
            ("tiny-Q4_0", 8192, (1, 4, 8)), ("tiny-draft", 8192, (1, 4, 8))]
    other = [("tiny-Q4_0", 0, (1, 8)), ("tiny-draft", 0, (1, 8)), ("smollm2", 0, (1,)), ("gemma-Q4_K_M", 0, (1,))]
    p += [(m, ctx, n, CAL_THREADS, "validation") for m, ctx, n in main if m in models]
    p += [(m, ctx, n, OTHER_THREADS, "validation") for m, ctx, n in other if m in models]
    return p


# --- the memory system's streaming bandwidth at 1 thread and at every core (a spec sheet's number) ---
STREAM_BYTES = 256 * 2**20  # per thread: 8 times the 32 MiB last-level cache, so every pass reads memory
STREAM_PASSES, STREAM_ROUNDS = 6, 5


STREAM_WALL_OVER_CPU = 1.05  # a run counts only if every thread had a core all along (wall <= this x CPU)
STREAM_TRIES = 20             # attempts per run before giving up on a loaded host


def _stream(array, start, out: list, i: int) -> None:
    """One thread's streaming read: numpy sums an int64 array (vectorised adds, the GIL released), timed
    by the thread's own CPU time and its wall time; all threads start together at `start`."""
    array.sum()  # warm: pages mapped, the loop hot
    start.wait()
    c0, w0 = time.thread_time(), time.perf_counter()
    for _ in range(STREAM_PASSES):
        array.sum()
    out[i] = (STREAM_PASSES * array.nbytes, time.thread_time() - c0, time.perf_counter() - w0)


def _stream_run(arrays, n: int):
    """n threads streaming together; None unless every thread ran on a core all along (a thread that
    waited for a core would leave the others the whole memory system: its CPU time would flatter)."""
    import threading

    out, start = [None] * n, threading.Barrier(n)
    threads = [threading.Thread(target=_stream, args=(arrays[i], start, out, i)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(w > STREAM_WALL_OVER_CPU * c for _, c, w in out):
        return None
    return sum(b / c for b, c, _ in out) / 1e9, sum(b for b, _, _ in out) / max(w for _, _, w in out) / 1e9


def membench(args) -> int:
    """Streaming-read bandwidth of the host at 1 thread and at every core, rounds alternating; writes
    membench.json: bw_threads_max = the all-core bandwidth over one thread's (CPU time; wall beside).
    A run in which a thread waited for a core is not kept (and is tried again)."""
    import numpy as np

    n_all = os.cpu_count() or 1
    arrays = [np.ones(STREAM_BYTES // 8, dtype=np.int64) for _ in range(n_all)]
    runs, rejected = [], 0
    for rnd in range(STREAM_ROUNDS):
        for n in ((1, n_all) if rnd % 2 == 0 else (n_all, 1)):
            for _ in range(STREAM_TRIES):
                got = _stream_run(arrays, n)
                if got is not None:
                    break
                rejected += 1
            else:
                raise SystemExit(f"membench: {STREAM_TRIES} runs of {n} thread(s) in a row had a thread waiting "
                                 "for a core; the host is too busy to measure its memory system")
            cpu_gbs, wall_gbs = got
            runs.append({"threads": n, "round": rnd, "cpu_gbs": round(cpu_gbs, 3), "wall_gbs": round(wall_gbs, 3),
                         "loadavg": os.getloadavg()[0]})
            print(f"round {rnd}, {n} thread(s): {cpu_gbs:.1f} GB/s (CPU time), {wall_gbs:.1f} GB/s (wall), "
                  f"load {runs[-1]['loadavg']:.2f}", flush=True)
    med = {(n, t): statistics.median(r[f"{t}_gbs"] for r in runs if r["threads"] == n)
           for n in {1, n_all} for t in ("cpu", "wall")}
    result = {"what": "streaming read (numpy int64 sum) of a 256 MiB array per thread", "cores": n_all,
              "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "rejected_runs": rejected,
              "gbs_1_thread": med[(1, "cpu")], "gbs_all_threads": med[(n_all, "cpu")],
              "gbs_1_thread_wall": med[(1, "wall")], "gbs_all_threads_wall": med[(n_all, "wall")],
              "bw_threads_max": round(med[(n_all, "cpu")] / med[(1, "cpu")], 3), "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "membench.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"1 thread {result['gbs_1_thread']:.1f} GB/s, {n_all} threads {result['gbs_all_threads']:.1f} GB/s: "
          f"bw_threads_max {result['bw_threads_max']:.3f} ({rejected} run(s) with a waiting thread not kept)")
    return 0


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(args) -> int:
    import numpy as np

    from specnative import Engine

    models = cache_models()
    cal = calibration_models(args.scratch)
    paths = {**models, **cal}
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "curves.jsonl"
    if args.only:  # measure only these models' cells and add them to the curves already there
        wanted = set(args.only.split(","))
        models = {k: v for k, v in models.items() if k in wanted}
        cal = {k: v for k, v in cal.items() if k in wanted}
        paths = {**models, **cal}
    else:
        log.write_text("")
    engines, cells = {}, []
    try:
        for name, ctx, concs, threads, role in plan(models, cal):
            key = (name, ctx, threads)
            n_ctx = ctx + max(concs) * (TAIL + K_MAX + 2) + 256
            engines[key] = Engine(paths[name], n_ctx=n_ctx, n_batch=512, n_threads=threads, n_seq_max=max(concs))
            vocab = engines[key]._n_vocab
            rng = np.random.default_rng(0)
            shared = rng.integers(10, min(vocab, 30000), size=ctx).tolist()
            for n_seq in concs:
                prompts = [shared + rng.integers(10, min(vocab, 30000), size=TAIL).tolist() for _ in range(n_seq)]
                # a first call: the shared prefix's prefill, and the size of one pass over the shapes
                curve = engines[key]._core.cost_curve(prompts, K_MAX, 1)
                repeats = max(2, min(40, math.ceil(MIN_CALL_S / (sum(curve["verify_ms"]) / 1e3))))
                cells.append((name, ctx, n_seq, threads, role, key, prompts, repeats))
        print(f"{len(cells)} cells open, {PASSES} passes", flush=True)
        for pas in range(PASSES):
            order = cells[pas % 2::2] + cells[1 - pas % 2::2]  # alternate the order between passes
            for name, ctx, n_seq, threads, role, key, prompts, repeats in order:
                c0, w0 = cpu_s(), time.perf_counter()
                curve = engines[key]._core.cost_curve(prompts, K_MAX, repeats)
                c1, w1 = cpu_s(), time.perf_counter()
                row = {"model": name, "file": Path(paths[name]).name, "role": role, "ctx": ctx, "concurrency": n_seq,
                       "threads": threads, "own": TAIL, "pass": pas, "repeats": repeats,
                       "verify_ms": [round(v, 5) for v in curve["verify_ms"]],
                       "cpu_s": round(c1 - c0, 5), "wall_s": round(w1 - w0, 5), "loadavg": os.getloadavg()[0]}
                with open(log, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"pass {pas} {name} ctx={ctx} N={n_seq} t={threads}: step {row['verify_ms'][0]:.2f} ms wall, "
                      f"call {row['cpu_s']:.2f} s CPU / {row['wall_s']:.2f} s wall, load {row['loadavg']:.1f}", flush=True)
    finally:
        for e in engines.values():
            e.close()
    return 0


def cell_curves(rows: list) -> list:
    """One row per cell: the median over passes of the wall curve ("wall_ms") and of the CPU curve
    ("cpu_ms": the call's CPU time divided among the shapes by the call's wall medians, per thread)."""
    cells = {}
    for r in rows:
        w = r["verify_ms"]
        total_s = r["cpu_s"] / ((r["repeats"] + 1) + w[0] / sum(w))  # (repeats+1) x sum(T) + T(1)
        cpu = [1e3 * total_s * v / sum(w) / r["threads"] for v in w]
        key = (r["model"], r["ctx"], r["concurrency"], r["threads"])
        c = cells.setdefault(key, {k: r[k] for k in ("model", "file", "role", "ctx", "concurrency", "threads", "own")}
                             | {"walls": [], "cpus": [], "loads": [], "ratio": []})
        c["walls"].append(w)
        c["cpus"].append(cpu)
        c["loads"].append(r["loadavg"])
        c["ratio"].append(r["wall_s"] / r["cpu_s"] * r["threads"])
    out = []
    for c in cells.values():
        c["wall_ms"] = [statistics.median(v) for v in zip(*c.pop("walls"))]
        c["cpu_ms"] = [statistics.median(v) for v in zip(*c.pop("cpus"))]
        c["wall_over_cpu"] = statistics.median(c.pop("ratio"))
        out.append(c)
    return out


# --- analysis -------------------------------------------------------------------------------------
PAIRS = {"tiny-Q4_0": "tiny-draft", "tiny-Q8_0": "tiny-draft", "qwen-1.5b": "qwen-0.5b",
         "gemma-Q8_0": "gemma-Q4_K_M", "gemma-Q4_K_M": "gemma-Q4_K_M"}


def host_device(threads: int = CAL_THREADS, bw_threads_max: float = 0.0):
    """The host's starting point for the fit; bw_threads_max is not fitted: it comes from membench."""
    from specnative.analysis.projection.device import Device

    return Device(name="host", label="this host", backend="cpu", mem_bw_gbs=10.0, threads=threads,
                  bw_threads_max=bw_threads_max,
                  batched_bw_efficiency=0.5, serial_share=0.5,
                  tflops={t: 0.03 for t in RATE_KEYS}, matvec_tflops={t: 0.03 for t in MATVEC_KEYS},
                  overhead_forward_us=200.0,
                  overhead_layer_us=20.0, source="fit")


RATE_KEYS = ("float", "legacy", "kquant", "Q4_0", "Q8_0", "Q4_1", "Q6_K")  # classes, and types with kernels of their own
# one-row (matrix-vector) rates of the quantized kernels; a float one-row product runs at the float rate
MATVEC_KEYS = RATE_KEYS[1:]
FIT_PARAMS = [(None, f"tflops.{t}") for t in RATE_KEYS] + [(None, f"matvec_tflops.{t}") for t in MATVEC_KEYS] + [(None, "mem_bw_gbs"), (None, "batched_bw_efficiency"), (None, "serial_share"),
              (None, "overhead_forward_us"), (None, "overhead_layer_us"), (None, "attention_score_ns"), (None, "attention_score_batched_ns"), (None, "dot_ns")]
FIXED_PARAMS = [(None, "overhead_forward_us"), (None, "overhead_layer_us")]
FIXED_COST_FILES = ("cal-fixed-l2", "cal-fixed-l8")
TIMINGS = {"cpu": "process CPU time per thread", "wall": "wall time"}
SLICES = (("real models, ctx 0, 1 thread", lambda u: (u["threads"] == CAL_THREADS) & (u["ctx"] == 0) & ~u["model"].str.startswith("tiny")),
          ("tiny models, ctx 0, 1 thread", lambda u: (u["threads"] == CAL_THREADS) & (u["ctx"] == 0) & u["model"].str.startswith("tiny")),
          ("context 8k (tiny pair), 1 thread", lambda u: (u["threads"] == CAL_THREADS) & (u["ctx"] > 0)),
          ("concurrency 4 and 8, 1 thread", lambda u: (u["threads"] == CAL_THREADS) & (u["concurrency"] > 1)),
          (f"{OTHER_THREADS} threads (another hardware)", lambda u: u["threads"] == OTHER_THREADS),
          ("all unseen, 1 thread", lambda u: u["threads"] == CAL_THREADS),
          ("all unseen", lambda u: u["threads"] > 0))


def evaluate(cells: list, shapes: dict, timing: str, bw_threads_max: float = 0.0):
    """Fit the host on the calibration cells' `timing` curves; every cell's predicted and measured
    step, verify ratio and c (a list of dicts) and the fitted device."""
    from specnative.analysis.projection import cost, fit

    curve = f"{timing}_ms"

    def predictor(r, n):
        shape = shapes[r["model"]]
        kv = cost.kv_cells(r["ctx"], r["concurrency"], n, r["own"])
        return lambda d: cost.forward_s(shape, d.with_threads(r["threads"]) if d.threads != r["threads"] else d,
                                        n, r["concurrency"], kv)

    cal_obs = [fit.Observation("host", predictor(r, n), ms / 1e3, {"row": r, "n": n})
               for r in cells if r["role"] == "calibration" for n, ms in enumerate(r[curve], start=1)]
    # two stages: the width-32 files' forward is all fixed cost, so they alone pin the overheads (the
    # joint fit would trade them against the per-row terms of the larger files); then the rest
    fixed_obs = [o for o in cal_obs if o.labels["row"]["model"] in FIXED_COST_FILES]
    fitted, _ = fit.fit({"host": host_device(bw_threads_max=bw_threads_max)}, FIXED_PARAMS, fixed_obs)
    fitted, _ = fit.fit(fitted, [p for p in FIT_PARAMS if p not in FIXED_PARAMS], cal_obs)
    dev = fitted["host"]
    by_key = {(r["model"], r["ctx"], r["concurrency"], r["threads"]): r for r in cells}
    out = []
    for r in cells:
        key_dev = dev if r["threads"] == dev.threads else dev.with_threads(r["threads"])
        shape = shapes[r["model"]]
        pred = [cost.forward_s(shape, key_dev, n, r["concurrency"], cost.kv_cells(r["ctx"], r["concurrency"], n, r["own"]))
                for n in range(1, K_MAX + 2)]
        meas = [ms / 1e3 for ms in r[curve]]
        base = dict(timing=timing, model=r["model"], role=r["role"], ctx=r["ctx"], concurrency=r["concurrency"],
                    threads=r["threads"])
        out.append({**base, "quantity": "step_ms", "k": "", "measured": meas[0] * 1e3, "predicted": pred[0] * 1e3})
        draft = PAIRS.get(r["model"])
        d_row = by_key.get((draft, r["ctx"], r["concurrency"], r["threads"])) if draft else None
        for k in (2, 4, 8):
            out.append({**base, "quantity": "verify_ratio", "k": k, "measured": meas[k] / meas[0], "predicted": pred[k] / pred[0]})
            if draft is None or d_row is not None:
                d_meas = d_row[curve][0] / 1e3 if d_row else 0.0
                d_pred = (cost.forward_s(shapes[draft], key_dev, 1, r["concurrency"],
                                         cost.kv_cells(r["ctx"], r["concurrency"], 1, r["own"])) if d_row else 0.0)
                out.append({**base, "quantity": "c", "k": k, "draft": draft if d_row else "n-gram (0)",
                            "measured": (k * d_meas + meas[k]) / meas[0] - 1, "predicted": (k * d_pred + pred[k]) / pred[0] - 1})
    for o in out:
        o["error_pct"] = 100 * (o["predicted"] / o["measured"] - 1)
    return out, dev


def analyze(args) -> int:
    import pandas as pd

    from specnative.analysis.projection.shape import from_gguf

    rows = [json.loads(line) for line in (args.out / "curves.jsonl").read_text().splitlines()]
    paths = {**cache_models(), **calibration_models(args.scratch)}
    shapes = {name: from_gguf(paths[name]) for name in {r["model"] for r in rows}}
    cells = cell_curves(rows)
    bench = args.out / "membench.json"  # the memory system's cap on threads' streaming, if measured
    membench_result = json.loads(bench.read_text()) if bench.is_file() and not args.no_membench else None
    cap = membench_result["bw_threads_max"] if membench_result else 0.0
    results = {t: evaluate(cells, shapes, t, cap) for t in TIMINGS}
    df = pd.DataFrame([o for out, _ in results.values() for o in out])
    df.round(4).to_csv(args.out / "errors.csv", index=False)
    df["abs"] = df["error_pct"].abs()
    df["set"] = df["role"].where(df["role"] == "calibration", "unseen")
    loads = [r["loadavg"] for r in rows]
    ratio = pd.DataFrame([{"threads": c["threads"], "r": c["wall_over_cpu"]} for c in cells]).groupby("threads")["r"].median()
    lines = ["# Host calibration and validation of the projection's cost model [projected]", "",
             f"{len(rows)} cost-curve calls, {len(cells)} cells, {PASSES} round-robin passes; load average "
             f"{min(loads):.1f} to {max(loads):.1f} (median {statistics.median(loads):.1f}); a call's wall time over its "
             "CPU time per thread (median over cells): " + ", ".join(f"{t} thread(s) {v:.2f}" for t, v in ratio.items()) + ".",
             "", "Median |error| % on unseen cells by slice, fitted and measured in each timing (n = cells):", "",
             "| slice | n | step, CPU | step, wall | verify ratio, CPU | verify ratio, wall | c, CPU | c, wall |",
             "|---|---|---|---|---|---|---|---|"]
    un = df[df["set"] == "unseen"]
    for name, sel in SLICES:
        g = un[sel(un)]
        med = {(q, t): g[(g["quantity"] == q) & (g["timing"] == t)]["abs"].median()
               for q in ("step_ms", "verify_ratio", "c") for t in TIMINGS}
        n = int(((g["quantity"] == "step_ms") & (g["timing"] == "cpu")).sum())
        lines.append(f"| {name} | {n} | " + " | ".join(f"{med[(q, t)]:.1f}" for q in ("step_ms", "verify_ratio", "c")
                                                       for t in TIMINGS) + " |")
    for timing, (_, dev) in results.items():
        rates = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in dev.tflops.items())
        matvec = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in dev.matvec_tflops.items())
        lines += ["", f"Fitted on the calibration curves only ({TIMINGS[timing]}; synthetic models, {CAL_THREADS} thread): "
                  f"matrix rate per thread (GFLOP/s) of products of 2 or more rows {rates}, of one-row products {matvec}; bandwidth per thread {dev.mem_bw_gbs:.1f} GB/s; overhead "
                  f"{dev.overhead_forward_us:.0f} us per forward + {dev.overhead_layer_us:.1f} us per layer; products of 2 or more "
                  f"rows stream weights at {dev.batched_bw_efficiency:.2f} of the one-row bandwidth; the shorter of an operation's "
                  f"streaming and arithmetic adds {dev.serial_share:.2f} of itself (1: their sum, 0: their max); "
                  f"{dev.attention_score_ns:.2f} ns per attention score (row x cached position x head x layer) in a one-row "
                  f"forward and {dev.attention_score_batched_ns:.2f} ns in forwards of two or more rows, "
                  f"{dev.dot_ns:.2f} ns per dot product of a weight row with an activation row."]
    if membench_result:
        m = membench_result
        lines += ["", f"Not fitted: the memory system's streaming bandwidth (`membench`: {m['what']}) is "
                  f"{m['gbs_1_thread']:.1f} GB/s at 1 thread and {m['gbs_all_threads']:.1f} GB/s at {m['cores']} threads "
                  f"(process CPU time; wall {m['gbs_1_thread_wall']:.1f} and {m['gbs_all_threads_wall']:.1f}), so threads "
                  f"together stream at most bw_threads_max = {m['bw_threads_max']:.3f} times one thread's bandwidth; "
                  f"load average {min(r['loadavg'] for r in m['runs']):.2f} to {max(r['loadavg'] for r in m['runs']):.2f}."]
    else:
        lines += ["", "Not fitted: no cap on the bandwidth threads stream at together (no membench.json read)."]
    lines += ["", "Median and max |error| % per quantity, calibration vs unseen cells:", "",
              "| timing | cells | quantity | k | n | median | max |", "|---|---|---|---|---|---|---|"]
    for (t, s, q, k), g in df.groupby(["timing", "set", "quantity", "k"], sort=True):
        lines.append(f"| {t} | {s} | {q} | {k} | {len(g)} | {g['abs'].median():.1f} | {g['abs'].max():.1f} |")
    lines += ["", "Unseen cells by model, context, concurrency and threads (signed error %, median over k where k "
              "applies; CPU time, then wall time):", "",
              "| model | ctx | N | threads | step CPU | step wall | verify ratio CPU | verify ratio wall | c CPU | c wall |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for (m, ctx, n, t), g in un.groupby(["model", "ctx", "concurrency", "threads"]):
        fmt = lambda s: f"{s.median():+.1f}" if len(s) else "–"
        vals = [fmt(g[(g["quantity"] == q) & (g["timing"] == tm)]["error_pct"])
                for q in ("step_ms", "verify_ratio", "c") for tm in TIMINGS]
        lines.append(f"| {m} | {ctx} | {n} | {t} | " + " | ".join(vals) + " |")
    dev = results["cpu"][1]
    unseen_c = un[(un["quantity"] == "c") & (un["threads"] == CAL_THREADS) & (un["timing"] == "cpu")]["abs"]
    rates = ", ".join(f"{k} = {v:.5f}" for k, v in dev.tflops.items())
    matvec = ", ".join(f"{k} = {v:.5f}" for k, v in dev.matvec_tflops.items())
    (args.out / "fitted_device.toml").write_text(
        f"[epyc-vm-1t]\nlabel = \"AMD EPYC VM (this project's 2-core host), 1 thread\"\nbackend = \"cpu\"\n"
        f"mem_bw_gbs = {dev.mem_bw_gbs:.2f}\ntflops = {{ {rates} }}\nmatvec_tflops = {{ {matvec} }}\n"
        f"bw_threads_max = {dev.bw_threads_max:.3f}\nthreads = {CAL_THREADS}\n"
        f"batched_bw_efficiency = {dev.batched_bw_efficiency:.3f}\nserial_share = {dev.serial_share:.3f}\noverhead_forward_us = {dev.overhead_forward_us:.1f}\n"
        f"overhead_layer_us = {dev.overhead_layer_us:.2f}\nattention_score_ns = {dev.attention_score_ns:.3f}\nattention_score_batched_ns = {dev.attention_score_batched_ns:.3f}\ndot_ns = {dev.dot_ns:.3f}\ncost_error = {unseen_c.median() / 100:.2f}\n")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verb", choices=("measure", "membench", "analyze"))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-membench", action="store_true",
                    help="analyze: leave the memory system's cap on threads' streaming out (membench.json unread)")
    ap.add_argument("--only", default="", help="measure: only these models (comma-separated), appended to curves.jsonl")
    ap.add_argument("--scratch", type=Path, default=Path.home() / ".cache" / "specnative" / "projection-calibration")
    args = ap.parse_args(argv)
    return {"measure": measure, "membench": membench, "analyze": analyze}[args.verb](args)


if __name__ == "__main__":
    raise SystemExit(main())
