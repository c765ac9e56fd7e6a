"""Projection against llama.cpp's published Apple-silicon table (discussion #4167: LLaMA 7B F16 /
Q8_0 / Q4_0, pp512 and tg128 per chip, build 8e672ef). (The CUDA scoreboard's rows, which this
script once predicted from spec-sheet priors as a test, kept in results/projection/cuda-scoreboard/,
are now part of the CUDA calibration: src/specnative/analysis/projection/cuda_calibration.py.)

Each chip is described by its spec sheet: memory bandwidth, GPU cores x 128 ALUs x 2 FLOP x the GPU
clock (M1 1.278 GHz, M2 1.398 GHz; FP16 runs at the FP32 rate on these GPUs). On the rows marked
`fit` (the M2-family chips M2 10-core, M2 Pro 16, M2 Max 30, M2 Ultra 60) the script fits only each
device's bandwidth and compute efficiency and one per-layer overhead of the Metal backend; it then
predicts every row, and the `test` rows (the M1 family, the other M2 core counts) with the
efficiencies of the fitted M2 chip of the same tier (base, Pro, Max, Ultra: the same memory system).

    python bench/projection_published.py [--out bench/results/projection]
"""
from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from specnative.analysis.projection import cost, fit
from specnative.analysis.projection.device import Device
from specnative.analysis.projection.shape import from_config

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "projection"
LLAMA_7B = dict(_name_or_path="LLaMA-7B", model_type="llama", hidden_size=4096, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                tie_word_embeddings=False)
CLOCK_GHZ = {"M1": 1.278, "M2": 1.398}
ALUS_PER_CORE = 128


def device_for(chip: str, cores: int, bw: float) -> Device:
    peak = cores * ALUS_PER_CORE * 2 * CLOCK_GHZ[chip.split()[0]] / 1e3
    return Device(name=f"{chip} {cores}c", label=f"Apple {chip} ({cores}-core GPU)", backend="metal",
                  mem_bw_gbs=bw, tflops={"float": peak}, bw_efficiency=0.8, compute_efficiency=0.5,
                  overhead_layer_us=20.0, source="spec sheet: bandwidth; cores x 128 ALUs x 2 x clock")


def tier(chip: str) -> str:
    return chip.split(" ", 1)[1] if " " in chip else "base"


def predict_tps(shape, device, test: str) -> float:
    if test == "tg128":
        return cost.decode_rate(shape, device, 128)
    return 512 / cost.prefill_s(shape, device, 512, n_batch=512)


def write_csv(path: Path, rows: list) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    args.out = args.out / "apple-silicon"
    rows = list(csv.DictReader(open(args.out / "rows.csv")))
    shapes = {w: from_config(LLAMA_7B, w) for w in ("F16", "Q8_0", "Q4_0")}
    devices = {}
    for r in rows:
        devices.setdefault(f"{r['chip']} {r['gpu_cores']}c", device_for(r["chip"], int(r["gpu_cores"]), float(r["mem_bw_gbs"])))

    def observation(r):
        shape, test = shapes[r["weights"]], r["test"]
        per_token = (lambda d: 1 / predict_tps(shape, d, test))
        return fit.Observation(f"{r['chip']} {r['gpu_cores']}c", per_token, 1 / float(r["tps"]), r)

    fit_rows = [r for r in rows if r["role"] == "fit"]
    fitted_names = sorted({f"{r['chip']} {r['gpu_cores']}c" for r in fit_rows})
    params = [(n, a) for n in fitted_names for a in ("bw_efficiency", "compute_efficiency")] + [(None, "overhead_layer_us")]
    fitted, result = fit.fit({n: devices[n] for n in fitted_names}, params, [observation(r) for r in fit_rows])
    by_tier = {tier(d.label.split("Apple ")[1].split(" (")[0]): d for d in fitted.values()}
    overhead = next(iter(fitted.values())).overhead_layer_us
    for name, d in devices.items():
        if name not in fitted:
            chip = name.rsplit(" ", 1)[0]
            ref = by_tier[tier(chip)]
            fitted[name] = Device(**{**d.__dict__, "bw_efficiency": ref.bw_efficiency,
                                     "compute_efficiency": ref.compute_efficiency, "overhead_layer_us": overhead,
                                     "source": d.source + f"; efficiencies of the fitted {ref.name}"})
    # Leave one out: each fit row predicted by a fit on the other 23
    loo = {}
    for i, r in enumerate(fit_rows):
        others = [observation(x) for j, x in enumerate(fit_rows) if j != i]
        refit, _ = fit.fit({n: devices[n] for n in fitted_names}, params, others)
        o = observation(r)
        loo[id(r)] = round(100 * (o.measured_s / o.predict(refit[o.device]) - 1), 1)
    out_rows = []
    for o, predicted, err in fit.errors(fitted, [observation(r) for r in rows]):
        r = o.labels
        out_rows.append({**{k: r[k] for k in ("chip", "gpu_cores", "mem_bw_gbs", "weights", "test", "role")},
                         "measured_tps": float(r["tps"]), "predicted_tps": round(1 / predicted, 2),
                         "error_pct": round(100 * (o.measured_s / predicted - 1), 1),
                         "leave_one_out_error_pct": loo.get(id(r), ""), "source": r["source"]})
    write_csv(args.out / "predictions.csv", out_rows)
    with open(args.out / "fitted_devices.toml", "w") as f:
        for n in fitted_names:
            d = fitted[n]
            f.write(f"# {d.label}: bw_efficiency {d.bw_efficiency:.3f}, compute_efficiency {d.compute_efficiency:.3f}, "
                    f"overhead_layer_us {d.overhead_layer_us:.1f} (shared by the Metal backend)\n")
    print(f"fit: {result.nfev} evaluations, cost {result.cost:.4g}; Metal per-layer overhead {overhead:.1f} us")
    for n in fitted_names:
        print(f"  {n}: bw_efficiency {fitted[n].bw_efficiency:.3f} compute_efficiency {fitted[n].compute_efficiency:.3f}")
    for test in ("tg128", "pp512"):
        errs = [abs(r["leave_one_out_error_pct"]) for r in out_rows if r["role"] == "fit" and r["test"] == test]
        print(f"fit {test} left out one at a time: median |error| {statistics.median(errs):.1f} % max {max(errs):.1f} %")
    for role in ("fit", "test"):
        for test in ("tg128", "pp512"):
            errs = [abs(r["error_pct"]) for r in out_rows if r["role"] == role and r["test"] == test]
            print(f"{role} {test}: n={len(errs)} median |error| {statistics.median(errs):.1f} % max {max(errs):.1f} %")
    for r in out_rows:
        print(f"  [{r['role']}] {r['chip']} {r['gpu_cores']}c {r['weights']} {r['test']}: measured {r['measured_tps']} "
              f"predicted {r['predicted_tps']} ({r['error_pct']:+.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
