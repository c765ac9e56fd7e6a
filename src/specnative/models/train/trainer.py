"""Training the EAGLE-3 head on self-distilled data, and measuring it on a held-out split.

The loss is cross-entropy against the target's own next-token distribution (its top-k logits,
softmaxed over the draft vocabulary) at every position, prompt included, or with hard labels
against its greedy continuation's tokens; for each training-time-test step j (the head's own
states fed back, as when it drafts position j+1), weighted 0.8^j as EAGLE-3 does. The held-out
measurement is always the hard one: top-1 against the continuation's tokens, what a verify at
T = 0 accepts. A budget in tokens gives the same bytes for the same seed; a
budget in time stops where the clock says, and its learning-rate schedule runs on the clock too
(so it reaches its floor at the deadline however the speed changes along the way).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from .batches import batches
from .deps import torch as _torch
from .head import ttt_forward


@dataclass
class TrainSettings:
    seed: int = 0
    steps: int = 3                 # training-time-test depth (draft positions trained)
    lr: float = 3e-3
    rows_per_batch: int = 2        # rows of row_len tokens per optimizer step (2 beat 4 and 1 on SmolLM2)
    row_len: int = 512
    max_tokens: int | None = None  # sequence tokens through the head, all epochs together
    deadline: float | None = None  # time.perf_counter() at which training stops
    epochs: int | None = None
    step_decay: float = 0.8
    warmup_rows: int = 80          # Adam's first steps at full rate scramble the lens-initialized head
    quiet: bool = False


def _step_losses(head, batch, steps: int, with_correct: bool = False, soft: bool = False):
    """Per step: (summed cross-entropy, taught positions, correct top-1 [B, T] or None). soft: against
    the target's distribution at every position (batch["soft_*"]), else against its continuation."""
    torch = _torch()
    out = []
    for j, h in enumerate(ttt_forward(head, batch, steps)):
        if soft:
            m = batch["soft_valid"][j]
            logp = torch.log_softmax(head.logits(h[m]), dim=-1)
            ce = -(batch["soft_p"][m] * logp.gather(-1, batch["soft_ids"][m])).sum()
            out.append((ce, int(m.sum()), None))
            continue
        m = batch["valid"][j]
        label = batch["label"][m]
        logits = head.logits(h[m])
        ce = torch.nn.functional.cross_entropy(logits, label, ignore_index=-100, reduction="sum")
        correct = None
        if with_correct:
            correct = torch.zeros_like(m)
            correct[m] = (logits.argmax(-1) == label) & (label >= 0)
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
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {"positions": int(taught[0]),
               "top1_by_position": (right / taught).round(4).tolist(),
               "chained_by_position": (chained / anchors).round(4).tolist(),
               "loss_by_position": (loss / taught).round(4).tolist()}
    if per_sequence:
        out["correct"] = correct_of
    return out


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


def train(head, train_set, held_set, t2d, s: TrainSettings) -> dict:
    """Train `head` in place. train_set/held_set: (sequences, features). Returns the history."""
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
    weights = [s.step_decay ** j for j in range(s.steps)]
    warmup_batches = max(1, -(-s.warmup_rows // s.rows_per_batch))
    history, done, started = [], 0, time.perf_counter()
    bar = tqdm(total=None if math.isinf(planned) else int(planned), unit="tok", unit_scale=True,
               desc="training", disable=s.quiet, dynamic_ncols=True)
    epoch, n_batches, stop = 0, 0, planned <= 0
    while not stop:
        order = np.random.RandomState((s.seed * 1000003 + epoch) & 0xFFFFFFFF).permutation(len(seqs))
        sums, counts, seen = np.zeros(s.steps), np.zeros(s.steps), 0
        for batch in batches(seqs, feats, t2d, rows_per_batch=s.rows_per_batch, row_len=s.row_len,
                             steps=s.steps, order=order):
            if timed and done > 0:  # the bar's total: what the speed so far reaches by the deadline
                rate = done / (time.perf_counter() - started)
                bar.total = int(min(planned, done + rate * max(s.deadline - time.perf_counter(), 0.0)))
            factor = _lr_factor(_progress(done, planned, started, s.deadline), n_batches, warmup_batches)
            for group in opt.param_groups:
                group["lr"] = s.lr * factor
            losses = _step_losses(head, batch, s.steps, soft="soft_ids" in batch)
            total = sum(w * ce / max(n, 1) for w, (ce, n, _) in zip(weights, losses)) / sum(weights)
            opt.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            for j, (ce, n, _) in enumerate(losses):
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
            by_step = (sums / counts).round(4).tolist()
        entry = {"epoch": epoch + 1, "tokens": seen, "complete": seen == epoch_tokens,
                 "loss_by_position": by_step, "elapsed_s": round(time.perf_counter() - started, 1)}
        if held_set[0]:
            entry["held_out"] = evaluate(head, *held_set, t2d, steps=s.steps, row_len=s.row_len,
                                         rows_per_batch=s.rows_per_batch)
        history.append(entry)
        if not s.quiet:
            held = entry.get("held_out", {}).get("top1_by_position", [])
            bar.write(f"epoch {epoch + 1}: loss by position {by_step}, held-out top-1 {held}")
        epoch += 1
        if s.epochs is not None and epoch >= s.epochs:
            stop = True
    bar.close()
    return {"epochs": history, "tokens": done, "batches": n_batches, "train_s": round(time.perf_counter() - started, 1),
            "planned_tokens": None if math.isinf(planned) else int(planned)}
