"""`specnative project` prices what a run measured and refuses what it cannot price: draft trees
and block drafters by their own rounds, model files by their recorded hash, a devices file checked
field by field, the interval's clamp at one step, serve runs, repeated device names."""
from __future__ import annotations

import hashlib
import shutil

import pandas as pd
import pytest
from synthetic_traces import PROVENANCE, off_row, on_row, write_run

from specnative.analysis.projection import cost
from specnative.analysis.projection.cost import LABEL
from specnative.analysis.projection.device import resolve
from specnative.analysis.projection.shape import from_gguf
from specnative.cli import main as cli_main
from specnative.models.tiny import write_tiny_llama


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def models(projection_models):
    return projection_models


def rows_for(models, ons):
    """An off row and the given on rows of one regime, naming the tiny files with their hashes."""
    ids = {"target_model": "pt.gguf", "target_sha256": sha(models / "pt.gguf")}
    out = [off_row(**ids)]
    for n, extra in enumerate(ons):
        row = on_row(**ids, draft_model="pd.gguf", draft_sha256=sha(models / "pd.gguf"), cell_id=f"on-{n}")
        row.update(extra)
        out.append(row)
    return out


def run_of(tmp_path, models, ons, provenance=None):
    return write_run(tmp_path / "run", rows_for(models, ons), provenance or dict(PROVENANCE, models=[]))


def digest(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def project(run, out, *extra, hardware="m2"):
    return cli_main(["project", str(run), "--hardware", hardware, "-o", str(out), *extra])


def refused(capsys, rc):
    captured = capsys.readouterr()
    assert rc == 1 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


TREE_ONE_NODE = "tree:topk=1,depth=1,budget=64"
TREE_TOPK = "tree:topk=4,depth=5,budget=8"
TREE_SPLIT = "tree:branches=4,p_split=0.1,budget=8"


def test_trees_and_blocks_are_priced_by_what_they_run(tmp_path, models, capsys):
    ons = [dict(k=64, draft_shape=TREE_ONE_NODE, nodes_per_round=1.0, accept_at_pos="0.7",
                accept_len_hist="300;700"),
           dict(k=8, draft_shape=TREE_TOPK, nodes_per_round=7.5, accept_at_pos="0.8;0.6;0.4;0.2;0.1",
                accept_len_hist="200;200;200;200;100;100"),
           dict(k=8, draft_shape=TREE_SPLIT, nodes_per_round=9.0, accept_at_pos="0.8;0.5",
                accept_len_hist="200;300;500"),
           dict(k=4, drafter="dflash", drafter_kind="dflash"),
           dict(k=4)]
    run = run_of(tmp_path, models, ons)
    assert project(run, tmp_path / "p", "--models", str(models)) == 0
    printed = capsys.readouterr().out
    df = pd.read_csv(tmp_path / "p" / "projection.csv")
    dev, = resolve("m2")
    t, d = from_gguf(models / "pt.gguf"), from_gguf(models / "pd.gguf")
    own = 64 + 32

    def f(shape, rows):
        return cost.forward_s(shape, dev, rows, 1, cost.kv_cells(0, 1, rows, own))

    step = f(t, 1)
    by_shape = {r["draft_shape"]: r for _, r in df.iterrows()}
    assert set(by_shape) == {TREE_ONE_NODE, TREE_TOPK, TREE_SPLIT, "block", "chain"}
    # a one-node tree: one draft decode of the root, a verify of its node and the pending token
    assert by_shape[TREE_ONE_NODE]["c"] == pytest.approx((f(d, 1) + f(t, 2)) / step - 1, rel=1e-6)
    assert by_shape[TREE_ONE_NODE]["c"] < 1.0
    # topk: the root's decode, then depth - 1 levels of topk frontier nodes; 7.5 nodes + 1 verified
    verify = (f(t, 8) + f(t, 9)) / 2
    assert by_shape[TREE_TOPK]["c"] == pytest.approx((f(d, 1) + 4 * f(d, 4) + verify) / step - 1, rel=1e-6)
    # split: the root and each of its 9 nodes fed once
    assert by_shape[TREE_SPLIT]["c"] == pytest.approx((10 * f(d, 1) + f(t, 10)) / step - 1, rel=1e-6)
    # a DFlash block: one draft decode of k + 1 positions
    assert by_shape["block"]["c"] == pytest.approx((f(d, 5) + f(t, 5)) / step - 1, rel=1e-6)
    assert by_shape["chain"]["c"] == pytest.approx((4 * f(d, 1) + f(t, 5)) / step - 1, rel=1e-6)
    assert by_shape[TREE_TOPK]["nodes_per_round"] == 7.5
    md = (tmp_path / "p" / "projection.md").read_text()
    assert all(s in md for s in (TREE_ONE_NODE, TREE_TOPK, TREE_SPLIT, "block"))
    assert TREE_TOPK in printed


def test_a_model_file_with_another_hash_is_refused(tmp_path, models, capsys):
    run = run_of(tmp_path, models, [dict(k=4)])
    other = tmp_path / "other"
    other.mkdir()
    write_tiny_llama(other / "pt.gguf", n_embd=64, n_ff=128, n_layer=2)  # the same name, another model
    shutil.copy(models / "pd.gguf", other / "pd.gguf")
    before = digest(tmp_path)
    line = refused(capsys, project(run, tmp_path / "p", "--models", str(other)))
    assert "pt.gguf" in line and sha(other / "pt.gguf") in line and sha(models / "pt.gguf") in line
    assert digest(tmp_path) == before and not (tmp_path / "p").exists()
    # the right file further on the search path is taken
    assert project(run, tmp_path / "p", "--models", str(other), "--models", str(models)) == 0
    capsys.readouterr()


def test_the_provenance_hash_is_checked_where_the_rows_record_none(tmp_path, models, capsys):
    prov = dict(PROVENANCE, models=[{"role": "target", "name": "pt.gguf", "path": str(models / "pt.gguf"),
                                     "sha256": "0" * 64}])
    run = run_of(tmp_path, models, [dict(k=4)], prov)
    frame = pd.read_csv(run / "traces.csv")
    frame["target_sha256"] = ""
    frame.to_csv(run / "traces.csv", index=False)
    line = refused(capsys, project(run, tmp_path / "p", "--models", str(models)))
    assert "0" * 64 in line and sha(models / "pt.gguf") in line
    assert not (tmp_path / "p").exists()


DEVICE = 'backend = "cpu"\nmem_bw_gbs = 10\ntflops = { float = 0.01 }\n'


@pytest.mark.parametrize("bad, field", [
    ("overhead_forward_us = -5", "overhead_forward_us"), ("overhead_layer_us = -1", "overhead_layer_us"),
    ("threads = -2", "threads"), ("threads = 0", "threads"), ("threads = 1.5", "threads"),
    ("mem_bw_gbs = nan", "mem_bw_gbs"), ("mem_bw_gbs = inf", "mem_bw_gbs"),
    ("tflops = { float = inf }", "tflops"), ("tflops = { float = nan }", "tflops"),
    ("matvec_tflops = { Q4_0 = nan }", "matvec_tflops"), ("vector_tflops = -1", "vector_tflops"),
    ("cost_error = 'wide'", "cost_error"), ("cost_error = 1.5", "cost_error"), ("cost_error = 1.0", "cost_error"),
    ("cost_error = -0.1", "cost_error"), ("cost_error = nan", "cost_error"), ("bw_efficiency = nan", "bw_efficiency"),
    ("dot_ns = inf", "dot_ns"), ("bw_threads_max = nan", "bw_threads_max"), ("threads = true", "threads"),
    ("mem_bw_gbs = '10'", "mem_bw_gbs"), ("label = 3", "label"), ("match = 'h100'", "match"),
    ("overhead_forwad_us = 5", "overhead_forwad_us"), ("backend = 'tpu'", "backend")])
def test_a_devices_file_is_checked_field_by_field(tmp_path, models, capsys, bad, field):
    run = run_of(tmp_path, models, [dict(k=4)])
    mine = tmp_path / "mine.toml"
    body = DEVICE
    key = bad.split("=")[0].strip()
    body = "\n".join(line for line in body.splitlines() if not line.startswith(key + " ")) + "\n"
    mine.write_text(f"[lab]\n{body}{bad}\n")
    before = digest(tmp_path)
    line = refused(capsys, project(run, tmp_path / "p", "--models", str(models), "--devices", str(mine),
                                   hardware="lab"))
    assert "'lab'" in line and field in line
    assert digest(tmp_path) == before and not (tmp_path / "p").exists()


def test_a_good_devices_file_prices(tmp_path, models, capsys):
    run = run_of(tmp_path, models, [dict(k=4)])
    mine = tmp_path / "mine.toml"
    mine.write_text(f"[lab]\n{DEVICE}threads = 2\ncost_error = 0\noverhead_forward_us = 0\n")
    assert project(run, tmp_path / "p", "--models", str(models), "--devices", str(mine), hardware="lab") == 0
    capsys.readouterr()
    row = pd.read_csv(tmp_path / "p" / "projection.csv").iloc[0]
    assert row["device"] == "lab" and row["cost_error"] == 0 and row["step_ms"] > 0


def test_an_output_path_through_a_file_is_refused(tmp_path, models, capsys):
    run = run_of(tmp_path, models, [dict(k=4)])
    taken = tmp_path / "taken"
    taken.write_text("mine\n")
    before = digest(tmp_path)
    line = refused(capsys, project(run, taken, "--models", str(models)))
    assert str(taken) in line
    below = refused(capsys, project(run, taken / "sub", "--models", str(models)))
    assert str(taken) in below
    assert digest(tmp_path) == before


def test_the_interval_never_prices_a_round_below_one_step(tmp_path, models, capsys):
    run = run_of(tmp_path, models, [dict(k=4, drafter="ngram-simple")])
    assert project(run, tmp_path / "p", "--models", str(models), hardware="h100-sxm") == 0
    capsys.readouterr()
    row = pd.read_csv(tmp_path / "p" / "projection.csv").iloc[0]
    assert row["c_draft"] == 0 and (1 + row["c"]) * (1 - row["cost_error"]) < 1  # the unclamped bound
    assert row["speedup_hi"] == pytest.approx(row["tau_hi"], rel=1e-9)
    assert row["speedup_lo"] == pytest.approx(row["tau_lo"] / ((1 + row["c"]) * (1 + row["cost_error"])))


def test_a_serve_run_is_refused(tmp_path, models, capsys):
    rows = rows_for(models, [dict(k=4)])
    for r in rows:
        r.update(request_rate=1.0, n_requests=8)
    run = write_run(tmp_path / "run", rows, dict(PROVENANCE, models=[], mode="serve"))
    before = digest(tmp_path)
    line = refused(capsys, project(run, tmp_path / "p", "--models", str(models)))
    assert "serve run" in line
    assert digest(tmp_path) == before


def test_a_device_named_twice_is_priced_once(tmp_path, models, capsys):
    run = run_of(tmp_path, models, [dict(k=4)])
    assert project(run, tmp_path / "p", "--models", str(models), hardware="m2,h100-sxm,m2, m2") == 0
    printed = capsys.readouterr().out
    df = pd.read_csv(tmp_path / "p" / "projection.csv")
    assert list(df["device"]) == ["m2", "h100-sxm"]
    assert sum(line.startswith(f"{LABEL} m2:") for line in printed.splitlines()) == 1


def test_mtp_rows_are_left_out_with_a_note(tmp_path, models, capsys):
    run = run_of(tmp_path, models, [dict(k=4), dict(k=4, drafter="mtp", drafter_kind="mtp", draft_model="",
                                                   draft_sha256="")])
    assert project(run, tmp_path / "p", "--models", str(models)) == 0
    assert "1 MTP row(s) left out" in capsys.readouterr().out
    df = pd.read_csv(tmp_path / "p" / "projection.csv")
    assert list(df["drafter"]) == ["model"]
