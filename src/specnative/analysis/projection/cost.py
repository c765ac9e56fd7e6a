"""The cost of one llama.cpp forward (llama_decode) on a device: n tokens for each of N sequences
over a KV cache of n_kv cells, as a sum of per-operation rooflines plus fixed costs.

Per forward, for each group of weights of one role and type:
    CPU:         max(bytes / bandwidth, 2 x elements x rows / rate(class, rows)) + serial_share x min(...)
    CUDA, Metal: the kernel llama.cpp's vendored backend selects for the type and the row count,
                 priced as that kernel behaves (cuda.py, metal.py)
the layer matrices multiply every row (N x n), the LM head only the rows that ask for logits.
Attention without flash attention (the engine's default) multiplies every row with all n_kv cached
positions (a masked product: llama.cpp's unified cache computes the scores of every cell):
    bytes = n_kv x KV bytes per position + 3 x 4 x n_head x n_kv x rows x n_layer (F32 scores),
    FLOPs = 2 x n_layer x n_head x (head_k + head_v) x n_kv x rows, at the float rate,
on a CPU each dot product of a weight row with an activation row adds dot_ns and each score (row x
cached position x head x layer) adds attention_score_ns (one row: the matrix-vector path) or
attention_score_batched_ns (two or more rows: the tiled path) (its short dot
product, scale, mask and exponential are per-score work that bytes and FLOPs do not count), and
every forward adds overhead_forward + n_layer x overhead_layer.

The quantities speculation needs follow from it (`step_costs`): the baseline step (one token per
sequence), the verify, the round's draft as the drafter runs it, and prefill (chunks of n_batch).
A round's draft and verify follow what it drafts (`step_costs`' draft_shape and block):

- a chain of k: k draft decodes of one token, a verify of k+1 tokens;
- a block drafter (DFlash, DSpark): one draft decode of k+1 positions, a verify of k+1 tokens;
- a topk tree (topk, depth, budget): `depth` draft decodes, the root's of one token and each
  further level's of its `topk` frontier nodes; a verify of nodes+1 tokens;
- a split tree (branches, p_split, budget): every node fed once after the root, nodes+1 draft
  tokens in one-token decodes (a tree that never splits drafts so; one that splits takes fewer,
  wider decodes of the same tokens); a verify of nodes+1 tokens.

nodes is the tree's measured nodes per round (default: its budget); a mean between two whole
counts interpolates between their forwards.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from specnative.analysis.projection import cuda, metal
from specnative.analysis.projection.device import Device
from specnative.analysis.projection.shape import ModelShape, type_class

LABEL = "[projected]"  # every projected figure carries it: no measurement of that hardware
SCORE_BYTES = 4.0   # F32 attention scores: written, read by softmax and written, read by the V product
SCORE_PASSES = 3.0


@dataclass(frozen=True)
class Forward:
    """One forward's predicted time and where it goes (seconds)."""
    weights_s: float
    attention_s: float
    fixed_s: float
    kernel: str = ""  # CUDA, Metal: the kernel family of the layer matrices (cuda.select, metal.select)
    kernels: tuple = ()  # CUDA, Metal: (type, kernel) of every group of matrices priced, layers first

    @property
    def total_s(self) -> float:
        return self.weights_s + self.attention_s + self.fixed_s


def _combine(device: Device, memory_s: float, compute_s: float) -> float:
    """A GPU overlaps an operation's memory traffic with its arithmetic (the roofline's max). A CPU
    thread's hardware prefetcher streams the next weights while it computes, but not all of the
    time: the shorter of the two adds serial_share of itself (1: their sum, 0: the max)."""
    if device.backend == "cpu":
        return max(memory_s, compute_s) + device.serial_share * min(memory_s, compute_s)
    return max(memory_s, compute_s)


def kv_cells(ctx: int, n_seq: int, n_tokens: int, own: int = 0) -> int:
    """KV cells a forward attends over in the sweep's layout: the ctx-token shared prefix once, each
    sequence's own `own` cells (its prompt tail and what it generated), and the batch itself."""
    return int(ctx + n_seq * (own + n_tokens))


def forward(shape: ModelShape, device: Device, n_tokens: int, n_seq: int = 1, n_kv: int | None = None,
            logits_rows: int | None = None, flash_attn: bool = False, kernel: str | None = None) -> Forward:
    """Predicted time of one llama_decode of n_tokens per sequence for n_seq sequences over n_kv
    cached positions (default: just the batch); logits_rows rows ask for logits (default: all).
    flash_attn: llama.cpp's fused attention (no F32 score matrices written and read). kernel: price
    with this family instead of the one the vendored source selects (CUDA: mmvq or mmq, for every
    quantized matrix product; Metal: one of metal.KERNELS, for every matrix product)."""
    if n_tokens < 1 or n_seq < 1:
        raise ValueError("a forward has at least one token and one sequence")
    rows = n_tokens * n_seq
    n_kv = rows if n_kv is None else max(int(n_kv), 1)
    logits_rows = rows if logits_rows is None else int(logits_rows)
    bw = device.bandwidth
    weights = 0.0
    layer_kernel = ""
    kernels = []
    for w in shape.weights:
        if w.role == "layer":
            r = rows
        elif w.role == "output":
            r = logits_rows
        else:  # embeddings are looked up (rows x row bytes), norms read: bandwidth only
            weights += (w.n_bytes * min(1.0, rows / max(shape.n_vocab, 1)) if w.role == "embedding"
                        else w.n_bytes) / bw
            continue
        if r == 0:
            continue
        if device.backend == "cuda":
            forced = kernel if kernel and w.type_name.upper() not in cuda.FLOAT_TYPES else None
            weights += cuda.matmul_s(device, w.type_name, w.n_bytes, w.n_elements, r, forced)
            chosen = forced or cuda.select(w.type_name, r, device.cc, device.cuda_kernels)
            kernels.append((w.role, w.type_name, chosen))
            if w.role == "layer":
                layer_kernel = layer_kernel or chosen
            continue
        if device.backend == "metal":
            chosen = kernel if kernel in metal.KERNELS else metal.select(w.type_name, r, w.row_length or None)
            weights += metal.matmul_s(device, w.type_name, w.n_bytes, w.n_elements, r, chosen)
            kernels.append((w.role, w.type_name, chosen))
            if w.role == "layer":
                layer_kernel = layer_kernel or chosen
            continue
        weights += _combine(device, w.n_bytes / device.weight_bandwidth(r),
                            2.0 * w.n_elements * r / device.rate(type_class(w.type_name), r, w.type_name))
        if device.backend == "cpu":  # one dot product per weight row and activation row
            weights += w.n_rows * r * device.dot_ns * 1e-9 / device.threads
    heads = shape.n_head * (shape.head_dim_k + shape.head_dim_v)
    attn_flops = 2.0 * shape.n_layer * heads * n_kv * rows
    attn_bytes = n_kv * shape.kv_bytes_per_token
    if not flash_attn:
        attn_bytes += SCORE_PASSES * SCORE_BYTES * shape.n_layer * shape.n_head * n_kv * rows
    attention = _combine(device, attn_bytes / bw, attn_flops / device.rate("float", rows))
    if device.backend == "cpu":  # per score: a head_dim-long dot product, scale, mask and exp, each its own call
        scores = float(shape.n_layer) * shape.n_head * n_kv * rows
        per_score = device.attention_score_ns if rows == 1 else device.attention_score_batched_ns
        attention += scores * per_score * 1e-9 / device.threads
    fixed = (device.overhead_forward_us + shape.n_layer * device.overhead_layer_us) * 1e-6
    kernels.sort(key=lambda k: k[0] != "layer")
    return Forward(weights, attention, fixed, layer_kernel, tuple((t, k) for _, t, k in kernels))


def forward_s(shape, device, n_tokens, n_seq=1, n_kv=None, logits_rows=None, flash_attn=False, kernel=None) -> float:
    return forward(shape, device, n_tokens, n_seq, n_kv, logits_rows, flash_attn, kernel).total_s


def prefill_s(shape: ModelShape, device: Device, n_prompt: int, n_batch: int = 512, start: int = 0,
              flash_attn: bool = False, kernel: str | None = None) -> float:
    """Predicted time to prefill n_prompt tokens of one sequence in chunks of n_batch after `start`
    cached positions; only the last chunk's last row asks for logits (llama-bench's ppN: start 0)."""
    total, done = 0.0, 0
    while done < n_prompt:
        chunk = min(n_batch, n_prompt - done)
        last = done + chunk >= n_prompt
        total += forward_s(shape, device, chunk, 1, n_kv=start + done + chunk, logits_rows=1 if last else 0,
                           flash_attn=flash_attn, kernel=kernel)
        done += chunk
    return total


def decode_rate(shape: ModelShape, device: Device, n_gen: int = 128, start: int = 0, flash_attn: bool = False) -> float:
    """llama-bench's tgN: tokens/s of n_gen one-token forwards from `start` cached positions."""
    steps = [forward_s(shape, device, 1, 1, n_kv=start + i + 1, flash_attn=flash_attn)
             for i in range(0, n_gen, max(n_gen // 8, 1))]
    return 1.0 / (sum(steps) / len(steps))


@dataclass(frozen=True)
class StepCosts:
    """The costs speculation is priced with, for one regime (seconds and ratios)."""
    step_s: float            # baseline: one token per sequence
    verify_s: float          # target over the round's drafted tokens + 1 per sequence
    draft_s: float           # the round's draft over draft_units (0 for an n-gram lookup): c_draft's unit
    k: int
    draft_units: float = 0.0  # what draft_s is one of: the sweep's c_draft divisor (k; a tree's levels)
    shape: str = "chain"     # what the round drafts: chain, block, or a tree's spelling

    def __post_init__(self):
        if not self.draft_units:
            object.__setattr__(self, "draft_units", float(self.k))

    @property
    def draft_round_s(self) -> float:
        return self.draft_units * self.draft_s

    @property
    def round_s(self) -> float:
        return self.draft_round_s + self.verify_s

    @property
    def c(self) -> float:
        """verify_cost_c as the sweep defines it: T_round / T_step - 1."""
        return self.round_s / self.step_s - 1.0

    @property
    def verify_ratio(self) -> float:
        return self.verify_s / self.step_s

    @property
    def c_draft(self) -> float:
        return self.draft_s / self.step_s


def _forward_rows(shape: ModelShape, device: Device, rows: float, n_seq: int, ctx: int, own: int) -> float:
    """One forward of `rows` tokens per sequence in the sweep's layout; a mean `rows` between two
    whole counts interpolates between their forwards."""
    lo = max(1, math.floor(rows))
    hi = max(lo, math.ceil(rows))
    t_lo = forward_s(shape, device, lo, n_seq, kv_cells(ctx, n_seq, lo, own))
    if hi == lo:
        return t_lo
    t_hi = forward_s(shape, device, hi, n_seq, kv_cells(ctx, n_seq, hi, own))
    return t_lo + (rows - lo) * (t_hi - t_lo)


def step_costs(target: ModelShape, device: Device, k: int, n_seq: int = 1, ctx: int = 0, own: int = 64,
               draft: ModelShape | None = None, draft_shape=None, nodes: float | None = None,
               block: bool = False) -> StepCosts:
    """Baseline step, verify and the round's draft in one regime (ctx-token shared prefix, n_seq
    sequences each with `own` cells of their own). draft None: an n-gram lookup (costs nothing).
    draft_shape: a tree (engine.draft_shape.DraftShape: kind topk or split) verified as nodes+1
    tokens (nodes: measured nodes per round, default its budget); block: a block drafter's one
    decode of k+1 positions. Otherwise a chain of k."""
    if k < 1:
        raise ValueError("k must be at least 1")
    tree = draft_shape if draft_shape is not None and getattr(draft_shape, "kind", "chain") != "chain" else None
    if tree is not None and block:
        raise ValueError("a block drafter drafts no trees")
    step = forward_s(target, device, 1, n_seq, kv_cells(ctx, n_seq, 1, own))

    def draft_forward(rows: float) -> float:
        return 0.0 if draft is None else _forward_rows(draft, device, rows, n_seq, ctx, own)

    if tree is None:
        verify = _forward_rows(target, device, k + 1, n_seq, ctx, own)
        if block:
            return StepCosts(step, verify, draft_forward(k + 1) / k, k, float(k), "block")
        return StepCosts(step, verify, draft_forward(1), k, float(k), "chain")
    n = float(tree.budget if nodes is None or not math.isfinite(nodes) or nodes <= 0 else nodes)
    verify = _forward_rows(target, device, n + 1, n_seq, ctx, own)
    if tree.kind == "topk":
        levels = float(tree.depth)
        drafted = draft_forward(1) + (tree.depth - 1) * draft_forward(tree.topk)
    else:  # split: the root, then every node fed once
        levels = float(tree.budget)
        drafted = (n + 1) * draft_forward(1)
    return StepCosts(step, verify, drafted / levels, k, levels, tree.spelling)


def speedup(tau: float, costs: StepCosts) -> float:
    """Tokens per round over the round's time in baseline steps: tau / (1 + c)."""
    return tau / (1.0 + costs.c) if math.isfinite(tau) else math.nan
