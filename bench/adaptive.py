"""The adaptive spec policy against every static configuration on the same work.

For each pair: the closed loop at concurrency 1, 2, 4, 8 and serving on three traces whose load or
content changes (burst: idle, saturation, idle; ramp: gaps shrinking twentyfold; mixed: requests
that copy their prompt interleaved with open questions, labelled apart). Every configuration runs
the same prompts and traces, interleaved repeat by repeat in a rotating order:

    off          no speculation
    k2 k4 k8     static chains of k
    by-batch     a k per occupancy band, the run's own advice: the best of off/k2/k4/k8 at each
                 concurrency of this run's closed loop (vLLM's [[lo, hi, k], ...] form)
    adaptive     k (0..8) chosen per sequence every round (engine/spec_policy.py); what it learns
                 carries from one run of the engine to the next, as in a server that runs for hours

Each closed-loop configuration runs once untimed at each concurrency before its repeats (a warm-up,
as llama-bench's; for adaptive it is also where the pair's acceptance is first seen).

Per (pair, workload, metric) comparison.csv holds adaptive's paired ratio to the best static
configuration (the one with the best median on that metric; "static" counts off and by-batch), its
95 % interval (geometric mean of the per-repeat ratios, t interval on their logs) and a decision:
better (interval above 1 and the ratio above 1.01), worse (below 1 and 0.99) or tie. Ratios are
oriented so that > 1 is better: throughput and goodput adaptive / best, latencies best / adaptive. By-batch's and adaptive's outputs
get the greedy lossless verdict on the first repeat.

    python bench/adaptive.py -r 4 -n 32 -o bench/results/adaptive   # tiny, tiny-noisy, gemma-self, gemma-ngram
    python bench/adaptive.py --pairs tiny -r 3 -n 32 -o runs/adaptive-look    # a quick look
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peerkit.common import WORK, busy_cores, git_rev, log  # noqa: E402

from specnative import DecodeSpec, Engine, lossless  # noqa: E402
from specnative.analysis import stats  # noqa: E402
from specnative.engine import decoding_ms  # noqa: E402
from specnative.record.provenance import cpu_model  # noqa: E402
from specnative.run.workloads.suite import SEQUENCE_PROMPTS  # noqa: E402
from specnative.serving import metrics as serve_metrics  # noqa: E402
from specnative.serving.arrivals import Request  # noqa: E402
from specnative.serving.loop import serve  # noqa: E402
from specnative.serving.runner import serving_verdict  # noqa: E402

STATIC = {"off": None, "k2": 2, "k4": 4, "k8": 8}
# Within 1 % is a tie whatever the interval: an open-loop trace's throughput is its arrivals' (every
# configuration finishes within a few ms of the others), so its intervals are a few parts in 10^4 wide.
MARGIN = 0.01
POLICIES = ("by-batch", "adaptive")  # judged on the first repeat (the static chains: by the suite and sweeps)
K_MAX = 8
CONCURRENCIES = (1, 2, 4, 8)
METRICS = {  # name: (the run's value, higher is better)
    "output_throughput": True, "goodput": True, "tpot_p50_ms": False, "tpot_p99_ms": False, "ttft_p99_ms": False}
PASSAGE = ("The committee met on Tuesday to review the budget for the new library. After a long discussion it "
           "agreed to fund the reading room, the children's corner and a small cafe, and asked the architect "
           "to present revised drawings by the end of the month.")
COPY_PROMPT = f"Repeat the following text exactly.\n\nText: {PASSAGE}\n\nRepeated text: {PASSAGE[:40]}"
OPEN_PROMPTS = ("What do you think makes a city pleasant to live in? Give your own view.",
                "Invent a short story about a fox who learns to sail.",
                "Why do people enjoy music? Answer freely.")


def pairs(names: list[str]) -> list[dict]:
    out = []
    for name in names:
        if name == "tiny":
            from specnative.models import tiny_pair
            target, draft = tiny_pair(WORK / "models", "deep", extra_layers=30)
            out.append({"name": name, "title": "tiny deep (2+30 layers, f32) / its 2-layer draft", "target": target,
                        "draft": draft, "drafter": "model"})
            continue
        if name == "tiny-noisy":
            from specnative.models import tiny_pair
            target, draft = tiny_pair(WORK / "models", "noisy", noise=0.05, extra_layers=30)
            out.append({"name": name, "title": "tiny deep (2+30 layers, f32) / a 2-layer draft with 5 % weight "
                        "noise (pays at low load only)", "target": target, "draft": draft, "drafter": "model"})
            continue
        if name == "qwen":
            from specnative.models.presets import qwen_files
            files = qwen_files()
            # its steps are ~30x the tiny pair's: the traces' gaps 8x
            out.append({"name": name, "title": "Qwen2.5-Coder 1.5B Q4_K_M / 0.5B Q4_K_M draft (pays on copying "
                        "tasks at low load only)", "target": files["Q4_K_M"], "draft": files["draft"],
                        "drafter": "model", "time_scale": 8.0})
            continue
        from specnative.models.presets import gemma_files
        files = gemma_files()
        if name == "gemma-self":
            out.append({"name": name, "title": "Gemma 3 270M Q8_0 drafting for itself (a draft as dear as the "
                        "target: never pays)", "target": files["Q8_0"], "draft": files["Q8_0"], "drafter": "model"})
        elif name == "gemma-ngram":
            out.append({"name": name, "title": "Gemma 3 270M Q8_0 with ngram-simple (pays where the output copies "
                        "the prompt)", "target": files["Q8_0"], "draft": None, "drafter": "ngram-simple"})
        elif name == "gemma-draft":
            out.append({"name": name, "title": "Gemma 3 270M Q8_0 / Q4_K_M draft", "target": files["Q8_0"],
                        "draft": files["Q4_K_M"], "drafter": "model"})
        else:
            raise SystemExit(f"error: unknown pair {name!r} (tiny, tiny-noisy, gemma-self, gemma-ngram, "
                             f"gemma-draft, qwen)")
    return out


def decode_spec(config: str, n: int, schedule) -> DecodeSpec | None:
    """generate()/serve()'s settings of a configuration; None: off."""
    if config == "off":
        return None
    if config == "adaptive":
        return DecodeSpec(n_predict=n, spec=True, k=K_MAX, spec_policy="adaptive")
    if config == "by-batch":
        return DecodeSpec(n_predict=n, spec=True, k=K_MAX, spec_policy="by-batch:" + json.dumps(schedule))
    return DecodeSpec(n_predict=n, spec=True, k=STATIC[config])


def rotation(configs: list[str], repeat: int) -> list[str]:
    shift = repeat % len(configs)
    return configs[shift:] + configs[:shift]


def policy_share(result_times: dict, rounds: int, round_ms: float) -> float:
    """The policy's own time per round over the round's time."""
    if not rounds or not round_ms > 0:
        return math.nan
    return (result_times.get("policy", 0.0) - result_times.get("policy_startup", 0.0)) / rounds / round_ms


def closed_loop(engine, pair, prompts, n: int, repeats: int, rows: list, verdicts: list,
                concurrencies=CONCURRENCIES) -> dict:
    """tokens/s per (concurrency, config) over repeats; returns the by-batch schedule it advises."""
    configs = ["off", "k2", "k4", "k8", "adaptive"]
    best_k = {}
    for conc in concurrencies:
        chosen = prompts[:conc]
        tps: dict[str, list] = {c: [] for c in configs}
        base_tokens = None
        specs = {}
        for config in configs:
            spec = decode_spec(config, n, None) or DecodeSpec(n_predict=n)
            if pair["drafter"] != "model" and spec.spec:
                spec = dataclasses.replace(spec, drafter=pair["drafter"])
            specs[config] = spec
            engine.generate(chosen, spec)  # a warm-up, not timed, as llama-bench's
        for r in range(repeats):
            for config in rotation(configs, r):
                spec = specs[config]
                res = engine.generate(chosen, spec)
                ms = decoding_ms(res.times)
                tps[config].append(res.decode_tokens / (ms / 1000.0))
                row = {"pair": pair["name"], "workload": f"closed-c{conc}", "config": config, "repeat": r,
                       "output_throughput": tps[config][-1]}
                if spec.spec:
                    hist = res.totals["k_chosen_hist"]
                    row["k0_share"] = hist[0] / hist.sum() if hist.sum() else math.nan
                    row["policy_share"] = policy_share(res.times, res.steps, res.round_ms)
                    row["alpha"] = res.draft_accept_rate
                rows.append(row)
                if config == "off" and base_tokens is None:
                    base_tokens = res.tokens
                if r == 0 and config in POLICIES:
                    verdicts.append({"pair": pair["name"], "workload": f"closed-c{conc}", "config": config,
                                     **closed_verdict(engine, chosen, base_tokens, res.tokens, spec)})
        medians = {c: statistics.median(v) for c, v in tps.items() if c != "adaptive"}
        best = max(medians, key=medians.get)
        best_k[conc] = 0 if best == "off" else STATIC[best]
        log(f"  {pair['name']} closed c{conc}: " + ", ".join(f"{c} {statistics.median(v):.1f}" for c, v in tps.items()))
    # each measured concurrency's best up to the next one measured; the largest's up to every slot
    schedule, sizes = [], list(concurrencies) + [max(max(concurrencies), max(CONCURRENCIES)) + 1]
    for lo, hi in zip(sizes, sizes[1:]):
        schedule.append([lo, hi - 1, best_k[lo]])
    return schedule


def closed_verdict(engine, prompts, base_tokens, tokens, spec) -> dict:
    if all(list(a) == list(b) for a, b in zip(base_tokens, tokens)):
        return {"verdict": lossless.EXACT, "reason": "identical tokens"}
    drafter = "" if spec.drafter == "model" else spec.drafter
    control = lossless.measure_noise(engine, prompts, base_tokens, spec.k, drafter)
    v = lossless.judge(engine, prompts, base_tokens, tokens, 0.0, 0, control)
    return {"verdict": v.verdict, "reason": v.reason}


def traces(engine, n: int, scale: float = 1.0, names=("burst", "ramp", "mixed")) -> dict:
    """The serving traces: token prompts, arrival times (s, times `scale`) and labels."""
    tok = [list(engine.tokenize(p)) for p in SEQUENCE_PROMPTS]
    copy, open_ = list(engine.tokenize(COPY_PROMPT)), [list(engine.tokenize(p)) for p in OPEN_PROMPTS]
    burst = [(0.6 * i, tok[i % len(tok)], "low-load") for i in range(3)]
    burst += [(2.0, tok[(3 + i) % len(tok)], "saturation") for i in range(12)]
    burst += [(2.0 + 2.5 + 0.6 * i, tok[i % len(tok)], "low-load") for i in range(3)]
    ramp, t = [], 0.0
    for i in range(20):
        ramp.append((t, tok[i % len(tok)], "ramp"))
        t += 1.0 - 0.95 * i / 19
    mixed, t = [], 0.0
    for i in range(16):
        mixed.append((t, copy if i % 2 == 0 else open_[i % len(open_)], "copy" if i % 2 == 0 else "open"))
        t += 0.25
    return {name: [Request(a * scale, tuple(p), n, label) for a, p, label in items]
            for name, items in (("burst", burst), ("ramp", ramp), ("mixed", mixed)) if name in names}


def served_verdict(engine, trace, run, off_tokens, k: int) -> dict:
    """Identical tokens to the off replay of the same trace: exact; otherwise the serving verdict
    (each request decoded alone, the noise control)."""
    if off_tokens is not None and all(list(a) == b for a, b in zip(run.tokens, off_tokens)):
        return {"verdict": lossless.EXACT, "reason": "identical tokens to the off replay"}
    v = serving_verdict(engine, trace, run.tokens, k)
    return {"verdict": v.verdict, "reason": v.reason}


def serve_traces(engine, pair, trace_set, n: int, repeats: int, schedule, slo, rows, verdicts) -> None:
    configs = ["off", "k2", "k4", "k8", "by-batch", "adaptive"]
    off_tokens: dict = {}
    for name, trace in trace_set.items():
        for r in range(repeats):
            for config in rotation(configs, r):
                spec = decode_spec(config, n, schedule)
                kw = {} if spec is None else {"spec": True, "k": spec.k, "spec_policy": spec.spec_policy,
                                             "drafter": pair["drafter"]}
                run = serve(engine, trace, max_concurrency=8, virtual_clock=True, slo=slo, **kw)
                row = {"pair": pair["name"], "workload": name, "config": config, "repeat": r,
                       **{m: run.summary[m] for m in METRICS}}
                if spec is not None:
                    hist = run.totals["k_chosen_hist"]
                    row["k0_share"] = hist[0] / hist.sum() if hist.sum() else math.nan
                    row["policy_share"] = policy_share(run.times, run.decode_steps, run.iteration_ms)
                    row["alpha"] = run.draft_accept_rate
                rows.append(row)
                if config == "off" and name not in off_tokens:
                    off_tokens[name] = [list(t) for t in run.tokens]
                if r == 0 and config in POLICIES:
                    verdicts.append({"pair": pair["name"], "workload": name, "config": config,
                                     **served_verdict(engine, trace, run, off_tokens.get(name), spec.k)})
            log(f"  {pair['name']} {name} repeat {r}: done")


def comparison(rows: list, level: float = 0.95) -> list[dict]:
    out = []
    keys = sorted({(r["pair"], r["workload"]) for r in rows})
    for pair, workload in keys:
        group = [r for r in rows if r["pair"] == pair and r["workload"] == workload]
        configs = sorted({r["config"] for r in group})
        for metric, higher in METRICS.items():
            if metric not in group[0]:
                continue
            by = {c: {r["repeat"]: r[metric] for r in group if r["config"] == c} for c in configs}
            if any(not all(math.isfinite(v) and v > 0 for v in vals.values()) for vals in by.values()):
                continue
            statics = [c for c in configs if c != "adaptive"]
            pick = max if higher else min
            best = pick(statics, key=lambda c: statistics.median(by[c].values()))
            repeats = sorted(by["adaptive"])
            ratios = [(by["adaptive"][i] / by[best][i]) if higher else (by[best][i] / by["adaptive"][i])
                      for i in repeats]
            iv = stats.geometric_interval(ratios, level)
            decided = ("better" if iv.low > 1 and iv.estimate > 1 + MARGIN else
                       "worse" if iv.high < 1 and iv.estimate < 1 - MARGIN else "tie")
            out.append({"pair": pair, "workload": workload, "metric": metric, "policy": "adaptive",
                        "best_static": best, "ratio": round(iv.estimate, 4), "ci_lo": round(iv.low, 4),
                        "ci_hi": round(iv.high, 4), "decision": decided,
                        "k0_share": round(statistics.mean(r["k0_share"] for r in group if r["config"] == "adaptive"),
                                          3),
                        "policy_share": round(max(r["policy_share"] for r in group if r["config"] == "adaptive"),
                                              5)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="tiny,tiny-noisy,gemma-self,gemma-ngram")
    ap.add_argument("-r", "--repeats", type=int, default=5)
    ap.add_argument("-n", "--n-predict", type=int, default=48)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--concurrencies", default=",".join(map(str, CONCURRENCIES)),
                    help="the closed loop's concurrencies (the by-batch schedule's bands start at each)")
    ap.add_argument("--traces", default="burst,ramp,mixed", help="the serving traces to replay")
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows, verdicts, schedules = [], [], {}
    load = busy_cores(1.0)
    for pair in pairs([p.strip() for p in a.pairs.split(",") if p.strip()]):
        log(f"{pair['name']}: {pair['title']}")
        with Engine(pair["target"], pair["draft"], n_ctx=8192, n_batch=512, n_seq_max=9,
                    n_threads=a.threads) as engine:
            concurrencies = tuple(int(c) for c in a.concurrencies.split(","))
            schedule = closed_loop(engine, pair, list(SEQUENCE_PROMPTS), a.n_predict, a.repeats, rows, verdicts,
                                   concurrencies)
            schedules[pair["name"]] = schedule
            step = statistics.median(1000.0 / r["output_throughput"] for r in rows
                                     if r["pair"] == pair["name"] and r["workload"] == "closed-c1"
                                     and r["config"] == "off")
            slo = serve_metrics.parse_slo(f"ttft:{20 * step:.1f},tpot:{1.5 * step:.2f}")
            trace_set = traces(engine, a.n_predict, pair.get("time_scale", 1.0), a.traces.split(","))
            serve_traces(engine, pair, trace_set, a.n_predict, a.repeats, schedule, slo, rows, verdicts)
    table = comparison(rows)
    with open(a.out / "comparison.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["pair", "workload", "metric", "policy", "best_static", "ratio", "ci_lo",
                                          "ci_hi", "decision", "k0_share", "policy_share"])
        w.writeheader()
        w.writerows(table)
    fields = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("pair", "workload", "config", "repeat"), k))
    with open(a.out / "replays.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    (a.out / "run.json").write_text(json.dumps({
        "command": "python bench/adaptive.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_rev(), "host": f"{cpu_model()}, {os.cpu_count()} cores, {a.threads} threads",
        "started": started, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "busy_cores_at_start": round(load, 2), "by_batch_schedules": schedules, "verdicts": verdicts}, indent=2) + "\n")
    bad = [v for v in verdicts if v["verdict"] not in (lossless.EXACT, lossless.NUMERIC)]
    log(f"wrote {a.out}/comparison.csv ({len(table)} rows); verdicts: {len(verdicts) - len(bad)} exact or numeric, "
        f"{len(bad)} other")
    for row in table:
        log(f"  {row['pair']:12s} {row['workload']:10s} {row['metric']:18s} vs {row['best_static']:8s} "
            f"{row['ratio']:.3f} [{row['ci_lo']:.3f}, {row['ci_hi']:.3f}] {row['decision']} k0 {row['k0_share']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
