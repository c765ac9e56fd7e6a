"""train-drafter on a tiny llama target: the written EAGLE-3 head loads in llama.cpp, drafts through
specnative's engine, beats an untrained head on the target's own text, agrees with the trainer's own
measurement, and is byte-identical for a seed."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specnative import Engine
from specnative.models import tiny_vocab, write_tiny_llama
from specnative.models.train.measure import speculative, teacher_forced
from specnative.models.train.pipeline import Options, train_drafter
from specnative.models.train.prompts import load_prompts

PROMPTS = ["The city of", "Once upon a time there was a", "Hello", "In the year"]
LAYERS = (1, 2, 3)
K = 3
# A target with learnable structure: one word's output row leads the others by a margin that makes
# it the target's choice about 40 % of the time, depending on the context (its other tokens come
# from random weights). A head must learn when; an untrained one never drafts it.
FORCE_LOGIT = 5.0


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("train_drafter")


@pytest.fixture(scope="module")
def target(work):
    forced = tiny_vocab()[0].index("\u2581the")
    return write_tiny_llama(work / "target.gguf", n_embd=64, n_layer=4, n_head=4, n_ff=128, forced_token=forced,
                            force_logit=FORCE_LOGIT)


def _train(target, out, **kw):
    options = {"target": str(target), "out": str(out), "data": "builtin", "n_predict": 48, "layers": LAYERS,
               "draft_vocab": 512, "ttt_steps": K, "quiet": True, "threads": 1}
    options.update(kw)
    return train_drafter(Options(**options))


@pytest.fixture(scope="module")
def trained(target, work):
    report = _train(target, work / "head.gguf", max_tokens=30_000)
    return work / "head.gguf", report


@pytest.fixture(scope="module")
def untrained(target, work):
    _train(target, work / "random.gguf", max_tokens=0)  # the same initialization, no step taken
    return work / "random.gguf"


def _alpha(target, head):
    with Engine(target, head, n_ctx=2048, n_batch=256, n_seq_max=4, n_threads=1) as engine:
        assert engine.hidden_drafter == "eagle3"
        return engine.generate(PROMPTS, n_predict=48, spec=True, k=K, drafter="eagle3")


def test_the_file_is_what_llama_cpps_eagle3_loader_reads(trained):
    import gguf

    path, report = trained
    reader = gguf.GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    assert reader.get_field("general.architecture").contents() == "eagle3"
    assert list(reader.get_field("eagle3.target_layers").contents()) == list(LAYERS)
    assert reader.get_field("eagle3.target_hidden_size").contents() == 64
    assert {"fc.weight", "d2t", "output.weight", "blk.0.attn_norm_2.weight"} <= names
    assert "token_embd.weight" not in names  # borrowed from the target
    d2t = next(t for t in reader.tensors if t.name == "d2t")
    assert d2t.tensor_type == gguf.GGMLQuantizationType.I64 and len(d2t.data) == 512
    assert len(np.unique(d2t.data)) == 512 and report["draft_vocab"]["size"] == 512


def test_a_trained_head_beats_an_untrained_one(target, trained, untrained):
    good, bad = _alpha(target, trained[0]), _alpha(target, untrained)
    assert good.totals["drafted"] > 0 and bad.totals["drafted"] > 0
    assert good.draft_accept_rate > 0.15
    assert good.draft_accept_rate > bad.draft_accept_rate + 0.1
    assert good.per_position_accept_rate[0] > 0.3


def test_the_report_beside_the_file(trained):
    path, report = trained
    saved = json.loads((path.parent / (path.name + ".train.json")).read_text())
    assert saved["sha256"] == report["sha256"]
    epochs = saved["training"]["epochs"]
    assert epochs[-1]["loss_by_position"][0] < epochs[0]["loss_by_position"][0]  # it learned
    held = saved["held_out"]
    assert len(held["after_training"]["top1_by_position"]) == K
    assert held["after_training"]["top1_by_position"][0] > held["before_training"]["top1_by_position"][0] + 0.1
    assert saved["data"]["tokens_sha256"] and saved["prompts"]["sha256"] and saved["split"]["held_out_sequences"] >= 1
    check = saved["data"]["torch_vs_llama_cpp"]  # f32 weights: the torch graph is llama.cpp's up to rounding
    assert check["greedy_agreement"] > 0.99 and check["max_abs_dlogit"] < 0.05


def test_llama_cpp_drafts_what_the_torch_head_predicts(target, trained):
    """specnative's counts by draft position equal those the torch head predicts for the same tokens,
    rounds simulated anchor for anchor: a wrong graph, feature order or file would part them."""
    path, _ = trained
    prompts, _ = load_prompts("builtin", str(target), n_predict=48, max_prompt_tokens=512)
    measured, sequences = speculative(str(target), str(path), prompts[:16], n_predict=48, k=K, threads=1,
                                      baseline=False)
    predicted = teacher_forced(str(target), str(path), sequences, k=K, n_predict=48, threads=1)["rounds"]
    assert measured["alpha_by_position"][0] > 0.2
    assert predicted["rounds"] == pytest.approx(measured["rounds"], rel=0.02)
    np.testing.assert_allclose(predicted["alpha_by_position"], measured["alpha_by_position"], atol=0.02)


def test_the_same_seed_gives_the_same_bytes(target, work):
    a = _train(target, work / "a.gguf", max_tokens=3000, seed=3)
    b = _train(target, work / "b.gguf", max_tokens=3000, seed=3)
    c = _train(target, work / "c.gguf", max_tokens=3000, seed=4)
    assert (work / "a.gguf").read_bytes() == (work / "b.gguf").read_bytes()
    assert a["sha256"] == b["sha256"] != c["sha256"]
