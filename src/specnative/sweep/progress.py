"""The sweep's progress display, its ETA, and where the sweep's own time goes.

Cells cost very different amounts: a 32k-token context makes every decoded token attend over 32k
cells, so the default grid's last cells (32k x 8 sequences) take many times its first. The ETA is
therefore a cost model of the remaining cells, not a per-cell average:

    seconds(cell) ~= a * decode_work + b * prefill_work + c

decode_work: sequence-tokens the cell decodes, each weighted by the attention it reads
(1 + context / attn_scale, where attn_scale is how many context cells cost as much as the
model's weights per token, from the GGUF header); prefill_work: the shared context the cell
prefills (the first cell of each context length), weighted likewise. a, b, c start from a prior
measured on the tiny preset and are refitted (non-negative least squares) as cells finish.

On a terminal the display is a tqdm bar whose postfix names the cell and its phase; elsewhere (CI,
a log file) one line per finished cell, no carriage returns. Each cell's phases (lossless check,
noise control, warm-up, repeats, cost curve, ...) are timed in wall and CPU seconds and kept for
provenance (`timing_record`): CPU seconds stay meaningful on a machine shared with other jobs.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import nnls


def cell_label(cell) -> str:
    """A sweep cell in words: target file, context, concurrency, temperature, task, drafter."""
    return (f"{cell.target.name} ctx={cell.ctx_len} conc={cell.concurrency} T={cell.temperature:g} {cell.task} "
            f"{cell.drafter}"
            f"{'' if getattr(cell, 'prefix_cache', True) else ' prefix-cache=off'}"
            + "".join(f" {name}={value}" for name, value in getattr(cell, "factors", ())))


def phase_of(what: str) -> str:
    """The phase a progress message belongs to ('repeat 3/10 [0.9,1.2]' -> 'repeats')."""
    if what.startswith("check k"):
        return "check k"
    head = what.split(" k=")[0].strip()
    if head.startswith("warm-up"):
        return "warm-up"
    if head.startswith("repeat"):
        return "repeats"
    return head


@dataclass(frozen=True)
class CellWork:
    """What a cell has to compute, in model units, known before it runs."""

    decode: float   # decoded sequence-tokens, each weighted by the attention it reads
    prefill: float  # shared-context tokens it prefills (0 once cached), weighted likewise


def attention_weight(context: float, attn_scale: float) -> float:
    return 1.0 + context / attn_scale


def attn_scale_of(shape: dict) -> float:
    """Context cells whose attention costs as much as the weights per token: weights ~ the
    parameter count (multiply-adds per token), attention ~ 2 x n_layer x n_embd_kv per cell."""
    return max(shape["params_per_token"] / max(shape["attn_per_cell"], 1.0), 1.0)


def cell_work(ctx_len: int, concurrency: int, n_predict: int, runs: float, attn_scale: float,
              prefills_context: bool, token_cost: float = 1.0) -> CellWork:
    """runs: how many generate()-sized passes the cell makes (lossless check, controls, warm-up and
    timed pairs; an estimate, refitted through the model's coefficients). token_cost: a token of
    this model against one of the tiny preset's (token_cost_of)."""
    decode = runs * concurrency * n_predict * attention_weight(ctx_len + n_predict / 2, attn_scale)
    prefill = ctx_len * attention_weight(ctx_len / 2, attn_scale) if prefills_context else 0.0
    return CellWork(token_cost * decode, token_cost * prefill)


# A tiny model's token costs its per-token overhead (~0.25 ms on 2 cores), which is what reading
# this many bytes of weights costs: a model's token costs 1 + its file size / this, relative to
# the tiny preset's (Qwen2.5-Coder 1.5B Q4_K_M: ~450; its cells took 400-1000x the tiny prior's
# prediction on this CPU, shared).
OVERHEAD_BYTES = 2.5e6


def token_cost_of(path) -> float:
    """A decoded token's cost relative to the tiny preset's, from the model file's size (decoding
    on a CPU reads every weight per step). Without it the prior, fitted on the tiny preset, said
    minutes for a real model's hours, and its weight in the refit kept the ETA low for many cells."""
    try:
        return 1.0 + Path(path).stat().st_size / OVERHEAD_BYTES
    except (OSError, TypeError):
        return 1.0


# Seconds per unit: the prior a, b, c, fitted (non-negative least squares) to the 18 cells of the
# tiny preset's default run on 2 cores (bench/results/first-run/after: 9.2e-5, 4.6e-5, 0.02 before
# token costs; its targets' token cost is ~1.14, hence the division); refitted as cells finish
PRIOR = (8.1e-5, 4.0e-5, 0.02)
# Seconds of measurement the prior counts as when the finished cells rescale it: the first cells
# (no context) take a second or less, and their overheads must not triple the whole estimate.
PRIOR_WEIGHT_S = 20.0


@dataclass
class CostModel:
    prior: tuple = PRIOR
    coef: tuple = PRIOR

    def fit(self, works: list[CellWork], seconds: list[float]) -> None:
        """Least squares, non-negative, on the finished cells; where they cannot tell a
        coefficient (no cell prefilled yet), the prior's ratio to the decode one stands."""
        if not works:
            return
        x = np.array([[w.decode, w.prefill, 1.0] for w in works])
        y = np.asarray(seconds, float)
        # how much slower or faster than the prior this machine is, the prior counting as evidence
        scale = float((y.sum() + PRIOR_WEIGHT_S) / ((x @ np.array(self.prior)).sum() + PRIOR_WEIGHT_S))
        if not np.any(x[:, 1] > 0):  # b unknown: scale the prior as a whole
            self.coef = tuple(scale * c for c in self.prior)
            return
        # ridge towards the prior, so one cell cannot swing a coefficient to zero
        weight = np.sqrt(max(len(works), 1)) * 0.3
        scale_x = x.mean(axis=0)
        x_aug = np.vstack([x, np.diag(weight * scale_x)])
        y_aug = np.concatenate([y, weight * scale_x * np.array(self.prior) * scale])
        coef, _ = nnls(x_aug, y_aug)
        self.coef = tuple(float(c) for c in coef)

    def predict(self, work: CellWork) -> float:
        a, b, c = self.coef
        return a * work.decode + b * work.prefill + c


@dataclass
class CellTiming:
    label: str
    phases: dict = field(default_factory=dict)  # phase -> [wall s, cpu s]
    wall: float = 0.0
    cpu: float = 0.0


class SweepProgress:
    """Progress of a sweep over `cells` with their predicted `works` (same order)."""

    def __init__(self, cells: list, works: list[CellWork], stream=None, clock=time.monotonic,
                 cpu_clock=time.process_time, tty: bool | None = None, label=cell_label):
        self.stream = stream or sys.stderr
        self.clock, self.cpu_clock, self.label = clock, cpu_clock, label
        self.works = dict(zip(cells, works))
        self.pending = list(cells)      # not finished nor skipped, in order
        self.model = CostModel()
        self.finished_works: list[CellWork] = []
        self.finished_seconds: list[float] = []
        self.timings: list[CellTiming] = []
        self.current: CellTiming | None = None
        self.phase, self.phase_wall, self.phase_cpu = None, 0.0, 0.0
        self.cell_wall = self.cell_cpu = 0.0
        self.started = clock()
        self.done = 0
        self.tty = self.stream.isatty() if tty is None else tty
        self.bar = None
        if self.tty:
            from tqdm import tqdm
            self.bar = tqdm(total=len(cells), file=self.stream, unit="cell", dynamic_ncols=True,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{postfix}]")

    # --- bookkeeping ---------------------------------------------------------------------------
    def skip(self, cell) -> None:
        """A cell that will not run here (refused, already in a resumed file)."""
        if cell in self.pending:
            self.pending.remove(cell)
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def _close_phase(self) -> None:
        if self.current is not None and self.phase is not None:
            spent = self.current.phases.setdefault(self.phase, [0.0, 0.0])
            spent[0] += self.clock() - self.phase_wall
            spent[1] += self.cpu_clock() - self.phase_cpu

    def show(self, cell, what: str) -> None:
        """The cell is in the phase `what` names (a new phase closes the previous one)."""
        if self.current is None or self.current.label != self.label(cell):
            self.current = CellTiming(self.label(cell))
            self.phase = None
            self.cell_wall, self.cell_cpu = self.clock(), self.cpu_clock()
        phase = phase_of(what)
        if phase != self.phase:
            self._close_phase()
            self.phase, self.phase_wall, self.phase_cpu = phase, self.clock(), self.cpu_clock()
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.eta_text()}] {self.label(cell)}: {what}", refresh=True)

    def finish(self, cell, rows: list[dict]) -> None:
        self._close_phase()
        timing = self.current if self.current is not None and self.current.label == self.label(cell) \
            else CellTiming(self.label(cell))
        timing.wall = self.clock() - (self.cell_wall if self.current is timing else self.clock())
        timing.cpu = self.cpu_clock() - (self.cell_cpu if self.current is timing else self.cpu_clock())
        self.timings.append(timing)
        self.current, self.phase = None, None
        if cell in self.pending:
            self.pending.remove(cell)
            self.finished_works.append(self.works[cell])
            self.finished_seconds.append(timing.wall)
            self.model.fit(self.finished_works, self.finished_seconds)
        self.done += 1
        line = f"{self.label(cell)}: {summary_of(rows)} ({timing.wall:.0f} s; {self.eta_text()})"
        if self.bar is not None:
            self.bar.write(f"[{self.done}/{self.bar.total}] {line}")
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.done + len(self.pending)}] {line}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    # --- the ETA -------------------------------------------------------------------------------
    def eta_seconds(self) -> float | None:
        """Predicted seconds left: the model's cost of every cell not finished, less what the
        running cell has spent already (never below zero for it)."""
        if not self.pending:
            return 0.0
        left = sum(self.model.predict(self.works[c]) for c in self.pending)
        if self.current is not None:
            running = next((c for c in self.pending if self.label(c) == self.current.label), None)
            if running is not None:
                predicted = self.model.predict(self.works[running])
                left -= min(predicted, self.clock() - self.cell_wall)
        return max(left, 0.0)

    def eta_text(self) -> str:
        left = self.eta_seconds()
        if left is None or not math.isfinite(left):
            return "ETA --"
        return f"ETA {int(left // 60)}m{int(left % 60):02d}s"

    def timing_record(self) -> list[dict]:
        return [{"cell": t.label, "wall_s": round(t.wall, 3), "cpu_s": round(t.cpu, 3),
                 "phases": {p: {"wall_s": round(w, 3), "cpu_s": round(c, 3)} for p, (w, c) in t.phases.items()}}
                for t in self.timings]


def summary_of(rows: list[dict]) -> str:
    """A finished cell in one line: baseline rate, and per k speedup, alpha and the verdict."""
    base = rows[0].get("tps") if rows else None
    on = [r for r in rows if r.get("spec_decode") == "on"]
    parts = ", ".join(f"{r.get('draft_shape') or 'k=' + str(r['k'])} speedup {r['speedup']:.2f} alpha {r['draft_accept_rate']:.2f} {r.get('verdict') or ''}"
                      .rstrip() + ("" if r.get("lossless_ok", True) in (None, True) else " LOSSY") for r in on)
    return f"base {base:.1f} t/s; {parts}" if base is not None else parts


# ---------------------------------------------------------------------------------------------
# The sweep's cells as work
# ---------------------------------------------------------------------------------------------
RUNS_PER_CELL = 16  # lossless check and control (~5 passes), warm-up and timed pairs (~10), cost curve
DEFAULT_ATTN_SCALE = 1000.0


def header_attn_scale(path) -> float:
    """attn_scale_of() from a GGUF header (a file it cannot read gets a middling default: the
    ETA only weighs cells with it, and the refits correct the scale)."""
    try:
        from specnative.engine.gguf_checks import read_header

        header = read_header(path)

        def value(key, default=None):
            found = header.get(f"{header.arch}.{key}")
            found = default if found is None else found
            return max(found) if isinstance(found, list) else found

        n_embd, n_layer = int(value("embedding_length")), int(value("block_count"))
        n_ff = int(value("feed_forward_length", 4 * n_embd))
        n_vocab = header.n_vocab() or 32000
        params = n_layer * (4 * n_embd * n_embd + 3 * n_embd * n_ff) + n_embd * n_vocab
        return attn_scale_of({"params_per_token": params, "attn_per_cell": 2 * n_layer * n_embd})
    except Exception:  # noqa: BLE001 - an estimate only; the model checks have refused broken files already
        return DEFAULT_ATTN_SCALE


def works_of(cells: list, n_predict: int, key=lambda c: (c.target, c.ctx_len), extra_runs=lambda c: 0
             ) -> list[CellWork]:
    """Each cell's work; the first cell of each (target, context length) prefills the context.
    extra_runs(cell): generate()-sized runs beyond RUNS_PER_CELL (a rejection cell's
    distributional test: dozens of runs at concurrency 1)."""
    scales, costs, seen, works = {}, {}, set(), []
    for cell in cells:
        if cell.target not in scales:
            scales[cell.target] = header_attn_scale(cell.target)
            costs[cell.target] = token_cost_of(cell.target)
        first = key(cell) not in seen and cell.ctx_len > 0
        seen.add(key(cell))
        works.append(cell_work(cell.ctx_len, cell.concurrency, n_predict, RUNS_PER_CELL + extra_runs(cell),
                               scales[cell.target], first, costs[cell.target]))
    return works


