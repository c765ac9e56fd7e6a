"""Training the DFlash block drafter on self-distilled data, and measuring it on a held-out split.

The recipe is DFlash's (Chen, Liang, Liu: "DFlash: Block Diffusion for Flash Speculative Decoding",
arXiv:2602.06036): anchors are drawn at random in every sequence, afresh each epoch; each opens a
block [anchor token, MASK, ...]; every masked offset i predicts the target's distribution over the
token at anchor + i given the true prefix (its top-k logits softmaxed over the draft vocabulary:
the soft labels the EAGLE-3 pipeline records; or, with hard labels, its greedy token), and the
cross-entropy of offset i is weighted exp(-(i - 1) / gamma), as early offsets decide what a verify
accepts. Sequences are packed into rows (batches.pack); a block sees only its own sequence. Each
batch draws its block length from 4..block_size, so the drafter also serves the shorter blocks a
smaller draft length k decodes (llama.cpp's block is k + 1 tokens). The held-out measurement is
the hard one: the drafter's top-1 against the target's own continuation at every offset, and
chained from offset 1 (what a greedy verify of one block accepts). The loop (warm-up, then a
cosine on the clock under a time budget) is loop.py's, which the EAGLE-3 head trains with too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .batches import _softmax, pack, place
from .deps import torch as _torch
from .dflash_head import block_states
from .loop import Recipe, hard_loss, held_out_record, soft_loss


@dataclass
class DFlashSettings(Recipe):
    """DFlash's recipe: packed rows, random anchors opening blocks of a length drawn per batch, the
    loss of offset i weighted exp(-(i - 1) / gamma) and averaged over the taught offsets."""
    block_tokens: int = 512         # block positions per row and batch: anchors = block_tokens / block length
    min_block: int = 4
    gamma: float = 7.0              # DFlash's loss decay for a block of 16
    label: ClassVar[str] = "training (dflash)"

    def positions(self, head) -> int:
        return head.cfg.block_size - 1

    def batches(self, head, sequences, features, t2d, order, rng):
        soft = sequences[0].soft_ids is not None
        B = head.cfg.block_size
        lens = list(range(min(self.min_block, B), B + 1))
        packed = pack([len(x.tokens) for x in sequences], self.row_len, order)
        for start in range(0, len(packed), self.rows_per_batch):
            rows = make_rows(packed[start:start + self.rows_per_batch], sequences, features, t2d, self.row_len)
            block_len = int(rng.choice(lens))
            anchors, valid = sample_anchors(eligible(rows, hard=not soft), max(1, self.block_tokens // block_len), rng)
            yield {**rows, "anchors": anchors, "valid": valid, "block_len": block_len, "soft": soft}

    def loss(self, head, batch):
        losses = [(ce, n) for ce, n, _ in block_losses(head, batch, batch["anchors"], batch["valid"],
                                                         batch["block_len"], soft=batch["soft"])]
        weights = [math.exp(-(i - 1) / self.gamma) for i in range(1, len(losses) + 1)]
        num = sum(w * ce for w, (ce, _) in zip(weights, losses))
        den = sum(w * n for w, (_, n) in zip(weights, losses))
        return num / max(den, 1), losses

    def evaluate(self, head, sequences, features, t2d) -> dict:
        return evaluate(head, sequences, features, t2d, block_len=head.cfg.block_size, row_len=self.row_len,
                        rows_per_batch=self.rows_per_batch)


def make_rows(rows, sequences, features, t2d, row_len: int) -> dict:
    """Tensors of packed rows: batches.place's, tok (each position's token), hard (draft row of the next
    token, -100 where none or outside the draft vocabulary) and, with soft labels, soft_ids/soft_p
    (the target's distribution over the next token, per row index)."""
    torch = _torch()
    out = place(rows, sequences, features, row_len)
    out["tok"] = torch.zeros(len(rows), row_len, dtype=torch.long)
    out["hard"] = torch.full((len(rows), row_len), -100, dtype=torch.long)
    soft = sequences[rows[0][0]].soft_ids is not None
    if soft:
        k = sequences[rows[0][0]].soft_ids.shape[1]
        out["soft_ids"] = torch.zeros(len(rows), row_len, k, dtype=torch.long)
        out["soft_p"] = torch.zeros(len(rows), row_len, k)
    for b, start, i, L in out["placed"]:
        s = sequences[i]
        span = slice(start, start + L)
        out["tok"][b, span] = torch.as_tensor(s.tokens)
        out["hard"][b, start:start + L - 1] = torch.as_tensor(t2d[s.tokens[1:]])
        if soft:
            ids = t2d[s.soft_ids]
            out["soft_ids"][b, span] = torch.as_tensor(np.maximum(ids, 0))
            out["soft_p"][b, span] = torch.as_tensor(_softmax(np.where(ids >= 0, s.soft_logits, -np.inf)))
    return out


def eligible(rows: dict, hard: bool):
    """[R, T] anchors a block may open: after at least one context position; with hard labels (and
    for scoring) only continuation positions whose next token exists, as drafting starts after the
    first generated token."""
    seg, pos = rows["seg"], rows["pos"]
    ok = (seg >= 0) & (pos >= 1)
    if hard:
        ok &= (pos >= rows["n_prompt"]) & _has_next(rows)
    return ok


def _has_next(rows: dict):
    torch = _torch()
    seg = rows["seg"]
    nxt = torch.cat((seg[:, 1:], torch.full_like(seg[:, :1], -1)), 1)
    return (seg >= 0) & (nxt == seg)


def sample_anchors(ok, n: int, rng: np.random.RandomState):
    """[R, N] anchor indices (N = min(n, most eligible in a row)) and [R, N] validity, drawn without
    replacement per row (rows with fewer repeat a valid one, marked invalid)."""
    torch = _torch()
    per_row = [np.flatnonzero(r) for r in ok.numpy()]
    N = max(1, min(n, max((len(p) for p in per_row), default=1)))
    idx = np.zeros((len(per_row), N), dtype=np.int64)
    valid = np.zeros((len(per_row), N), dtype=bool)
    for r, p in enumerate(per_row):
        if len(p) == 0:
            continue
        pick = np.sort(rng.choice(p, size=min(N, len(p)), replace=False))
        idx[r, :len(pick)] = pick
        idx[r, len(pick):] = pick[0]
        valid[r, :len(pick)] = True
    return torch.from_numpy(idx), torch.from_numpy(valid)


def _targets(rows: dict, anchors, valid, block_len: int, hard: bool):
    """Per offset 1..block_len-1: the row index of its label (anchor + i - 1: the target's view of the
    token at anchor + i) and where it is taught [R, N, block_len - 1]: inside the anchor's sequence,
    and with hard labels where the token at anchor + i exists."""
    torch = _torch()
    T = rows["seg"].shape[1]
    at = anchors[..., None] + torch.arange(block_len - 1)
    inside = at < T
    at = at.clamp(max=T - 1)
    same = rows["seg"].gather(1, at.flatten(1)).view_as(at) == rows["seg"].gather(1, anchors)[..., None]
    ok = same & inside & valid[..., None]
    if hard:
        ok &= _has_next(rows).gather(1, at.flatten(1)).view_as(at)
    return at, ok


def block_losses(head, rows: dict, anchors, valid, block_len: int, soft: bool, with_correct: bool = False):
    """Per offset 1..block_len-1: (summed cross-entropy, taught blocks, correct top-1 [R, N] or None)."""
    x = block_states(head, rows["feats"], rows["pos"], rows["seg"], rows["tok"], anchors, block_len)
    at, ok = _targets(rows, anchors, valid, block_len, hard=not soft)
    R, N = anchors.shape
    out = []
    for i in range(1, block_len):
        where, m = at[..., i - 1], ok[..., i - 1]
        logits = head.logits(x[:, :, i][m])
        if soft:
            k = rows["soft_ids"].shape[-1]
            ids = rows["soft_ids"].gather(1, where[..., None].expand(R, N, k))[m]
            p = rows["soft_p"].gather(1, where[..., None].expand(R, N, k))[m]
            out.append((soft_loss(logits, ids, p), int(m.sum()), None))
            continue
        ce, correct = hard_loss(logits, rows["hard"].gather(1, where)[m], m, with_correct)
        out.append((ce, int(m.sum()), correct))
    return out


def evaluate(head, sequences, features, t2d, *, block_len: int, row_len: int, rows_per_batch: int = 2,
             chunk: int = 96, per_sequence: bool = False) -> dict:
    """Top-1 agreement with the target's continuation per draft offset (1..block_len-1), on its own and
    chained from offset 1 (what a greedy verify of the block accepts), over every continuation anchor;
    mean loss per offset. With per_sequence, "correct": per sequence a bool array [block_len - 1, L]
    in trainer.simulate_rounds' layout (offset j + 1 of the block opened at position a, at a - 1 + j)."""
    torch = _torch()
    n_off = block_len - 1
    right, taught, chained, anchors_n, loss = (np.zeros(n_off) for _ in range(5))
    correct_of = [None] * len(sequences)
    head.eval()
    with torch.no_grad():
        packed = pack([len(s.tokens) for s in sequences], row_len, range(len(sequences)))
        for start in range(0, len(packed), rows_per_batch):
            rows = make_rows(packed[start:start + rows_per_batch], sequences, features, t2d, row_len)
            ok = eligible(rows, hard=True)
            grid = np.zeros((ok.shape[0], n_off, ok.shape[1]), dtype=bool)
            for r in range(ok.shape[0]):
                idx = np.flatnonzero(ok[r].numpy())
                for c in range(0, len(idx), chunk):
                    part = torch.from_numpy(idx[c:c + chunk])[None]
                    sub = {key: (v[r:r + 1] if torch.is_tensor(v) else v) for key, v in rows.items()}
                    valid = torch.ones_like(part, dtype=torch.bool)
                    _, has_label = _targets(sub, part, valid, block_len, hard=True)
                    chain = None
                    for j, (ce, n, correct) in enumerate(block_losses(head, sub, part, valid, block_len, soft=False,
                                                                      with_correct=True)):
                        loss[j] += float(ce)
                        taught[j] += n
                        right[j] += int(correct.sum())
                        has = has_label[..., j]
                        chain = correct if chain is None else chain & correct
                        chained[j] += int((chain & has).sum())
                        anchors_n[j] += int(has.sum())
                        cols = part[0].numpy() - 1 + j
                        inside = cols < grid.shape[2]
                        grid[r, j, cols[inside]] = correct[0].numpy()[inside]
            if per_sequence:
                for b, s0, i, length in rows["placed"]:
                    correct_of[i] = grid[b, :, s0:s0 + length].copy()
    head.train()
    return held_out_record(taught, right, chained, anchors_n, loss, correct_of if per_sequence else None,
                           block_len=block_len)
