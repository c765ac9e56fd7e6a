"""Draft trees (generate(draft_shape=...)): the spellings, greedy output equal to the target's, the
recursive rejection rule distributed as p, the counts, the KV cache after a run, the tree faults
each caught, and refusals."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import ENGINE_KW, PROMPTS, assert_lossless_verdict, injected

from specnative import Engine, lossless
from specnative.lossless import verdicts
from specnative.engine import DraftShape, parse_draft_shape, parse_draft_shapes
from specnative.models import tiny_pair
from specnative.sweep import SweepConfig

TOPK = "tree:topk=3,depth=4,budget=8"
SPLIT = "tree:branches=4,p_split=0.05,budget=8"
SHAPES = (TOPK, SPLIT)
PROMPTS8 = ["The city of", "Once upon a time there was a", "Hello", "In the morning", "A good teacher",
            "Dear friend,", "The report says", "Here is a list"]
T = 0.8
TREE_DIST_FAULTS = ("tree_residual_stale", "tree_sibling_twice", "tree_bonus_wrong_node")


# --- spellings ------------------------------------------------------------------------------------
def test_shapes_parse_and_spell_back():
    topk = parse_draft_shape("tree:topk=4,depth=5,budget=8")
    assert (topk.kind, topk.topk, topk.depth, topk.budget) == ("topk", 4, 5, 8)
    assert parse_draft_shape(topk.spelling) == topk and topk.ids_per_sequence == 8
    split = parse_draft_shape("tree:branches=4,p_split=0.1")
    assert (split.kind, split.branches, split.p_split, split.budget) == ("split", 4, 0.1, 8)
    assert parse_draft_shape(split.spelling) == split and split.ids_per_sequence == 4
    assert parse_draft_shape("chain") == parse_draft_shape(None) == DraftShape()
    shapes = parse_draft_shapes("chain,tree:topk=4,depth=5,budget=8,tree:branches=2,p_split=0.2,budget=4")
    assert [s.spelling for s in shapes] == ["chain", "tree:topk=4,depth=5,budget=8",
                                            "tree:branches=2,p_split=0.2,budget=4"]


@pytest.mark.parametrize("spelling, words", [
    ("tree", "use 'chain'"), ("tree:topk=4,branches=2", "mixes"), ("tree:topk=0", "topk must be in"),
    ("tree:p_split=2", "p_split must be in"), ("tree:budget=8", "give topk/depth"),
    ("tree:width=3", "is not one of"), ("tree:topk=x", "an integer"), ("tree:topk=2,topk=3", "twice")])
def test_bad_shapes_are_refused_with_one_line(spelling, words):
    with pytest.raises(ValueError, match=words):
        parse_draft_shape(spelling)


# --- engines ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree_engine(noisy_pair):
    target, draft = noisy_pair
    with Engine(target, draft, n_ctx=4096, n_batch=512, n_seq_max=64, **ENGINE_KW) as engine:
        yield engine


@pytest.fixture(scope="module")
def far_tree_engine(model_dir):
    """Draft = target + 10 % weight noise: rejections (and so siblings tried) are common."""
    target, draft = tiny_pair(model_dir, "noisy", noise=0.1)
    with Engine(target, draft, n_ctx=4096, n_batch=512, n_seq_max=64, **ENGINE_KW) as engine:
        yield engine


def check_tree_counts(out, shape: DraftShape):
    depth = shape.depth if shape.kind == "topk" else shape.budget
    for c, tokens in zip(out.counts, out.tokens):
        assert c["emitted"] == len(tokens) - 1
        assert c["accept_len_hist"].sum() == c["rounds"]
        assert (c["accept_len_hist"] * np.arange(depth + 1)).sum() == c["accepted"] == c["accepted_at"].sum()
        assert c["accepted_rank"].sum() == c["accepted"]
        assert np.all(c["accepted_rank"] <= c["offered_rank"])
        assert np.all(np.diff(c["accepted_at"]) <= 0) and np.all(c["accepted_at"] <= c["drafted_at"])
        assert c["drafted"] <= (shape.budget + (shape.branches - 1 if shape.kind == "split" else 0)) * c["rounds"]
        assert c["drafted_at"][0] <= c["rounds"]


# --- greedy: the target's own output ---------------------------------------------------------------
@pytest.mark.parametrize("spelling", SHAPES)
def test_copy_draft_trees_accept_the_main_path(copy_pair, spelling):
    target, draft = copy_pair
    with Engine(target, draft, n_ctx=2048, n_batch=256, n_seq_max=32, **ENGINE_KW) as engine:
        base = engine.generate(PROMPTS, n_predict=24)
        out = engine.generate(PROMPTS, n_predict=24, spec=True, draft_shape=spelling)
        assert_lossless_verdict(engine, PROMPTS, base.tokens, out.tokens)
        check_tree_counts(out, parse_draft_shape(spelling))
        # an exact copy: the rank-0 child is the target's argmax nearly always
        assert out.totals["accepted_rank"][0] >= 0.8 * out.totals["accepted"]
        assert out.mean_accept_len > 2.0


@pytest.mark.parametrize("spelling", SHAPES)
@pytest.mark.parametrize("n_seq", [1, 3])
def test_greedy_trees_are_lossless_and_use_several_branches(tree_engine, spelling, n_seq):
    prompts = PROMPTS[:n_seq]
    base = tree_engine.generate(prompts, n_predict=32)
    out = tree_engine.generate(prompts, n_predict=32, spec=True, draft_shape=spelling)
    # the cache holds each prompt and every emitted token but the last, nothing of another branch
    extents = verdicts.cache_extents(tree_engine, len(prompts))
    assert verdicts.cache_problem(tree_engine, tree_engine.to_token_prompts(prompts), out.tokens, extents) is None
    assert_lossless_verdict(tree_engine, prompts, base.tokens, out.tokens)
    shape = parse_draft_shape(spelling)
    check_tree_counts(out, shape)
    assert out.totals["drafted"] > out.totals["rounds"] * 2  # trees, not single tokens
    assert out.totals["offered_rank"][1] > 0  # nodes with a second child were reached


def test_a_tree_of_one_branch_is_the_chain(tree_engine):
    """topk=1: one child per node, the chain of k = depth, token for token and count for count."""
    chain = tree_engine.generate(PROMPTS, n_predict=32, spec=True, k=4)
    tree = tree_engine.generate(PROMPTS, n_predict=32, spec=True, draft_shape="tree:topk=1,depth=4,budget=4")
    for a, b in zip(chain.tokens, tree.tokens):
        np.testing.assert_array_equal(a, b)
    for key in ("drafted", "accepted", "rounds", "emitted", "rejected"):
        assert chain.totals[key] == tree.totals[key], key
    np.testing.assert_array_equal(chain.totals["accepted_at"], tree.totals["accepted_at"])


def test_match_rule_on_trees_keeps_the_keyed_samples(tree_engine):
    base = tree_engine.generate(PROMPTS, n_predict=32, temperature=T, seed=5)
    out = tree_engine.generate(PROMPTS, n_predict=32, temperature=T, seed=5, spec=True, accept_rule="match",
                               draft_shape=TOPK)
    assert_lossless_verdict(tree_engine, PROMPTS, base.tokens, out.tokens, temperature=T, seed=5)


# --- T > 0: recursive rejection over siblings --------------------------------------------------------
def _dist(engine, spelling: str, fault: str = "none") -> lossless.DistributionTest:
    with injected(engine, fault):
        return lossless.rejection_distribution(engine, PROMPTS8, T, 0, SweepConfig.dist_positions, n_predict=32,
                                               draft_shape=spelling)


@pytest.mark.parametrize("spelling", SHAPES)
def test_recursive_rejection_is_distributed_as_p(far_tree_engine, spelling):
    test = _dist(far_tree_engine, spelling)
    assert test.passed, test.reason
    assert test.positions >= SweepConfig.dist_positions
    assert test.decisions > test.positions  # siblings after a rejection were judged too


@pytest.mark.parametrize("fault", TREE_DIST_FAULTS)
def test_each_tree_rule_fault_fails_at_the_default_cell_size(far_tree_engine, fault):
    test = _dist(far_tree_engine, TOPK, fault)
    assert not test.passed, test.reason


@pytest.mark.parametrize("fault", ["tree_bonus_wrong_node", "tree_branch_kv_kept"])
def test_tree_faults_fail_the_greedy_verdict(tree_engine, fault):
    base = tree_engine.generate(PROMPTS, n_predict=32)
    with injected(tree_engine, fault):
        out = tree_engine.generate(PROMPTS, n_predict=32, spec=True, draft_shape=SPLIT if "kv" in fault else TOPK)
    control = lossless.measure_noise(tree_engine, PROMPTS, base.tokens, 4, "")
    verdict = lossless.judge(tree_engine, PROMPTS, base.tokens, out.tokens, 0.0, 0, control)
    assert verdict.verdict == lossless.FAIL, verdict.reason


def test_chain_faults_leave_trees_correct_and_tree_faults_leave_chains_correct(tree_engine):
    base = tree_engine.generate(PROMPTS, n_predict=24)
    clean_chain = tree_engine.generate(PROMPTS, n_predict=24, spec=True, k=4)
    with injected(tree_engine, "tree_branch_kv_kept"):
        chain = tree_engine.generate(PROMPTS, n_predict=24, spec=True, k=4)
    for a, b in zip(clean_chain.tokens, chain.tokens):
        np.testing.assert_array_equal(a, b)
    with injected(tree_engine, "rollback_short"):
        tree = tree_engine.generate(PROMPTS, n_predict=24, spec=True, draft_shape=TOPK)
    assert_lossless_verdict(tree_engine, PROMPTS, base.tokens, tree.tokens)


# --- refusals ----------------------------------------------------------------------------------------
def test_trees_are_refused_where_they_cannot_run(tree_engine, noisy_pair):
    with pytest.raises(ValueError, match="drafted by the draft model"):
        tree_engine.generate(PROMPTS, n_predict=8, spec=True, drafter="ngram-simple", draft_shape=TOPK)
    with pytest.raises(ValueError, match="draft_p_min applies to chains"):
        tree_engine.generate(PROMPTS, n_predict=8, spec=True, draft_p_min=0.5, draft_shape=TOPK)
    with pytest.raises(ValueError, match="needs temperature 0"):
        tree_engine.generate(PROMPTS, n_predict=8, spec=True, temperature=0.5, draft_shape=TOPK)
    target, draft = noisy_pair
    with Engine(target, draft, n_ctx=1024, n_batch=64, n_seq_max=4, **ENGINE_KW) as small:
        with pytest.raises(ValueError, match="needs n_seq_max >= 24"):
            small.generate(PROMPTS, n_predict=8, spec=True, draft_shape=TOPK)
    with Engine(target, draft, n_ctx=1024, n_batch=64, n_seq_max=8, kv_unified=False, **ENGINE_KW) as split_kv:
        with pytest.raises(ValueError, match="kv_unified"):
            split_kv.generate(PROMPTS[:1], n_predict=8, spec=True, draft_shape=TOPK)


# --- the sweep's axis ----------------------------------------------------------------------------------
def test_sweep_draft_shape_axis_times_trees_beside_chains(noisy_pair, tmp_path):
    from specnative.record.schema import read_traces
    from specnative.report import write_report
    from specnative.sweep import run_sweep

    target, draft = noisy_pair
    tree = "tree:topk=2,depth=3,budget=4"
    cfg = SweepConfig(targets=[target], draft=draft, ctx_lens=[0], concurrencies=[1, 2], ks=[4], n_predict=16,
                      warmup=0, repeats=2, max_repeats=2, threads=1, out_dir=tmp_path / "run", report=False,
                      draft_shapes=["chain", tree])
    rows = read_traces(run_sweep(cfg))
    on = rows[rows["spec_decode"] == "on"]
    chains, trees = on[on["draft_shape"].isna()], on[on["draft_shape"] == tree]
    assert len(chains) == len(trees) == 2 and len(rows[rows["spec_decode"] == "off"]) == 2
    assert set(trees["k"]) == {4} and trees["cell_id"].str.endswith(f"|shape={tree}").all()
    assert trees["lossless_ok"].all(), trees["verdict_reason"].tolist()
    assert (trees["nodes_per_round"] > 1).all() and trees["accept_at_rank"].notna().all()
    for _, r in trees.iterrows():  # the identity speedup = tau / (1 + c) per cell
        assert r["speedup"] == pytest.approx(r["steady_tau"] / (1 + r["verify_cost_c"]), rel=1e-3)
    summary = write_report(tmp_path / "run").read_text()
    assert "## Trees or chains?" in summary and tree in summary
