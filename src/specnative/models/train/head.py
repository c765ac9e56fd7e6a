"""The EAGLE-3 head in torch: the graph llama.cpp's `eagle3` model runs, and its training-time test.

llama.cpp (src/models/eagle3.cpp, common/speculative.cpp) runs the head as:
  encoder   g = fc(concat(in[l0], in[l1], in[l2]))  the three target layer inputs at position P;
  decoder   at position P the pair (token P+1, g_P):
            x  = concat(rms(E[token]) * attn_norm, rms(g) * attn_norm_2)   (2 n_embd wide)
            h1 = g + Wo attn(Wq x, Wk x, Wv x)           RoPE (adjacent pairs) at P, causal KV cache
            h2 = h1 + down(silu(gate(rms(h1) * ffn_norm)) * up(...))      the "prenorm" state
            logits = output(rms(h2) * output_norm)        over the draft vocabulary, mapped by d2t
  drafting  the first draft comes from (last target token, g of the last accepted position); each
            later draft feeds (the previous draft, the previous step's h2) at the next position,
            attending to the cache of true-feature positions plus its own chain.
E is the target's token embedding (borrowed, frozen here). Training mirrors drafting exactly
(EAGLE-3's training-time test): step 0 runs every position with true features; step j at position
q takes h2 of step j-1 at q-1 and attends to step-0 keys up to q-j and to the keys of steps
1..j at their chain positions. Tokens stay teacher-forced: a later draft only matters when the
earlier ones were right, i.e. equal to the target's tokens. The attention, FFN, output head and
borrowed embeddings are layers.py's, shared with the DFlash drafter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .deps import torch as _torch
from .gguf_target import rms_norm
from .layers import Attention, Borrowed, OutputHead, Shape, SwiGLU, ones, rand, repeat_kv, rope_pairs


@dataclass(frozen=True)
class HeadConfig(Shape):
    n_embd: int
    n_embd_target: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_draft_vocab: int
    rope_base: float
    rms_eps: float


def make_head(cfg: HeadConfig, tok_embd, output_init, seed: int, output_norm=None, lens_slice: int | None = None):
    """A head with seeded random weights; `output_init` [n_draft_vocab, n_embd] (the target's
    output rows of the draft vocabulary) and `output_norm` (the target's final norm) start its
    output path as the target's own, `tok_embd` is borrowed. lens_slice: fc starts as (nearly)
    the identity on that feature slice (the highest target layer), so the head's residual starts
    as a late target state which that output path reads with calibrated logits (random features
    through it give logits tens of nats off, which the first epoch would spend undoing)."""
    torch = _torch()

    class Head(torch.nn.Module, Borrowed, Attention, SwiGLU, OutputHead):
        arch = "eagle3"

        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(int(seed))
            n, nt = cfg.n_embd, cfg.n_embd_target
            self.init_borrowed(cfg, tok_embd)
            self.fc = rand(g, n, 3 * nt, fan_in=3 * nt)
            if lens_slice is not None:
                with torch.no_grad():
                    self.fc.mul_(0.01 * math.sqrt(3 * nt) / math.sqrt(nt))  # small, about 0.01 / sqrt(nt)
                    self.fc[:, lens_slice * nt:(lens_slice + 1) * nt] += torch.eye(n, nt)
            # the one decoder layer's tensors live on the head itself (blk.0 in the file)
            self.attn_norm = ones(n)
            self.attn_norm_2 = ones(n)
            self.init_attention(cfg, g, n_in=2 * n)
            self.init_ffn(cfg, g)
            self.init_output(output_init, output_norm)

        def encode(self, feats):
            return feats @ self.fc.T

        def qkv(self, tokens, g, pos):
            """Queries, keys, values [B, heads, T, d] of the pairs (tokens, g) at positions pos."""
            eps = cfg.rms_eps
            x = torch.cat((rms_norm(self.embed(tokens), self.attn_norm, eps), rms_norm(g, self.attn_norm_2, eps)), -1)
            cos, sin = self.rope(pos)  # [B, T, d/2]
            q = rope_pairs(self.queries(x), cos, sin)
            k = rope_pairs(self.keys(x), cos, sin)
            k, v = repeat_kv(k, cfg, 2), repeat_kv(self.values(x), cfg, 2)
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def block_out(self, att, g):
            """h2 from the attention output [B, heads, T, d] and the residual g."""
            B, _, T, _ = att.shape
            return self.ffn(g + self.attn_out(att.transpose(1, 2).reshape(B, T, -1)))

    return Head()


def _shift(x, s: int):
    """x [B, T, ...] moved s places later along T (the first s rows zero)."""
    if s == 0:
        return x
    torch = _torch()
    return torch.cat((torch.zeros_like(x[:, :s]), x[:, :-s]), dim=1)


def ttt_forward(head, batch, steps: int):
    """The head's prenorm states h2 [B, T, n_embd] of steps 0..steps-1 over a packed batch.

    batch: feats [B, T, 3 n_embd_t], next_tok [B, T] (token q+1 of the same sequence), pos [B, T]
    (position in the sequence), seg [B, T] (sequence id within the batch row, -1 padding)."""
    torch = _torch()
    seg, pos, tokens = batch["seg"], batch["pos"], batch["next_tok"]
    T = seg.shape[1]
    same = seg[:, :, None] == seg[:, None, :]                       # [B, Tq, Tk]
    q_idx = torch.arange(T)[:, None]
    k_idx = torch.arange(T)[None, :]
    scale = 1.0 / math.sqrt(head.cfg.d_head)
    g = head.encode(batch["feats"])
    keys, values, states = [], [], []
    for j in range(steps):
        if j > 0:  # the previous step's state at the previous position of the same sequence
            prev_same = _shift(seg[..., None], 1)[..., 0] == seg
            prev_same[:, 0] = False
            g = _shift(states[-1], 1) * prev_same[..., None]
        q, k, v = head.qkv(tokens, g, pos)
        keys.append(k)
        values.append(v)
        mask0 = same & (k_idx <= q_idx - j)                        # step-0 keys up to q - j
        if j == 0:  # causal within each sequence: torch's fused kernel, no explicit score matrix
            att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask0[:, None], scale=scale)
            states.append(head.block_out(att, g))
            continue
        scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~mask0[:, None], float("-inf"))]
        for i in range(1, j + 1):  # step i's key sits j - i places earlier on the chain
            s = j - i
            valid = _shift(seg[..., None], s)[..., 0] == seg
            valid[:, :s] = False
            d = (q * _shift(keys[i].transpose(1, 2), s).transpose(1, 2)).sum(-1) * scale
            scores.append(d.masked_fill(~valid[:, None], float("-inf"))[..., None])
        p = torch.softmax(torch.cat(scores, -1), -1)
        att = p[..., :T] @ values[0]
        for i in range(1, j + 1):
            att = att + p[..., T + i - 1:T + i] * _shift(values[i].transpose(1, 2), j - i).transpose(1, 2)
        states.append(head.block_out(att, g))
    return states


FILE_NAME = "specnative-eagle3-head"


def file_keys(head, target_info) -> tuple[dict, dict]:
    """The eagle3 file's own keys (after the target layers; in the tokenizer): the target's width."""
    return {"eagle3.target_hidden_size": target_info.n_embd}, {}


def from_file(reader, layers, n_draft_vocab: int, tok_embd, path):
    """An untrained head of the shape an eagle3 file (`reader`) describes, `tok_embd` borrowed."""
    field = lambda key: reader.get_field(key).contents()
    cfg = HeadConfig(n_embd=int(field("eagle3.embedding_length")), n_embd_target=int(field("eagle3.target_hidden_size")),
                     n_head=int(field("eagle3.attention.head_count")),
                     n_head_kv=int(field("eagle3.attention.head_count_kv")),
                     n_ff=int(field("eagle3.feed_forward_length")), n_draft_vocab=n_draft_vocab,
                     rope_base=float(field("eagle3.rope.freq_base")),
                     rms_eps=float(field("eagle3.attention.layer_norm_rms_epsilon")))
    return make_head(cfg, tok_embd, _torch().zeros(n_draft_vocab, cfg.n_embd), seed=0)
