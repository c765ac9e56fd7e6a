"""The building blocks both drafters are made of, as llama.cpp's graphs run them.

Each is a mix-in of a torch module that registers its parameters on it under the same names for
both kinds (wq ... k_norm, ffn_*, output_norm, output: writer.py names the file's tensors by them),
so EAGLE-3's one layer lives on the head itself and DFlash's layers are modules of their own.
Borrowed: the target's token embeddings (frozen; llama.cpp borrows the target's) and RoPE tables;
Attention: grouped-query q/k/v/o projections, optionally with per-head q/k norms; SwiGLU: the
pre-normed gated FFN with its residual; OutputHead: the final norm and an own output over the draft
vocabulary (d2t). Parameters draw from one seeded generator in the order they are registered.
"""
from __future__ import annotations

import math
from dataclasses import asdict

from .deps import torch as _torch
from .gguf_target import rms_norm, rope_tables


class Shape:
    """What a drafter's config (a frozen dataclass with n_embd, n_head, ...) derives."""

    @property
    def d_head(self) -> int:
        return self.n_embd // self.n_head

    def as_dict(self) -> dict:
        return asdict(self)


def rand(g, *shape, fan_in: int):
    """A parameter of seeded normal weights scaled by 1 / sqrt(fan_in)."""
    torch = _torch()
    return torch.nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(fan_in))


def ones(n: int):
    torch = _torch()
    return torch.nn.Parameter(torch.ones(n))


def split_heads(x, n: int, d: int):
    """[..., n * d] as [..., n, d]."""
    return x.reshape(*x.shape[:-1], n, d)


def rope_pairs(x, cos, sin):
    """llama's RoPE (adjacent pairs rotate together) of x [B, T, heads, d] with per-row cos/sin [B, T, d/2]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return _torch().stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def rope_neox(x, cos, sin):
    """NeoX RoPE (the halves of each head rotate together) of x [..., heads, d] with cos/sin [..., d/2]."""
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    c, s = cos[..., None, :], sin[..., None, :]
    return _torch().cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)


def from_target(weights: dict, d2t):
    """(token embeddings, output rows of the draft vocabulary, final norm) a new head starts from:
    the target's tensors (`weights`: float32 arrays; output.weight absent where it is tied to the
    embeddings), d2t the draft vocabulary's target ids (None: all)."""
    torch = _torch()
    tok_embd = torch.from_numpy(weights["token_embd.weight"])
    output = torch.from_numpy(weights.get("output.weight", weights["token_embd.weight"]))
    return (tok_embd, output if d2t is None else output[torch.from_numpy(d2t)],
            torch.from_numpy(weights["output_norm.weight"]))


class Borrowed:
    def init_borrowed(self, cfg, tok_embd) -> None:
        self.cfg = cfg
        self.register_buffer("tok_embd", tok_embd, persistent=False)
        self._rope = rope_tables(cfg.d_head, cfg.rope_base, 1)

    def embed(self, tokens):
        return self.tok_embd[tokens]

    def rope(self, pos):
        """cos, sin [..., d_head / 2] at the positions `pos`."""
        if self._rope[0].shape[0] <= int(pos.max()):
            self._rope = rope_tables(self.cfg.d_head, self.cfg.rope_base, 2 * int(pos.max()) + 2)
        return self._rope[0][pos], self._rope[1][pos]


class Attention:
    def init_attention(self, cfg, g, n_in: int, qk_norm: bool = False) -> None:
        d = cfg.d_head
        self.wq = rand(g, cfg.n_head * d, n_in, fan_in=n_in)
        self.wk = rand(g, cfg.n_head_kv * d, n_in, fan_in=n_in)
        self.wv = rand(g, cfg.n_head_kv * d, n_in, fan_in=n_in)
        self.wo = rand(g, cfg.n_embd, cfg.n_head * d, fan_in=cfg.n_head * d)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = ones(d)
            self.k_norm = ones(d)

    def queries(self, x):
        """[..., n_head, d_head], normed where the layer norms them (before RoPE)."""
        q = split_heads(x @ self.wq.T, self.cfg.n_head, self.cfg.d_head)
        return rms_norm(q, self.q_norm, self.cfg.rms_eps) if self.qk_norm else q

    def keys(self, x):
        k = split_heads(x @ self.wk.T, self.cfg.n_head_kv, self.cfg.d_head)
        return rms_norm(k, self.k_norm, self.cfg.rms_eps) if self.qk_norm else k

    def values(self, x):
        return split_heads(x @ self.wv.T, self.cfg.n_head_kv, self.cfg.d_head)

    def attn_out(self, att):
        """The output projection of the heads' results concatenated, [..., n_head * d_head]."""
        return att @ self.wo.T


def repeat_kv(x, cfg, dim: int):
    """Grouped-query attention: each key/value head repeated for the query heads it serves."""
    return x.repeat_interleave(cfg.n_head // cfg.n_head_kv, dim=dim)


class SwiGLU:
    def init_ffn(self, cfg, g) -> None:
        self.ffn_norm = ones(cfg.n_embd)
        self.ffn_gate = rand(g, cfg.n_ff, cfg.n_embd, fan_in=cfg.n_embd)
        self.ffn_up = rand(g, cfg.n_ff, cfg.n_embd, fan_in=cfg.n_embd)
        self.ffn_down = rand(g, cfg.n_embd, cfg.n_ff, fan_in=cfg.n_ff)

    def ffn(self, x):
        f = rms_norm(x, self.ffn_norm, self.cfg.rms_eps)
        return x + (_torch().nn.functional.silu(f @ self.ffn_gate.T) * (f @ self.ffn_up.T)) @ self.ffn_down.T


class OutputHead:
    def init_output(self, output_init, output_norm=None) -> None:
        torch = _torch()
        n = output_init.shape[1]
        self.output_norm = torch.nn.Parameter(torch.ones(n) if output_norm is None else output_norm.clone().float())
        self.output = torch.nn.Parameter(output_init.clone().float())

    def logits(self, x):
        return rms_norm(x, self.output_norm, self.cfg.rms_eps) @ self.output.T
