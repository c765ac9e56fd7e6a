"""Packing self-distilled sequences into training batches, and the draft vocabulary.

Several sequences share one batch row (their attention kept apart by segment ids), so short
chat turns do not waste a row each. For every position q of a sequence the head reads the
features at q and token q+1 and is taught what the target says after token q+1. Hard labels
(the continuation's token q+2) are taught and scored only where the anchor lies in the target's
continuation: at inference the head only ever drafts after a generated token. Soft labels (the
target's own distribution there) are taught at every position, prompt included: they are the
target's whatever text it reads, and they multiply the data a short budget can generate.
"""
from __future__ import annotations

import bisect

import numpy as np

from .deps import torch as _torch


def choose_draft_vocab(sequences, n_vocab: int, size: int):
    """d2t: the `size` most frequent taught tokens of `sequences` (the continuation's tokens, then
    the target's soft labels by probability mass; ties and unseen tokens by id), ascending; None
    when the draft vocabulary is the whole target vocabulary."""
    if size >= n_vocab:
        return None
    counts = np.zeros(n_vocab, dtype=np.int64)
    mass = np.zeros(n_vocab, dtype=np.float64)
    for s in sequences:
        np.add.at(counts, s.tokens[s.n_prompt + 1:], 1)
        if s.soft_ids is not None:
            np.add.at(mass, s.soft_ids.ravel(), _softmax(s.soft_logits).ravel().astype(np.float64))
    order = np.lexsort((np.arange(n_vocab), -mass, -counts))  # count, then mass descending, then id
    return np.sort(order[:size]).astype(np.int64)


def coverage(sequences, d2t) -> float:
    """Share of taught tokens the draft vocabulary holds (the rest a head can never draft)."""
    labels = np.concatenate([s.tokens[s.n_prompt + 1:] for s in sequences]) if sequences else np.zeros(0)
    if d2t is None or labels.size == 0:
        return 1.0
    return float(np.isin(labels, d2t).mean())


def t2d_table(d2t, n_vocab: int) -> np.ndarray:
    """target id -> draft row (-100, the ignored label, for tokens outside the draft vocabulary)."""
    table = np.full(n_vocab, -100, dtype=np.int64)
    if d2t is None:
        table[:] = np.arange(n_vocab)
    else:
        table[d2t] = np.arange(len(d2t))
    return table


def _softmax(logits):
    """Row-wise softmax of top-k logits (rows of -inf only give zeros)."""
    top = np.max(logits, axis=-1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0).astype(np.float32)


def pack(lengths, row_len: int, order) -> list[list[int]]:
    """Sequence indices per row: each sequence, in `order`, joins the open row it fills best (the
    least room left that still holds it) or opens a new one; rows come in the order they opened.
    Best fit leaves a few per cent of a row empty where placing in turn left about a fifth, and
    an empty slot costs a full position of compute."""
    rows, free = [], []  # free: sorted (room left, row index) of the rows that still have room
    for i in order:
        n = lengths[i]
        at = bisect.bisect_left(free, (n, -1))
        if at < len(free):
            room, r = free.pop(at)
        else:
            room, r = row_len, len(rows)
            rows.append([])
        rows[r].append(int(i))
        if room - n > 0:
            bisect.insort(free, (room - n, r))
    return rows


def place(rows, sequences, features, row_len: int) -> dict:
    """What every packed batch holds (both kinds): feats, pos (in its sequence), seg (the sequence's
    place in its row, -1 padding), n_prompt [R, T]; "placed": (row, start, sequence index, length)
    of each sequence; "tokens": the sequence tokens in it."""
    torch = _torch()
    R, width = len(rows), features[0].shape[1]
    out = {"feats": torch.zeros(R, row_len, width), "pos": torch.zeros(R, row_len, dtype=torch.long),
           "seg": torch.full((R, row_len), -1, dtype=torch.long), "n_prompt": torch.zeros(R, row_len, dtype=torch.long),
           "placed": []}
    for b, members in enumerate(rows):
        start = 0
        for m, i in enumerate(members):
            L = len(sequences[i].tokens)
            span = slice(start, start + L)
            out["feats"][b, span] = features[i]
            out["pos"][b, span] = torch.arange(L)
            out["seg"][b, span] = m
            out["n_prompt"][b, span] = sequences[i].n_prompt
            out["placed"].append((b, start, i, L))
            start += L
    out["tokens"] = int((out["seg"] >= 0).sum())
    return out


def make_batch(rows, sequences, features, t2d, row_len: int, steps: int) -> dict:
    """Tensors of one batch of packed rows (see head.ttt_forward): place's, next_tok [B, T] (token
    q+1), per-step masks `valid` [steps, B, T] of taught positions and `label` [B, T] (draft rows;
    -100 outside the draft vocabulary or where nothing is taught)."""
    torch = _torch()
    out = place(rows, sequences, features, row_len)
    pos, seg = out["pos"], out["seg"]
    next_tok = torch.zeros(len(rows), row_len, dtype=torch.long)
    label = torch.full((len(rows), row_len), -100, dtype=torch.long)
    target_ok = torch.zeros(len(rows), row_len, dtype=torch.bool)   # token pos + 2 exists
    for b, start, i, L in out["placed"]:
        s = sequences[i]
        next_tok[b, start:start + L - 1] = torch.as_tensor(s.tokens[1:])
        if L > 2:
            label[b, start:start + L - 2] = torch.as_tensor(t2d[s.tokens[2:]])
            target_ok[b, start:start + L - 2] = True
    # step j at q drafts for the anchor q - j, which must be a continuation position
    out["valid"] = torch.stack([(pos - j >= out["n_prompt"] - 1) & target_ok & (seg >= 0) for j in range(steps)])
    out.update(next_tok=next_tok, label=label)
    if sequences[rows[0][0]].soft_ids is not None:
        out.update(_soft(rows, sequences, t2d, row_len, pos, seg, steps))
    return out


def _soft(rows, sequences, t2d, row_len: int, pos, seg, steps: int) -> dict:
    """The target's distribution over the next token after q + 1 (its soft label at q+1) for every
    position q: a softmax of its top-k logits over those the draft vocabulary keeps; taught at every position of
    the sequence, prompt included (`soft_valid` [steps, B, T]), since it is the target's own."""
    torch = _torch()
    k = sequences[rows[0][0]].soft_ids.shape[1]
    ids = torch.zeros(len(rows), row_len, k, dtype=torch.long)
    p = torch.zeros(len(rows), row_len, k)
    has_next = torch.zeros(len(rows), row_len, dtype=torch.bool)
    for b, members in enumerate(rows):
        start = 0
        for i in members:
            s = sequences[i]
            L = len(s.tokens)
            rows_ids = t2d[s.soft_ids[1:]]
            rows_p = _softmax(np.where(rows_ids >= 0, s.soft_logits[1:], -np.inf))
            ids[b, start:start + L - 1] = torch.as_tensor(np.maximum(rows_ids, 0))
            p[b, start:start + L - 1] = torch.as_tensor(rows_p)
            has_next[b, start:start + L - 1] = torch.as_tensor((rows_ids >= 0).any(-1))
            start += L
    soft_valid = torch.stack([(pos - j >= 0) & has_next & (seg >= 0) for j in range(steps)])
    return {"soft_ids": ids, "soft_p": p, "soft_valid": soft_valid}


def batches(sequences, features, t2d, *, rows_per_batch: int, row_len: int, steps: int, order):
    """Batches over the sequences in `order` (a generator, one epoch)."""
    lengths = [len(s.tokens) for s in sequences]
    rows = pack(lengths, row_len, order)
    for start in range(0, len(rows), rows_per_batch):
        yield make_batch(rows[start:start + rows_per_batch], sequences, features, t2d, row_len, steps)
