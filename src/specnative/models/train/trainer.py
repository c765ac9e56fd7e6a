"""Training the EAGLE-3 head on self-distilled data, and measuring it on a held-out split.

The loss is cross-entropy against the target's own next-token distribution (its top-k logits,
softmaxed over the draft vocabulary) at every position, prompt included, or with hard labels
against its greedy continuation's tokens; for each training-time-test step j (the head's own
states fed back, as when it drafts position j+1), weighted 0.8^j as EAGLE-3 does. The held-out
measurement is always the hard one: top-1 against the continuation's tokens, what a verify at
T = 0 accepts. The loop (optimizer, schedule, budgets) is loop.py's, shared with the DFlash drafter.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batches import batches
from .deps import torch as _torch
from .head import ttt_forward
from .loop import Recipe, _lr_factor, _progress, hard_loss, held_out_record, soft_loss, train

# the loop and its schedule are loop.py's, offered here with EAGLE-3's recipe
__all__ = ["TrainSettings", "_lr_factor", "_progress", "evaluate", "simulate_rounds", "train"]


@dataclass
class TrainSettings(Recipe):
    """EAGLE-3's recipe: packed rows of every position, training-time test `steps` deep, step j's
    mean loss weighted step_decay^j."""
    steps: int = 3                 # training-time-test depth (draft positions trained)
    step_decay: float = 0.8

    def positions(self, head) -> int:
        return self.steps

    def batches(self, head, sequences, features, t2d, order, rng):
        return batches(sequences, features, t2d, rows_per_batch=self.rows_per_batch, row_len=self.row_len,
                       steps=self.steps, order=order)

    def loss(self, head, batch):
        losses = [(ce, n) for ce, n, _ in _step_losses(head, batch, self.steps, soft="soft_ids" in batch)]
        weights = [self.step_decay ** j for j in range(self.steps)]
        total = sum(w * ce / max(n, 1) for w, (ce, n) in zip(weights, losses)) / sum(weights)
        return total, losses

    def evaluate(self, head, sequences, features, t2d) -> dict:
        return evaluate(head, sequences, features, t2d, steps=self.steps, row_len=self.row_len,
                        rows_per_batch=self.rows_per_batch)


def _step_losses(head, batch, steps: int, with_correct: bool = False, soft: bool = False):
    """Per step: (summed cross-entropy, taught positions, correct top-1 [B, T] or None). soft: against
    the target's distribution at every position (batch["soft_*"]), else against its continuation."""
    out = []
    for j, h in enumerate(ttt_forward(head, batch, steps)):
        if soft:
            m = batch["soft_valid"][j]
            out.append((soft_loss(head.logits(h[m]), batch["soft_ids"][m], batch["soft_p"][m]), int(m.sum()), None))
            continue
        m = batch["valid"][j]
        ce, correct = hard_loss(head.logits(h[m]), batch["label"][m], m, with_correct)
        out.append((ce, int(m.sum()), correct))
    return out


def _left(x, j: int):
    """x [B, T] read j places later (x[:, q + j] at q; False past the end)."""
    if j == 0:
        return x
    torch = _torch()
    return torch.cat((x[:, j:], torch.zeros_like(x[:, :j])), dim=1)


def evaluate(head, sequences, features, t2d, *, steps: int, row_len: int, rows_per_batch: int,
             per_sequence: bool = False) -> dict:
    """Teacher-forced top-1 agreement per draft position (step j scored on its own, earlier tokens
    given) and chained (positions 1..j+1 all right from one anchor: what a speculative round at
    T = 0 accepts), over every continuation anchor of `sequences`; mean loss per step. With
    per_sequence, also "correct": per sequence a bool array [steps, L], step j right at position q."""
    torch = _torch()
    right = np.zeros(steps)
    taught = np.zeros(steps)
    chained = np.zeros(steps)
    anchors = np.zeros(steps)
    loss = np.zeros(steps)
    correct_of = [None] * len(sequences)
    head.eval()
    with torch.no_grad():
        for batch in batches(sequences, features, t2d, rows_per_batch=rows_per_batch, row_len=row_len,
                             steps=steps, order=range(len(sequences))):
            chain, per_step = None, []
            for j, (ce, n, correct) in enumerate(_step_losses(head, batch, steps, with_correct=True)):
                loss[j] += float(ce)
                taught[j] += n
                right[j] += int(correct.sum())
                per_step.append(correct)
                at_anchor = _left(correct, j)
                chain = at_anchor if chain is None else chain & at_anchor
                ok = _left(batch["valid"][j], j)
                chained[j] += int((chain & ok).sum())
                anchors[j] += int(ok.sum())
            if per_sequence:
                stacked = torch.stack(per_step).numpy()
                for b, start, i, length in batch["placed"]:
                    correct_of[i] = stacked[:, b, start:start + length].copy()
    head.train()
    return held_out_record(taught, right, chained, anchors, loss, correct_of if per_sequence else None)


def simulate_rounds(sequences, correct, k: int, n_predict: int) -> dict:
    """The counts a greedy speculative run with draft length k would make, from per-position
    correctness (evaluate's "correct"): rounds start after the prompt and advance by the accepted
    drafts plus one, as specnative's engine and llama.cpp's eagle3 drafter do. Comparable with
    specnative's accepted_at / drafted_at on the same tokens, anchor for anchor."""
    drafted_at, accepted_at = np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
    rounds = emitted = 0
    for s, ok in zip(sequences, correct):
        if ok.shape[0] < k:
            raise ValueError(f"correctness of {ok.shape[0]} draft positions cannot simulate k = {k}")
        n_out = len(s.tokens) - s.n_prompt
        anchor, produced = s.n_prompt - 1, 1  # the prefill emits the first token
        while produced < min(n_out, n_predict):
            k_eff = min(k, n_predict - produced - 1)
            m = 0
            while m < k_eff and anchor + m < ok.shape[1] and ok[m, anchor + m]:
                m += 1
            drafted_at[:max(k_eff, 0)] += 1
            accepted_at[:m] += 1
            rounds += 1
            emitted += m + 1
            produced += m + 1
            anchor += m + 1
    with np.errstate(invalid="ignore", divide="ignore"):
        by_position = np.where(drafted_at > 0, accepted_at / np.maximum(drafted_at, 1), np.nan)
    return {"rounds": rounds, "drafted": int(drafted_at.sum()), "accepted": int(accepted_at.sum()),
            "alpha": float(accepted_at.sum() / max(drafted_at.sum(), 1)),
            "alpha_by_position": by_position.round(4).tolist(),
            "tau": emitted / max(rounds, 1)}
