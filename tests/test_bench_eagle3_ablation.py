"""bench/eagle3_ablation.py on a tiny llama target: a cache of self-distilled data is written once,
and a variant trained on it reports agreement by draft position that training moved off the
untrained head's; a layer the cache does not hold, or a decoder layer the target lacks, is refused
by name."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import eagle3_ablation  # noqa: E402

from specnative.models import tiny_vocab, write_tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    work = tmp_path_factory.mktemp("ablation")
    forced = tiny_vocab()[0].index("\u2581the")
    target = write_tiny_llama(work / "target.gguf", n_embd=64, n_layer=4, n_head=4, n_ff=128, forced_token=forced,
                              force_logit=5.0)
    for name in ("train", "unseen"):
        eagle3_ablation.main(["cache", str(target), "builtin", "5", str(work / f"{name}.pt"), "--layers", "1,2,3",
                              "--n-predict", "32", "-t", "1"])
    return target, work / "train.pt", work / "unseen.pt"


def _variant(caches, capsys, *extra):
    target, train, unseen = caches
    eagle3_ablation.main(["train", str(target), str(train), str(unseen), "--layers", "1,2,3", "--draft-vocab", "512",
                          "-t", "1", *extra])
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_training_moves_the_agreement_off_the_untrained_heads(caches, capsys):
    untrained = _variant(caches, capsys, "--tokens", "0", "--ttt", "1")
    trained = _variant(caches, capsys, "--tokens", "20000", "--ttt", "1")
    assert len(trained["held_out_top1"]) == 1 and len(trained["unseen_top1"]) == 1
    assert trained["unseen_top1"][0] > untrained["unseen_top1"][0] + 0.05
    assert 0 < trained["unseen_vocabulary_coverage"] <= 1


def test_a_layer_the_cache_lacks_is_refused(caches, capsys):
    with pytest.raises(SystemExit, match=r"holds the inputs of layers \(1, 2, 3\), not of \[0\]"):
        _variant(caches, capsys, "--layers", "0,1,2")


def test_a_decoder_layer_the_target_lacks_is_refused(caches, capsys):
    with pytest.raises(SystemExit, match=r"--decoder-from-layer 4: the target has layers 0\.\.3"):
        _variant(caches, capsys, "--decoder-from-layer", "4")
