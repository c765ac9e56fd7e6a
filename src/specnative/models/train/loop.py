"""The one training loop both drafters train with, and its schedule.

A kind of drafter is a Recipe: the settings every kind has (seed, learning rate, rows per batch,
the budget in tokens, epochs or time) and the three things that differ, `batches` (one epoch of
batches in a seeded order), `loss` (the weighted loss of a batch and its sum per draft position)
and `evaluate` (the held-out measurement). The loop is the same for every kind: AdamW with the
gradient clipped to norm 1, a linear warm-up then a cosine to a tenth of the rate, epochs until
the budget is spent (a token budget gives the same bytes for the same seed; under a time budget
the schedule runs on the clock, so it reaches its floor at the deadline however the speed changes
along the way), a progress bar, the held-out measurement after every epoch and the history.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tqdm import tqdm

from .deps import torch as _torch


@dataclass
class Recipe:
    seed: int = 0
    lr: float = 3e-3
    rows_per_batch: int = 2        # rows of row_len tokens per optimizer step (2 beat 4 and 1 on SmolLM2)
    row_len: int = 512
    max_tokens: int | None = None  # sequence tokens through the head, all epochs together
    deadline: float | None = None  # time.perf_counter() at which training stops
    epochs: int | None = None
    warmup_rows: int = 80          # Adam's first steps at full rate scramble a head started from the target
    quiet: bool = False
    label: ClassVar[str] = "training"

    def positions(self, head) -> int:
        """Draft positions the loss and the measurement report."""
        raise NotImplementedError

    def batches(self, head, sequences, features, t2d, order, rng):
        """One epoch's batches (dicts with "tokens": the sequence tokens in it) over the sequences in
        `order`; `rng` (seeded per epoch, after drawing `order`) for what else the kind draws."""
        raise NotImplementedError

    def loss(self, head, batch):
        """(the weighted loss to minimize, per draft position (summed loss, taught count))."""
        raise NotImplementedError

    def evaluate(self, head, sequences, features, t2d) -> dict:
        """The held-out measurement: top1_by_position, chained_by_position, loss_by_position, ..."""
        raise NotImplementedError


def soft_loss(logits, ids, p):
    """Summed cross-entropy against the target's top-k distribution (ids, p [n, k]) of each row."""
    return -(p * _torch().log_softmax(logits, -1).gather(-1, ids)).sum()


def hard_loss(logits, label, m, with_correct: bool):
    """(summed cross-entropy against `label` [n] (-100: taught nothing), top-1 right on the grid of
    `m` (bool, the n positions taught) or None): a label outside the draft vocabulary is a wrong draft."""
    torch = _torch()
    ce = torch.nn.functional.cross_entropy(logits, label, ignore_index=-100, reduction="sum")
    if not with_correct:
        return ce, None
    correct = torch.zeros_like(m)
    correct[m] = (logits.argmax(-1) == label) & (label >= 0)
    return ce, correct


def held_out_record(taught, right, chained, anchors, loss, correct_of, **extra) -> dict:
    """What both kinds' held-out measurements report, from per-position sums: the positions scored,
    top-1 agreement on its own and chained from the first draft, mean loss; "correct" (per sequence,
    step j right at position q) where `correct_of` is given."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {"positions": int(taught[0]), **extra, "top1_by_position": (right / taught).round(4).tolist(),
               "chained_by_position": (chained / anchors).round(4).tolist(),
               "loss_by_position": (loss / taught).round(4).tolist()}
    if correct_of is not None:
        out["correct"] = correct_of
    return out


def _lr_factor(progress: float, batch: int, warmup_batches: int) -> float:
    """Linear warm-up over the first `warmup_batches` batches, then cosine from 1 down to 0.1 at
    progress 1 (the share of the planned tokens or of the time budget spent, whichever is ahead)."""
    x = min(max(progress, 0.0), 1.0)
    return min(1.0, (batch + 1) / warmup_batches) * (0.1 + 0.45 * (1 + math.cos(math.pi * x)))


def _progress(done: int, planned: float, started: float, deadline: float | None) -> float:
    """How far training is, 0..1: by tokens when a token plan exists, by the clock under a deadline."""
    by_tokens = done / planned if planned > 0 and not math.isinf(planned) else 0.0
    if deadline is None:
        return by_tokens
    by_time = (time.perf_counter() - started) / max(deadline - started, 1e-9)
    return max(by_tokens, by_time)


def train(head, train_set, held_set, t2d, s: Recipe) -> dict:
    """Train `head` in place as the recipe `s` says. train_set/held_set: (sequences, features).
    Returns the history (the training curve)."""
    torch = _torch()
    torch.manual_seed(s.seed)
    seqs, feats = train_set
    epoch_tokens = sum(len(x.tokens) for x in seqs)
    planned = math.inf
    if s.max_tokens is not None:
        planned = s.max_tokens
    if s.epochs is not None:
        planned = min(planned, s.epochs * epoch_tokens)
    timed = s.deadline is not None
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup_batches = max(1, -(-s.warmup_rows // s.rows_per_batch))
    n_pos = s.positions(head)
    history, done, started = [], 0, time.perf_counter()
    bar = tqdm(total=None if math.isinf(planned) else int(planned), unit="tok", unit_scale=True,
               desc=s.label, disable=s.quiet, dynamic_ncols=True)
    epoch, n_batches, stop = 0, 0, planned <= 0
    while not stop:
        rng = np.random.RandomState((s.seed * 1000003 + epoch) & 0xFFFFFFFF)
        order = rng.permutation(len(seqs))
        sums, counts, seen = np.zeros(n_pos), np.zeros(n_pos), 0
        for batch in s.batches(head, seqs, feats, t2d, order, rng):
            if timed and done > 0:  # the bar's total: what the speed so far reaches by the deadline
                rate = done / (time.perf_counter() - started)
                bar.total = int(min(planned, done + rate * max(s.deadline - time.perf_counter(), 0.0)))
            factor = _lr_factor(_progress(done, planned, started, s.deadline), n_batches, warmup_batches)
            for group in opt.param_groups:
                group["lr"] = s.lr * factor
            total, losses = s.loss(head, batch)
            opt.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            for j, (ce, n) in enumerate(losses):
                sums[j] += float(ce.detach())
                counts[j] += n
            done += batch["tokens"]
            seen += batch["tokens"]
            n_batches += 1
            bar.update(batch["tokens"])
            bar.set_postfix(epoch=epoch + 1, loss=f"{float(total.detach()):.3f}")
            if done >= planned or (timed and time.perf_counter() >= s.deadline):
                stop = True
                break
        with np.errstate(invalid="ignore", divide="ignore"):
            by_position = (sums / counts).round(4).tolist()
        entry = {"epoch": epoch + 1, "tokens": seen, "complete": seen == epoch_tokens,
                 "loss_by_position": by_position, "elapsed_s": round(time.perf_counter() - started, 1)}
        if held_set[0]:
            entry["held_out"] = s.evaluate(head, *held_set, t2d)
        history.append(entry)
        if not s.quiet:
            held = entry.get("held_out", {})
            bar.write(f"epoch {epoch + 1}: loss by position {by_position[:8]}, held-out top-1 "
                      f"{held.get('top1_by_position', [])[:8]}, chained {held.get('chained_by_position', [])[:8]}")
        epoch += 1
        if s.epochs is not None and epoch >= s.epochs:
            stop = True
    bar.close()
    return {"epochs": history, "tokens": done, "batches": n_batches, "train_s": round(time.perf_counter() - started, 1),
            "planned_tokens": None if math.isinf(planned) else int(planned)}
