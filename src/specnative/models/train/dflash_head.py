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
Training mirrors that exactly (block_states): anchors of a packed row each get their block, whose
queries attend to the row's context keys before the anchor (same sequence) and to their own block.
The attention, FFN, output head and borrowed embeddings are layers.py's, shared with the EAGLE-3 head.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .deps import torch as _torch
from .gguf_target import rms_norm
from .layers import Attention, Borrowed, OutputHead, Shape, SwiGLU, ones, rand, repeat_kv, rope_neox


@dataclass(frozen=True)
class DFlashConfig(Shape):
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


def make_dflash_head(cfg: DFlashConfig, tok_embd, output_init, seed: int, output_norm=None):
    """A drafter with seeded random weights; `output_init` [n_draft_vocab, n_embd] (the target's output
    rows of the draft vocabulary) and `output_norm` (the target's final norm) start its output path as
    the target's own; `tok_embd` is borrowed and frozen, as llama.cpp borrows it."""
    torch = _torch()
    nn = torch.nn

    class Layer(nn.Module, Attention, SwiGLU):
        def __init__(self, g):
            super().__init__()
            self.cfg = cfg
            self.attn_norm = ones(cfg.n_embd)
            self.init_attention(cfg, g, n_in=cfg.n_embd, qk_norm=True)
            self.init_ffn(cfg, g)

    class DFlashHead(nn.Module, Borrowed, OutputHead):
        arch = "dflash"

        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(int(seed))
            n = cfg.n_embd
            self.init_borrowed(cfg, tok_embd)
            self.fc = rand(g, n, cfg.n_feat * n, fan_in=cfg.n_feat * n)
            self.enc_norm = ones(n)
            self.layers = nn.ModuleList([Layer(g) for _ in range(cfg.n_layer)])
            self.init_output(output_init, output_norm)

        def context(self, feats):
            """g [.., T, n_embd]: the fused target features the cache is filled from."""
            return rms_norm(feats @ self.fc.T, self.enc_norm, cfg.rms_eps)

    return DFlashHead()


def block_states(head, feats, pos, seg, tokens, anchors, block_len: int):
    """The drafter's last residual states [R, N, block_len, n_embd] of N blocks per packed row.

    feats [R, T, n_feat * n_embd], pos/seg [R, T] (position in its sequence; sequence id, -1 padding),
    tokens [R, T] (the sequence's token at each position), anchors [R, N] (row index of each block's
    anchor: its token opens the block, the context is the same sequence before it)."""
    torch = _torch()
    cfg = head.cfg
    R, T = seg.shape
    N = anchors.shape[1]
    H, d = cfg.n_head, cfg.d_head
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
    x = head.embed(btok)                                                     # [R, N, Lb, n]
    # context keys: the anchor's own sequence, strictly before it
    k_idx = torch.arange(T)
    ctx_ok = (seg[:, None, :] == seg.gather(1, anchors)[..., None]) & (k_idx[None, None, :] < anchors[..., None])
    ctx_bias = torch.zeros(R, N, T).masked_fill(~ctx_ok, float("-inf"))[:, None, :, None, :]  # [R,1,N,1,T]

    for layer in head.layers:
        ck = repeat_kv(rope_neox(layer.keys(g), ctx_cos, ctx_sin), cfg, 2).permute(0, 2, 1, 3)  # [R, H, T, d]
        cv = repeat_kv(layer.values(g), cfg, 2).permute(0, 2, 1, 3)
        h = rms_norm(x, layer.attn_norm, eps)
        q = rope_neox(layer.queries(h), b_cos, b_sin).permute(0, 3, 1, 2, 4)            # [R, H, N, Lb, d]
        k = repeat_kv(rope_neox(layer.keys(h), b_cos, b_sin), cfg, 3).permute(0, 3, 1, 2, 4)
        v = repeat_kv(layer.values(h), cfg, 3).permute(0, 3, 1, 2, 4)
        s_ctx = (q.reshape(R, H, N * block_len, d) @ ck.transpose(-1, -2)).view(R, H, N, block_len, T) * scale
        s_ctx = s_ctx + ctx_bias
        s_blk = (q @ k.transpose(-1, -2)) * scale                            # [R, H, N, Lb, Lb]
        p = torch.softmax(torch.cat((s_ctx, s_blk), -1), -1)
        att = (p[..., :T].reshape(R, H, N * block_len, T) @ cv).view(R, H, N, block_len, d) + p[..., T:] @ v
        x = layer.ffn(x + layer.attn_out(att.permute(0, 2, 3, 1, 4).reshape(R, N, block_len, H * d)))
    return x


FILE_NAME = "specnative-dflash-drafter"
MASK_KEY = "tokenizer.ggml.mask_token_id"


def file_keys(head, target_info) -> tuple[dict, dict]:
    """The dflash file's own keys: the block size (a draft is at most block_size - 1 tokens) and, in
    the tokenizer, the token of the block's masked positions."""
    return {"dflash.block_size": head.cfg.block_size}, {MASK_KEY: head.cfg.mask_token}


def from_file(reader, layers, n_draft_vocab: int, tok_embd, path):
    """An untrained drafter of the shape a dflash file (`reader`) describes, `tok_embd` borrowed.
    Without DFlash2's conv and selector tensors the file is a plain DFlash drafter, the only kind
    this reads."""
    if reader.get_field("selector_hidden.weight") is not None:
        raise ValueError(f"{path} is not a plain dflash file")
    field = lambda key: reader.get_field(key).contents()
    cfg = DFlashConfig(n_embd=int(field("dflash.embedding_length")), n_layer=int(field("dflash.block_count")),
                       n_head=int(field("dflash.attention.head_count")),
                       n_head_kv=int(field("dflash.attention.head_count_kv")),
                       n_ff=int(field("dflash.feed_forward_length")), n_feat=len(layers),
                       n_draft_vocab=n_draft_vocab, block_size=int(field("dflash.block_size")),
                       mask_token=int(field(MASK_KEY)), rope_base=float(field("dflash.rope.freq_base")),
                       rms_eps=float(field("dflash.attention.layer_norm_rms_epsilon")))
    return make_dflash_head(cfg, tok_embd, _torch().zeros(n_draft_vocab, cfg.n_embd), seed=0)
