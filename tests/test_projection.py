"""The projection: model shapes, the cost model, the fit, the devices table and `specnative project`
on tiny runs (labels, intervals, refusals that change no file)."""
from __future__ import annotations

import hashlib
import math
from dataclasses import replace

import numpy as np
import pytest
from synthetic_traces import PROVENANCE, grid_rows, off_row, write_run

from specnative.analysis.projection import cost, fit
from specnative.analysis.projection.cost import LABEL
from specnative.analysis.projection.device import Device, DeviceError, from_gpu_name, load_devices, resolve
from specnative.analysis.projection.project import tau_interval
from specnative.analysis.projection.shape import from_config, from_gguf
from specnative.cli import main as cli_main

LLAMA_7B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny_models(projection_models):
    return projection_models


def tiny_run(tmp_path, models, rows=None):
    rows = rows if rows is not None else grid_rows(target_model="pt.gguf", draft_model="pd.gguf")
    for r in rows:
        r["target_model"] = "pt.gguf"
        r["target_sha256"] = hashlib.sha256((models / "pt.gguf").read_bytes()).hexdigest()
        if r["spec_decode"] == "on":
            r["draft_model"] = "pd.gguf"
            r["draft_sha256"] = hashlib.sha256((models / "pd.gguf").read_bytes()).hexdigest()
    prov = dict(PROVENANCE, models=[])
    return write_run(tmp_path / "run", rows, prov)


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_shape_from_gguf_counts_every_tensor_byte(tiny_models):
    import gguf

    shape = from_gguf(tiny_models / "pt.gguf")
    reader = gguf.GGUFReader(str(tiny_models / "pt.gguf"))
    assert shape.total_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert (shape.n_layer, shape.n_embd, shape.n_vocab) == (4, 64, 1024)
    assert shape.elements_of("layer") == 4 * (4 * 64 * 64 + 3 * 64 * 128)


@pytest.mark.parametrize("weight_type, gib", [("F16", 12.55), ("Q8_0", 6.67), ("Q4_0", 3.56)])
def test_shape_from_config_matches_llamacpp_file_sizes(weight_type, gib):
    # llama.cpp's table lists LLaMA 7B at these sizes (llama-bench's GiB column)
    assert from_config(LLAMA_7B, weight_type).total_bytes / 2**30 == pytest.approx(gib, abs=0.01)


def test_verify_costs_little_on_a_bandwidth_bound_gpu_and_a_lot_on_a_cpu():
    shape = from_config(LLAMA_7B, "Q4_0")
    gpu, = resolve("h100-sxm")
    cpu = Device("cpu", "cpu", "cpu", 20.0, {"float": 0.01, "legacy": 0.02, "kquant": 0.02}, threads=2)
    on_gpu = cost.step_costs(shape, gpu, k=4)
    on_cpu = cost.step_costs(shape, cpu, k=4)
    assert on_gpu.verify_ratio < 1.5 < on_cpu.verify_ratio  # the GPU's matrix-vector kernel redoes its columns
    assert cost.step_costs(shape, gpu, 4, ctx=32768).step_s > on_gpu.step_s  # KV reads grow with context
    assert cost.step_costs(shape, gpu, 4, draft=None).c_draft == 0  # an n-gram lookup costs nothing


def test_fit_recovers_parameters_it_generated():
    shape = from_config(LLAMA_7B, "Q8_0")
    truth = Device("d", "d", "metal", 400.0, {"float": 10.0}, bw_efficiency=0.7, compute_efficiency=0.4,
                   overhead_layer_us=30.0)
    obs = [fit.Observation("d", (lambda n: lambda d: cost.forward_s(shape, d, n))(n), cost.forward_s(shape, truth, n))
           for n in (1, 2, 8, 64, 256, 512)]
    start = Device("d", "d", "metal", 400.0, {"float": 10.0}, bw_efficiency=0.9, compute_efficiency=0.9,
                   overhead_layer_us=5.0)
    fitted, _ = fit.fit({"d": start}, [("d", "bw_efficiency"), ("d", "compute_efficiency"), ("d", "overhead_layer_us")], obs)
    assert all(abs(e) < 0.01 for _, _, e in fit.errors(fitted, obs))
    assert fitted["d"].compute_efficiency == pytest.approx(0.4, rel=0.05)


def test_tau_interval_holds_the_iid_closed_form():
    alpha, k = 0.7, 4
    hist = [1000 * alpha ** j * (1 - alpha) for j in range(k)] + [1000 * alpha ** k]
    tau, lo, hi = tau_interval(np.round(hist))
    assert tau == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha), rel=0.01)
    assert lo < tau < hi
    _, lo_small, hi_small = tau_interval(np.round(np.array(hist) / 10))
    assert hi_small - lo_small > hi - lo  # fewer rounds, wider interval


def test_devices_table_sources_user_file_and_gpu_names(tmp_path):
    table = load_devices()
    assert {"m2", "m2-pro", "m2-max", "m2-ultra", "h100-sxm"} <= set(table)
    assert all(d.source for d in table.values())
    assert from_gpu_name("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert from_gpu_name("Some Other GPU") is None
    mine = tmp_path / "mine.toml"
    mine.write_text('[lab-gpu]\nbackend = "cuda"\nmem_bw_gbs = 500\ntflops = { float = 50 }\nsource = "ours"\n'
                    '[m2]\nbackend = "metal"\nmem_bw_gbs = 1\ntflops = { float = 1 }\n')
    lab, m2 = resolve("lab-gpu,m2", mine)
    assert lab.mem_bw_gbs == 500 and m2.mem_bw_gbs == 1  # the user's entries win
    bad = tmp_path / "bad.toml"
    bad.write_text('[x]\nbackend = "tpu"\nmem_bw_gbs = 1\ntflops = { float = 1 }\n')
    with pytest.raises(DeviceError, match="backend"):
        resolve("x", bad)


def test_project_labels_every_line_and_file_and_keeps_the_run(tmp_path, tiny_models, capsys):
    run = tiny_run(tmp_path, tiny_models)
    before = digest(run)
    out = tmp_path / "proj"
    rc = cli_main(["project", str(run), "--hardware", "m2,h100-sxm,rtx-4090", "--models", str(tiny_models),
                   "-o", str(out)])
    printed = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert printed and all(line.startswith(LABEL) for line in printed)
    assert digest(run) == before  # traces.csv and provenance untouched
    import pandas as pd

    df = pd.read_csv(out / "projection.csv")
    assert set(df["label"]) == {LABEL}
    assert set(df["device"]) == {"m2", "h100-sxm", "rtx-4090"} and len(df) == 3 * 6
    assert (df["speedup_lo"] <= df["speedup"]).all() and (df["speedup"] <= df["speedup_hi"]).all()
    # the interval holds tau's interval widened by the cost error
    row = df.iloc[0]
    assert row["speedup_lo"] == pytest.approx(row["tau_lo"] / ((1 + row["c"]) * (1 + row["cost_error"])), rel=1e-6)
    assert row["tau"] == pytest.approx((1 - 0.8 ** 5) / 0.2, rel=0.01)
    md = (out / "projection.md").read_text()
    assert all(LABEL in line for line in md.splitlines() if line.startswith("|") and "---" not in line)
    assert (out / "projection_speedup.png").stat().st_size > 0


@pytest.mark.parametrize("case", ["unknown-hardware", "no-alpha", "no-model"])
def test_project_refuses_in_one_line_and_writes_nothing(tmp_path, tiny_models, capsys, case):
    rows = grid_rows()
    if case == "no-alpha":
        rows = [r for r in rows if r["spec_decode"] == "off"] + [
            dict(r, accept_len_hist="", accept_at_pos="") for r in rows if r["spec_decode"] == "on"]
    run = tiny_run(tmp_path, tiny_models, rows)
    before = digest(tmp_path)
    args = ["project", str(run), "--hardware", "m9" if case == "unknown-hardware" else "m2", "-o", str(tmp_path / "proj")]
    if case != "no-model":
        args += ["--models", str(tiny_models)]
    assert cli_main(args) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert {"unknown-hardware": "unknown hardware", "no-alpha": "acceptance by position",
            "no-model": "not found"}[case] in captured.err
    assert digest(tmp_path) == before and not (tmp_path / "proj").exists()


def test_prefill_and_decode_rate_are_consistent():
    shape = from_config(LLAMA_7B, "Q4_0")
    dev, = resolve("m2-max")
    assert cost.decode_rate(shape, dev, 128) == pytest.approx(1 / cost.forward_s(shape, dev, 1, 1, 64), rel=0.05)
    assert 512 / cost.prefill_s(shape, dev, 512) > 5 * cost.decode_rate(shape, dev)
    assert not math.isnan(cost.speedup(2.0, cost.step_costs(shape, dev, 4)))
    assert off_row()["spec_decode"] == "off"


def test_cpu_rates_by_type_and_the_gemv_to_gemm_switch():
    shape = from_config(LLAMA_7B, "Q4_0")
    cpu = Device("cpu", "cpu", "cpu", 10.0, {"float": 0.01, "legacy": 0.01, "Q4_0": 0.04}, threads=1,
                 batched_bw_efficiency=0.25)
    assert cpu.rate("legacy", 1, "Q4_0") == 4 * cpu.rate("legacy", 1, "Q5_0")  # a type's own kernel wins
    one, two = cost.forward(shape, cpu, 1), cost.forward(shape, cpu, 2)
    assert two.weights_s > 3 * one.weights_s  # from two rows on, the tiled paths re-stream the weights
    assert cpu.with_threads(2).bandwidth == 2 * cpu.bandwidth  # per-thread streaming


def test_cpu_serial_share_spans_the_sum_and_the_roofline_max(tmp_path):
    shape = from_config(LLAMA_7B, "Q4_0")
    base = Device("cpu", "cpu", "cpu", 10.0, {"float": 0.01, "legacy": 0.01}, threads=1)
    times = [cost.forward(shape, replace(base, serial_share=s), 1).weights_s for s in (1.0, 0.5, 1e-9)]
    assert times[0] > times[1] > times[2]  # less serial work, less time
    gpu_like = cost.forward(shape, replace(base, backend="metal"), 1).weights_s
    assert times[2] == pytest.approx(gpu_like, rel=1e-6)  # no serial share: the roofline's max
    f = tmp_path / "dev.toml"
    f.write_text('[c]\nbackend = "cpu"\nmem_bw_gbs = 10\ntflops = { float = 0.01 }\nserial_share = 1.5\n')
    with pytest.raises(DeviceError, match="serial_share"):
        load_devices(f)


def test_cpu_per_dot_and_per_score_costs_follow_rows_and_cached_positions(tmp_path, tiny_models):
    shape = from_config(LLAMA_7B, "Q4_0")
    assert shape.weights and sum(w.n_rows for w in shape.weights if w.role == "layer") == 32 * (5 * 4096 + 2 * 11008)  # q k v o down, gate up
    gguf_shape = from_gguf(tiny_models / "pt.gguf")  # rows from each tensor's inner length
    assert sum(w.n_rows for w in gguf_shape.weights if w.role == "layer") == 4 * (5 * 64 + 2 * 128)
    base = Device("cpu", "cpu", "cpu", 10.0, {"float": 0.01, "legacy": 0.01}, threads=1)
    dots = replace(base, dot_ns=2.0)
    extra = cost.forward(shape, dots, 3, 2).weights_s - cost.forward(shape, base, 3, 2).weights_s
    rows = sum(w.n_rows for w in shape.weights if w.role in ("layer", "output"))
    assert extra == pytest.approx(rows * 6 * 2e-9, rel=1e-9)  # every weight row meets every activation row
    assert cost.forward(shape, dots.with_threads(2), 3, 2).weights_s < cost.forward(shape, dots, 3, 2).weights_s
    scores = replace(base, attention_score_ns=1.0)
    added = [cost.forward(shape, scores, 1, 1, n_kv).attention_s - cost.forward(shape, base, 1, 1, n_kv).attention_s
             for n_kv in (1000, 2000)]
    assert added[1] == pytest.approx(2 * added[0], rel=1e-9)  # linear in the cached positions
    assert added[0] == pytest.approx(32 * 32 * 1000 * 1e-9, rel=1e-9)
    assert cost.forward(shape, replace(base, backend="metal", attention_score_ns=1.0, dot_ns=1.0), 1, 1, 1000).total_s \
        == pytest.approx(cost.forward(shape, replace(base, backend="metal"), 1, 1, 1000).total_s)  # CPU terms only
    f = tmp_path / "dev.toml"
    f.write_text('[c]\nbackend = "cpu"\nmem_bw_gbs = 10\ntflops = { float = 0.01 }\ndot_ns = -1\n')
    with pytest.raises(DeviceError, match="dot_ns"):
        load_devices(f)


def test_project_leaves_out_synthetic_acceptance_rows(tmp_path, tiny_models, capsys):
    rows = grid_rows()
    rows += [dict(r, synthetic_acceptance="0.9", lossless_ok="", cell_id=r["cell_id"] + "-synthetic")
             for r in rows if r["spec_decode"] == "on"][:2]
    run = tiny_run(tmp_path, tiny_models, rows)
    assert cli_main(["project", str(run), "--hardware", "m2", "--models", str(tiny_models), "-o", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "2 synthetic-acceptance row(s) left out" in out
    import pandas as pd

    assert len(pd.read_csv(tmp_path / "p" / "projection.csv")) == 6  # the six measured regimes only


# llama.cpp's Apple-silicon table (discussion #4167), LLaMA 7B tg128 t/s: F16, Q8_0, Q4_0
M2_TG128 = {"m2": (6.72, 12.21, 21.91), "m2-pro": (12.47, 22.70, 37.87), "m2-max": (24.16, 39.97, 60.99),
            "m2-ultra": (39.86, 62.14, 88.64)}


@pytest.mark.parametrize("device", sorted(M2_TG128))
def test_shipped_m2_devices_predict_the_published_decode_rates(device):
    dev, = resolve(device)
    for weight_type, published in zip(("F16", "Q8_0", "Q4_0"), M2_TG128[device]):
        predicted = cost.decode_rate(from_config(LLAMA_7B, weight_type), dev, 128)
        assert abs(predicted / published - 1) < 0.25, (device, weight_type, predicted, published)


def test_cpu_one_row_rates_enter_only_one_row_products(tmp_path):
    shape = from_config(LLAMA_7B, "Q4_0")
    base = Device("cpu", "cpu", "cpu", 10.0, {"float": 0.01, "legacy": 0.01, "Q4_0": 0.02}, threads=1)
    gemv = replace(base, matvec_tflops={"legacy": 0.005, "Q4_0": 0.04})
    assert gemv.rate("legacy", 1, "Q4_0") == 2 * base.rate("legacy", 1, "Q4_0")  # the type's own one-row kernel
    assert gemv.rate("legacy", 1, "Q5_0") == base.rate("legacy", 1, "Q5_0") / 2  # its class's one-row kernel
    assert gemv.rate("float", 1, "F16") == base.rate("float", 1, "F16")  # a class it does not name: the tiled rate
    assert gemv.rate("legacy", 2, "Q4_0") == base.rate("legacy", 2, "Q4_0")  # two rows on: the tiled rates
    assert cost.forward(shape, gemv, 1).weights_s < cost.forward(shape, base, 1).weights_s
    assert cost.forward(shape, gemv, 3, 2).weights_s == cost.forward(shape, base, 3, 2).weights_s
    assert cost.forward(shape, gemv.with_threads(2), 1).weights_s < cost.forward(shape, gemv, 1).weights_s
    assert fit.get_param(fit.set_param(gemv, "matvec_tflops.Q4_0", 0.08), "matvec_tflops.Q4_0") == 0.08
    f = tmp_path / "dev.toml"
    for bad, match in (('matvec_tflops = { Q4_0 = -1 }', "positive"), ('matvec_tflops = { nope = 1 }', "nope")):
        f.write_text(f'[c]\nbackend = "cpu"\nmem_bw_gbs = 10\ntflops = {{ float = 0.01 }}\n{bad}\n')
        with pytest.raises(DeviceError, match=match):
            load_devices(f)
    f.write_text('[g]\nbackend = "cuda"\nmem_bw_gbs = 10\ntflops = { float = 1 }\nmatvec_tflops = { Q4_0 = 1 }\n')
    with pytest.raises(DeviceError, match="CPUs only"):
        load_devices(f)
    f.write_text('[c]\nbackend = "cpu"\nmem_bw_gbs = 10\ntflops = { float = 0.01 }\nmatvec_tflops = { Q4_0 = 0.03 }\n')
    assert load_devices(f)["c"].rate("legacy", 1, "Q4_0") == pytest.approx(0.03e12)


def test_cpu_memory_system_caps_the_threads_streaming_together(tmp_path):
    shape = from_config(LLAMA_7B, "Q4_0")
    free = Device("cpu", "cpu", "cpu", 10.0, {"float": 0.01, "legacy": 0.01}, threads=1, batched_bw_efficiency=0.4)
    capped = replace(free, bw_threads_max=1.25)
    assert capped.bandwidth == free.bandwidth  # one thread streams below the cap
    assert cost.forward(shape, capped, 1).total_s == cost.forward(shape, free, 1).total_s
    two_free, two = free.with_threads(2), capped.with_threads(2)
    assert two_free.bandwidth == 2 * free.bandwidth
    assert two.bandwidth == pytest.approx(1.25 * free.bandwidth)  # two one-row streams meet the cap
    assert two.weight_bandwidth(4) == two_free.weight_bandwidth(4)  # two tiled streams (2 x 0.4) stay below it
    assert cost.forward(shape, two, 1).total_s > cost.forward(shape, two_free, 1).total_s
    nine = cost.forward(shape, replace(two, bw_threads_max=1.9), 9).weights_s  # the matrices' tiled streams: no cap
    assert nine == pytest.approx(cost.forward(shape, two_free, 9).weights_s, rel=1e-5)  # (norms: one-row reads)
    assert nine > cost.forward(shape, two_free, 9).weights_s
    gpu = replace(free, backend="metal", bw_threads_max=1.25, threads=1)
    assert gpu.bandwidth == free.bandwidth
    f = tmp_path / "dev.toml"
    for bad in ("0.5", "-1"):
        f.write_text(f'[c]\nbackend = "cpu"\nmem_bw_gbs = 10\ntflops = {{ float = 0.01 }}\nbw_threads_max = {bad}\n')
        with pytest.raises(DeviceError, match="bw_threads_max"):
            load_devices(f)
