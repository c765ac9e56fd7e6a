"""The tiny GGUF writer: determinism, layout llama.cpp expects, and the draft variants."""

import hashlib

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from specnative import models  # noqa: E402
from specnative.models import tiny as tiny_models

N_SPECIAL = models.FIRST_NORMAL_ID  # unk, bos, eos and the 256 byte tokens


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read(path):
    """(metadata dict, {tensor name: (numpy array in (out, in) order, ggml type)})."""
    r = gguf.GGUFReader(path)
    meta = {name: field.contents() for name, field in r.fields.items()}
    tensors = {t.name: (np.array(t.data), t.tensor_type) for t in r.tensors}
    return meta, tensors


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return models.write_tiny_llama(tmp_path_factory.mktemp("base") / "base.gguf")


def test_same_arguments_give_identical_bytes(base, tmp_path):
    again = models.write_tiny_llama(tmp_path / "again.gguf", noise=0.0)
    assert sha256(again) == sha256(base)
    other = models.write_tiny_llama(tmp_path / "other.gguf", seed=1)
    assert sha256(other) != sha256(base)


def test_metadata_and_tensors_are_what_llama_expects(base):
    meta, tensors = read(base)
    assert meta["general.architecture"] == "llama"
    assert meta["general.file_type"] == gguf.LlamaFileType.ALL_F32
    assert meta["llama.block_count"] == 2
    assert meta["llama.embedding_length"] == 128
    assert meta["llama.feed_forward_length"] == 256
    assert meta["llama.attention.head_count"] == 4
    assert meta["llama.attention.head_count_kv"] == 4
    assert meta["llama.context_length"] == 131072
    assert meta["llama.rope.dimension_count"] == 32
    assert meta["llama.attention.layer_norm_rms_epsilon"] > 0
    assert meta["tokenizer.ggml.model"] == "llama"
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert meta["tokenizer.ggml.unknown_token_id"] == 0
    assert meta["tokenizer.ggml.add_bos_token"] is True
    assert meta["tokenizer.ggml.add_eos_token"] is False
    assert meta["tokenizer.ggml.add_space_prefix"] is True

    n_vocab = tiny_models.DEFAULT_VOCAB_SIZE
    expected = {"token_embd.weight": (n_vocab, 128), "output_norm.weight": (128,),
                "output.weight": (n_vocab, 128)}
    for i in range(2):
        expected.update({
            f"blk.{i}.attn_norm.weight": (128,), f"blk.{i}.ffn_norm.weight": (128,),
            f"blk.{i}.attn_q.weight": (128, 128), f"blk.{i}.attn_k.weight": (128, 128),
            f"blk.{i}.attn_v.weight": (128, 128), f"blk.{i}.attn_output.weight": (128, 128),
            f"blk.{i}.ffn_gate.weight": (256, 128), f"blk.{i}.ffn_up.weight": (256, 128),
            f"blk.{i}.ffn_down.weight": (128, 256),
        })
    assert {name: a.shape for name, (a, _) in tensors.items()} == expected
    assert all(t == gguf.GGMLQuantizationType.F32 for _, t in tensors.values())


def test_grouped_query_attention_shapes(tmp_path):
    path = models.write_tiny_llama(tmp_path / "gqa.gguf", n_head=8, n_head_kv=2, n_layer=1)
    _, tensors = read(path)
    assert tensors["blk.0.attn_q.weight"][0].shape == (128, 128)
    assert tensors["blk.0.attn_k.weight"][0].shape == (32, 128)


def test_token_types_and_texts(base):
    meta, _ = read(base)
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    T = gguf.TokenType
    assert len(tokens) == len(types) == len(meta["tokenizer.ggml.scores"]) == 1024
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert types[:3] == [T.UNKNOWN, T.CONTROL, T.CONTROL]
    assert tokens[3:N_SPECIAL] == [f"<0x{b:02X}>" for b in range(256)]
    assert set(types[3:N_SPECIAL]) == {T.BYTE}
    assert set(types[N_SPECIAL:]) == {T.NORMAL}
    assert len(set(tokens)) == len(tokens)
    # Frequent English words are whole pieces, and every piece can be built by
    # SentencePiece merges (each of its prefixes is a piece too).
    pieces = set(tokens[N_SPECIAL:])
    for word in ("the", "and", "of", "people", "The"):
        assert "\u2581" + word in pieces
    assert {"\u2581", "a", "Z", ".", ","} <= pieces
    for piece in pieces:
        assert all(piece[:i] in pieces for i in range(1, len(piece)))


def test_special_and_byte_tokens_have_zero_output_rows(base, tmp_path):
    noisy = models.write_tiny_llama(tmp_path / "noisy.gguf", noise=0.1)
    for path in (base, noisy):
        out = read(path)[1]["output.weight"][0]
        assert not out[:N_SPECIAL].any()
        assert (np.abs(out[N_SPECIAL:]).sum(axis=1) > 0).all()


def test_noisy_copy_differs_by_the_requested_relative_noise(base, tmp_path):
    _, b = read(base)
    _, n = read(models.write_tiny_llama(tmp_path / "noisy.gguf", noise=0.2))
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_up.weight", "blk.1.attn_v.weight"):
        rel = np.std(n[name][0] - b[name][0]) / np.std(b[name][0])
        assert rel == pytest.approx(0.2, rel=0.05)
    assert np.array_equal(n["blk.0.attn_norm.weight"][0], b["blk.0.attn_norm.weight"][0])
    other = models.write_tiny_llama(tmp_path / "noisy2.gguf", noise=0.2, noise_seed=2)
    assert sha256(other) != sha256(tmp_path / "noisy.gguf")


def test_deep_target_starts_with_the_base_blocks(base, tmp_path):
    _, b = read(base)
    meta, d = read(models.write_tiny_llama(tmp_path / "deep.gguf", extra_layers=3))
    assert meta["llama.block_count"] == 5
    for name, (a, _) in b.items():
        assert np.array_equal(d[name][0], a), name
    damped = np.abs(d["blk.4.ffn_down.weight"][0]).max()
    assert 0 < damped < 1e-3 * np.abs(b["blk.1.ffn_down.weight"][0]).max() * 1.0001
    assert np.abs(d["blk.4.ffn_up.weight"][0]).max() > 0.1  # the rest is not damped


def test_shuffled_and_smaller_vocabularies(base, tmp_path):
    meta, b = read(base)
    tokens = meta["tokenizer.ggml.tokens"]
    smeta, s = read(models.write_tiny_llama(tmp_path / "shuffled.gguf", vocab="shuffled"))
    shuffled = smeta["tokenizer.ggml.tokens"]
    assert len(shuffled) == len(tokens) and set(shuffled) == set(tokens)
    assert shuffled[:N_SPECIAL] == tokens[:N_SPECIAL]
    assert all(x != y for x, y in zip(shuffled[N_SPECIAL:], tokens[N_SPECIAL:]))
    # Scores travel with their pieces, so text tokenizes the same way.
    score = dict(zip(tokens, meta["tokenizer.ggml.scores"]))
    assert all(score[t] == x for t, x in zip(shuffled, smeta["tokenizer.ggml.scores"]))

    small_meta, small = read(models.write_tiny_llama(tmp_path / "small.gguf", n_vocab=900))
    assert small_meta["tokenizer.ggml.tokens"] == tokens[:900]
    assert np.array_equal(small["token_embd.weight"][0], b["token_embd.weight"][0][:900])
    assert np.array_equal(small["blk.0.attn_q.weight"][0], b["blk.0.attn_q.weight"][0])


def test_f16_weights(base, tmp_path):
    meta, h = read(models.write_tiny_llama(tmp_path / "f16.gguf", dtype="f16"))
    _, b = read(base)
    assert meta["general.file_type"] == gguf.LlamaFileType.MOSTLY_F16
    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    for name, (a, t) in h.items():
        assert t == (F16 if a.ndim == 2 else F32), name
        np.testing.assert_allclose(a.astype(np.float32), b[name][0], rtol=1e-3, atol=1e-3)


def test_invalid_arguments(tmp_path):
    with pytest.raises(ValueError, match="n_embd and n_ff must be multiples of 32"):
        models.write_tiny_llama(tmp_path / "x.gguf", n_embd=100)
    with pytest.raises(ValueError, match="dtype must be 'f32' or 'f16'"):
        models.write_tiny_llama(tmp_path / "x.gguf", dtype="q4")
    with pytest.raises(ValueError, match="unknown vocab 'klingon'"):
        models.write_tiny_llama(tmp_path / "x.gguf", vocab="klingon")
    with pytest.raises(ValueError, match="unknown kind 'nonsense'"):
        models.tiny_pair(tmp_path, "nonsense")
    assert not list(tmp_path.iterdir())


def test_tiny_pair_kinds_and_cache(tmp_path):
    base_name = f"tiny-llama-v{tiny_models.FORMAT_VERSION}.gguf"
    target, draft = models.tiny_pair(tmp_path, "copy")
    assert target == draft and target.name == base_name

    target, draft = models.tiny_pair(tmp_path, "noisy")
    assert target.name == base_name and "noise0.1" in draft.name
    mtime = draft.stat().st_mtime_ns
    assert models.tiny_pair(tmp_path, "noisy") == (target, draft)
    assert draft.stat().st_mtime_ns == mtime  # cached, not rewritten

    _, other = models.tiny_pair(tmp_path, "noisy", noise=0.05)
    assert "noise0.05" in other.name

    target, draft = models.tiny_pair(tmp_path, "deep")
    assert read(target)[0]["llama.block_count"] == 32
    assert draft.name == base_name

    target, draft = models.tiny_pair(tmp_path, "shuffled", dtype="f16")
    assert "dtypef16" in target.name and "vocabshuffled" in draft.name
    target, draft = models.tiny_pair(tmp_path, "small_vocab")
    assert target.name == base_name
    assert len(read(draft)[0]["tokenizer.ggml.tokens"]) == tiny_models.DEFAULT_VOCAB_SIZE - 64

    # A parameter that cannot change a file does not change its name either.
    assert models.tiny_pair(tmp_path, "deep", extra_damping=0.01)[1].name == base_name

    assert not [p for p in tmp_path.iterdir() if p.suffix != ".gguf"]  # no temp files left
