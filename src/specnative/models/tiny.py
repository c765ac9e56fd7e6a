"""Tiny deterministic random-weight llama GGUF models for tests and the default sweep.

Every file is a pure function of its arguments (byte-identical when rewritten), so a
target and a draft can be derived from one base with known behaviour:

* an exact copy (noise 0) accepts every draft token;
* a noisy copy (``noise > 0``) accepts fewer, the more noise;
* a deep target (``extra_layers > 0``) adds damped blocks on top of the base: it costs
  more per token but predicts almost exactly like the shallow base used as its draft.

Tokenizer: SentencePiece style (``tokenizer.ggml.model = "llama"``), ids 0 ``<unk>``,
1 ``<s>`` (bos), 2 ``</s>`` (eos), 3..258 the byte tokens ``<0x00>``..``<0xFF>``, then
printable pieces up to ``DEFAULT_VOCAB_SIZE``.
"""

from __future__ import annotations

import inspect
import os
import string
import threading
import zlib
from pathlib import Path

import gguf
import numpy as np

__all__ = [
    "BOS_ID",
    "DEFAULT_VOCAB_SIZE",
    "EOS_ID",
    "FIRST_NORMAL_ID",
    "FORMAT_VERSION",
    "PAIR_KINDS",
    "tiny_pair",
    "tiny_vocab",
    "UNK_ID",
    "write_tiny_llama",
]

# Bump when the generated weights or vocabulary change, so cached files are rewritten.
FORMAT_VERSION = 1

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_NORMAL_ID = 3 + 256  # after the specials and the byte tokens
DEFAULT_VOCAB_SIZE = 1024
SPACE = "\u2581"  # SentencePiece's visible space

# Residual channel 0 is held at a constant: every token embedding carries BIAS_VALUE
# there and no block writes to it. The output rows of printable tokens read it with
# weight BIAS_LOGIT, which lifts their logits by roughly BIAS_LOGIT * BIAS_VALUE /
# rms(residual) above the zeroed rows of control and byte tokens, so those are
# practically never sampled even at temperature 1 (an eos would end a sequence).
BIAS_VALUE = 4.0
BIAS_LOGIT = 6.0
# Attention logit scale: > 1 makes heads attend selectively rather than average.
QK_GAIN = 1.5
# Output layer: random rows give logits of std ~OUT_GAIN; subtracting ANTI_REPEAT times
# the token's own embedding makes tokens present in the residual (the current one and,
# through attention, recent ones) less likely next, so greedy text does not loop on one
# token.
OUT_GAIN = 3.0
ANTI_REPEAT = 0.5
# Extra weight of a forced token's output row on the constant channel: its logit leads the
# others by ~FORCE_LOGIT * BIAS_VALUE / rms(residual) ~ 38, far beyond their spread of ~3.
FORCE_LOGIT = 10.0
# The token a forced model emits (a printable piece, so not an end of generation).
FORCED_TOKEN = FIRST_NORMAL_ID + 100

# Frequent English words (roughly by frequency), each added as a "▁word" piece with all
# its prefixes, so SentencePiece merging can reach the whole word.
_WORDS = """
the of and to in is that for it as was with be by on not he this are or his from at
which but have an they you were her she there one all we their has been would more
when will who if no out so what up said about can into them than its other some time
could only two then do these first may any new like my also now after people made over
did most many before must through back year where much your way well should because
each just those how too little state good very make world still own see men work long
get here between both life being under never day same another know while last might us
hello text token draft target model test data fast slow read write run step word words
great old off come since against go came right used take three use during without
again place around however home small found thought went say part once high upon school
every does got left number course war until always away fact though water less put
think almost hand enough far took head yet system better set told nothing night end why
find going look point next city give group young let room side given present order
rather second face per among form often early white case become large big need four
within felt along saw best least power light thing family want mind area done open god
kind door thus help sense whole matter perhaps law human line above name action show
five history gave today act feet across taken past quite seen death body half really
week free field car love money speak sure ask tell play move live keep start turn
""".split()
# Frequent word endings, so unknown words split into a stem plus a familiar ending.
_SUFFIXES = "s ed ing er ly es al tion ment ness ful able ive est ity ous ers ting ted".split()
# Capitalised sentence starters.
_CAPITALISED = "The It In He She We They This That I A There What When But And".split()


def _prefix_closure(piece: str, start: int) -> list[str]:
    """All prefixes of `piece` from length `start` on: SPM merges need every step."""
    return [piece[:i] for i in range(start, len(piece) + 1)]


def _default_pieces() -> list[str]:
    """Printable pieces in id order, starting at FIRST_NORMAL_ID.

    Every piece's prefixes come before it, so any truncation of the list still lets
    SentencePiece merge characters into every kept piece.
    """
    chars = [chr(c) for c in range(0x21, 0x7F)]  # printable ASCII except space
    pieces = [SPACE] + chars + [SPACE + c for c in string.ascii_letters + string.digits]
    seen = set(pieces)
    candidates = [p for s in _SUFFIXES for p in _prefix_closure(s, 2)]
    for word in _CAPITALISED + _WORDS:
        candidates += _prefix_closure(SPACE + word, 3)
    for piece in candidates:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    return pieces


def tiny_vocab(vocab: str = "default", n_vocab: int | None = None):
    """Return (tokens, scores, token_types) of the tiny tokenizer.

    vocab: "default", or "shuffled": the same pieces and scores with the printable
    pieces at permuted ids, so every id from FIRST_NORMAL_ID on has a different text
    (a draft with it must be refused as incompatible).
    n_vocab: vocabulary size, at most DEFAULT_VOCAB_SIZE (default); a smaller one keeps
    the first n_vocab tokens.
    """
    n_vocab = DEFAULT_VOCAB_SIZE if n_vocab is None else int(n_vocab)
    pieces = _default_pieces()[: DEFAULT_VOCAB_SIZE - FIRST_NORMAL_ID]
    if len(pieces) != DEFAULT_VOCAB_SIZE - FIRST_NORMAL_ID:
        raise AssertionError("the word list is too short for DEFAULT_VOCAB_SIZE")
    if not FIRST_NORMAL_ID < n_vocab <= DEFAULT_VOCAB_SIZE:
        raise ValueError(f"n_vocab must be in ({FIRST_NORMAL_ID}, {DEFAULT_VOCAB_SIZE}]")
    # Higher score = merged earlier; earlier (more frequent) pieces win ties.
    scores = [-float(i) for i in range(len(pieces))]
    pieces, scores = pieces[: n_vocab - FIRST_NORMAL_ID], scores[: n_vocab - FIRST_NORMAL_ID]
    if vocab == "shuffled":
        # Rotating by one moves every piece to another id; the set of texts is unchanged.
        pieces, scores = pieces[1:] + pieces[:1], scores[1:] + scores[:1]
    elif vocab != "default":
        raise ValueError(f"unknown vocab {vocab!r}: use 'default' or 'shuffled'")
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256 + [T.NORMAL] * len(pieces)
    scores = [0.0] * FIRST_NORMAL_ID + scores
    return tokens, scores, [int(t) for t in types]


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    # One stream per (seed, tensor name): a block's weights do not depend on how many
    # blocks or which other tensors exist. RandomState's stream is frozen by numpy, so
    # the same arguments give the same bytes on any numpy version.
    rng = np.random.RandomState([seed & 0xFFFFFFFF, zlib.crc32(name.encode())])
    return rng.standard_normal(shape) * std


def _block(seed: int, i: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int) -> dict:
    """Weights of block i as float64 arrays in numpy (out, in) order."""
    d_head = n_embd // n_head
    p = f"blk.{i}."
    q_std = QK_GAIN / np.sqrt(n_embd)
    return {
        p + "attn_norm.weight": np.ones(n_embd),
        p + "attn_q.weight": _normal(seed, p + "attn_q", (n_head * d_head, n_embd), q_std),
        p + "attn_k.weight": _normal(seed, p + "attn_k", (n_head_kv * d_head, n_embd), q_std),
        p + "attn_v.weight": _normal(seed, p + "attn_v", (n_head_kv * d_head, n_embd), n_embd**-0.5),
        p + "attn_output.weight": _normal(seed, p + "attn_output", (n_embd, n_head * d_head), n_embd**-0.5),
        p + "ffn_norm.weight": np.ones(n_embd),
        p + "ffn_gate.weight": _normal(seed, p + "ffn_gate", (n_ff, n_embd), n_embd**-0.5),
        p + "ffn_up.weight": _normal(seed, p + "ffn_up", (n_ff, n_embd), n_embd**-0.5),
        p + "ffn_down.weight": _normal(seed, p + "ffn_down", (n_embd, n_ff), n_ff**-0.5),
    }


def _shape_structure(tensors: dict, forced_token: int | None = None, force_logit: float = FORCE_LOGIT) -> None:
    """Impose the designed structure (after any noise, so every variant keeps it).

    forced_token: that output row reads the constant channel FORCE_LOGIT harder than the
    others, so it is the argmax at every position (p ~ 1 even at temperature 1): a model
    whose next token is known, which any drafter borrowing this output head (and keeping
    the constant channel) predicts exactly (the drafters' forced-high variants)."""
    tensors["token_embd.weight"][:, 0] = BIAS_VALUE
    for name, t in tensors.items():
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            t[0, :] = 0.0  # nothing writes to the constant channel
    out = tensors["output.weight"]
    out[:, 0] = BIAS_LOGIT
    out[:FIRST_NORMAL_ID, :] = 0.0  # unk, control and byte tokens: logit exactly 0
    if forced_token is not None:
        out[forced_token, 0] = BIAS_LOGIT + force_logit


def write_tiny_llama(
    path,
    *,
    seed: int = 0,
    n_embd: int = 128,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 4,
    n_ff: int = 256,
    n_ctx_train: int = 131072,
    noise: float = 0.0,
    noise_seed: int = 1,
    extra_layers: int = 0,
    extra_damping: float = 1e-3,
    vocab: str = "default",
    n_vocab: int | None = None,
    dtype: str = "f32",
    forced_token: int | None = None,
    force_logit: float = FORCE_LOGIT,
) -> Path:
    """Write a random-weight llama GGUF to `path` and return it as a Path.

    seed and the shapes fix the base weights. noise > 0 adds noise * std(tensor) * N(0, 1)
    to every weight tensor (generator seeded by noise_seed). extra_layers = m appends m
    random blocks after the n_layer base blocks, with their attn_output and ffn_down
    scaled by extra_damping. vocab/n_vocab: see tiny_vocab (weights of a kept token do
    not depend on either). dtype "f32" or "f16" for the 2-D weights; norms stay f32.
    forced_token: that token is the argmax everywhere (see _shape_structure); a smaller
    force_logit (e.g. 1) makes it only often the argmax. EOS_ID with a small (or negative)
    force_logit: a model whose sequences end by themselves after a few tokens.
    """
    if n_embd % 32 or n_ff % 32:
        raise ValueError("n_embd and n_ff must be multiples of 32 (Q4_0/Q8_0 blocks)")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_head must divide n_embd and n_head_kv must divide n_head")
    if dtype not in ("f32", "f16"):
        raise ValueError("dtype must be 'f32' or 'f16'")
    tokens, scores, types = tiny_vocab(vocab, n_vocab)
    if forced_token is not None and forced_token != EOS_ID and not FIRST_NORMAL_ID <= forced_token < len(tokens):
        raise ValueError(f"forced_token must be {EOS_ID} (eos) or a printable id in [{FIRST_NORMAL_ID}, {len(tokens)})")

    # Embeddings are drawn for the full default vocabulary and cut, so a smaller
    # vocabulary keeps the weights of the tokens it shares.
    embd = _normal(seed, "token_embd", (DEFAULT_VOCAB_SIZE, n_embd), 1.0)
    out = _normal(seed, "output", (DEFAULT_VOCAB_SIZE, n_embd), OUT_GAIN / np.sqrt(n_embd))
    out -= ANTI_REPEAT / np.sqrt(n_embd) * embd
    tensors = {"token_embd.weight": embd[: len(tokens)], "output_norm.weight": np.ones(n_embd),
               "output.weight": out[: len(tokens)]}
    for i in range(n_layer + extra_layers):
        block = _block(seed, i, n_embd, n_head, n_head_kv, n_ff)
        if i >= n_layer:
            # Damped residual writes: the extra blocks barely move the base's output.
            block[f"blk.{i}.attn_output.weight"] *= extra_damping
            block[f"blk.{i}.ffn_down.weight"] *= extra_damping
        tensors.update(block)
    if noise > 0:
        for name, t in tensors.items():
            t += noise * t.std() * _normal(noise_seed, name, t.shape, 1.0)
    _shape_structure(tensors, forced_token, force_logit)

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        _write_gguf(tmp, tensors, tokens, scores, types, n_layer + extra_layers, n_embd,
                    n_head, n_head_kv, n_ff, n_ctx_train, dtype)
        os.replace(tmp, path)  # readers never see a half-written file
    finally:
        tmp.unlink(missing_ok=True)
    return path


def add_tiny_tokenizer(w: gguf.GGUFWriter, tokens, scores, types) -> None:
    """The tiny tokenizer's keys (tiny_vocab's lists); drafter files copy them."""
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)


def _write_gguf(path, tensors, tokens, scores, types, n_block, n_embd, n_head, n_head_kv,
                n_ff, n_ctx_train, dtype) -> None:
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("specnative-tiny-llama")
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_block)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    add_tiny_tokenizer(w, tokens, scores, types)
    for name, t in tensors.items():
        wide = dtype == "f16" and t.ndim == 2
        w.add_tensor(name, t.astype(np.float16 if wide else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# kind -> (target overrides, draft overrides) on top of write_tiny_llama's defaults.
# Acceptance quoted from llama.cpp's llama-speculative-simple (greedy, 4 drafts per round,
# 200 tokens; accepted / drafted) on the default seed.
PAIR_KINDS = {
    # target = base, draft = the very same file: every draft is accepted (100%).
    "copy": ({}, {}),
    # draft = base + 10% noise per tensor: 35% accepted (per-token argmax agreement
    # ~65%); noise 0.01 agrees ~97% per token, 0.03 ~90%. Pass noise=... to tune.
    "noisy": ({}, {"noise": 0.1}),
    # target = base + 30 damped blocks (16x the layers), draft = the 2-block base: 95%.
    "deep": ({"extra_layers": 30}, {}),
    # draft has the same pieces at other ids: llama.cpp refuses the pair.
    "shuffled": ({}, {"vocab": "shuffled"}),
    # draft = base cut to 960 tokens: passes llama.cpp's compatibility check (sizes may
    # differ by 128), but the target emits ids the draft lacks; llama-speculative-simple
    # aborts on the first one ("failed to add token 968"). An engine must cope or refuse.
    "small_vocab": ({}, {"n_vocab": DEFAULT_VOCAB_SIZE - 64}),
}
_DEFAULTS = {
    k: v.default
    for k, v in inspect.signature(write_tiny_llama).parameters.items()
    if v.kind is v.KEYWORD_ONLY
}


def _cached(directory: Path, params: dict) -> Path:
    """Write the model for `params` unless a file of that name exists; the name lists the
    non-default parameters, so it identifies the content."""
    params = dict(params)
    if not params["extra_layers"]:  # these do not change the file then
        params["extra_damping"] = _DEFAULTS["extra_damping"]
    if not params["noise"]:
        params["noise_seed"] = _DEFAULTS["noise_seed"]
    changed = sorted((k, v) for k, v in params.items() if v != _DEFAULTS[k])
    name = f"tiny-llama-v{FORMAT_VERSION}" + "".join(f"-{k}{v}" for k, v in changed) + ".gguf"
    path = directory / name
    if not path.exists():
        write_tiny_llama(path, **params)
    return path


def tiny_pair(directory, kind: str = "copy", **params) -> tuple[Path, Path]:
    """Return (target_path, draft_path) for one of PAIR_KINDS, writing files only if absent.

    `params` are write_tiny_llama arguments applied to both models (e.g. seed, n_embd,
    dtype); "noise" applies to the draft only and "extra_layers" to the target only.
    Files are cached in `directory` under names such as tiny-llama-v1.gguf or
    tiny-llama-v1-noise0.1.gguf.
    """
    if kind not in PAIR_KINDS:
        raise ValueError(f"unknown kind {kind!r}: use one of {sorted(PAIR_KINDS)}")
    unknown = set(params) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown parameters {sorted(unknown)}")
    target_only, draft_only = PAIR_KINDS[kind]
    shared = {k: v for k, v in params.items() if k not in ("noise", "extra_layers")}
    target = {**_DEFAULTS, **shared, **target_only}
    draft = {**_DEFAULTS, **shared, **draft_only}
    if "extra_layers" in params:
        target["extra_layers"] = params["extra_layers"]
    if "noise" in params:
        draft["noise"] = params["noise"]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return _cached(directory, target), _cached(directory, draft)
