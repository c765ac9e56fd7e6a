"""Draft trees under load (serve_loop.cpp with a tree drafter): every request's output is the one
it gets decoded alone, with the draft model and with an EAGLE-3 head; a one-branch tree serves
exactly as the chain; slots reuse their branch ids without leaking a cell; the serve command
writes tree rows and refuses what a tree cannot run with."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import ENGINE_KW, PROMPTS, injected
from test_trees import SPLIT, TOPK

from specnative import Engine, lossless
from specnative.models.tiny_drafters import drafter_pair
from specnative.record.schema import read_traces
from specnative.serving import arrivals
from specnative.serving.loop import serve
from specnative.serving.runner import serving_verdict


@pytest.fixture(scope="module")
def engines(noisy_pair, tmp_path_factory):
    """drafter -> an engine whose drafter agrees with the target part of the time."""
    target, draft = noisy_pair
    e_target, head = drafter_pair(tmp_path_factory.mktemp("serve-trees"), "eagle3", acceptance="mid")
    opened = {"model": Engine(target, draft, n_ctx=8192, n_batch=512, n_seq_max=64, **ENGINE_KW),
              "eagle3": Engine(e_target, head, n_ctx=8192, n_batch=512, n_seq_max=64, **ENGINE_KW)}
    yield opened
    for engine in opened.values():
        engine.close()


def trace_of(engine, rate=400.0, n=10, seed=3):
    prompts = [engine.tokenize(t).tolist() for t in PROMPTS]
    return arrivals.build_trace(prompts, [24, 16, 20], rate, n, seed=seed)


@pytest.mark.parametrize("drafter", ["model", "eagle3"])
@pytest.mark.parametrize("spelling", [TOPK, SPLIT])
def test_served_trees_give_each_request_its_output_alone(engines, drafter, spelling):
    engine = engines[drafter]
    trace = trace_of(engine)
    run = serve(engine, trace, max_concurrency=3, spec=True, drafter=drafter, draft_shape=spelling)
    verdict = serving_verdict(engine, trace, run.tokens, k=8)
    assert verdict.verdict in (lossless.EXACT, lossless.NUMERIC), verdict.reason
    assert run.kv_cells_left == 0  # every branch id of every slot released
    totals = run.totals
    assert totals["drafted"] > 2 * totals["rounds"] and totals["accepted"] > 0
    assert totals["accepted_rank"].sum() == totals["accepted"]
    assert run.times["draft"] > 0 and (drafter == "model" or run.times["draft_ingest"] > 0)


@pytest.mark.parametrize("drafter", ["model", "eagle3"])
def test_a_one_branch_tree_serves_as_the_chain(engines, drafter):
    engine = engines[drafter]
    trace = trace_of(engine, rate=float("inf"), n=8, seed=5)
    chain = serve(engine, trace, max_concurrency=4, spec=True, k=4, drafter=drafter, virtual_clock=True)
    tree = serve(engine, trace, max_concurrency=4, spec=True, drafter=drafter, virtual_clock=True,
                 draft_shape="tree:topk=1,depth=4,budget=4")
    assert serving_verdict(engine, trace, tree.tokens, k=4).lossless_ok
    # count for count wherever the outputs agree token for token (a numeric near-tie of the two
    # batch shapes may part one request's output)
    same = [i for i, (a, b) in enumerate(zip(chain.tokens, tree.tokens)) if np.array_equal(a, b)]
    assert len(same) >= len(trace) - 1
    for i in same:
        for key in ("drafted", "accepted", "rounds", "emitted"):
            assert chain.records[i]["counts"][key] == tree.records[i]["counts"][key], (i, key)


def test_a_kept_branch_fails_the_serving_verdict(engines):
    engine = engines["model"]
    trace = trace_of(engine, rate=float("inf"), n=6, seed=2)
    with injected(engine, "tree_branch_kv_kept"):
        bad = serve(engine, trace, max_concurrency=3, spec=True, draft_shape=SPLIT)
    assert serving_verdict(engine, trace, bad.tokens, k=8).verdict == lossless.FAIL


def test_the_verdict_replays_a_trees_requests_in_groups_of_slots_not_of_sequence_ids(noisy_pair):
    """A tree's serving engine holds a sequence id per branch (here 2 slots x 8) but KV cells and a
    batch for its slots only: the checks replay as many requests together as it has slots."""
    target, draft = noisy_pair
    with Engine(target, draft, n_ctx=200, n_batch=64, n_seq_max=16, **ENGINE_KW) as engine:
        trace = trace_of(engine, rate=float("inf"), n=8)
        served = serve(engine, trace, max_concurrency=2, spec=True, draft_shape=TOPK).tokens
        tampered = [t.copy() for t in served]
        tampered[0][-1] = (int(tampered[0][-1]) + 1) % 32  # not the target's token: a failure to find
        with pytest.raises(ValueError, match="KV cells|n_batch"):
            serving_verdict(engine, trace, tampered, k=8)  # as many requests as ids: more than it holds
        assert serving_verdict(engine, trace, tampered, k=8, ids_per_sequence=8).verdict == lossless.FAIL


def test_trees_in_serve_refuse_other_drafters(engines):
    engine = engines["model"]
    with pytest.raises(ValueError, match="or an EAGLE-3 head"):
        serve(engine, trace_of(engine, n=2), max_concurrency=2, spec=True, drafter="ngram-simple", draft_shape=TOPK)


# --- the serve command ---------------------------------------------------------------------------
def test_serve_command_writes_tree_rows(noisy_pair, tmp_path):
    from specnative.serving.cli import main

    target, draft = noisy_pair
    assert main(["-m", str(target), "-md", str(draft), "--draft-shape", TOPK, "--request-rate", "inf",
                 "--num-requests", "6", "-n", "12", "-r", "1", "-np", "3", "-t", "1", "--no-db",
                 "--out", str(tmp_path / "run")]) == 0
    rows = read_traces(tmp_path / "run" / "traces.csv")
    on = rows[rows["spec_decode"] == "on"]
    assert len(on) == 1 and on["draft_shape"].iloc[0] == TOPK and on["k"].iloc[0] == 8
    assert on["cell_id"].iloc[0].endswith(f"/shape={TOPK}/on") and on["nodes_per_round"].iloc[0] > 1
    assert on["lossless_ok"].all() and on["kv_cells_left"].iloc[0] == 0


@pytest.mark.parametrize("argv, words", [
    (["--drafter", "ngram-simple"], "drafted by the draft model or an EAGLE-3 head"),
    (["--prefix-cache", "on"], "use --prefix-cache off with a draft tree"),
    (["--synthetic-acceptance", "0.5"], "synthetic acceptance applies to chains"),
    (["--max-concurrency", "40"], "over llama.cpp's most sequences per context (256)"),
    (["--max-concurrency", "4", "-b", "30"], "over --batch-size 30"),
])
def test_serve_refuses_what_a_tree_cannot_run_with_before_any_work(argv, words, tmp_path, capsys):
    from specnative.serving.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--draft-shape", TOPK, *argv, "--out", str(tmp_path / "run")])
    assert words in str(exc.value.code) + capsys.readouterr().err
    assert not (tmp_path / "run").exists()
