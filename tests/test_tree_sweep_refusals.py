"""Sweeps with draft trees: what no cell could run is refused in one line before any model is loaded
or the run folder made (the stop rule with trees, a tree's verify batch past --batch-size, more
sequence ids than llama.cpp holds, too few tokens for a decode step), sharded tree sweeps merge,
-k unused by every chain is said, and `specnative runs` names the draft shapes and synthetic
profiles of a run's grid."""
from __future__ import annotations

import pytest
from conftest import TEST_NGL

from specnative.cli import merge_main
from specnative.engine import native, synthetic
from specnative.record import merge, run_folder, schema, shards
from specnative.serving import cli as serve_cli
from specnative.run import options
from specnative.sweep import SweepConfig, main, run_sweep, runner
from specnative.sweep import cli as sweep_cli

TREE = "tree:topk=2,depth=2,budget=2"


def argv_for(pair, out, *extra) -> list[str]:
    target, draft = pair
    return ["-m", str(target), "-md", str(draft), "--ctx-len", "0", "-np", "1,2", "-n", "6",
            "--warmup", "0", "-r", "1", "--max-repeats", "1", "-t", "1", "-ngl", str(TEST_NGL),
            "-o", str(out), "--no-report", "--no-db", *extra]


def no_engine(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the grid was checked")
    monkeypatch.setattr(runner, "Engine", refuse)


def refused(pair, tmp_path, monkeypatch, *extra) -> str:
    """The one-line error of a sweep refused before loading; no run folder was made."""
    no_engine(monkeypatch)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(argv_for(pair, out, *extra))
    assert not out.exists()
    return str(exc.value.code)


# --- refused up front ------------------------------------------------------------------------------
def test_the_stop_rule_with_trees_is_refused_before_loading(noisy_pair, tmp_path, monkeypatch):
    message = refused(noisy_pair, tmp_path, monkeypatch, "--draft-p-min", "0,0.5", "--draft-shape", f"chain,{TREE}")
    assert message.startswith("error: --draft-p-min > 0 with draft trees")


def test_a_tree_past_the_batch_size_is_refused_before_loading(noisy_pair, tmp_path, monkeypatch):
    # 12 nodes and the pending token per sequence, two sequences: 26 > 25 (the chain's 2 x 3 fits)
    message = refused(noisy_pair, tmp_path, monkeypatch, "-k", "2", "-b", "25",
                      "--draft-shape", "chain,tree:topk=4,depth=3,budget=12")
    assert "tree:topk=4,depth=3,budget=12" in message and "26, over --batch-size 25" in message


def test_a_tree_needing_more_sequence_ids_than_llama_cpp_holds_is_refused(noisy_pair, tmp_path, monkeypatch):
    argv = ["-np", "3", "--draft-shape", "tree:topk=2,depth=2,budget=128"]  # 3 x 128 ids > 256
    message = refused(noisy_pair, tmp_path, monkeypatch, *argv)
    assert "tree:topk=2,depth=2,budget=128" in message and "128 branches per sequence" in message
    assert f"384 sequence ids, over llama.cpp's most sequences per context ({native.max_parallel_sequences})" \
        in message


@pytest.mark.parametrize("n", ["1", "2"])
@pytest.mark.parametrize("shape", ["chain", TREE])
def test_too_few_tokens_per_sequence_are_refused_with_the_minimum(noisy_pair, tmp_path, monkeypatch, shape, n):
    message = refused(noisy_pair, tmp_path, monkeypatch, "-n", n, "--draft-shape", shape)
    assert f"-n/--n-predict {n}" in message and "at least 3" in message


def test_the_minimum_tokens_per_sequence_measure(noisy_pair, tmp_path):
    target, draft = noisy_pair
    cfg = SweepConfig(targets=[target], draft=draft, ctx_lens=[0], concurrencies=[1], ks=[2], n_predict=3,
                      warmup=0, repeats=1, max_repeats=1, threads=1, gpu_layers=TEST_NGL,
                      out_dir=tmp_path / "run", report=False, draft_shapes=["chain", TREE])
    rows = schema.read_traces(run_sweep(cfg))
    assert len(rows) == 3 and set(rows["draft_shape"].dropna()) == {TREE}
    on = rows[rows["spec_decode"] == "on"]
    assert (on["drafted"] > 0).all() and on["draft_accept_rate"].notna().all()


def test_one_synthetic_profile_spelled_twice_is_measured_once():
    assert [p.text for p in synthetic.parse_profiles("0.5,0.50,rates:0.9/0.5,rates:0.90/0.5,len:2,len:2.0")] \
        == ["0.5", "rates:0.9/0.5", "len:2"]


# --- -k that no chain uses ---------------------------------------------------------------------
def parsed(parser, argv: list[str], verb: str):
    return options.spec_from_args(parser.parse_args(argv), argv, verb)


@pytest.mark.parametrize("extra, noted", [
    (["-k", "3", "--draft-shape", TREE], True),
    (["--draft-max", "3", "--draft-shape", TREE], True),
    (["--draft-shape", TREE], False),                          # -k not given
    (["-k", "3", "--draft-shape", f"chain,{TREE}"], False),    # the chain drafts 3
    (["-k", "3", "--draft-shape", TREE, "--drafter", "model,ngram-simple"], False),  # the n-gram drafter's chain
])
def test_sweep_says_when_k_is_not_used(noisy_pair, tmp_path, capsys, extra, noted):
    target, draft = noisy_pair
    argv = ["-m", str(target), "-md", str(draft), "-o", str(tmp_path / "out"), *extra]
    spec = parsed(sweep_cli.build_parser(), argv, "sweep")
    assert ("note: -k/--draft-max 3 is not used" in capsys.readouterr().err) == noted
    assert spec.drafter.ks == ([3] if "3" in extra else [options.DEFAULT_K])


@pytest.mark.parametrize("extra, noted", [(["-k", "3", "--draft-shape", TREE], True), (["-k", "3"], False)])
def test_serve_says_when_k_is_not_used(noisy_pair, tmp_path, capsys, extra, noted):
    target, draft = noisy_pair
    argv = ["-m", str(target), "-md", str(draft), "-o", str(tmp_path / "out"), *extra]
    parsed(serve_cli.build_parser(), argv, "serve")
    assert ("note: -k/--draft-max 3 is not used" in capsys.readouterr().err) == noted


# --- `specnative runs` ------------------------------------------------------------------------------
def test_runs_grid_names_draft_shapes_and_synthetic_profiles():
    sweep = {"grid": {"ctx_len": [0], "concurrency": [1, 2], "k": [2], "draft_shape": ["chain", TREE],
                      "synthetic_acceptance": ["0.5", "len:2"]}}
    assert run_folder.grid_summary(sweep) == \
        f"ctx 0 × c 1,2 × k 2 × shape chain {TREE} × synthetic 0.5,len:2"
    serve = {"mode": "serve", "serve": {"request_rate": ["inf"], "max_concurrency": 2, "k": 2, "draft_shape": TREE}}
    assert run_folder.grid_summary(serve).endswith(f"shape {TREE}")


# --- sharded tree sweeps merge ----------------------------------------------------------------------
def test_a_tree_row_belongs_to_its_cell():
    base = "0123456789abcdef|ctx0|c1|T0|greedy|task=mixed"
    assert run_folder.base_cell(f"{base}|shape={TREE}") == base
    assert merge.base_key({"cell_id": f"{base}|shape={TREE}", "spec_decode": "on"}) == base


def test_a_tree_only_shard_expects_tree_rows_only():
    model, ngram = "a|ctx0|c1|T0|greedy|task=mixed", "a|ctx0|c1|T0|greedy|task=mixed|drafter=ngram-simple"
    record = {"grid": {"k": [2], "draft_shape": [TREE]}, "shard": {"cells": [[0, model], [1, ngram]]}}
    assert set(merge.expected_rows(record)) == {model, f"{model}|shape={TREE}", ngram, f"{ngram}|k2"}


def test_sharded_tree_sweeps_merge_into_the_whole_grid(noisy_pair, tmp_path):
    target, draft = noisy_pair
    config = {"targets": [target], "draft": draft, "ctx_lens": [0], "concurrencies": [1, 2], "ks": [2],
              "n_predict": 6, "warmup": 0, "repeats": 1, "max_repeats": 1, "threads": 1, "gpu_layers": TEST_NGL,
              "report": False, "draft_shapes": ["chain", TREE]}
    for i in range(2):
        run_sweep(SweepConfig(**config, out_dir=tmp_path / f"shard{i}", shard=shards.Shard(i, 2)))
    assert merge_main([str(tmp_path / "merged"), str(tmp_path / "shard0"), str(tmp_path / "shard1"),
                       "--no-report"]) == 0
    rows = schema.read_traces(tmp_path / "merged" / "traces.csv")
    assert len(rows) == 6 and (rows["draft_shape"] == TREE).sum() == 2
