"""The trained DFlash drafter as a GGUF file in the `dflash` format llama.cpp loads, and back.

Keys and tensors as llama.cpp's dflash loader (src/models/dflash.cpp) and draft-dflash
(common/speculative.cpp) read them: the usual llama hyperparameters of the drafter's layers,
`dflash.target_layers` (the target layers whose inputs it reads), `dflash.block_size` (a draft is at
most block_size - 1 tokens) and `tokenizer.ggml.mask_token_id` (the token of the block's masked
positions); `fc.weight` and `enc.output_norm.weight` (the feature fusion), per layer the attention
with its q/k norms and the FFN, `output_norm`, and an own `output` over the draft vocabulary with
`d2t` (int64, the target id of each draft row). The token embeddings are not written: llama.cpp
borrows the target's. Without DFlash2's conv and selector tensors the file is a plain DFlash
drafter. The tokenizer keys are copied from the target, so the engine's vocabulary check passes.
Everything written is a function of its inputs: the same drafter gives the same bytes.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import gguf
import numpy as np

from specnative.models.train.writer import add_decoder_header

MASK_KEY = "tokenizer.ggml.mask_token_id"
_LAYER_NAMES = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
                "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "ffn_norm": "ffn_norm", "ffn_gate": "ffn_gate",
                "ffn_up": "ffn_up", "ffn_down": "ffn_down"}
_GLOBAL_NAMES = {"fc": "fc.weight", "enc_norm": "enc.output_norm.weight", "output_norm": "output_norm.weight",
                 "output": "output.weight"}


def _copy_tokenizer(w: gguf.GGUFWriter, reader: gguf.GGUFReader) -> None:
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or key == MASK_KEY:
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub_type)


def dflash_tensors(head) -> dict:
    """The torch drafter's parameters under their GGUF names, as float32 numpy arrays."""
    p = {k: v.detach().float().cpu().numpy() for k, v in head.named_parameters()}
    out = {gguf_name: p[attr] for attr, gguf_name in _GLOBAL_NAMES.items()}
    for i in range(head.cfg.n_layer):
        for attr, name in _LAYER_NAMES.items():
            out[f"blk.{i}.{name}.weight"] = p[f"layers.{i}.{attr}"]
    return out


def write_dflash(path, *, head, d2t, target_reader: gguf.GGUFReader, target_info, layers,
                 name: str = "specnative-dflash-drafter") -> Path:
    """Write the drafter `head` (dflash_head.make_dflash_head) and `d2t` (None: the full target
    vocabulary) as a dflash GGUF at `path` (atomically) and return the path."""
    cfg = head.cfg
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        w = gguf.GGUFWriter(tmp, "dflash")
        w.add_name(name)
        add_decoder_header(w, cfg, target_info, n_layer=cfg.n_layer)
        w.add_key_value("dflash.target_layers", [int(i) for i in layers], gguf.GGUFValueType.ARRAY,
                        sub_type=gguf.GGUFValueType.INT32)
        w.add_uint32("dflash.block_size", int(cfg.block_size))
        w.add_vocab_size(int(target_info.n_vocab))
        _copy_tokenizer(w, target_reader)
        w.add_uint32(MASK_KEY, int(cfg.mask_token))
        for tensor_name, value in dflash_tensors(head).items():
            w.add_tensor(tensor_name, np.ascontiguousarray(value, dtype=np.float32))
        if d2t is not None:
            w.add_tensor("d2t", np.ascontiguousarray(d2t, dtype=np.int64), raw_dtype=gguf.GGMLQuantizationType.I64)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)  # readers never see a half-written file
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_dflash(path, tok_embd):
    """(torch drafter, d2t or None, its target layers) of a dflash file this package wrote, with
    `tok_embd` (the target's token embeddings) borrowed as llama.cpp borrows them."""
    from gguf.quants import dequantize

    from .deps import torch as _torch
    from .dflash_head import DFlashConfig, make_dflash_head

    torch = _torch()
    reader = gguf.GGUFReader(str(path))

    def field(key):
        return reader.get_field(key).contents()

    if field("general.architecture") != "dflash" or reader.get_field("selector_hidden.weight") is not None:
        raise ValueError(f"{path} is not a plain dflash file")
    arrays = {t.name: np.array(dequantize(t.data, t.tensor_type) if t.name != "d2t" else t.data, copy=True)
              for t in reader.tensors}
    d2t = arrays.get("d2t")
    layers = tuple(int(i) for i in field("dflash.target_layers"))
    n_embd = int(field("dflash.embedding_length"))
    cfg = DFlashConfig(n_embd=n_embd, n_layer=int(field("dflash.block_count")),
                       n_head=int(field("dflash.attention.head_count")),
                       n_head_kv=int(field("dflash.attention.head_count_kv")),
                       n_ff=int(field("dflash.feed_forward_length")), n_feat=len(layers),
                       n_draft_vocab=arrays["output.weight"].shape[0], block_size=int(field("dflash.block_size")),
                       mask_token=int(field(MASK_KEY)), rope_base=float(field("dflash.rope.freq_base")),
                       rms_eps=float(field("dflash.attention.layer_norm_rms_epsilon")))
    head = make_dflash_head(cfg, tok_embd, torch.from_numpy(arrays["output.weight"]), seed=0)
    with torch.no_grad():
        params = dict(head.named_parameters())
        for attr, name in _GLOBAL_NAMES.items():
            params[attr].copy_(torch.from_numpy(arrays[name].reshape(params[attr].shape)))
        for i in range(cfg.n_layer):
            for attr, name in _LAYER_NAMES.items():
                target = params[f"layers.{i}.{attr}"]
                target.copy_(torch.from_numpy(arrays[f"blk.{i}.{name}.weight"].reshape(target.shape)))
    return head, (None if d2t is None else d2t.astype(np.int64)), layers
