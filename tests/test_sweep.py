"""The sweep: traces.csv schema and values, lossless gate, resume after Ctrl-C, bad flags."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from conftest import TEST_NGL

from specnative.record import schema
from specnative.sweep import SweepConfig, main, run_sweep, runner


def small_config(pair, out_dir, **overrides) -> SweepConfig:
    target, draft = pair
    values = dict(targets=[target], draft=draft, ctx_lens=[0, 96], concurrencies=[1, 3], ks=[3],
                  n_predict=10, warmup=1, repeats=2, threads=1, gpu_layers=TEST_NGL, out_dir=out_dir,
                  report=False)
    values.update(overrides)
    return SweepConfig(**values)


@pytest.fixture(scope="module")
def small_run(noisy_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    traces = run_sweep(small_config(noisy_pair, out))
    return out, schema.read_traces(traces)


def test_columns_start_with_the_seed_schema_in_order(small_run):
    out, frame = small_run
    header = (out / "traces.csv").read_text().splitlines()[0].split(",")
    assert header[:9] == ["quant_bits", "spec_decode", "draft_accept_rate", "verify_cost_c",
                          "concurrency", "ctx_len", "tps", "lossless_ok", "seed"]
    assert tuple(header) == schema.COLUMN_NAMES


def test_types_and_one_off_and_on_row_per_cell(small_run):
    _, frame = small_run
    assert len(frame) == 2 * 2 * 2  # 4 cells x (off, on)
    assert frame["quant_bits"].dtype == "Int64" and set(frame["quant_bits"]) == {32}
    assert frame["lossless_ok"].dtype == "boolean" and frame["lossless_ok"].all()
    for _, cell in frame.groupby(["ctx_len", "concurrency"]):
        assert sorted(cell["spec_decode"]) == ["off", "on"]
    off, on = frame[frame.spec_decode == "off"], frame[frame.spec_decode == "on"]
    assert off["draft_accept_rate"].isna().all() and off["verify_cost_c"].isna().all()
    assert off["k"].isna().all() and off["draft_model"].isna().all()
    assert on["draft_accept_rate"].between(0, 1).all() and (on["k"] == 3).all()
    assert (frame["tps"] > 0).all()


def test_derived_columns_follow_their_definitions(small_run):
    _, frame = small_run
    on = frame[frame.spec_decode == "on"]
    for _, row in on.iterrows():
        off = frame[(frame.spec_decode == "off") & (frame.ctx_len == row.ctx_len)
                    & (frame.concurrency == row.concurrency)].iloc[0]
        assert row.tps_baseline == pytest.approx(off.tps, rel=1e-5)
        assert row.speedup == pytest.approx(row.tps / row.tps_baseline, rel=1e-4)
        assert row.verify_cost_c == pytest.approx(row.round_ms / off.step_ms - 1, rel=1e-4)
        assert row.draft_accept_rate == pytest.approx(row.accepted / row.drafted, rel=1e-5)
        assert row.mean_accept_len == pytest.approx(row.emitted / row.rounds, rel=1e-5)
        hist = [int(v) for v in row.accept_len_hist.split(";")]
        assert len(hist) == 4 and sum(hist) == row.rounds
        assert row.token_accept_rate == pytest.approx(row.accepted / (row.accepted + row.rejected), rel=1e-5)
        assert row.token_accept_rate >= row.draft_accept_rate
        alpha, k, c = row.token_accept_rate, 3, row.verify_cost_c
        per_round = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        assert row.predicted_speedup == pytest.approx(per_round / (1 + c), rel=1e-4)
    assert (frame[frame.spec_decode == "off"]["speedup"] == 1).all()


def test_provenance_records_models_build_and_command(small_run):
    out, _ = small_run
    record = json.loads((out / "provenance.json").read_text())
    assert record["completed"] is True
    assert record["llama_cpp_commit"].startswith("0c1e57098")
    assert record["warmup"] == 1 and record["repeats"] == 2
    roles = {m["role"]: m for m in record["models"]}
    assert len(roles["target"]["sha256"]) == 64 and roles["draft"]["quant_bits"] == 32
    assert record["cpu_model"] and record["date"]


def test_a_lossless_failure_keeps_its_row(noisy_pair, tmp_path):
    # Sampling with a spec seed different from the baseline's: the outputs must differ.
    cfg = small_config(noisy_pair, tmp_path, ctx_lens=[0], concurrencies=[2], temperatures=[0.8],
                       accept_rule="match", check_seed_offset=1)
    frame = schema.read_traces(run_sweep(cfg))
    on = frame[frame.spec_decode == "on"].iloc[0]
    assert not on.lossless_ok and on.lossless_method == "exact-seed"
    assert on.first_divergence >= 0 and not math.isnan(on.divergence_margin)
    assert on.tps > 0  # still measured


def test_rejection_cells_get_the_distributional_verdict_and_the_match_proxy(noisy_pair, tmp_path):
    cfg = small_config(noisy_pair, tmp_path, ctx_lens=[0], concurrencies=[1], temperatures=[0.8],
                       accept_rule="rejection", dist_positions=64)
    on = schema.read_traces(run_sweep(cfg)).query("spec_decode == 'on'").iloc[0]
    assert on.lossless_ok and on.lossless_method == "distribution" and on.accept_rule == "rejection"
    assert on.verdict == "exact-dist" and on.proxy_verdict in ("exact", "numeric") and on.dist_positions >= 64


def test_interrupted_sweep_resumes_without_losing_or_repeating_cells(noisy_pair, tmp_path, monkeypatch):
    target, draft = noisy_pair
    argv = ["-m", str(target), "-md", str(draft), "--ctx-len", "0,64", "-np", "1,2", "-k", "2",
            "-n", "6", "--warmup", "0", "-r", "1", "-t", "1", "-ngl", str(TEST_NGL), "-o", str(tmp_path), "--no-report"]
    real_measure, calls = runner.measure_cell, []

    def interrupt_third_cell(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(runner, "measure_cell", interrupt_third_cell)
    assert main(argv) == 130
    first = schema.read_traces(tmp_path / "traces.csv")
    assert len(first) == 4  # two finished cells
    monkeypatch.setattr(runner, "measure_cell", real_measure)
    with pytest.raises(SystemExit, match="--resume"):
        main(argv)  # refuses to overwrite
    assert main(argv + ["--resume"]) == 0
    final = schema.read_traces(tmp_path / "traces.csv")
    assert len(final) == 8 and final["cell_id"].is_unique
    pd.testing.assert_frame_equal(final.iloc[:4], first)


@pytest.mark.parametrize("argv, message", [
    (["--preset", "tiny", "-m", "x.gguf"], "--preset cannot"),
    (["-m", "t.gguf"], "both -m"),
    (["--concurrency", "0"], "concurrency"),
    (["--ctx-len", "0,0"], "duplicates"),
    (["--temp", "0.7", "--accept-rule", "greedy"], "greedy needs"),
    (["-k", "100", "-np", "8"], "batch-size"),
    (["--repeats", "0"], "repeats"),
    (["--resume"], "--resume needs --out"),
    (["-m", "missing.gguf", "-md", "missing-too.gguf"], "not found"),
])
def test_bad_flags_fail_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert message in str(exc.value.code) + capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--bogus"], ["--ctx-len", "abc"], ["--accept-rule", "maybe"]])
def test_unknown_or_malformed_flags_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "error" in capsys.readouterr().err


def test_cells_that_cannot_fit_are_refused_with_the_reason(noisy_pair, tmp_path):
    cfg = small_config(noisy_pair, tmp_path, ctx_lens=[0, 200_000], concurrencies=[1])
    frame = schema.read_traces(run_sweep(cfg))
    assert set(frame["ctx_len"]) == {0}
    refused = json.loads((tmp_path / "provenance.json").read_text())["refused_cells"]
    assert refused and "training context" in refused[0]["reason"]


def test_each_context_length_gets_a_cache_sized_for_it(noisy_pair, tmp_path, monkeypatch):
    """A rollback's KV removal scans the whole cache (llama.cpp's seq_rm is O(n_ctx)), so a
    ctx=0 cell must not run in a cache sized for the grid's longest context."""
    sizes, real_engine_for = {}, runner.engine_for

    def recording(cfg, target, cells, own_tokens=64):
        engine = real_engine_for(cfg, target, cells, own_tokens)
        sizes[tuple(sorted({c.ctx_len for c in cells}))] = engine.n_ctx
        return engine

    monkeypatch.setattr(runner, "engine_for", recording)
    run_sweep(small_config(noisy_pair, tmp_path, ctx_lens=[0, 512], concurrencies=[1, 2], ks=[2],
                           warmup=0, repeats=1))
    assert set(sizes) == {(0,), (512,)}
    assert sizes[(0,)] + 512 <= sizes[(512,)]  # the short cells do not carry the long context's cells


def test_only_the_first_cell_of_an_engine_warms_up(small_run):
    """After an engine's first cell nothing is left to warm: the next cells' lossless-check pair is
    their first timed pair (no warm-up run); the first cell of each context length warms up."""
    _, traces = small_run
    off = traces[traces["spec_decode"] == "off"].sort_values(["ctx_len", "concurrency"])
    for _, group in off.groupby("ctx_len"):
        used = group["warmup_used"].tolist()
        assert used[0] >= 1 and all(u == 0 for u in used[1:]), used
        assert group["warmup_settled"].iloc[1:].all()  # recorded as settled: warm already
