"""--shard i/N and specnative merge: shards of a sweep, merged, are the unsharded grid;
shards that do not belong together are refused with the reason."""
from __future__ import annotations

import json
import re
import shutil

import pandas as pd
import pytest
from conftest import TEST_NGL
from test_resume_history import snapshot

from specnative.cli import merge_main
from specnative.record import schema, shards
from specnative.sweep import SweepConfig, main, run_sweep

# What a cell is: the same in a shard and in the unsharded run. (Its counts and verdict details are
# not compared across the two: a shard's cells run first in their engine and later in the whole
# run, and another cache history may move a near-tie.)
IDENTITY = ["cell_id", "spec_decode", "ctx_len", "concurrency", "k", "task", "prompts_sha256", "target_sha256"]


def grid_config(pair, out_dir, **overrides) -> SweepConfig:
    target, draft = pair
    values = dict(targets=[target], draft=draft, ctx_lens=[0, 48], concurrencies=[1, 2], ks=[2],
                  n_predict=6, warmup=0, repeats=1, max_repeats=1, threads=1, gpu_layers=TEST_NGL,
                  out_dir=out_dir, report=False)
    values.update(overrides)
    return SweepConfig(**values)


@pytest.fixture(scope="module")
def runs(noisy_pair, tmp_path_factory):
    """The same 4-cell grid unsharded and as shards 0/2 and 1/2."""
    root = tmp_path_factory.mktemp("shards")
    run_sweep(grid_config(noisy_pair, root / "whole"))
    for i in range(2):
        run_sweep(grid_config(noisy_pair, root / f"shard{i}", shard=shards.Shard(i, 2)))
    return root


def test_shards_are_disjoint_round_robin_shares_of_the_grid(runs):
    ids = [set(schema.read_traces(runs / f"shard{i}" / "traces.csv")["cell_id"]) for i in range(2)]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    recorded = [json.loads((runs / f"shard{i}" / "provenance.json").read_text())["shard"] for i in range(2)]
    assert [[index for index, _ in r["cells"]] for r in recorded] == [[0, 2], [1, 3]]


def test_merged_shards_equal_the_unsharded_grid(runs):
    out = runs / "merged"
    assert merge_main([str(out), str(runs / "shard1"), str(runs / "shard0"), "--no-report"]) == 0
    whole = schema.read_traces(runs / "whole" / "traces.csv")
    merged = schema.read_traces(out / "traces.csv")
    assert list(merged["cell_id"]) == list(whole["cell_id"])  # grid order, whatever order the shards came in
    assert merged[IDENTITY].equals(whole[IDENTITY])
    # the shards' rows themselves, every column, moved into grid order
    parts = pd.concat([schema.read_traces(runs / f"shard{i}" / "traces.csv") for i in range(2)])
    pd.testing.assert_frame_equal(merged, parts.set_index("cell_id").loc[merged["cell_id"]].reset_index()[merged.columns])
    assert merged["lossless_ok"].all() and (merged["verdict"].dropna() != "fail").all()
    prov = json.loads((out / "provenance.json").read_text())
    assert "shard" not in prov and prov["completed"] is True
    assert [m["shard"] for m in prov["merged_from"]] == ["0/2", "1/2"]
    assert sum(e["cells"] for e in prov["noise_control"].values()) == (merged["spec_decode"] == "on").sum()


def _copy_with(runs, name: str, tmp_path, **changes) -> str:
    """A copy of a shard directory whose provenance.json has some keys changed."""
    copy = tmp_path / f"{name}-copy"
    shutil.copytree(runs / name, copy)
    record = json.loads((copy / "provenance.json").read_text())
    record.update(changes)
    (copy / "provenance.json").write_text(json.dumps(record))
    return str(copy)


def test_mismatched_or_incomplete_shards_are_refused(runs, tmp_path, capsys):
    s0 = str(runs / "shard0")
    grid = json.loads((runs / "shard1" / "provenance.json").read_text())["grid"]
    cases = [
        ([s0], "missing shard(s) 1/2"),
        ([s0, s0], "given twice"),
        ([s0, _copy_with(runs, "shard1", tmp_path, grid={**grid, "n_predict": 7})], "grid.n_predict"),
        ([s0, _copy_with(runs, "shard1", tmp_path / "b", llama_cpp_commit="other")], "llama_cpp_commit"),
        ([s0, _copy_with(runs, "shard1", tmp_path / "c", completed=False)], "did not finish"),
        ([s0, str(runs / "whole")], "not a shard"),
        ([s0, _copy_with(runs, "shard1", tmp_path / "d", cpu_model="another CPU")], "identical machines"),
    ]
    for i, (dirs, message) in enumerate(cases):
        before = {d: snapshot(d) for d in dirs}
        with pytest.raises(SystemExit, match="(?s)^error: .*" + re.escape(message)):
            merge_main([str(tmp_path / f"out{i}"), *dirs, "--no-report"])
        # refused before anything is written: every shard byte for byte as it was, no output directory
        assert {d: snapshot(d) for d in dirs} == before and not (tmp_path / f"out{i}").exists()
    allowed = merge_main([str(tmp_path / "mixed"), s0, _copy_with(runs, "shard1", tmp_path / "e", cpu_model="x"),
                          "--no-report", "--allow-hardware-differences"])
    assert allowed == 0
    assert json.loads((tmp_path / "mixed" / "provenance.json").read_text())["cpu_model"].startswith("mixed")


def test_a_resume_with_another_shard_is_refused(noisy_pair, runs, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(runs / "shard0", out)
    with pytest.raises(SystemExit, match="shard"):
        run_sweep(grid_config(noisy_pair, out, shard=shards.Shard(1, 2), resume=True))


@pytest.mark.parametrize("text", ["2/2", "-1/2", "1", "a/b", "0/0"])
def test_bad_shard_flags_are_argparse_errors(text, capsys):
    with pytest.raises(SystemExit):
        main(["--shard", text])
    assert "--shard" in capsys.readouterr().err
