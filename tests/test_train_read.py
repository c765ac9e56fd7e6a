"""train-drafter's recorded replies: a ShareGPT reply follows its prompt's own tokens, the target
reads it in one pass (features and soft labels exactly as its forward gives them), a read reply
teaches soft labels only and is never held out or scored, and the prompts the head is measured on
afterwards are kept out of its training data."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specnative.models import write_tiny_llama
from specnative.models.train import pipeline
from specnative.models.train.batches import make_batch, t2d_table
from specnative.models.train.distill import read_replies
from specnative.models.train.gguf_target import TorchLlama
from specnative.models.train.pipeline import Options, train_drafter
from specnative.models.train.prompts import TokenPrompt, load_prompts, reply_tokens
from specnative.run.workloads import Workload
from specnative.run.workloads.prompts import Prompt

LAYERS = (1, 2, 3)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("read") / "target.gguf", n_embd=64, n_layer=4, n_head=4,
                            n_ff=128)


def _chat(ident, question, reply):
    return Prompt("sharegpt", (("user", question),), ident, dataset="sharegpt", reply=reply)


def _token_prompts(target, n: int, reply_tokens_max: int = 24):
    workload = Workload(target, [_chat("q0", "x", "y")])
    out = []
    for i in range(n):
        p = _chat(f"sharegpt/c{i}", f"Tell me about the river number {i}.", f"The river number {i} is long and wide.")
        tokens = tuple(workload.tokenize(workload.text_of(p), True))
        out.append(TokenPrompt(p.ident, tokens, reply_tokens(workload, p, tokens, reply_tokens_max)))
    return out


def test_a_reply_follows_its_prompts_own_tokens(target):
    workload = Workload(target, [_chat("q0", "x", "y")])
    p = _chat("sharegpt/a", "What is a river?", "A river is water that flows to the sea.")
    tokens = tuple(workload.tokenize(workload.text_of(p), True))
    reply = reply_tokens(workload, p, tokens, 64)
    closed = workload.render(p.messages + (("assistant", p.reply),), add_generation_prompt=False)
    assert reply and tuple(workload.tokenize(closed, True)) == tokens + reply
    assert reply_tokens(workload, p, tokens, 3) == reply[:3]
    assert reply_tokens(workload, _chat("sharegpt/b", "No reply here?", None), tokens, 64) == ()


def test_the_target_reads_a_reply_in_one_pass(target):
    prompts = _token_prompts(target, 3)
    model = TorchLlama(target)
    sequences, features = read_replies(model, prompts, layers=LAYERS, top_k=4, deadline=None,
                                       skip={"sharegpt/c1"}, quiet=True)
    assert [s.ident for s in sequences] == ["read:sharegpt/c0", "read:sharegpt/c2"]
    for s, f, p in zip(sequences, features, (prompts[0], prompts[2])):
        assert tuple(s.tokens) == p.tokens + p.reply and s.n_prompt == len(s.tokens)
        feats, logits = model.forward(s.tokens, LAYERS, logits=True)
        assert torch.equal(f, feats)
        assert np.array_equal(s.soft_ids, logits.topk(4, dim=-1).indices.numpy())
    assert read_replies(model, prompts, layers=LAYERS, top_k=4, deadline=0.0, quiet=True) == ([], [])


def test_a_read_reply_teaches_soft_labels_only(target):
    prompts = _token_prompts(target, 1)
    sequences, features = read_replies(TorchLlama(target), prompts, layers=LAYERS, top_k=4, deadline=None, quiet=True)
    n_vocab = int(sequences[0].soft_ids.max()) + 100
    batch = make_batch([[0]], sequences, features, t2d_table(None, n_vocab), row_len=64, steps=2)
    L = len(sequences[0].tokens)
    assert not batch["valid"].any()                           # nothing scored against the recorded text
    assert int(batch["soft_valid"][0].sum()) == L - 1         # the target's distribution at every position


def test_read_replies_train_and_stay_out_of_the_held_out_split(target, tmp_path, monkeypatch):
    offered = _token_prompts(target, 8)
    monkeypatch.setattr(pipeline, "check_spec", lambda spec: None)
    monkeypatch.setattr(pipeline, "load_prompts", lambda spec, target, **kw: (
        offered if kw.get("replies") else [TokenPrompt(p.ident, p.tokens) for p in offered], {"spec": spec}))
    report = train_drafter(Options(target=str(target), out=str(tmp_path / "h.gguf"), data="sharegpt:8",
                                   n_predict=16, max_tokens=2_000, layers=LAYERS, draft_vocab=256, ttt_steps=1,
                                   read_share=0.5, held_out=0.25, quiet=True))
    # no time budget to share: every prompt is continued and every reply read
    split = report["split"]
    assert report["data"]["continued"] == 8 and report["data"]["read"]["replies"] == split["of_them_read_replies"] == 8
    assert split["held_out_sequences"] == 2 and split["train_sequences"] == 6 + 8
    assert not any(ident.startswith("read:") for ident in split["held_out_ids"])
    assert report["held_out"]["after_training"]["positions"] > 0


def test_the_evaluation_prompts_are_kept_out_of_training(target):
    everything, _ = load_prompts("builtin", target, n_predict=16, max_prompt_tokens=10_000)
    measured = {p.tokens for p in everything[:5]}
    kept, record = load_prompts("builtin", target, n_predict=16, max_prompt_tokens=10_000, exclude=measured)
    assert record["skipped_as_evaluation_prompts"] == 5
    assert [p.tokens for p in kept] == [p.tokens for p in everything[5:]]


def test_the_measured_prompts_are_loaded_once_and_never_trained_on(target, tmp_path):
    train_file, eval_file = tmp_path / "train.txt", tmp_path / "eval.txt"
    train_file.write_text("The city of\nOnce upon a time there was a\nIn the year\n")
    eval_file.write_text("In the year\nHello\n")
    report = train_drafter(Options(target=str(target), out=str(tmp_path / "h.gguf"), data=str(train_file),
                                   eval_data=str(eval_file), n_predict=16, max_tokens=500, layers=LAYERS,
                                   draft_vocab=256, ttt_steps=1, eval_k=2, quiet=True))
    assert report["prompts"]["skipped_as_evaluation_prompts"] == 1 and report["prompts"]["kept"] == 2
    evaluation = report["evaluation"]
    assert evaluation["overlap_with_training"] == 0 and evaluation["prompts"]["kept"] == 2
    assert evaluation["specnative"]["k"] == 2 and sum(evaluation["specnative"]["drafted_at"]) > 0
