"""Metal's matrix-vector kernels against llama.cpp's published small-batch curves: forward time over
one row's, T(n)/T(1), for n = 2..8 (llama-bench pp1..pp8, flash attention on), from the tables of
pull request #10581, which introduced the vendored small-batch kernels (mul_mv_ext). Two chips: an
M1 Pro, and a chip the copied part of the thread does not name, whose one-row speed puts it in the
M2 Ultra's class (it is priced as the shipped m2-ultra device).

The bandwidth and compute efficiency of each chip come from the Apple-silicon fit (pp512 and tg128,
bench/projection_published.py; the M1 Pro with the M2 Pro's, as there); the curves fit only what they
alone show, shared by every chip (metal.py): mul_mv_ext's operations per element and row for the
legacy types, Q8_0 and the k-quants, mul_mv's beyond one row, and the share of a weight stream each further
pass costs. Validation: each chip's curves predicted by a fit on the other's (leave one chip out), and
each curve by a fit on the rest (leave one curve out). Rows without a pp1 (no ratio) are predicted in
tokens/s as tests (they depend on the one-row fit as well).

    python bench/projection_metal_curves.py [--out bench/results/projection/metal-curves] [--write-devices]

--write-devices writes the fit into every Metal device of the shipped devices table.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from specnative.analysis.projection import cost
from specnative.analysis.projection.device import SHIPPED, resolve
from specnative.analysis.projection.shape import from_config
from specnative.record.provenance import source_commit

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "projection" / "metal-curves"


def _cfg(name, hidden, layers, heads, kv, ff, vocab, tied):
    return dict(_name_or_path=name, model_type="llama", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=ff, vocab_size=vocab,
                tie_word_embeddings=tied)


# The models the tables name, from their published configs (llama-bench prints family and size only)
MODELS = {
    "qwen2 7B": _cfg("Qwen2.5-Coder-7B", 3584, 28, 28, 4, 18944, 152064, False),
    "qwen2 14B": _cfg("Qwen2.5-Coder-14B", 5120, 48, 40, 8, 13824, 152064, False),
    "qwen2 32B": _cfg("Qwen2.5-Coder-32B", 5120, 64, 40, 8, 27648, 152064, False),
    "llama 3B": _cfg("Llama-3.2-3B", 3072, 28, 24, 8, 8192, 128256, True),
    "llama 7B": _cfg("Llama-2-7B", 4096, 32, 32, 32, 11008, 32000, False),
    "llama 13B": _cfg("Llama-2-13B", 5120, 40, 40, 40, 13824, 32000, False),
}
PARAMS = ("ext_ops_legacy", "ext_ops_q8_0", "ext_ops_kquant", "mv_column_ops", "matvec_pass_share")
PRIOR = np.array([4.0, 4.0, 4.0, 4.0, 0.5])
BOUNDS = ([0.0] * 5, [200.0, 200.0, 200.0, 200.0, 1.0])


def devices() -> dict:
    m2_ultra, = resolve("m2-ultra")
    m2_pro, = resolve("m2-pro")
    m1_pro = dataclasses.replace(m2_pro, name="m1-pro", label="Apple M1 Pro (16-core GPU)", mem_bw_gbs=200.0,
                                 tflops={"float": 16 * 128 * 2 * 1.278 / 1e3},
                                 source="spec sheet (200 GB/s; 16 cores x 128 ALUs x 2 x 1.278 GHz); "
                                        "efficiencies of the fitted M2 Pro")
    return {"M1 Pro": m1_pro, "unnamed (M2 Ultra class)": m2_ultra}


def with_params(device, p):
    ext_legacy, ext_q8_0, ext_kquant, mv_ops, share = p
    ops = {"legacy": ext_legacy, "Q8_0": ext_q8_0, "kquant": ext_kquant, "float": ext_legacy}
    return dataclasses.replace(device, mmvq_column_ops=ops,
                               mv_column_ops=mv_ops, matvec_pass_share=share)


def forward_s(shape, device, n):
    return cost.forward_s(shape, device, n, 1, n_kv=n, logits_rows=1, flash_attn=True)


def curves(rows) -> dict:
    """(chip, model, type) -> {n: tokens/s} (pp1 rows run twice are averaged)."""
    out: dict = {}
    for r in rows:
        key = (r["chip"], r["model"], r["type"])
        n = int(r["test"][2:])
        out.setdefault(key, {}).setdefault(n, []).append(float(r["tps"]))
    return {k: {n: statistics.mean(v) for n, v in c.items()} for k, c in out.items()}


class Curve:
    def __init__(self, key, tps, device):
        self.key, self.tps, self.device = key, tps, device
        self.shape = from_config(MODELS[key[1]], key[2])

    def published_ratio(self, n):
        return n * self.tps[1] / self.tps[n]

    def ratio(self, p, n):
        d = with_params(self.device, p)
        return forward_s(self.shape, d, n) / forward_s(self.shape, d, 1)

    def residuals(self, p):
        return [np.log(self.ratio(p, n) / self.published_ratio(n)) for n in sorted(self.tps) if n > 1]


def fit(curve_list):
    def residuals(p):
        res = [x for c in curve_list for x in c.residuals(p)]
        return np.array(res + list(0.05 * (p - PRIOR) / np.maximum(PRIOR, 1e-9)))
    return least_squares(residuals, PRIOR, bounds=BOUNDS).x


def pct(a, b):
    return 100.0 * (a / b - 1.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--write-devices", action="store_true", help="write the fit into the shipped Metal devices")
    args = ap.parse_args(argv)
    rows = list(csv.DictReader(open(args.out / "published.csv")))
    devs = devices()
    all_curves = curves(rows)
    ratio_curves = [Curve(k, c, devs[k[0]]) for k, c in all_curves.items() if 1 in c and len(c) > 1]
    full = fit(ratio_curves)
    loco = {chip: fit([c for c in ratio_curves if c.key[0] != chip]) for chip in devs}
    lo1 = {c.key: fit([o for o in ratio_curves if o is not c]) for c in ratio_curves}
    table = []
    for c in ratio_curves:
        for n in sorted(c.tps):
            if n == 1:
                continue
            pub = c.published_ratio(n)
            table.append(dict(chip=c.key[0], model=c.key[1], type=c.key[2], n_rows=n,
                              kernel=cost.forward(c.shape, with_params(c.device, full), n).kernel,
                              published_ratio=round(pub, 3), fitted_ratio=round(c.ratio(full, n), 3),
                              error_pct=round(pct(c.ratio(full, n), pub), 1),
                              leave_chip_out_error_pct=round(pct(c.ratio(loco[c.key[0]], n), pub), 1),
                              leave_curve_out_error_pct=round(pct(c.ratio(lo1[c.key], n), pub), 1)))
    tests = []
    for key, tps in all_curves.items():
        if 1 in tps:
            continue
        c = Curve(key, tps, devs[key[0]])
        d = with_params(c.device, full)
        for n, t in sorted(tps.items()):
            predicted = n / forward_s(c.shape, d, n)
            tests.append(dict(chip=key[0], model=key[1], type=key[2], n_rows=n,
                              kernel=cost.forward(c.shape, d, n).kernel, published_tps=t,
                              predicted_tps=round(predicted, 2), error_pct=round(pct(predicted, t), 1)))
    mm_tests = matrix_matrix_tests(all_curves, rows, devs, full)
    for name, data in (("ratios.csv", table), ("tests.csv", tests), ("matrix_matrix_tests.csv", mm_tests)):
        with open(args.out / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(data[0]))
            w.writeheader()
            w.writerows(data)
    write_readme(args.out, full, loco, table, tests, mm_tests)
    if args.write_devices:
        write_devices(SHIPPED, full)
    print(f"fit: {dict(zip(PARAMS, np.round(full, 3)))}")
    for col in ("error_pct", "leave_chip_out_error_pct", "leave_curve_out_error_pct"):
        print(f"{col}: median |error| {statistics.median(abs(r[col]) for r in table):.1f} %")
    return 0


def matrix_matrix_tests(all_curves, rows, devs, p) -> list:
    """The build before the small-batch kernels (the tables' first t/s column) ran mul_mm from 5 rows
    on: its pp5..pp8 over its pp1 test the matrix-matrix kernel's price at a few rows, priced with
    the efficiency fitted on pp512 (nothing fitted here)."""
    before = curves([dict(r, tps=r["tps_before"]) for r in rows])
    out = []
    for key, tps in before.items():
        if 1 not in tps:
            continue
        c = Curve(key, tps, devs[key[0]])
        d = with_params(c.device, p)
        one = forward_s(c.shape, d, 1)
        for n in (n for n in sorted(tps) if n >= 5):
            mm = cost.forward_s(c.shape, d, n, 1, n_kv=n, logits_rows=1, flash_attn=True, kernel="mul_mm")
            out.append(dict(chip=key[0], model=key[1], type=key[2], n_rows=n, published_ratio=round(c.published_ratio(n), 3),
                            predicted_ratio=round(mm / one, 3), error_pct=round(pct(mm / one, c.published_ratio(n)), 1)))
    return out


DEVICE_KEYS = ("mmvq_column_ops", "mv_column_ops", "matvec_pass_share")
SOURCE_NOTE = "; matrix-vector curves: fit to llama.cpp pull request #10581's tables (bench/results/projection/metal-curves)"


def write_devices(path: Path, p) -> None:
    """Every Metal device of the devices table gets the fitted matrix-vector parameters (after its
    per-layer overhead) and names the fit in its source; other devices are left as they are."""
    ext_legacy, ext_q8_0, ext_kquant, mv_ops, share = (round(float(v), 3) for v in p)
    block = [f"mmvq_column_ops = {{ legacy = {ext_legacy}, Q8_0 = {ext_q8_0}, kquant = {ext_kquant}, float = {ext_legacy} }}",
             f"mv_column_ops = {mv_ops}", f"matvec_pass_share = {share}"]
    out, section = [], []

    def flush():
        metal = any(line.strip() == 'backend = "metal"' for line in section)
        for line in section:
            if metal and line.split(" =")[0] in DEVICE_KEYS:
                continue
            if metal and line.startswith("source = ") and SOURCE_NOTE not in line:
                line = line[:-1] + SOURCE_NOTE + '"'
            out.append(line)
            if metal and line.startswith("overhead_layer_us"):
                out.extend(block)
        section.clear()

    for line in path.read_text().splitlines():
        if line.startswith("["):
            flush()
        section.append(line)
    flush()
    path.write_text("\n".join(out) + "\n")


def write_readme(out: Path, full, loco, table, tests, mm_tests) -> None:
    med = lambda col, rows: statistics.median(abs(r[col]) for r in rows)  # noqa: E731
    lines = ["# Metal: the small-batch curves of llama.cpp's matrix-vector kernels", "",
             "`python bench/projection_metal_curves.py` (this folder: `published.csv` the copied figures, "
             "`ratios.csv` every fitted row with its errors, `tests.csv` the rows without a pp1).", "",
             f"Commit: {source_commit('unknown')}. Nothing here is measured on this host: the figures are llama.cpp's, "
             "the predictions the projection's Metal model (src/specnative/analysis/projection/metal.py).", "",
             "**Fit** (shared by every chip; each chip's bandwidth and compute efficiency stay those of the "
             "Apple-silicon fit): " + ", ".join(f"`{n}` {v:.3g}" for n, v in zip(PARAMS, full)) + ".", "",
             "| held out | fitted on | median abs error of T(n)/T(1) |", "|---|---|---|",
             f"| nothing (in sample) | every curve | {med('error_pct', table):.1f} % |"]
    for chip in loco:
        rows = [r for r in table if r["chip"] == chip]
        lines.append(f"| {chip} | the other chip's curves | {med('leave_chip_out_error_pct', rows):.1f} % |")
    lines.append(f"| each curve | the other curves | {med('leave_curve_out_error_pct', table):.1f} % |")
    lines += ["", "| chip | model | type | rows | kernel | published T(n)/T(1) | fitted | error | chip out | curve out |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['chip']} | {r['model']} | {r['type']} | {r['n_rows']} | {r['kernel']} | "
                     f"{r['published_ratio']} | {r['fitted_ratio']} | {r['error_pct']:+.1f} % | "
                     f"{r['leave_chip_out_error_pct']:+.1f} % | {r['leave_curve_out_error_pct']:+.1f} % |")
    if tests:
        lines += ["", f"Tests in tokens/s (no pp1 in the copied rows; median abs error {med('error_pct', tests):.1f} %):", "",
                  "| chip | model | type | rows | kernel | published t/s | predicted | error |", "|---|---|---|---|---|---|---|---|"]
        for r in tests:
            lines.append(f"| {r['chip']} | {r['model']} | {r['type']} | {r['n_rows']} | {r['kernel']} | "
                         f"{r['published_tps']} | {r['predicted_tps']} | {r['error_pct']:+.1f} % |")
    if mm_tests:
        lines += ["", "Tests of the matrix-matrix kernel at a few rows: the build before the small-batch kernels ran "
                  f"mul_mm from 5 rows on (the tables' first t/s column; median abs error {med('error_pct', mm_tests):.1f} %):", "",
                  "| chip | model | type | rows | published T(n)/T(1) | predicted (mul_mm) | error |", "|---|---|---|---|---|---|---|"]
        for r in mm_tests:
            lines.append(f"| {r['chip']} | {r['model']} | {r['type']} | {r['n_rows']} | {r['published_ratio']} | "
                         f"{r['predicted_ratio']} | {r['error_pct']:+.1f} % |")
    (out / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
