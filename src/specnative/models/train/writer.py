"""A trained drafter as the GGUF file llama.cpp loads (`eagle3` or `dflash`), and back.

What both kinds' files share is written here: the float32 decoder keys (the target's training
context, the drafter's widths, heads, RoPE and norm epsilon), `ARCH.target_layers` (the target
layers whose inputs it reads), the tokenizer keys copied from the target (so the engine's
vocabulary check passes), the tensors under llama.cpp's names (`fc.weight`, `output_norm`, an own
`output` over the draft vocabulary, per layer the attention and FFN) and `d2t` (int64, the target id
of each draft row, absolute ids as llama.cpp's converters write them); not the token embeddings,
which llama.cpp borrows from the target. Each kind adds its own keys (file_keys) and reads its
shape back (from_file): head.py for eagle3, dflash_head.py for dflash. The same head gives the
same bytes.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import gguf
import numpy as np

from . import dflash_head
from . import head as eagle3_head

KINDS = {"eagle3": eagle3_head, "dflash": dflash_head}
# parameter -> tensor, in the file's order: the head's own tensors first, then each decoder layer's
GLOBAL_NAMES = {"fc": "fc.weight", "enc_norm": "enc.output_norm.weight", "output_norm": "output_norm.weight",
                "output": "output.weight"}
LAYER_NAMES = {"attn_norm": "attn_norm", "attn_norm_2": "attn_norm_2", "wq": "attn_q", "wk": "attn_k",
               "wv": "attn_v", "wo": "attn_output", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
               "ffn_norm": "ffn_norm", "ffn_gate": "ffn_gate", "ffn_up": "ffn_up", "ffn_down": "ffn_down"}


def tensor_names(head) -> dict:
    """{parameter name: GGUF tensor name} in the file's order. A decoder layer's tensors on the head
    itself (EAGLE-3's one layer) are blk.0's, those of `layers.i` are blk.i's."""
    params = [name for name, _ in head.named_parameters()]
    out = {name: GLOBAL_NAMES[name] for name in GLOBAL_NAMES if name in params}
    for name in params:
        layer, _, attr = name.rpartition(".")
        if attr in LAYER_NAMES:
            out[name] = f"blk.{layer.rpartition('.')[2] or 0}.{LAYER_NAMES[attr]}.weight"
    unnamed = [name for name in params if name not in out]
    if unnamed:
        raise ValueError(f"no GGUF tensor name for {unnamed}")
    return out


def head_tensors(head) -> dict:
    """The torch head's parameters under their GGUF names, as float32 numpy arrays, in file order."""
    params = dict(head.named_parameters())
    return {gguf_name: params[name].detach().float().cpu().numpy() for name, gguf_name in tensor_names(head).items()}


def _add_decoder_header(w: gguf.GGUFWriter, cfg, target_info, n_layer: int) -> None:
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


def write_drafter(path, head, *, d2t, target_reader: gguf.GGUFReader, target_info, layers) -> Path:
    """Write `head` (an eagle3 or dflash torch head) and `d2t` (None: the full target vocabulary) as
    its kind's GGUF at `path` (atomically) and return the path."""
    kind = KINDS[head.arch]
    keys, tokenizer_keys = kind.file_keys(head, target_info)
    tensors = head_tensors(head)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        w = gguf.GGUFWriter(tmp, head.arch)
        w.add_name(kind.FILE_NAME)
        _add_decoder_header(w, head.cfg, target_info, n_layer=len({n.split(".")[1] for n in tensors if n[:4] == "blk."}))
        w.add_key_value(f"{head.arch}.target_layers", [int(i) for i in layers], gguf.GGUFValueType.ARRAY,
                        sub_type=gguf.GGUFValueType.INT32)
        for key, value in keys.items():
            w.add_uint32(key, int(value))
        w.add_vocab_size(int(target_info.n_vocab))
        for key, field in target_reader.fields.items():  # the target's tokenizer, less the keys the kind sets
            if key.startswith("tokenizer.") and key not in tokenizer_keys:
                vtype = field.types[0]
                sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
                w.add_key_value(key, field.contents(), vtype, sub_type=sub_type)
        for key, value in tokenizer_keys.items():
            w.add_uint32(key, int(value))
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


def read_drafter(path, tok_embd):
    """(torch head, d2t or None, its target layers) of an eagle3 or dflash file this package wrote,
    with `tok_embd` (the target's token embeddings) borrowed as llama.cpp borrows them."""
    from gguf.quants import dequantize

    from .deps import torch as _torch

    torch = _torch()
    reader = gguf.GGUFReader(str(path))
    found = reader.get_field("general.architecture").contents()
    if found not in KINDS:
        raise ValueError(f"{path} is not an eagle3 or dflash file")
    arrays = {t.name: np.array(dequantize(t.data, t.tensor_type) if t.name != "d2t" else t.data, copy=True)
              for t in reader.tensors}
    d2t = arrays.get("d2t")
    layers = tuple(int(i) for i in reader.get_field(f"{found}.target_layers").contents())
    head = KINDS[found].from_file(reader, layers, arrays["output.weight"].shape[0], tok_embd, path)
    with torch.no_grad():
        params = dict(head.named_parameters())
        for name, gguf_name in tensor_names(head).items():
            params[name].copy_(torch.from_numpy(arrays[gguf_name].reshape(params[name].shape)))
    return head, (None if d2t is None else d2t.astype(np.int64)), layers
