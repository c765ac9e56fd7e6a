"""The CUDA cost model's calibration on llama.cpp's published figures (cuda_published.py) and its
validation: leave one source out, leave one scoreboard GPU out, and the tests it never fits.

    python -m specnative.analysis.projection.cuda_calibration --out bench/results/projection/cuda [--write-devices]

Fitted (scipy.optimize.least_squares, soft-L1 loss on log(predicted / published t/s), every
parameter in log space, a weak prior on each so that one the data cannot pin stays near it):
per architecture group (cuda_published.ARCH) the bandwidth share MMVQ reaches (bw_efficiency), the
share of it the tiled kernels stream at (mmq_bw_efficiency), the tensor-core share MMQ / cuBLAS
reach (compute_efficiency) and a fixed cost per forward (overhead_forward_us); shared by every CUDA
device the fixed cost per layer and the operations per weight element each further matrix-vector
column costs (mmvq_column_ops: legacy, kquant, float). The two bandwidth shares are pooled: each
architecture's is drawn towards a fitted centre rather than a fixed prior. The spec-sheet peaks are
not fitted. An architecture with no calibration row takes its fallback's values, or the pooled
centres and the priors where it has no fallback.
--write-devices rewrites the CUDA section of devices.toml from the spec sheets and the full fit.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import subprocess
from functools import cache
from pathlib import Path

import numpy as np

from specnative.analysis.projection import cost, cuda
from specnative.analysis.projection import cuda_published as pub
from specnative.analysis.projection.device import SHIPPED, Device
from specnative.analysis.projection.shape import MIXES, from_config

ARCH_PARAMS = {"bw_efficiency": (0.8, 0.5), "compute_efficiency": (0.3, 1.0), "overhead_forward_us": (300.0, 2.0),
               "mmq_bw_efficiency": (0.8, 0.5)}
SHARED_PARAMS = {"overhead_layer_us": (10.0, 2.0), "mmvq_column_ops.legacy": (4.0, 0.7),
                 "mmvq_column_ops.kquant": (8.0, 0.7), "mmvq_column_ops.float": (2.0, 0.7)}
# Pooled across architectures: each architecture's value is drawn towards one fitted centre (a shared
# parameter "pooled.NAME" with the prior above) instead of a fixed prior, so an architecture whose data
# pin only a product of two shares (MMQ rows alone: bw_efficiency x mmq_bw_efficiency) splits it as the
# architectures that see both kernels do
POOLED = ("bw_efficiency", "mmq_bw_efficiency")
PRIOR_WEIGHT = 0.05  # a prior residual log(value / prior) / width, times this (a column cost's width is
# narrower: only PR #26079's curves see it, and a fit without them would otherwise let it run away)
SHARES = ("bw_efficiency", "compute_efficiency", "mmq_bw_efficiency")
SOURCES = ("scoreboard", "pr15131", "pr26079")
SECTION = "# --- NVIDIA (CUDA)"


@cache
def model_shape(model: str, weight_type: str):
    return from_config(dict(pub.MODELS[model], _name_or_path=model), weight_type)


def device_for(name: str, params: dict) -> Device:
    """The spec-sheet device with the fitted values of its architecture and the shared ones."""
    bw, _, _, fp32, fp16, int8, cc, label, match = pub.GPUS[name]
    arch = params["arch"].get(pub.arch_of(name)) or params["arch"].get(pub.ARCH_FALLBACK.get(pub.arch_of(name), ""))
    shared = params["shared"]
    arch = arch or {k: shared.get(f"pooled.{k}", v) for k, (v, _) in ARCH_PARAMS.items()}
    return Device(name=name, label=label, backend="cuda", mem_bw_gbs=float(bw),
                  tflops={"float": float(fp16), "legacy": float(int8), "kquant": float(int8)},
                  vector_tflops=float(fp32), compute_capability=float(cc),
                  bw_efficiency=arch["bw_efficiency"], compute_efficiency=arch["compute_efficiency"],
                  overhead_forward_us=arch["overhead_forward_us"], overhead_layer_us=shared["overhead_layer_us"],
                  mmq_bw_efficiency=arch["mmq_bw_efficiency"],
                  mmvq_column_ops={k.split(".")[1]: v for k, v in shared.items() if k.startswith("mmvq_column_ops.")},
                  extra={"match": list(match)})


def layer_kernel(row: pub.Row) -> str:
    """The kernel family the vendored source runs the row's layer matrices with."""
    layer_type = MIXES.get(row.weight_type.upper(), (row.weight_type.upper(),))[0]
    return cuda.select(layer_type, row.n_ubatch, cuda.cc_of(pub.GPUS[row.device][6]), row.kernel_set)


def predict_tps(row: pub.Row, device: Device) -> float:
    shape = model_shape(row.model, row.weight_type)
    if row.kernel_set != device.cuda_kernels:
        device = dataclasses.replace(device, cuda_kernels=row.kernel_set)
    if row.n_gen:
        return cost.decode_rate(shape, device, row.n_gen, flash_attn=row.flash_attn)
    return row.n_prompt / cost.prefill_s(shape, device, row.n_prompt, row.n_ubatch, flash_attn=row.flash_attn,
                                         kernel=row.kernel or None)


def prior_params() -> dict:
    shared = {k: v for k, (v, _) in SHARED_PARAMS.items()}
    shared.update({f"pooled.{p}": ARCH_PARAMS[p][0] for p in POOLED})
    return {"arch": {}, "shared": shared}


def fit(rows: list) -> dict:
    """Parameters fitted to `rows` (each of them a calibration row)."""
    from scipy.optimize import least_squares

    arches = sorted({pub.arch_of(r.device) for r in rows})
    shared_params = dict(SHARED_PARAMS, **{f"pooled.{p}": ARCH_PARAMS[p] for p in POOLED})
    keys = [("arch", a, p) for a in arches for p in ARCH_PARAMS] + [("shared", None, p) for p in shared_params]
    priors = [(ARCH_PARAMS if kind == "arch" else shared_params)[p] for kind, _, p in keys]
    x0 = np.log([v for v, _ in priors])
    upper = np.array([0.0 if p.removeprefix("pooled.") in SHARES else np.inf for _, _, p in keys])
    centre = {p: keys.index(("shared", None, f"pooled.{p}")) for p in POOLED}
    x0 = np.minimum(x0, upper - 1e-6)

    def params_of(x) -> dict:
        out = prior_params()
        for (kind, arch, p), value in zip(keys, np.exp(x)):
            if kind == "arch":
                out["arch"].setdefault(arch, {})[p] = float(value)
            else:
                out["shared"][p] = float(value)
        return out

    def residuals(x):
        params = params_of(x)
        devices = {}
        res = []
        for r in rows:
            d = devices.get(r.device) or devices.setdefault(r.device, device_for(r.device, params))
            res.append(math.log(predict_tps(r, d) / r.tps))
        res += [PRIOR_WEIGHT * (xi - (x[centre[p]] if kind == "arch" and p in centre else math.log(v))) / w
                for xi, (kind, _, p), (v, w) in zip(x, keys, priors)]
        return np.array(res)

    result = least_squares(residuals, x0, bounds=(np.full_like(x0, -np.inf), upper), loss="soft_l1", f_scale=0.05)
    return params_of(result.x)


def predictions(rows: list, params: dict) -> list:
    """(row, predicted t/s, error predicted / published - 1) for each row."""
    out = []
    for r in rows:
        p = predict_tps(r, device_for(r.device, params))
        out.append((r, p, p / r.tps - 1.0))
    return out


def curve_ratios(preds: list) -> list:
    """Per curve (rows sharing `curve`, ppN at -ub N), the forward-time ratio T(N)/T(first N) published
    and predicted: (curve, N, kernel chosen, published ratio, predicted ratio, error)."""
    out = []
    curves: dict = {}
    for r, p, _ in preds:
        if r.test.startswith("pp") and r.source != "scoreboard":
            curves.setdefault(r.curve, []).append((r, p))
    for name, members in curves.items():
        members.sort(key=lambda m: m[0].n_ubatch)
        r0, p0 = members[0]
        t0_pub, t0_pred = r0.n_ubatch / r0.tps, r0.n_ubatch / p0
        for r, p in members[1:]:
            published = (r.n_ubatch / r.tps) / t0_pub
            predicted = (r.n_ubatch / p) / t0_pred
            kernel = r.kernel or layer_kernel(r)
            out.append((name, r.n_ubatch, kernel, published, predicted, predicted / published - 1.0))
    return out


def crossovers(preds: list) -> list:
    """PR #26079's forced curves: per (device, model) the smallest ne11 at which MMQ is faster than
    MMVQ, published and predicted (None: MMVQ faster throughout 1..8), and where the source switches."""
    table: dict = {}
    for r, p, _ in preds:
        if r.source == "pr26079":
            table.setdefault((r.device, r.model, r.weight_type), {}).setdefault(r.n_ubatch, {})[r.kernel] = (r.tps, p)
    out = []
    for (device, model, weight_type), by_n in table.items():
        def first(index, by_n=by_n):
            for n in sorted(by_n):
                if n > 1 and by_n[n]["mmq"][index] > by_n[n]["mmvq"][index]:
                    return n
            return None
        cc = cuda.cc_of(pub.GPUS[device][6])
        out.append((device, model, weight_type, first(0), first(1), cuda.next_switch(weight_type, cc)))
    return out


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def _median_abs(values) -> float:
    values = [abs(v) for v in values]
    return float(np.median(values)) if values else math.nan


def _rows_table(preds: list) -> list:
    lines = ["| curve / GPU | test | -ub | kernel | published t/s | predicted t/s | error |", "|---|---|---|---|---|---|---|"]
    for r, p, e in preds:
        kernel = r.kernel or layer_kernel(r)
        lines.append(f"| {r.curve} | {r.test} | {r.n_ubatch} | {kernel} | {r.tps:g} | {p:.1f} | {_pct(e)} |")
    return lines


def _ratio_table(ratios: list) -> list:
    lines = ["| curve | N | kernel | published T(N)/T(first) | predicted | error |", "|---|---|---|---|---|---|"]
    for name, n, kernel, published, predicted, e in ratios:
        lines.append(f"| {name} | {n} | {kernel} | {published:.3f} | {predicted:.3f} | {_pct(e)} |")
    return lines


def validate(all_rows: list) -> dict:
    """The full fit, each source left out, each scoreboard GPU left out, and the tests."""
    fit_rows = [r for r in all_rows if r.role == "fit"]
    full = fit(fit_rows)
    out = {"full": full, "in_sample": predictions(fit_rows, full), "loso": {}, "logo": [],
           "test": predictions([r for r in all_rows if r.role == "test"], full)}
    for source in SOURCES:
        params = fit([r for r in fit_rows if r.source != source])
        out["loso"][source] = (params, predictions([r for r in fit_rows if r.source == source], params))
    for device, _, _ in pub.SCOREBOARD.values():
        held = [r for r in fit_rows if r.source == "scoreboard" and r.device == device]
        params = fit([r for r in fit_rows if r not in held])
        out["logo"] += predictions(held, params)
    return out


def _scoreboard_summary(preds: list) -> list:
    tg = [e for r, _, e in preds if r.test == "tg128"]
    pp = [e for r, _, e in preds if r.test == "pp512"]
    return [(f"median |error| tg128 {_median_abs(tg) * 100:.1f} % (goal 10 %), pp512 {_median_abs(pp) * 100:.1f} % "
             f"(goal 20 %) over {len(tg)} GPUs")]


def goals(result: dict) -> list:
    """The validation against its goals, leave one source out first."""
    def ratio_median(preds):
        return _median_abs([x[-1] for x in curve_ratios(preds)]) * 100

    score = result["loso"]["scoreboard"][1]
    tg = _median_abs([e for r, _, e in score if r.test == "tg128"]) * 100
    pp = _median_abs([e for r, _, e in score if r.test == "pp512"]) * 100
    tg_g = _median_abs([e for r, _, e in result["logo"] if r.test == "tg128"]) * 100
    pp_g = _median_abs([e for r, _, e in result["logo"] if r.test == "pp512"]) * 100
    cross = crossovers(result["in_sample"])
    same = sum(1 for _, _, _, published, predicted, _ in cross if published == predicted)
    test = curve_ratios(result["test"])
    rows = [("ratio curves T(N)/T(1), N <= 16, median (goal 15 %): PR #15131 left out",
             f"{ratio_median(result['loso']['pr15131'][1]):.1f} %"),
            ("the same, PR #26079 left out", f"{ratio_median(result['loso']['pr26079'][1]):.1f} %"),
            ("tg128 median (goal 10 %): the scoreboard left out / each scoreboard GPU left out", f"{tg:.1f} % / {tg_g:.1f} %"),
            ("pp512 median (goal 20 %): the scoreboard left out / each scoreboard GPU left out", f"{pp:.1f} % / {pp_g:.1f} %"),
            ("the kernel switch where the source puts it (every curve crossing it)", "by construction (cuda.select)"),
            ("PR #26079: MMQ overtakes MMVQ at the published row count (full fit)", f"{same} of {len(cross)} curves"),
            ("A100 34B Q8_0 (test, a March 2024 build priced with its kernels, early-2024): T(9)/T(1) published / predicted", f"{test[-1][3]:.2f} / {test[-1][4]:.2f}")]
    return (["## Against the goals", "", "| goal | result |", "|---|---|"]
            + [f"| {a} | {b} |" for a, b in rows] + [""])


def report(result: dict, command: str, commit: str) -> str:
    full = result["full"]
    lines = ["# The CUDA cost model on llama.cpp's published figures [projected]", "",
             ("Every predicted number here is a projection of the model in "
              "`src/specnative/analysis/projection/cuda.py` (kernel selection and kernel costs, "
              "[docs/projection.md](../../../../docs/projection.md)); the published ones are copied with their "
              "sources in `src/specnative/analysis/projection/cuda_published.py`."), "",
             f"Command: `{command}`  ", f"Commit: `{commit}` (the model and the data as fitted here).", "",
             "## Fitted on the whole calibration set", "",
             ("| architecture | bw_efficiency (MMVQ) | mmq_bw_efficiency (MMQ's share of it) | "
              "compute_efficiency (MMQ, cuBLAS) | overhead_forward_us |"),
             "|---|---|---|---|---|"]
    for arch, values in sorted(full["arch"].items()):
        lines.append(f"| {arch} | {values['bw_efficiency']:.3f} | {values['mmq_bw_efficiency']:.3f} | "
                     f"{values['compute_efficiency']:.3f} | {values['overhead_forward_us']:.0f} |")
    lines += ["", "Shared: " + ", ".join(f"{k} {v:.3g}" for k, v in full["shared"].items()), ""]
    lines += goals(result)
    lines += ["## Leave one source out", "",
              "Each source's rows predicted by a fit on the other two sources alone.", ""]
    for source, (params, preds) in result["loso"].items():
        lines += [f"### {source} left out", ""]
        if source == "scoreboard":
            lines += _scoreboard_summary(preds) + [""]
        ratios = curve_ratios(preds)
        if ratios:
            median = _median_abs([x[-1] for x in ratios]) * 100
            lines += [f"ratio curves T(N)/T(first), N <= 16: median |error| {median:.1f} % (goal 15 %)", ""]
            lines += _ratio_table(ratios) + [""]
        lines += _rows_table(preds) + [""]
    lines += ["## Leave one scoreboard GPU out", "",
              ("Each scoreboard GPU's pp512 and tg128 predicted by a fit on everything else (its architecture's "
               "other GPUs and curves included)."), ""] + _scoreboard_summary(result["logo"]) + [""]
    lines += _rows_table(result["logo"]) + [""]
    lines += ["## In sample (the full fit on its own rows)", ""] + _scoreboard_summary(
        [x for x in result["in_sample"] if x[0].source == "scoreboard"]) + [""]
    ratios = curve_ratios(result["in_sample"])
    lines += [f"ratio curves: median |error| {_median_abs([x[-1] for x in ratios]) * 100:.1f} %", ""]
    lines += ["## Where MMQ overtakes MMVQ (PR #26079's forced curves)", "",
              "| device | model | type | published: MMQ faster from ne11 | predicted (full fit) | the source switches at |",
              "|---|---|---|---|---|---|"]
    for device, model, weight_type, published, predicted, switch in crossovers(result["in_sample"]):
        lines.append(f"| {device} | {model} | {weight_type} | {published or 'never (1..8)'} | "
                     f"{predicted or 'never (1..8)'} | {switch} |")
    lines += ["", "## Tests (never fitted)", ""]
    ratios = curve_ratios(result["test"])
    lines += _ratio_table(ratios) + [""] + _rows_table(result["test"]) + [""]
    return "\n".join(lines) + "\n"


def figures(preds: list, out_dir: Path) -> list:
    """Forward time against rows, published (points) against projected (lines), one figure per device
    class of the curves (the full fit's predictions of calibration curves and the tests)."""
    from matplotlib.figure import Figure

    curves: dict = {}
    for r, p, _ in preds:
        if r.source != "scoreboard":
            curves.setdefault(r.device, {}).setdefault(r.curve, []).append((r.n_ubatch, r.n_ubatch / r.tps * 1e3,
                                                                            r.n_ubatch / p * 1e3))
    paths = []
    for device, by_curve in curves.items():
        fig = Figure(figsize=(6.4, 4.2))
        ax = fig.subplots()
        for i, (name, points) in enumerate(sorted(by_curve.items())):
            points.sort()
            x = [n for n, _, _ in points]
            ax.plot(x, [m for _, m, _ in points], "o", color=f"C{i % 10}", label=f"{name} (published)")
            ax.plot(x, [q for _, _, q in points], "-", color=f"C{i % 10}", label="[projected]")
        ax.set_xlabel("rows per forward")
        ax.set_ylabel("ms per forward")
        ax.set_yscale("log")
        ax.set_title(f"[projected] {device}: forward time against rows, published (points) and projected", fontsize=8)
        ax.legend(fontsize=5, ncol=2)
        fig.tight_layout()
        path = out_dir / f"forward_{device}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def devices_section(params: dict) -> str:
    """The CUDA section of devices.toml: every GPU's spec sheet and its architecture's fitted values."""
    lines = [SECTION + ": generated by `python -m specnative.analysis.projection.cuda_calibration --write-devices`.",
             "# Peaks from the spec sheets (dense, no sparsity): tflops.float FP16 tensor (cuBLAS, MMF),",
             "# legacy/kquant INT8 (MMQ: tensor cores from Turing on, dp4a on Pascal sm_61 and Volta), vector_tflops",
             "# FP32 (MMVQ, MMVF). Per architecture fitted on llama.cpp's published CUDA figures only (the CUDA",
             "# scoreboard, pull requests #15131 and #26079): bw_efficiency, mmq_bw_efficiency, compute_efficiency,",
             "# overhead_forward_us; shared by all: overhead_layer_us, mmvq_column_ops. Validation per source:",
             "# bench/results/projection/cuda/README.md.", ""]
    for name, (bw, sms, clock, fp32, fp16, int8, cc, label, match) in pub.GPUS.items():
        d = device_for(name, params)
        arch = pub.arch_of(name)
        fitted_on = arch if arch in params["arch"] else pub.ARCH_FALLBACK.get(arch, "the prior")
        ops = ", ".join(f"{k} = {v:.4g}" for k, v in d.mmvq_column_ops.items())
        lines += [f"[{name}]", f'label = "{label}"', 'backend = "cuda"', f"compute_capability = {cc}",
                  f"mem_bw_gbs = {bw}", f"tflops = {{ float = {fp16}, legacy = {int8}, kquant = {int8} }}",
                  f"vector_tflops = {fp32}", f"bw_efficiency = {d.bw_efficiency:.4f}",
                  f"compute_efficiency = {d.compute_efficiency:.4f}", f"mmq_bw_efficiency = {d.mmq_bw_efficiency:.4f}",
                  f"mmvq_column_ops = {{ {ops} }}", f"overhead_forward_us = {d.overhead_forward_us:.1f}",
                  f"overhead_layer_us = {d.overhead_layer_us:.2f}", "cost_error = 0.15",
                  f"match = [{', '.join(repr(m).replace(chr(39), chr(34)) for m in match)}]",
                  (f'source = "spec sheet ({bw} GB/s, {sms} SMs at {clock} GHz, FP32 {fp32}, FP16 tensor {fp16}, INT8 '
                   f'{int8} TFLOPS dense, sm_{round(cc * 10)}); efficiencies and fixed costs: the {fitted_on} fit '
                   f'on llama.cpp\'s CUDA scoreboard and pull requests #15131 and #26079"'), ""]
    return "\n".join(lines)


def write_devices(params: dict, path: Path = SHIPPED) -> None:
    text = path.read_text()
    head = text.split(SECTION)[0].rstrip() + "\n\n"
    path.write_text(head + devices_section(params))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specnative.analysis.projection.cuda_calibration")
    p.add_argument("--out", type=Path, required=True, help="folder for README.md and predictions.csv")
    p.add_argument("--write-devices", action="store_true", help="rewrite the CUDA section of the shipped devices.toml")
    args = p.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    command = "python -m specnative.analysis.projection.cuda_calibration --out " + str(args.out) + (
        " --write-devices" if args.write_devices else "")
    result = validate(pub.rows())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "README.md").write_text(report(result, command, commit or "?"))
    import csv

    with (args.out / "predictions.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["source", "curve", "device", "model", "type", "test", "n_ubatch", "kernel", "role",
                    "published_tps", "predicted_full_fit", "error_full_fit"])
        for r, pred, e in result["in_sample"] + result["test"]:
            w.writerow([r.source, r.curve, r.device, r.model, r.weight_type, r.test, r.n_ubatch, r.kernel, r.role,
                        r.tps, f"{pred:.2f}", f"{e:.4f}"])
    figures(result["in_sample"] + result["test"], args.out)
    if args.write_devices:
        write_devices(result["full"])
    print((args.out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
