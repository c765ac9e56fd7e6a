"""Tiny hidden-state drafters for the tiny llama target, and a tiny MTP-capable target.

llama.cpp's drafters that read the target's hidden states (common/speculative.cpp:
draft-dflash, draft-dspark, draft-eagle3, draft-mtp) need files of their own
architecture. These writers produce exactly the tensors and metadata the loader at the
pinned commit expects (src/models/dflash.cpp, eagle3.cpp, glm4-moe.cpp), with random
weights, numpy + gguf only:

* ``dflash``: a DFlash block drafter (``dflash`` architecture, mask token, block size,
  target layer ids); ``dflash2``: the same plus the conv + selector tensors and metadata
  (DFlash2); ``dspark``: DFlash plus a Markov head (and a confidence head);
* ``eagle3``: an EAGLE-3 draft (one decoder layer, 3 target layers);
* ``write_tiny_mtp_target``: a glm4moe-style target with one nextn (MTP) layer.

Acceptance is designed, not trained: the drafts borrow the target's token embeddings
and output head (llama.cpp shares them through ctx_other) and never write the residual's
constant channel (models.BIAS_VALUE). Against a target written with ``forced_token``
(models.FORCED_TOKEN) both predict that token everywhere: the forced-high variant,
alpha ~ 1 at any temperature. Against the plain target the same draft file guesses from
random weights: the low variant. ``drafter_pair`` returns either.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import gguf
import numpy as np

from specnative.models.tiny import (
    FORCE_LOGIT,
    FORCED_TOKEN,
    _normal,
    _shape_structure,
    add_tiny_tokenizer,
    tiny_vocab,
    write_tiny_llama,
)

__all__ = ["DRAFTER_KINDS", "MASK_TOKEN_ID", "drafter_pair", "write_tiny_drafter", "write_tiny_mtp_target"]

# Bump when a writer's output changes, so cached files are rewritten.
FORMAT_VERSION = 1
# DFlash's mask token: an id of the shared vocabulary (<unk>; its embedding row also
# carries the constant channel, so the noise block keeps it).
MASK_TOKEN_ID = 0
DRAFTER_KINDS = ("dflash", "dflash2", "dspark", "eagle3")


def _zero_constant_channel_writes(tensors: dict) -> None:
    """No block writes residual channel 0 (the constant the borrowed head reads)."""
    for name, t in tensors.items():
        if name.endswith(("attn_output.weight", "ffn_down.weight", "nextn.eh_proj.weight")):
            t[0, :] = 0.0


def _dflash_block(seed: int, i: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int) -> dict:
    d_head = n_embd // n_head
    p = f"blk.{i}."
    s = n_embd**-0.5
    return {
        p + "attn_norm.weight": np.ones(n_embd),
        p + "attn_q.weight": _normal(seed, p + "attn_q", (n_head * d_head, n_embd), s),
        p + "attn_k.weight": _normal(seed, p + "attn_k", (n_head_kv * d_head, n_embd), s),
        p + "attn_v.weight": _normal(seed, p + "attn_v", (n_head_kv * d_head, n_embd), s),
        p + "attn_output.weight": _normal(seed, p + "attn_output", (n_embd, n_head * d_head), s),
        p + "attn_q_norm.weight": np.ones(d_head),
        p + "attn_k_norm.weight": np.ones(d_head),
        p + "ffn_norm.weight": np.ones(n_embd),
        p + "ffn_gate.weight": _normal(seed, p + "ffn_gate", (n_ff, n_embd), s),
        p + "ffn_up.weight": _normal(seed, p + "ffn_up", (n_ff, n_embd), s),
        p + "ffn_down.weight": _normal(seed, p + "ffn_down", (n_embd, n_ff), n_ff**-0.5),
    }


def _dflash2_tensors(seed: int, n_layer: int, n_embd: int, n_vocab: int, kernel: int, group: int,
                     rank: int) -> dict:
    """DFlash2's per-layer dynamic convolutions and the selector's low-rank transition."""
    projected = 2 * kernel * (n_embd // group)
    t = {
        "selector_predecessor.weight": _normal(seed, "sel_prev", (n_vocab, rank), 0.1),
        "selector_successor.weight": _normal(seed, "sel_next", (n_vocab, rank), 0.1),
        "selector_hidden.weight": _normal(seed, "sel_hidden", (rank, n_embd), n_embd**-0.5),
    }
    for i in range(n_layer):
        for side in ("attn", "ffn"):
            # base: identity on the current position (tap 0), small elsewhere; dynamic part small
            base = _normal(seed, f"blk.{i}.{side}_conv_base", (2, kernel, n_embd), 0.05)
            base[:, 0, :] += 1.0
            t[f"blk.{i}.{side}_conv_base"] = base
            t[f"blk.{i}.{side}_conv_proj.weight"] = _normal(seed, f"blk.{i}.{side}_conv_proj",
                                                            (projected, n_embd), 0.05 * n_embd**-0.5)
    return t


def _dspark_tensors(seed: int, n_embd: int, n_vocab: int, rank: int) -> dict:
    return {
        "markov_w1.weight": _normal(seed, "markov_w1", (n_vocab, rank), 0.1),
        "markov_w2.weight": _normal(seed, "markov_w2", (n_vocab, rank), 0.1),
        "conf_proj.weight": _normal(seed, "conf_proj", (1, n_embd + rank), 0.1),
        "conf_proj.bias": np.zeros(1),
    }


def _eagle3_tensors(seed: int, n_embd: int, n_embd_tgt: int, n_head: int, n_head_kv: int, n_ff: int) -> dict:
    d_head = n_embd // n_head
    s2 = (2 * n_embd) ** -0.5
    fc = _normal(seed, "fc", (n_embd, 3 * n_embd_tgt), (3 * n_embd_tgt) ** -0.5)
    # g's channel 0 = mean of the 3 features' constant channels (the target's BIAS_VALUE)
    fc[0, :] = 0.0
    fc[0, [k * n_embd_tgt for k in range(3)]] = 1.0 / 3.0
    p = "blk.0."
    return {
        "fc.weight": fc,
        "output_norm.weight": np.ones(n_embd),
        p + "attn_norm.weight": np.ones(n_embd),
        p + "attn_norm_2.weight": np.ones(n_embd),
        p + "attn_q.weight": _normal(seed, p + "attn_q", (n_head * d_head, 2 * n_embd), s2),
        p + "attn_k.weight": _normal(seed, p + "attn_k", (n_head_kv * d_head, 2 * n_embd), s2),
        p + "attn_v.weight": _normal(seed, p + "attn_v", (n_head_kv * d_head, 2 * n_embd), s2),
        p + "attn_output.weight": _normal(seed, p + "attn_output", (n_embd, n_head * d_head), n_embd**-0.5),
        p + "ffn_norm.weight": np.ones(n_embd),
        p + "ffn_gate.weight": _normal(seed, p + "ffn_gate", (n_ff, n_embd), n_embd**-0.5),
        p + "ffn_up.weight": _normal(seed, p + "ffn_up", (n_ff, n_embd), n_embd**-0.5),
        p + "ffn_down.weight": _normal(seed, p + "ffn_down", (n_embd, n_ff), n_ff**-0.5),
    }


def _atomic_write(path: Path, write) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)  # readers never see a half-written file
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _add_common_hparams(w: gguf.GGUFWriter, n_embd: int, n_layer: int, n_head: int, n_head_kv: int,
                        n_ff: int) -> None:
    w.add_context_length(131072)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)


def _add_tensors(w: gguf.GGUFWriter, tensors: dict) -> None:
    for name, t in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))


def write_tiny_drafter(
    path,
    kind: str,
    *,
    seed: int = 7,
    n_embd: int = 128,
    n_embd_target: int | None = None,
    n_layer: int = 1,
    n_head: int = 4,
    n_head_kv: int = 4,
    n_ff: int = 256,
    target_layers: tuple[int, ...] | None = None,
    block_size: int = 8,
    mask_token: int | None = MASK_TOKEN_ID,
) -> Path:
    """Write a random-weight drafter of `kind` (DRAFTER_KINDS) for the tiny llama target.

    n_embd must equal the target's for dflash-style drafts (their features are
    target_layers x n_embd wide); eagle3 maps n_embd_target (default n_embd) to its own.
    target_layers: the target layers whose inputs the draft reads (default (0, 1) for the
    2-layer tiny target; eagle3 needs three, default (0, 1, 1)). block_size: dflash's
    trained block (k is clamped to block_size - 1). mask_token=None writes a dflash file
    without tokenizer.ggml.mask_token_id (which llama.cpp cannot draft with).
    """
    if kind not in DRAFTER_KINDS:
        raise ValueError(f"unknown drafter kind {kind!r}: use one of {DRAFTER_KINDS}")
    tokens, scores, types = tiny_vocab()
    n_vocab = len(tokens)
    n_embd_target = n_embd if n_embd_target is None else n_embd_target
    arch = "eagle3" if kind == "eagle3" else "dflash"
    if target_layers is None:
        target_layers = (0, 1, 1) if kind == "eagle3" else (0, 1)

    if kind == "eagle3":
        tensors = _eagle3_tensors(seed, n_embd, n_embd_target, n_head, n_head_kv, n_ff)
        n_layer = 1
    else:
        tensors = {
            "fc.weight": _normal(seed, "fc", (n_embd, len(target_layers) * n_embd), (len(target_layers) * n_embd) ** -0.5),
            "enc.output_norm.weight": np.ones(n_embd),
            "output_norm.weight": np.ones(n_embd),
        }
        for i in range(n_layer):
            tensors.update(_dflash_block(seed, i, n_embd, n_head, n_head_kv, n_ff))
        if kind == "dflash2":
            tensors.update(_dflash2_tensors(seed, n_layer, n_embd, n_vocab, kernel=3, group=16, rank=16))
        if kind == "dspark":
            tensors.update(_dspark_tensors(seed, n_embd, n_vocab, rank=16))
    _zero_constant_channel_writes(tensors)

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(f"specnative-tiny-{kind}")
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        _add_common_hparams(w, n_embd, n_layer, n_head, n_head_kv, n_ff)
        w.add_array(f"{arch}.target_layers", [int(i) for i in target_layers])
        if kind == "eagle3":
            w.add_uint32("eagle3.target_hidden_size", n_embd_target)
        else:
            w.add_uint32("dflash.block_size", block_size)
        if kind == "dflash2":
            w.add_uint32("dflash.conv_kernel_size", 3)
            w.add_uint32("dflash.conv_group_size", 16)
            w.add_uint32("dflash.selector_rank", 16)
            w.add_uint32("dflash.selector_top_k", 4)
        if kind == "dspark":
            w.add_string("dflash.has_confidence_head", "true")
        w.add_vocab_size(n_vocab)
        add_tiny_tokenizer(w, tokens, scores, types)
        if mask_token is not None:
            w.add_uint32("tokenizer.ggml.mask_token_id", mask_token)
        _add_tensors(w, tensors)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return _atomic_write(path, write)


def write_tiny_mtp_target(
    path,
    *,
    seed: int = 0,
    n_embd: int = 128,
    n_layer: int = 2,
    n_head: int = 4,
    n_ff: int = 256,
    forced_token: int | None = None,
    force_logit: float = FORCE_LOGIT,
) -> Path:
    """A glm4moe-style target: n_layer dense blocks (leading_dense_block_count = n_layer)
    plus one nextn (MTP) layer, the last block, which llama.cpp's draft-mtp drafts with.

    The nextn layer needs experts in glm4moe; it has 2 tiny experts and a shared one.
    forced_token as in models.write_tiny_llama (the MTP head shares the output head).
    """
    tokens, scores, types = tiny_vocab()
    n_vocab = len(tokens)
    s = n_embd**-0.5
    embd = _normal(seed, "token_embd", (n_vocab, n_embd), 1.0)
    out = _normal(seed, "output", (n_vocab, n_embd), 3.0 * s) - 0.5 * s * embd
    tensors = {"token_embd.weight": embd, "output_norm.weight": np.ones(n_embd), "output.weight": out}
    n_expert, n_ff_exp = 2, 64
    for i in range(n_layer + 1):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": np.ones(n_embd),
            p + "attn_q.weight": _normal(seed, p + "attn_q", (n_embd, n_embd), 1.5 * s),
            p + "attn_k.weight": _normal(seed, p + "attn_k", (n_embd, n_embd), 1.5 * s),
            p + "attn_v.weight": _normal(seed, p + "attn_v", (n_embd, n_embd), s),
            p + "attn_output.weight": _normal(seed, p + "attn_output", (n_embd, n_embd), s),
            p + "post_attention_norm.weight": np.ones(n_embd),  # glm4moe: the pre-FFN norm
        })
        if i < n_layer:  # dense trunk
            tensors.update({
                p + "ffn_gate.weight": _normal(seed, p + "ffn_gate", (n_ff, n_embd), s),
                p + "ffn_up.weight": _normal(seed, p + "ffn_up", (n_ff, n_embd), s),
                p + "ffn_down.weight": _normal(seed, p + "ffn_down", (n_embd, n_ff), n_ff**-0.5),
            })
            continue
        # the nextn layer: MoE block + the MTP projections
        tensors.update({
            p + "ffn_gate_inp.weight": _normal(seed, p + "ffn_gate_inp", (n_expert, n_embd), s),
            p + "exp_probs_b.bias": np.zeros(n_expert),
            p + "ffn_gate_exps.weight": _normal(seed, p + "ffn_gate_exps", (n_expert, n_ff_exp, n_embd), s),
            p + "ffn_up_exps.weight": _normal(seed, p + "ffn_up_exps", (n_expert, n_ff_exp, n_embd), s),
            p + "ffn_down_exps.weight": _normal(seed, p + "ffn_down_exps", (n_expert, n_embd, n_ff_exp), n_ff_exp**-0.5),
            p + "ffn_gate_shexp.weight": _normal(seed, p + "ffn_gate_shexp", (n_ff_exp, n_embd), s),
            p + "ffn_up_shexp.weight": _normal(seed, p + "ffn_up_shexp", (n_ff_exp, n_embd), s),
            p + "ffn_down_shexp.weight": _normal(seed, p + "ffn_down_shexp", (n_embd, n_ff_exp), n_ff_exp**-0.5),
            p + "nextn.eh_proj.weight": _normal(seed, p + "nextn.eh_proj", (n_embd, 2 * n_embd), (2 * n_embd) ** -0.5),
            p + "nextn.enorm.weight": np.ones(n_embd),
            p + "nextn.hnorm.weight": np.ones(n_embd),
            p + "nextn.shared_head_norm.weight": np.ones(n_embd),
        })
    # the constant channel: the trunk keeps it (models._shape_structure), no expert writes it, and
    # the MTP head rebuilds it from its input [enorm(embedding); hnorm(hidden)]: eh_proj's row 0
    # reads channel 0 of the normed embedding only
    _shape_structure(tensors, forced_token, force_logit)
    tensors[f"blk.{n_layer}.ffn_down_exps.weight"][:, 0, :] = 0.0
    tensors[f"blk.{n_layer}.ffn_down_shexp.weight"][0, :] = 0.0
    _zero_constant_channel_writes(tensors)
    tensors[f"blk.{n_layer}.nextn.eh_proj.weight"][0, 0] = 1.0

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(tmp, "glm4moe")
        w.add_name("specnative-tiny-mtp")
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        _add_common_hparams(w, n_embd, n_layer + 1, n_head, n_head, n_ff)
        w.add_uint32("glm4moe.leading_dense_block_count", n_layer)
        w.add_uint32("glm4moe.nextn_predict_layers", 1)
        w.add_uint32("glm4moe.expert_count", n_expert)
        w.add_uint32("glm4moe.expert_used_count", 1)
        w.add_uint32("glm4moe.expert_shared_count", 1)
        w.add_uint32("glm4moe.expert_feed_forward_length", n_ff_exp)
        w.add_float32("glm4moe.expert_weights_scale", 1.0)
        w.add_bool("glm4moe.expert_weights_norm", True)
        w.add_uint32("glm4moe.expert_gating_func", 2)  # sigmoid
        w.add_vocab_size(n_vocab)
        add_tiny_tokenizer(w, tokens, scores, types)
        _add_tensors(w, tensors)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return _atomic_write(path, write)


# drafter_pair's acceptance levels: how hard the target's (and so the drafter's) forced token
# leads (models.FORCE_LOGIT); None: the plain target, which the random drafter rarely matches.
# high: twice models.FORCE_LOGIT, as the MTP target's trunk (no q/k norms) leaves the forced token
# a smaller lead at the same weight (p < 1 at T = 0.8 with 10); mid: alpha ~ 0.5 on these files.
ACCEPTANCE = {"high": 2 * FORCE_LOGIT, "mid": 7.0, "low": None}


def drafter_pair(directory, kind: str, *, acceptance: str = "high", **params) -> tuple[Path, Path | None]:
    """(target, drafter file) for a hidden-state drafter kind, writing files only if absent.

    kind: one of DRAFTER_KINDS, or "mtp" (drafter file None: the target's own nextn head).
    acceptance "high": the target emits models.FORCED_TOKEN everywhere and the drafter
    agrees (alpha ~ 1 at any temperature); "mid": the forced token leads only a little, so
    target and drafter agree on it part of the time; "low": the plain tiny target, which the
    random drafter rarely matches. The same drafter file serves all three (it borrows the
    target's head). params go to write_tiny_drafter (e.g. mask_token=None, n_embd=64).
    """
    if acceptance not in ACCEPTANCE:
        raise ValueError(f"acceptance must be one of {sorted(ACCEPTANCE)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    force_logit = ACCEPTANCE[acceptance]
    forced = {} if force_logit is None else {"forced_token": FORCED_TOKEN, "force_logit": force_logit}
    tag = "" if force_logit is None else f"-forced{force_logit:g}"
    if kind == "mtp":
        target = directory / f"tiny-mtp-v{FORMAT_VERSION}{tag}.gguf"
        if not target.exists():
            write_tiny_mtp_target(target, **forced)
        return target, None
    if kind not in DRAFTER_KINDS:
        raise ValueError(f"unknown drafter kind {kind!r}: use one of {DRAFTER_KINDS + ('mtp',)}")
    target = directory / f"tiny-llama-target-v{FORMAT_VERSION}{tag}.gguf"
    if not target.exists():
        write_tiny_llama(target, **forced)
    extra = "".join(f"-{k}{v}" for k, v in sorted(params.items()))
    draft = directory / f"tiny-{kind}-v{FORMAT_VERSION}{extra}.gguf"
    if not draft.exists():
        write_tiny_drafter(draft, kind, **params)
    return target, draft
