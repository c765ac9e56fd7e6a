"""bench/eagle3_ablation.py on a tiny llama target: a cache of self-distilled data is written once,
and a variant trained on it, or on read replies alone, reports agreement by draft position that
training moved off the untrained head's; a layer the cache does not hold, a decoder layer the
target lacks, and data without recorded replies are refused by name."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import eagle3_ablation  # noqa: E402

from specnative.models import tiny_vocab, write_tiny_llama  # noqa: E402
from specnative.models.train.distill import read_replies  # noqa: E402
from specnative.models.train.gguf_target import TorchLlama  # noqa: E402
from specnative.models.train.prompts import TokenPrompt, load_prompts  # noqa: E402


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


def test_read_replies_alone_train_a_head(caches, capsys, tmp_path):
    target, _, _ = caches
    # replies of the tiny target's own text: each builtin prompt's continuation from the train cache
    prompts, _ = load_prompts("builtin", target, n_predict=32, max_prompt_tokens=10_000)
    continued = {tuple(s.tokens[:s.n_prompt]): s for s in torch.load(caches[1], weights_only=False)["sequences"]}
    offered = [TokenPrompt(p.ident, p.tokens, tuple(int(t) for t in continued[p.tokens].tokens[len(p.tokens):]))
               for p in prompts if p.tokens in continued]
    sequences, features = read_replies(TorchLlama(target), offered, layers=(1, 2, 3), top_k=16, deadline=None,
                                       quiet=True)
    torch.save({"sequences": sequences, "features": [f.half() for f in features], "layers": (1, 2, 3)},
               tmp_path / "read.pt")
    untrained = _variant(caches, capsys, "--tokens", "0", "--ttt", "1")
    trained = _variant(caches, capsys, "--tokens", "20000", "--ttt", "1", "--data-fraction", "0",
                       "--read-cache", str(tmp_path / "read.pt"))
    assert trained["train_sequences"] == len(sequences)
    assert trained["unseen_top1"][0] > untrained["unseen_top1"][0] + 0.05


def test_no_data_is_refused(caches, capsys):
    with pytest.raises(SystemExit, match="--data-fraction 0 trains on nothing without --read-cache"):
        _variant(caches, capsys, "--data-fraction", "0")
    target, _, _ = caches
    with pytest.raises(SystemExit, match="no prompt with a recorded reply"):
        eagle3_ablation.main(["read", str(target), "builtin", "1", "unused.pt", "--layers", "1,2,3", "-t", "1"])
