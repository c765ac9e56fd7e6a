"""The spec policy as a sweep axis (record/factors.py): a cell per policy, the static cells' ids and
rows as a run without the axis, the policy's choices on its rows, resume, the advice's regimes and
the refusals."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from test_sweep import small_config

from specnative.analysis import advisor
from specnative.record import schema
from specnative.record.factors import factor_named
from specnative.sweep import main, run_sweep

POLICIES = ["static", "adaptive", "by-batch:[[1,1,3],[2,8,0]]"]


@pytest.fixture(scope="module")
def runs(noisy_pair, tmp_path_factory):
    """The same grid without the axis and with three policies."""
    plain_dir, axis_dir = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("policies")
    plain = schema.read_traces(run_sweep(small_config(noisy_pair, plain_dir, ctx_lens=[0])))
    cfg = small_config(noisy_pair, axis_dir, ctx_lens=[0])
    cfg.factors = {"spec_policy": POLICIES}
    with_axis = schema.read_traces(run_sweep(cfg))
    return plain_dir, plain, axis_dir, with_axis, cfg


def test_each_policy_is_a_cell_and_the_static_cells_keep_their_ids(runs):
    plain_dir, plain, axis_dir, frame, _ = runs
    assert len(frame) == 3 * len(plain)  # every cell once per policy, its own off row and on row
    static = frame[~frame["cell_id"].str.contains("spec_policy=")]
    assert sorted(static["cell_id"]) == sorted(plain["cell_id"])  # older runs' ids, unchanged
    on = frame[frame.spec_decode == "on"]
    assert set(on["spec_policy"].dropna()) == {"adaptive", "by-batch:[[1,1,3],[2,8,0]]"}
    assert on[on.spec_policy.isna()]["cell_id"].isin(plain["cell_id"]).all()
    assert frame["lossless_ok"].all()  # a policy changes when tokens are drafted, never which
    grid = json.loads((axis_dir / "provenance.json").read_text())["grid"]
    assert grid["spec_policy"] == POLICIES
    assert "spec_policy" not in json.loads((plain_dir / "provenance.json").read_text())["grid"]


def test_a_policy_cell_records_its_choices(runs):
    *_, frame, _ = runs
    on = frame[frame.spec_decode == "on"].set_index("concurrency")
    by_batch = on[on.spec_policy == POLICIES[2]]
    # the schedule drafts at most 3 at one sequence and nothing at three: k = 0 every round there
    assert by_batch.loc[3, "k0_share"] == 1.0 and by_batch.loc[3, "drafted"] == 0
    assert by_batch.loc[1, "k0_share"] < 1.0 and by_batch.loc[1, "drafted"] > 0
    adaptive = on[on.spec_policy == "adaptive"]
    assert adaptive["policy_ms_per_round"].gt(0).all() and adaptive["k_chosen_hist"].notna().all()


def test_the_advice_keeps_each_policy_a_regime_of_its_own(runs):
    _, plain, _, frame, _ = runs
    cells = advisor.load_traces(frame)
    on = cells[cells.spec_decode == "on"]
    assert sorted(on["spec_policy"].unique()) == sorted(POLICIES)  # the static rows read as static
    assert advisor.load_traces(plain).query("spec_decode == 'on'")["spec_policy"].eq("static").all()


def test_a_run_with_the_axis_resumes_without_measuring_again(runs):
    *_, axis_dir, frame, cfg = runs
    cfg.resume = True
    again = schema.read_traces(run_sweep(cfg))
    pd.testing.assert_frame_equal(again, frame)


def test_policy_spellings_split_on_commas_between_values_only():
    factor = factor_named("spec_policy")
    assert factor.values_from("static,adaptive:prior=0.6,weight=2,by-batch:[[1,2,4],[3,8,0]]") == [
        "static", "adaptive:prior=0.6,weight=2", "by-batch:[[1,2,4],[3,8,0]]"]
    with pytest.raises(ValueError, match="given twice"):
        factor.values_from("adaptive,adaptive")


@pytest.mark.parametrize("argv, message", [
    (["--spec-policy", "sometimes"], "expected static, adaptive"),
    (["--spec-policy", "by-batch:[[1,8,9]]", "-k", "4"], "drafts more than k=4"),
    (["--spec-policy", "adaptive", "--draft-shape", "tree:topk=2,depth=2,budget=4"], "applies to chains"),
])
def test_bad_policies_are_refused_before_any_work(argv, message, capsys, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(argv + ["-o", str(out)])
    assert message in str(exc.value.code) + capsys.readouterr().err
    assert not out.exists()  # a refused run makes no folder
