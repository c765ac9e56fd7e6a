"""The target's llama graph in torch, with weights dequantized from its GGUF file.

llama.cpp's engine hands out logits but not the layer inputs an EAGLE-3 head reads, so the
training features come from this re-implementation of src/models/llama.cpp: the input of layer
`il` is the residual stream before that layer's attention norm (t_layer_inp[il]; layer 0's is the
token embedding). Its logits are checked against llama.cpp's on the same tokens (distill.py), as
the weights here are exact dequantizations but the matmuls are float32 rather than llama.cpp's
quantized dot products.

RoPE is llama.cpp's NORM mode (rotating adjacent pairs), which matches the GGUF files' q/k rows:
the converter permutes them for exactly this mode.
"""
from __future__ import annotations

import numpy as np
from gguf.quants import dequantize

from .deps import torch as _torch
from .target_check import TargetInfo, read_target


def load_weights(reader, names=None) -> dict:
    """{name: float32 numpy array in (out, in) order} of the file's tensors (all, or `names`)."""
    out = {}
    for t in reader.tensors:
        if names is None or t.name in names:
            # a copy: F32 tensors come back as read-only views of the memory-mapped file
            out[t.name] = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, order="C", copy=True)
    return out


def rope_tables(n_rot: int, base: float, n_pos: int):
    """cos and sin [n_pos, n_rot/2] of llama.cpp's rotation: pair i turns by pos * base^(-2i/n_rot)."""
    torch = _torch()
    inv = base ** (-torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot)
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rope(x, cos, sin):
    """x [..., L, heads, n_rot] rotated by adjacent pairs (x0, x1) at the L positions of cos/sin [L, n_rot/2]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return _torch().stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def rms_norm(x, weight, eps: float):
    torch = _torch()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class TorchLlama:
    """Forward passes of one llama GGUF target (inference only, no autograd)."""

    def __init__(self, path, n_threads: int | None = None):
        torch = _torch()
        if n_threads:
            torch.set_num_threads(int(n_threads))
        reader, info = read_target(path)
        self.info: TargetInfo = info
        w = {k: torch.from_numpy(v) for k, v in load_weights(reader).items()}
        self.tok_embd = w["token_embd.weight"]
        self.output = w.get("output.weight", self.tok_embd)  # tied when the file has no output
        self.output_norm = w["output_norm.weight"]
        self.blocks = [{k.split(".", 2)[2]: v for k, v in w.items() if k.startswith(f"blk.{i}.")}
                       for i in range(info.n_layer)]
        self._rope = rope_tables(info.n_rot, info.rope_base, 1)

    def _rope_for(self, n: int):
        if self._rope[0].shape[0] < n:
            self._rope = rope_tables(self.info.n_rot, self.info.rope_base, max(n, 2 * self._rope[0].shape[0]))
        return self._rope[0][:n], self._rope[1][:n]

    def _block(self, b: dict, x, cos, sin):
        torch = _torch()
        info = self.info
        n_tok, d_head = x.shape[0], info.n_embd // info.n_head
        h = rms_norm(x, b["attn_norm.weight"], info.rms_eps)
        q = (h @ b["attn_q.weight"].T).view(n_tok, info.n_head, d_head)
        k = (h @ b["attn_k.weight"].T).view(n_tok, info.n_head_kv, d_head)
        v = (h @ b["attn_v.weight"].T).view(n_tok, info.n_head_kv, d_head)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = info.n_head // info.n_head_kv
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        x = x + att.transpose(0, 1).reshape(n_tok, info.n_embd) @ b["attn_output.weight"].T
        h = rms_norm(x, b["ffn_norm.weight"], info.rms_eps)
        ff = torch.nn.functional.silu(h @ b["ffn_gate.weight"].T) * (h @ b["ffn_up.weight"].T)
        return x + ff @ b["ffn_down.weight"].T

    def forward(self, tokens, layers=(), logits: bool = False):
        """(features [L, len(layers) * n_embd]: the inputs of `layers` concatenated in their order,
        logits [L, n_vocab] or None) for one sequence of token ids from position 0. Without
        logits, the blocks after the last requested layer are not computed."""
        torch = _torch()
        with torch.no_grad():
            ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
            x = self.tok_embd[ids]
            cos, sin = self._rope_for(len(ids))
            wanted = {il: None for il in layers}
            stop = self.info.n_layer if logits else (max(layers) if layers else 0)
            for il in range(stop):
                if il in wanted:
                    wanted[il] = x
                x = self._block(self.blocks[il], x, cos, sin)
            if stop in wanted and stop < self.info.n_layer:
                wanted[stop] = x
            feats = torch.cat([wanted[il] for il in layers], dim=-1) if layers else None
            out = rms_norm(x, self.output_norm, self.info.rms_eps) @ self.output.T if logits else None
        return feats, out
