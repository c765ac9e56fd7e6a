"""The target's greedy continuations in torch, many sequences at once, with features and soft labels.

On CPU llama.cpp decodes a quantized model a few sequences at a time and its quantized kernels
are compute-bound there (a step of 8 sequences costs about 5 single steps). The same target in
float32 torch (gguf_target.py, checked against llama.cpp) decodes 32 or more sequences per step as dense
matrix products at a higher rate, and the same pass yields the layer inputs and the logits the
head trains on, so no second forward is needed. The price: greedy choices are torch's, which follow
llama.cpp's except at near-ties (distill.py measures how often).

Each prompt is prefilled on its own (no compute spent on padding) into a shared KV cache where it
ends at the same slot as the others (left-aligned padding, masked out of attention); positions
start at 0 at every sequence's first token, as in its own llama.cpp context. Then all sequences
decode together, one token per step.
"""
from __future__ import annotations

import numpy as np

from .deps import torch as _torch
from .gguf_target import TorchLlama, rms_norm, rope_tables


def _rope(x, cos, sin):
    """x [B, T, heads, d] rotated by adjacent pairs; cos/sin [B, T, d/2]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return _torch().stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def top_logits(logits, top_k: int):
    """The top_k next tokens and their logits. Probabilities are formed later over the tokens the
    draft vocabulary keeps (batches.py), so the full softmax (slow on CPU) is never needed."""
    values, ids = logits.topk(top_k, dim=-1)
    return ids.numpy().astype(np.int64), values.numpy().astype(np.float32)


class _Cache:
    """A KV cache for a batch of sequences that all end at slot `width` after their prompts."""

    def __init__(self, model: TorchLlama, lengths, n_predict: int, layers):
        torch = _torch()
        info = model.info
        self.model, self.layers, self.width = model, tuple(layers), max(lengths)
        total = self.width + n_predict
        self.pad = torch.tensor([self.width - n for n in lengths])
        shape = (len(lengths), info.n_head_kv, total, info.n_embd // info.n_head)
        self.k = [torch.zeros(shape) for _ in range(info.n_layer)]
        self.v = [torch.zeros(shape) for _ in range(info.n_layer)]
        self.cos, self.sin = rope_tables(info.n_rot, info.rope_base, total)

    def run(self, tokens, rows: slice, start: int, top_k: int):
        """tokens [b, T] of batch rows `rows` at slots start..start+T-1. Returns the layer inputs
        [b, T, 3 n_embd], the top_k (ids, logits) [b, T, top_k] or None, and the last slot's logits."""
        torch = _torch()
        m, info = self.model, self.model.info
        b, T = tokens.shape
        d = info.n_embd // info.n_head
        slots = torch.arange(start, start + T)
        pad = self.pad[rows]
        pos = (slots[None, :] - pad[:, None]).clamp(min=0)
        cos, sin = self.cos[pos], self.sin[pos]
        keys = torch.arange(start + T)
        visible = (keys[None, None, :] >= pad[:, None, None]) & (keys[None, None, :] <= slots[None, :, None])
        x = m.tok_embd[tokens]
        wanted = {}
        for il, blk in enumerate(m.blocks):
            if il in self.layers:
                wanted[il] = x
            h = rms_norm(x, blk["attn_norm.weight"], info.rms_eps)
            q = _rope((h @ blk["attn_q.weight"].T).view(b, T, info.n_head, d), cos, sin).transpose(1, 2)
            k = _rope((h @ blk["attn_k.weight"].T).view(b, T, info.n_head_kv, d), cos, sin).transpose(1, 2)
            self.k[il][rows, :, start:start + T] = k
            v = (h @ blk["attn_v.weight"].T).view(b, T, info.n_head_kv, d).transpose(1, 2)
            self.v[il][rows, :, start:start + T] = v
            att = torch.nn.functional.scaled_dot_product_attention(
                q, self.k[il][rows, :, :start + T], self.v[il][rows, :, :start + T], attn_mask=visible[:, None],
                enable_gqa=True)
            x = x + att.transpose(1, 2).reshape(b, T, info.n_embd) @ blk["attn_output.weight"].T
            h = rms_norm(x, blk["ffn_norm.weight"], info.rms_eps)
            ff = torch.nn.functional.silu(h @ blk["ffn_gate.weight"].T) * (h @ blk["ffn_up.weight"].T)
            x = x + ff @ blk["ffn_down.weight"].T
        x = rms_norm(x, m.output_norm, info.rms_eps)
        top = None
        if top_k:  # 128 positions at a time: all b x T x n_vocab logits at once would not fit, and
            # one flat matrix product per block runs near the CPU's peak, unlike many thin ones
            flat = x.reshape(b * T, info.n_embd)
            parts = [top_logits(flat[i:i + 128] @ m.output.T, top_k) for i in range(0, b * T, 128)]
            top = (np.concatenate([a for a, _ in parts]).reshape(b, T, top_k),
                   np.concatenate([c for _, c in parts]).reshape(b, T, top_k))
        return torch.cat([wanted[il] for il in self.layers], dim=-1), top, x[:, -1] @ m.output.T


def generate_batch(model: TorchLlama, prompts, *, n_predict: int, layers, stop_ids, top_k: int):
    """Greedy continuations of `prompts` (token lists) together: per sequence (generated tokens,
    features [L, 3 n_embd] of prompt + generated, soft ids and logits [L, top_k] or None). A
    sequence ends after a token of stop_ids (kept) or n_predict tokens."""
    torch = _torch()
    with torch.no_grad():
        cache = _Cache(model, [len(p) for p in prompts], n_predict, layers)
        feats, soft, last = [], [], []
        for i, p in enumerate(prompts):  # each prompt alone: no compute on padding
            tokens = torch.as_tensor(np.asarray(p, dtype=np.int64))[None]
            f, top, lg = cache.run(tokens, slice(i, i + 1), cache.width - len(p), top_k)
            feats.append([f[0]])
            soft.append([top] if top_k else [])
            last.append(lg)
        logits = torch.cat(last)
        stop = torch.as_tensor(sorted(stop_ids), dtype=torch.long)
        done = torch.zeros(len(prompts), dtype=torch.bool)
        ended_at = torch.full((len(prompts),), n_predict, dtype=torch.long)
        outputs = []
        for t in range(n_predict):
            token = logits.argmax(-1)
            outputs.append(token)
            ends = ~done & torch.isin(token, stop)
            ended_at[ends] = t + 1
            done |= ends
            # the new token's layer inputs, and the distribution after it
            f, top, logits = cache.run(token[:, None], slice(None), cache.width + t, top_k)
            for i in range(len(prompts)):
                feats[i].append(f[i])
                if top_k:
                    soft[i].append((top[0][i:i + 1], top[1][i:i + 1]))
            if bool(done.all()):
                break
        out_tokens = torch.stack(outputs, dim=1).numpy()
        result = []
        for i, p in enumerate(prompts):
            g = int(ended_at[i])
            length = len(p) + g
            f = torch.cat(feats[i])[:length].contiguous()
            ids = values = None
            if top_k:
                ids = np.concatenate([s[0].reshape(-1, top_k) for s in soft[i]])[:length]
                values = np.concatenate([s[1].reshape(-1, top_k) for s in soft[i]])[:length]
            result.append((out_tokens[i, :g], f, ids, values))
    return result
