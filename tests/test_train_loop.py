"""Both drafters train through the one loop (loop.train) and are written by the one GGUF writer:
the pipeline hands the loop each kind's recipe, training lowers both kinds' held-out loss, and a
fault planted in the loop (no optimizer step, no learning rate) shows in both kinds' loss alike."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specnative.models import tiny_vocab, write_tiny_llama
from specnative.models.train import loop, pipeline
from specnative.models.train.dflash_trainer import DFlashSettings
from specnative.models.train.gguf_target import TorchLlama
from specnative.models.train.pipeline import Options, train_drafter
from specnative.models.train.target_check import read_target
from specnative.models.train.trainer import TrainSettings
from specnative.models.train.writer import read_drafter, write_drafter

KINDS = {"eagle3": ({"ttt_steps": 2}, TrainSettings), "dflash": ({"block_size": 5}, DFlashSettings)}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    forced = tiny_vocab()[0].index("\u2581the")
    return write_tiny_llama(tmp_path_factory.mktemp("train_loop") / "target.gguf", n_embd=64, n_layer=4, n_head=4,
                            n_ff=128, forced_token=forced, force_logit=5.0)


def _train(target, out, kind: str) -> dict:
    options = {"target": str(target), "out": str(out), "kind": kind, "data": "builtin", "n_predict": 32,
               "layers": (1, 2, 3), "draft_vocab": 512, "max_tokens": 3000, "quiet": True, "threads": 1}
    return train_drafter(Options(**options, **KINDS[kind][0]))


def _lowers_the_held_out_loss(report) -> bool:
    before = report["held_out"]["before_training"]["loss_by_position"]
    after = report["held_out"]["after_training"]["loss_by_position"]
    return len(before) == len(after) > 0 and all(a < b for a, b in zip(after, before))


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_trains_through_the_one_loop_and_writes_through_the_one_writer(target, tmp_path, monkeypatch,
                                                                                  kind):
    assert pipeline.train is loop.train
    recipes = []

    def spy(head, train_set, held_set, t2d, recipe):
        recipes.append(recipe)
        return loop.train(head, train_set, held_set, t2d, recipe)

    monkeypatch.setattr(pipeline, "train", spy)
    report = _train(target, tmp_path / "drafter.gguf", kind)
    assert len(recipes) == 1 and type(recipes[0]) is KINDS[kind][1] and isinstance(recipes[0], loop.Recipe)
    assert report["training"]["tokens"] >= 3000 and _lowers_the_held_out_loss(report)
    # the file read back and written again by the same core gives the same bytes
    head, d2t, layers = read_drafter(tmp_path / "drafter.gguf", TorchLlama(target).tok_embd)
    assert head.arch == kind and layers == (1, 2, 3)
    reader, info = read_target(target)
    again = write_drafter(tmp_path / "again.gguf", head, d2t=d2t, target_reader=reader, target_info=info,
                          layers=layers)
    assert again.read_bytes() == (tmp_path / "drafter.gguf").read_bytes()


@pytest.mark.parametrize("fault", ["no optimizer step", "no learning rate"])
def test_a_fault_in_the_loop_fails_both_kinds(target, tmp_path, monkeypatch, fault):
    if fault == "no optimizer step":
        monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, closure=None: None)
    else:
        monkeypatch.setattr(loop, "_lr_factor", lambda progress, batch, warmup_batches: 0.0)
    for kind in KINDS:
        report = _train(target, tmp_path / f"{kind}.gguf", kind)
        assert report["training"]["tokens"] >= 3000 and not _lowers_the_held_out_loss(report), kind
