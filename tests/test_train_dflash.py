"""train-drafter --kind dflash on a tiny llama target: the written block drafter loads in llama.cpp
(draft-dflash through specnative's engine), drafts exactly what the torch drafter predicts, and on a
target that always says the same word it learns to draft whole blocks of it."""
from __future__ import annotations

import gguf
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
K = 4
BLOCK = 8


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("train_dflash")


def _target(work, name: str, force_logit: float):
    forced = tiny_vocab()[0].index("\u2581the")
    return write_tiny_llama(work / name, n_embd=64, n_layer=4, n_head=4, n_ff=128, forced_token=forced,
                            force_logit=force_logit)


@pytest.fixture(scope="module")
def target(work):
    # the forced word leads by a margin that makes it the target's choice part of the time, by context
    return _target(work, "target.gguf", 5.0)


@pytest.fixture(scope="module")
def steady_target(work):
    # the forced word leads everywhere: a deterministic target, every block the same word
    return _target(work, "steady.gguf", 20.0)


def _train(target, out, **kw):
    options = {"target": str(target), "out": str(out), "kind": "dflash", "data": "builtin", "n_predict": 48,
               "layers": LAYERS, "draft_vocab": 512, "block_size": BLOCK, "quiet": True, "threads": 1}
    options.update(kw)
    return train_drafter(Options(**options))


@pytest.fixture(scope="module")
def trained(target, work):
    report = _train(target, work / "dflash.gguf", max_tokens=20_000)
    return work / "dflash.gguf", report


def _run(target, drafter_file, k=K):
    with Engine(target, drafter_file, n_ctx=2048, n_batch=256, n_seq_max=4, n_threads=1) as engine:
        assert engine.hidden_drafter == "dflash"
        return engine.generate(PROMPTS, n_predict=48, spec=True, k=k, drafter="dflash")


def test_the_file_is_what_llama_cpps_dflash_loader_reads(trained):
    path, report = trained
    reader = gguf.GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    field = lambda key: reader.get_field(key).contents()
    assert field("general.architecture") == "dflash"
    assert list(field("dflash.target_layers")) == list(LAYERS)
    assert field("dflash.block_size") == BLOCK
    mask = field("tokenizer.ggml.mask_token_id")
    assert mask == report["training"]["mask_token"] == 0  # the tiny vocabulary's <unk>: no free control token
    assert {"fc.weight", "enc.output_norm.weight", "output.weight", "output_norm.weight", "d2t",
            "blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.0.ffn_down.weight"} <= names
    # plain DFlash (no DFlash2 selector), the target's embeddings borrowed
    assert "token_embd.weight" not in names and "selector_hidden.weight" not in names
    d2t = next(t for t in reader.tensors if t.name == "d2t")
    assert d2t.tensor_type == gguf.GGMLQuantizationType.I64 and len(np.unique(d2t.data)) == 512
    assert report["kind"] == "dflash" and report["head"]["block_size"] == BLOCK


def test_the_report_has_the_training_curve(trained):
    _, report = trained
    epochs = report["training"]["epochs"]
    assert epochs and report["training"]["tokens"] >= 20_000
    held = epochs[-1]["held_out"]
    assert len(held["top1_by_position"]) == BLOCK - 1 and len(held["chained_by_position"]) == BLOCK - 1
    assert all(a >= b for a, b in zip(held["chained_by_position"], held["chained_by_position"][1:]))
    assert len(epochs[0]["loss_by_position"]) == BLOCK - 1


def test_llama_cpp_drafts_what_the_torch_drafter_predicts(target, trained):
    """A block's drafts never depend on each other, so the torch drafter's chained top-1 on the tokens
    specnative emitted is exactly what llama.cpp's greedy verify accepted, round for round."""
    path, _ = trained
    prompts, _ = load_prompts("builtin", str(target), n_predict=48, max_prompt_tokens=384)
    measured, sequences = speculative(str(target), str(path), prompts[:8], n_predict=48, k=K, threads=1,
                                      drafter="dflash", baseline=False)
    predicted = teacher_forced(str(target), str(path), sequences, k=K, n_predict=48, threads=1)["rounds"]
    assert measured["accepted"] > 0
    assert predicted["rounds"] == measured["rounds"]
    assert predicted["accepted"] == pytest.approx(measured["accepted"], abs=max(2, 0.02 * measured["accepted"]))
    assert np.allclose(predicted["alpha_by_position"], measured["alpha_by_position"], atol=0.03)


def test_a_drafter_trained_on_a_deterministic_target_drafts_whole_blocks(steady_target, work):
    report = _train(steady_target, work / "steady-dflash.gguf", max_tokens=20_000)
    totals = _run(steady_target, work / "steady-dflash.gguf", k=BLOCK - 1).totals
    alpha = totals["accepted_at"] / np.maximum(totals["drafted_at"], 1)
    assert alpha.min() >= 0.9, alpha                        # every offset of the block, up to 7
    assert totals["emitted"] / totals["rounds"] >= 6.0      # tau: most of each block accepted
    assert report["held_out"]["after_training"]["chained_by_position"][-1] >= 0.9


def test_training_lowers_the_held_out_loss_at_every_offset(trained):
    """The seeded drafter before training against the same drafter after it, on held-out sequences
    (the target's own continuations of prompts never trained on): cross-entropy by block offset."""
    _, report = trained
    before = report["held_out"]["before_training"]["loss_by_position"]
    after = report["held_out"]["after_training"]["loss_by_position"]
    assert len(before) == len(after) == BLOCK - 1
    assert all(a < b - 1.0 for a, b in zip(after, before)), (before, after)


@pytest.mark.parametrize("change, message", [
    ({"block_size": 1}, "--block-size"),
    ({"block_size": 4, "eval_k": 4, "eval_data": "builtin"}, "drafts at most 3"),
    ({"draft_layers": 0}, "--draft-layers"),
    ({"gamma": 0.0}, "--gamma"),
])
def test_bad_dflash_options_are_refused_before_any_work(target, work, change, message):
    out = work / "refused.gguf"
    with pytest.raises(ValueError, match=message):
        _train(target, out, max_tokens=10, **change)
    assert not out.exists()


def test_a_short_block_needs_no_eval_k_without_eval_data_and_an_untrained_file_says_so(target, work):
    """--eval-k is the --eval-data measurement's draft length: without --eval-data, a block of 2 is
    trained under the --eval-k default; --max-tokens 0 writes the seeded initialization, and the
    report says the file is untrained."""
    from specnative.models.train.pipeline import summary
    report = _train(target, work / "block2.gguf", max_tokens=0, block_size=2)
    assert (work / "block2.gguf").is_file() and report["head"]["block_size"] == 2
    assert report["untrained"] is True and report["training"]["tokens"] == 0
    assert "UNTRAINED" in summary(report).splitlines()[0]
