"""Draft trees from an EAGLE-3 head (drafters/eagle3_tree.cpp), on the tiny EAGLE-3 files the
project writes (tiny_drafters.py): greedy output is the target's, a one-branch tree is exactly
llama.cpp's own EAGLE-3 chain, the recursive rejection rule keeps the target's distribution and
each planted tree fault is caught, timers add up with the ingest step, other hidden-state files
are refused."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import ENGINE_KW, assert_lossless_verdict, check_spec_timers, injected
from test_trees import PROMPTS8, SPLIT, T, TOPK, TREE_DIST_FAULTS, check_tree_counts

from specnative import Engine, lossless
from specnative.engine import parse_draft_shape
from specnative.lossless import verdicts
from specnative.models.tiny_drafters import drafter_pair
from specnative.sweep import SweepConfig

PROMPTS = ["The city of", "Once upon a time there was a", "Hello", "In the year"]


@pytest.fixture(scope="module")
def eagle_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("eagle3-trees")


@pytest.fixture(scope="module")
def eagle_engine(eagle_dir):
    """A target and an EAGLE-3 head that agree with it part of the time."""
    target, head = drafter_pair(eagle_dir, "eagle3", acceptance="mid")
    with Engine(target, head, n_ctx=4096, n_batch=512, n_seq_max=64, **ENGINE_KW) as engine:
        yield engine


def tree_run(engine, prompts, shape, **kw):
    return engine.generate(prompts, spec=True, drafter="eagle3", draft_shape=shape, **kw)


@pytest.mark.parametrize("spelling", [TOPK, SPLIT])
@pytest.mark.parametrize("n_seq", [1, 4])
def test_greedy_eagle3_trees_are_the_targets_output(eagle_engine, spelling, n_seq):
    prompts = PROMPTS[:n_seq]
    base = eagle_engine.generate(prompts, n_predict=32)
    out = tree_run(eagle_engine, prompts, spelling, n_predict=32)
    extents = verdicts.cache_extents(eagle_engine, n_seq)
    assert verdicts.cache_problem(eagle_engine, eagle_engine.to_token_prompts(prompts), out.tokens, extents) is None
    assert_lossless_verdict(eagle_engine, prompts, base.tokens, out.tokens)
    check_tree_counts(out, parse_draft_shape(spelling))
    assert out.totals["accepted"] > 0 and out.totals["drafted"] > 2 * out.totals["rounds"]


def test_a_one_branch_eagle3_tree_is_llama_cpps_own_eagle3_chain(eagle_engine):
    """The head driven per branch here, with one branch, against llama.cpp's common loop drafting
    the same chain: count for count wherever the outputs agree token for token (the head's
    protocol is the same), and the outputs agree up to a numeric near-tie of the two batch shapes."""
    chain = eagle_engine.generate(PROMPTS, n_predict=32, spec=True, drafter="eagle3", k=4)
    tree = tree_run(eagle_engine, PROMPTS, "tree:topk=1,depth=4,budget=4", n_predict=32)
    assert_lossless_verdict(eagle_engine, PROMPTS, chain.tokens, tree.tokens)
    same = [s for s, (a, b) in enumerate(zip(chain.tokens, tree.tokens)) if np.array_equal(a, b)]
    assert len(same) >= len(PROMPTS) - 1
    for s in same:
        for key in ("drafted", "accepted", "rounds", "emitted", "rejected"):
            assert chain.counts[s][key] == tree.counts[s][key], (s, key)
        np.testing.assert_array_equal(chain.counts[s]["accepted_at"], tree.counts[s]["accepted_at"])
    assert 0 < tree.totals["accepted"] < tree.totals["drafted"]  # neither everything nor nothing


def test_an_agreeing_head_fills_its_trees(eagle_dir):
    target, head = drafter_pair(eagle_dir, "eagle3", acceptance="high")
    with Engine(target, head, n_ctx=2048, n_batch=256, n_seq_max=32, **ENGINE_KW) as engine:
        out = tree_run(engine, PROMPTS, "tree:branches=4,p_split=0.1,budget=8", n_predict=40)
    assert out.totals["accepted"] >= 0.9 * out.totals["drafted"]
    assert out.mean_accept_len > 6


def test_eagle3_tree_timers_add_up_with_the_ingest_step(eagle_engine):
    out = tree_run(eagle_engine, PROMPTS, TOPK, n_predict=24)
    check_spec_timers(out)
    assert out.times["draft_ingest"] > 0 and out.times["prefill_draft"] > 0


# --- T > 0 -----------------------------------------------------------------------------------------
def _dist(engine, fault: str = "none") -> lossless.DistributionTest:
    with injected(engine, fault):
        return lossless.rejection_distribution(engine, PROMPTS8, T, 0, SweepConfig.dist_positions, n_predict=32,
                                               drafter="eagle3", draft_shape=TOPK)


def test_recursive_rejection_on_eagle3_trees_is_distributed_as_p(eagle_engine):
    test = _dist(eagle_engine)
    assert test.passed, test.reason
    assert test.decisions > test.positions  # siblings after a rejection were judged too


@pytest.mark.parametrize("fault", TREE_DIST_FAULTS)
def test_each_tree_rule_fault_fails_on_eagle3_trees(eagle_engine, fault):
    test = _dist(eagle_engine, fault)
    assert not test.passed, test.reason


def test_a_kept_branch_fails_the_greedy_verdict_on_eagle3_trees(eagle_engine):
    base = eagle_engine.generate(PROMPTS, n_predict=32)
    with injected(eagle_engine, "tree_branch_kv_kept"):
        out = tree_run(eagle_engine, PROMPTS, SPLIT, n_predict=32)
    control = lossless.measure_noise(eagle_engine, PROMPTS, base.tokens, 4, "")
    verdict = lossless.judge(eagle_engine, PROMPTS, base.tokens, out.tokens, 0.0, 0, control)
    assert verdict.verdict == lossless.FAIL, verdict.reason


# --- refusals --------------------------------------------------------------------------------------
def test_trees_from_other_hidden_state_files_are_refused(eagle_dir):
    target, head = drafter_pair(eagle_dir, "dflash", acceptance="mid")
    with Engine(target, head, n_ctx=1024, n_batch=256, n_seq_max=32, **ENGINE_KW) as engine:
        with pytest.raises(ValueError, match="or an EAGLE-3 head"):
            engine.generate(PROMPTS[:1], n_predict=8, spec=True, drafter="dflash", draft_shape=TOPK)


# --- the sweep's axis ----------------------------------------------------------------------------
def test_sweep_times_eagle3_trees_beside_its_chains(eagle_dir, tmp_path):
    from specnative.record.schema import read_traces
    from specnative.sweep import main

    target, head = drafter_pair(eagle_dir, "eagle3", acceptance="mid")
    tree = "tree:topk=2,depth=3,budget=4"
    assert main(["-m", str(target), "--drafter", "eagle3", "--drafter-file", f"eagle3={head}",
                 "--draft-shape", f"chain,{tree}", "--ctx-len", "0", "-np", "1,2", "-k", "4", "-n", "16",
                 "--warmup", "0", "--repeats", "2", "--max-repeats", "2", "--threads", "1", "--no-db",
                 "--out", str(tmp_path / "run")]) == 0
    rows = read_traces(tmp_path / "run" / "traces.csv")
    on = rows[rows["spec_decode"] == "on"]
    trees, chains = on[on["draft_shape"] == tree], on[on["draft_shape"].isna()]
    assert len(trees) == len(chains) == 2 and set(trees["drafter"]) == {"eagle3"}
    assert trees["lossless_ok"].all() and (trees["verdict"] != "fail").all(), trees["verdict_reason"].tolist()
    assert (trees["draft_ingest_ms"] > 0).all() and (trees["nodes_per_round"] > 1).all()
    for _, r in trees.iterrows():  # the identity speedup = tau / (1 + c) per cell
        assert r["speedup"] == pytest.approx(r["steady_tau"] / (1 + r["verify_cost_c"]), rel=1e-3)


def test_sweep_refuses_trees_without_a_tree_drafter(capsys):
    from specnative.sweep import main

    with pytest.raises(SystemExit) as exc:
        main(["--drafter", "ngram-simple,dflash", "--draft-shape", "chain,tree:topk=2,depth=3,budget=4"])
    assert "add --drafter model or eagle3" in str(exc.value.code) + capsys.readouterr().err
