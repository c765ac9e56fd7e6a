"""The trained head as a GGUF file in the `eagle3` format llama.cpp loads, and back.

Keys and tensors as llama.cpp's eagle3 loader (src/models/eagle3.cpp) and its converter expect:
the usual llama hyperparameters for the one decoder layer, `eagle3.target_layers` (3 ids) and
`eagle3.target_hidden_size`; `fc.weight`, `blk.0.attn_norm` (the token half) and `attn_norm_2` (the
feature half), the attention and FFN of the layer, `output_norm` and an own `output` over the draft
vocabulary with `d2t` (int64, the target id of each draft row, absolute ids as llama.cpp's
converter writes them). The token embeddings are not written: llama.cpp borrows the target's.
The tokenizer keys are copied from the target, so the engine's vocabulary check passes.
Everything written is a function of its inputs: the same head gives the same bytes.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import gguf
import numpy as np


def _copy_tokenizer(w: gguf.GGUFWriter, reader: gguf.GGUFReader) -> None:
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub_type)


def add_decoder_header(w: gguf.GGUFWriter, cfg, target_info, n_layer: int) -> None:
    """The float32 decoder keys a trained drafter file shares (EAGLE-3 head and DFlash drafter alike):
    the target's training context, the drafter's widths, heads, RoPE and norm epsilon."""
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(target_info.n_ctx_train)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_rope_dimension_count(cfg.d_head)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.rms_eps)


def write_head(path, *, tensors: dict, d2t, target_reader: gguf.GGUFReader, target_info, cfg, layers,
               name: str = "specnative-eagle3-head") -> Path:
    """Write `tensors` ({gguf name: float32 array in (out, in) order}) and `d2t` (None: the full
    target vocabulary) as an eagle3 GGUF at `path` (atomically) and return the path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        w = gguf.GGUFWriter(tmp, "eagle3")
        w.add_name(name)
        add_decoder_header(w, cfg, target_info, n_layer=1)
        w.add_key_value("eagle3.target_layers", [int(i) for i in layers], gguf.GGUFValueType.ARRAY,
                        sub_type=gguf.GGUFValueType.INT32)
        w.add_uint32("eagle3.target_hidden_size", int(target_info.n_embd))
        w.add_vocab_size(int(target_info.n_vocab))
        _copy_tokenizer(w, target_reader)
        for tensor_name, value in tensors.items():
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


def head_tensors(head) -> dict:
    """The torch head's parameters under their GGUF names, as float32 numpy arrays."""
    p = {k: v.detach().float().cpu().numpy() for k, v in head.named_parameters()}
    return {
        "fc.weight": p["fc"],
        "output_norm.weight": p["output_norm"],
        "output.weight": p["output"],
        "blk.0.attn_norm.weight": p["attn_norm"],
        "blk.0.attn_norm_2.weight": p["attn_norm_2"],
        "blk.0.attn_q.weight": p["wq"],
        "blk.0.attn_k.weight": p["wk"],
        "blk.0.attn_v.weight": p["wv"],
        "blk.0.attn_output.weight": p["wo"],
        "blk.0.ffn_norm.weight": p["ffn_norm"],
        "blk.0.ffn_gate.weight": p["ffn_gate"],
        "blk.0.ffn_up.weight": p["ffn_up"],
        "blk.0.ffn_down.weight": p["ffn_down"],
    }


_PARAM_OF = {"fc.weight": "fc", "output_norm.weight": "output_norm", "output.weight": "output",
             "blk.0.attn_norm.weight": "attn_norm", "blk.0.attn_norm_2.weight": "attn_norm_2",
             "blk.0.attn_q.weight": "wq", "blk.0.attn_k.weight": "wk", "blk.0.attn_v.weight": "wv",
             "blk.0.attn_output.weight": "wo", "blk.0.ffn_norm.weight": "ffn_norm",
             "blk.0.ffn_gate.weight": "ffn_gate", "blk.0.ffn_up.weight": "ffn_up", "blk.0.ffn_down.weight": "ffn_down"}


def read_head(path, tok_embd):
    """(torch head, d2t or None, its three target layers) of an eagle3 file this package wrote,
    with `tok_embd` (the target's token embeddings) borrowed as llama.cpp borrows them."""
    from gguf.quants import dequantize

    from .deps import torch as _torch
    from .head import HeadConfig, make_head

    torch = _torch()
    reader = gguf.GGUFReader(str(path))
    field = lambda key: reader.get_field(key).contents()
    if field("general.architecture") != "eagle3":
        raise ValueError(f"{path} is not an eagle3 file")
    arrays = {t.name: np.array(dequantize(t.data, t.tensor_type) if t.name != "d2t" else t.data, copy=True)
              for t in reader.tensors}
    d2t = arrays.get("d2t")
    n_embd = int(field("eagle3.embedding_length"))
    cfg = HeadConfig(n_embd=n_embd, n_embd_target=int(field("eagle3.target_hidden_size")),
                     n_head=int(field("eagle3.attention.head_count")),
                     n_head_kv=int(field("eagle3.attention.head_count_kv")),
                     n_ff=int(field("eagle3.feed_forward_length")), n_draft_vocab=arrays["output.weight"].shape[0],
                     rope_base=float(field("eagle3.rope.freq_base")),
                     rms_eps=float(field("eagle3.attention.layer_norm_rms_epsilon")))
    head = make_head(cfg, tok_embd, torch.from_numpy(arrays["output.weight"]), seed=0)
    with torch.no_grad():
        params = dict(head.named_parameters())
        for name, attr in _PARAM_OF.items():
            params[attr].copy_(torch.from_numpy(arrays[name].reshape(params[attr].shape)))
    return head, (None if d2t is None else d2t.astype(np.int64)), tuple(int(i) for i in field("eagle3.target_layers"))
