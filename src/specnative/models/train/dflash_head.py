"""The DFlash block drafter in torch: the graph llama.cpp's `dflash` model runs, over many blocks at once.

llama.cpp (src/models/dflash.cpp, common/speculative.cpp: draft-dflash) runs the drafter as:
  context   every position p the target has decoded: g_p = rms(fc(concat(in[l] for l in target_layers)))
            * enc_norm; each layer writes K = k_norm(Wk g_p) (NeoX RoPE at p) and V = Wv g_p into the
            drafter's cache (KV injection);
  block     after the target's last decoded position a-1, one forward of [t_a, MASK, ..., MASK] at
            positions a..a+k (t_a: the token just sampled, k: the draft length, at most block_size-1):
            x = E[token] (the target's embeddings, borrowed); per layer
            h = rms(x) * attn_norm, q = q_norm(Wq h), k = k_norm(Wk h) (both NeoX-roped), v = Wv h,
            x += Wo attn(q; context keys < a and all block keys, non-causal), x += down(silu(gate) * up)
            of rms(x) * ffn_norm; logits = output(rms(x) * output_norm) over the draft vocabulary (d2t);
  drafting  the argmax at block offset i (1..k) is draft i. Nothing is fed back: a block's drafts do
            not depend on each other, so its top-1 agreement per offset, chained from offset 1, is what
            a greedy verify accepts.
Training mirrors that exactly (block_logits): anchors of a packed row each get their block, whose
queries attend to the row's context keys before the anchor (same sequence) and to their own block.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .deps import torch as _torch
from .gguf_target import rms_norm, rope_tables


@dataclass(frozen=True)
class DFlashConfig:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_feat: int            # target layers read (the features are n_feat x n_embd wide)
    n_draft_vocab: int
    block_size: int        # the trained block: a draft of at most block_size - 1 tokens
    mask_token: int
    rope_base: float
    rms_eps: float

    @property
    def d_head(self) -> int:
        return self.n_embd // self.n_head

    def as_dict(self) -> dict:
        return asdict(self)


LAYER_PARAMS = ("attn_norm", "wq", "wk", "wv", "wo", "q_norm", "k_norm", "ffn_norm", "ffn_gate", "ffn_up",
                "ffn_down")


def make_dflash_head(cfg: DFlashConfig, tok_embd, output_init, seed: int, output_norm=None):
    """A drafter with seeded random weights; `output_init` [n_draft_vocab, n_embd] (the target's output
    rows of the draft vocabulary) and `output_norm` (the target's final norm) start its output path as
    the target's own; `tok_embd` is borrowed and frozen, as llama.cpp borrows it."""
    torch = _torch()
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self, g):
            super().__init__()
            n, d = cfg.n_embd, cfg.d_head

            def rand(*shape, fan_in):
                return nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(fan_in))

            self.attn_norm = nn.Parameter(torch.ones(n))
            self.wq = rand(cfg.n_head * d, n, fan_in=n)
            self.wk = rand(cfg.n_head_kv * d, n, fan_in=n)
            self.wv = rand(cfg.n_head_kv * d, n, fan_in=n)
            self.wo = rand(n, cfg.n_head * d, fan_in=cfg.n_head * d)
            self.q_norm = nn.Parameter(torch.ones(d))
            self.k_norm = nn.Parameter(torch.ones(d))
            self.ffn_norm = nn.Parameter(torch.ones(n))
            self.ffn_gate = rand(cfg.n_ff, n, fan_in=n)
            self.ffn_up = rand(cfg.n_ff, n, fan_in=n)
            self.ffn_down = rand(n, cfg.n_ff, fan_in=cfg.n_ff)

    class DFlashHead(nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(int(seed))
            n = cfg.n_embd
            self.cfg = cfg
            self.fc = nn.Parameter(torch.randn(n, cfg.n_feat * n, generator=g) / math.sqrt(cfg.n_feat * n))
            self.enc_norm = nn.Parameter(torch.ones(n))
            self.layers = nn.ModuleList([Layer(g) for _ in range(cfg.n_layer)])
            self.output_norm = nn.Parameter(torch.ones(n) if output_norm is None else output_norm.clone().float())
            self.output = nn.Parameter(output_init.clone().float())
            self.register_buffer("tok_embd", tok_embd, persistent=False)
            self._rope = rope_tables(cfg.d_head, cfg.rope_base, 1)

        def rope(self, pos):
            if self._rope[0].shape[0] <= int(pos.max()):
                self._rope = rope_tables(cfg.d_head, cfg.rope_base, 2 * int(pos.max()) + 2)
            return self._rope[0][pos], self._rope[1][pos]

        def context(self, feats):
            """g [.., T, n_embd]: the fused target features the cache is filled from."""
            return rms_norm(feats @ self.fc.T, self.enc_norm, cfg.rms_eps)

        def logits(self, x):
            return rms_norm(x, self.output_norm, cfg.rms_eps) @ self.output.T

    return DFlashHead()


def _neox(x, cos, sin):
    """NeoX RoPE (the halves of each head rotate together) of x [..., heads, d] with cos/sin [..., d/2]."""
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    c, s = cos[..., None, :], sin[..., None, :]
    return _torch().cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)


def _heads(x, n: int, d: int):
    return x.reshape(*x.shape[:-1], n, d)


def block_states(head, feats, pos, seg, tokens, anchors, block_len: int):
    """The drafter's last residual states [R, N, block_len, n_embd] of N blocks per packed row.

    feats [R, T, n_feat * n_embd], pos/seg [R, T] (position in its sequence; sequence id, -1 padding),
    tokens [R, T] (the sequence's token at each position), anchors [R, N] (row index of each block's
    anchor: its token opens the block, the context is the same sequence before it)."""
    torch = _torch()
    cfg = head.cfg
    R, T = seg.shape
    N = anchors.shape[1]
    H, Hkv, d = cfg.n_head, cfg.n_head_kv, cfg.d_head
    group = H // Hkv
    scale = 1.0 / math.sqrt(d)
    eps = cfg.rms_eps

    g = head.context(feats)                                                  # [R, T, n]
    ctx_cos, ctx_sin = head.rope(pos)                                        # [R, T, d/2]
    a_pos = pos.gather(1, anchors)                                           # [R, N]
    offsets = torch.arange(block_len)
    bpos = a_pos[..., None] + offsets                                        # [R, N, Lb]
    b_cos, b_sin = head.rope(bpos)
    first = tokens.gather(1, anchors)
    btok = torch.full((R, N, block_len), cfg.mask_token, dtype=torch.long)
    btok[..., 0] = first
    x = head.tok_embd[btok]                                                  # [R, N, Lb, n]
    # context keys: the anchor's own sequence, strictly before it
    k_idx = torch.arange(T)
    ctx_ok = (seg[:, None, :] == seg.gather(1, anchors)[..., None]) & (k_idx[None, None, :] < anchors[..., None])
    ctx_bias = torch.zeros(R, N, T).masked_fill(~ctx_ok, float("-inf"))[:, None, :, None, :]  # [R,1,N,1,T]

    for layer in head.layers:
        ck = _neox(rms_norm(_heads(g @ layer.wk.T, Hkv, d), layer.k_norm, eps), ctx_cos, ctx_sin)  # [R,T,Hkv,d]
        cv = _heads(g @ layer.wv.T, Hkv, d)
        ck = ck.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)          # [R, H, T, d]
        cv = cv.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
        h = rms_norm(x, layer.attn_norm, eps)
        q = _neox(rms_norm(_heads(h @ layer.wq.T, H, d), layer.q_norm, eps), b_cos, b_sin)     # [R,N,Lb,H,d]
        k = _neox(rms_norm(_heads(h @ layer.wk.T, Hkv, d), layer.k_norm, eps), b_cos, b_sin)
        v = _heads(h @ layer.wv.T, Hkv, d)
        q = q.permute(0, 3, 1, 2, 4)                                         # [R, H, N, Lb, d]
        k = k.repeat_interleave(group, dim=3).permute(0, 3, 1, 2, 4)
        v = v.repeat_interleave(group, dim=3).permute(0, 3, 1, 2, 4)
        s_ctx = (q.reshape(R, H, N * block_len, d) @ ck.transpose(-1, -2)).view(R, H, N, block_len, T) * scale
        s_ctx = s_ctx + ctx_bias
        s_blk = (q @ k.transpose(-1, -2)) * scale                            # [R, H, N, Lb, Lb]
        p = torch.softmax(torch.cat((s_ctx, s_blk), -1), -1)
        att = (p[..., :T].reshape(R, H, N * block_len, T) @ cv).view(R, H, N, block_len, d) + p[..., T:] @ v
        att = att.permute(0, 2, 3, 1, 4).reshape(R, N, block_len, H * d)
        x = x + att @ layer.wo.T
        f = rms_norm(x, layer.ffn_norm, eps)
        x = x + (torch.nn.functional.silu(f @ layer.ffn_gate.T) * (f @ layer.ffn_up.T)) @ layer.ffn_down.T
    return x
