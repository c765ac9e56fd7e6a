"""The Metal cost model: the kernel the vendored ggml-metal selects per (type, rows, row length), the
cost of each kernel family, and what `project --bench` reports for an Apple chip."""
import dataclasses
import json

import pytest

from specnative.analysis.projection import cost, metal
from specnative.analysis.projection import cuda_published as pub
from specnative.analysis.projection.device import DeviceError, resolve
from specnative.analysis.projection.shape import from_config
from specnative.report.projection_cli import main


def kernels(type_name, row_length=None, top=40):
    return [metal.select(type_name, n, row_length) for n in range(1, top + 1)]


def switches(type_name, row_length=None):
    ks = kernels(type_name, row_length)
    return {n + 1: ks[n] for n in range(1, len(ks)) if ks[n] != ks[n - 1]}


@pytest.mark.parametrize("type_name, expected", [
    ("Q4_0", {2: "mul_mv_ext", 9: "mul_mm"}), ("Q8_0", {2: "mul_mv_ext", 9: "mul_mm"}),
    ("F16", {2: "mul_mv_ext", 9: "mul_mm"}), ("IQ4_NL", {2: "mul_mv_ext", 9: "mul_mm"}),
    ("Q4_K", {4: "mul_mv_ext", 9: "mul_mm"}), ("Q6_K", {4: "mul_mv_ext", 9: "mul_mm"}),
    ("IQ2_XS", {9: "mul_mm"}),                  # no small-batch kernel: the matrix-vector one up to 8 rows
])
def test_each_kernel_is_chosen_where_the_vendored_source_chooses_it(type_name, expected):
    assert kernels(type_name)[0] == "mul_mv"
    assert switches(type_name) == expected
    assert metal.next_switch(type_name) == 9     # matrix-vector to matrix-matrix, whatever the type


def test_row_length_gates_the_small_batch_and_the_matrix_matrix_kernels():
    assert switches("Q4_0", row_length=4000) == {9: "mul_mm"}   # not a multiple of 128: mul_mv to 8 rows
    assert set(kernels("Q4_0", row_length=32)) == {"mul_mv"}    # shorter than 64: never mul_mm
    assert metal.next_switch("Q4_0", row_length=32) is None and metal.next_switch("Q4_0", row_length=4000) == 9
    with pytest.raises(ValueError, match="at least one row"):
        metal.select("Q4_0", 0)


@pytest.fixture
def m2_ultra():
    dev, = resolve("m2-ultra")
    return dev


def test_one_row_and_a_prompt_are_priced_as_the_apple_silicon_fit_priced_them(m2_ultra):
    """The fit of bandwidth and compute efficiency (tg128, pp512) saw the roofline's max; the kernel
    rules keep it at one row and at a whole number of 32-row tiles."""
    n_bytes, n_el = 3.6e9, 6.5e9
    bw, rate = m2_ultra.bandwidth, m2_ultra.rate("float", 512)
    assert metal.matmul_s(m2_ultra, "Q4_0", n_bytes, n_el, 1) == pytest.approx(max(n_bytes / bw, 2 * n_el / rate))
    assert metal.matmul_s(m2_ultra, "Q4_0", n_bytes, n_el, 512) == pytest.approx(max(n_bytes / bw, 2 * n_el * 512 / rate))


def test_matrix_vector_time_grows_with_every_row_and_each_further_pass_streams_again(m2_ultra):
    dev = dataclasses.replace(m2_ultra, mmvq_column_ops={"legacy": 8.0}, mv_column_ops=3.0, matvec_pass_share=0.5)
    stream = 3.6e9 / dev.bandwidth
    column = 6.5e9 * 8.0 / (dev.tflops["float"] * 1e12)
    times = {n: metal.matmul_s(dev, "Q4_0", 3.6e9, 6.5e9, n) for n in range(1, 41)}
    for n in range(2, 6):        # one threadgroup pass: the stream once, a column per row
        assert times[n] == pytest.approx(stream + n * column)
    for n in range(6, 9):        # 3 or 4 rows per threadgroup: two passes
        assert times[n] == pytest.approx(stream * 1.5 + n * column)
    assert all(times[n + 1] > times[n] for n in range(2, 8))
    assert times[9] == times[20] == times[32] < times[33]          # mul_mm: one tile of 32 rows, then two
    plain = metal.matmul_s(dev, "Q4_K", 3.6e9, 6.5e9, 3)           # a k-quant at 3 rows: mul_mv, a pass per row
    assert plain == pytest.approx(stream * 2.0 + 3 * 6.5e9 * 3.0 / (dev.tflops["float"] * 1e12))


def test_the_shipped_chips_price_the_published_curve_of_their_class(m2_ultra):
    """The fitted curve (bench/results/projection/metal-curves): Qwen2.5-Coder 7B Q4_0, pp1..pp8 on
    an M2 Ultra-class chip, T(n)/T(1) published 1.43 at 2 rows and 3.13 at 8; the matrix-matrix
    kernel at 9 rows costs more than the small-batch kernel at 8 (a 32-row tile of arithmetic)."""
    shape = from_config(dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                             intermediate_size=18944, vocab_size=152064), "Q4_0")
    t = {n: cost.forward_s(shape, m2_ultra, n, 1, n_kv=n, logits_rows=1, flash_attn=True) for n in (1, 2, 8, 9)}
    assert t[2] / t[1] == pytest.approx(1.43, rel=0.15)
    assert t[8] / t[1] == pytest.approx(3.13, rel=0.15)
    assert t[9] > t[8]


def test_a_kernel_that_cannot_run_is_refused_before_it_is_priced(m2_ultra):
    with pytest.raises(ValueError, match="unknown Metal kernel 'mmvq'"):
        metal.matmul_s(m2_ultra, "Q4_0", 3.6e9, 6.5e9, 4, kernel="mmvq")
    with pytest.raises(ValueError, match="at most 8 rows, not 9"):
        metal.matmul_s(m2_ultra, "Q4_0", 3.6e9, 6.5e9, 9, kernel="mul_mv_ext")


def test_a_forward_names_the_kernel_of_its_layer_matrices(m2_ultra):
    shape = from_config(pub.MODELS["llama2-7b"], "Q4_K")
    assert cost.forward(shape, m2_ultra, 1).kernel == "mul_mv"
    assert cost.forward(shape, m2_ultra, 3).kernel == "mul_mv"
    assert cost.forward(shape, m2_ultra, 5).kernel == "mul_mv_ext"
    assert cost.forward(shape, m2_ultra, 9).kernel == "mul_mm"


def test_the_matrix_vector_fields_are_refused_where_they_do_not_apply(tmp_path):
    f = tmp_path / "d.toml"
    f.write_text('[c]\nlabel = "c"\nbackend = "cpu"\nmem_bw_gbs = 10\ntflops = { float = 0.1 }\n'
                 'mmvq_column_ops = { legacy = 4 }\n')
    with pytest.raises(DeviceError, match="CUDA and Metal devices only"):
        resolve("c", f)
    gpu = '[g]\nlabel = "g"\nbackend = "{backend}"\nmem_bw_gbs = 100\ntflops = {{ float = 10 }}\n{line}\n'
    f.write_text(gpu.format(backend="cuda", line="mv_column_ops = 3"))
    with pytest.raises(DeviceError, match="mv_column_ops applies to Metal devices only"):
        resolve("g", f)
    f.write_text(gpu.format(backend="metal", line="matvec_pass_share = 1.5"))
    with pytest.raises(DeviceError, match="matvec_pass_share"):
        resolve("g", f)
    f.write_text(gpu.format(backend="metal", line="matvec_pass_share = 0.7"))
    assert resolve("g", f)[0].matvec_pass_share == 0.7


def test_bench_on_an_apple_chip_reports_metal_kernels(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(pub.MODELS["llama2-7b"]))
    assert main(["--bench", "pp1-10", "--model", str(config), "--type", "Q4_0", "--hardware", "m2-ultra",
                 "--output", "json"]) == 0
    by = {r["test"]: r for r in json.loads(capsys.readouterr().out)}
    assert by["pp1"]["kernel"] == "mul_mv" and by["pp8"]["kernel"] == "mul_mv_ext" and by["pp9"]["kernel"] == "mul_mm"
    ratios = [by[f"pp{n}"]["verify_ratio"] for n in range(1, 11)]
    assert ratios[0] == pytest.approx(1.0) and all(b >= a for a, b in zip(ratios, ratios[1:]))
