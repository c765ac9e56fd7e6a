"""The sweep's progress display: the ETA from a cost model of the remaining cells (checked with a
fake clock against synthetic cell costs shaped like a real default run), phase timing, and one
line per finished cell when the output is not a terminal."""
from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest

from specnative.report import record_md
from specnative.sweep import Cell, SweepConfig, progress
from specnative.sweep.grid import cells_of

N_PREDICT = 32


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def default_grid() -> list:
    cfg = SweepConfig(targets=[Path("q4.gguf"), Path("q8.gguf")], draft=Path("d.gguf"))
    return cells_of(cfg)  # the default grid, in the sweep's order: ctx ascending, heaviest last


def true_costs(cells, works, coef, rng) -> list[float]:
    """Seconds per cell: the model's form with other coefficients than the prior, and +-15 % noise."""
    a, b, c = coef
    return [(a * w.decode + b * w.prefill + c) * float(rng.lognormal(0.0, 0.15)) for w in works]


def eta_errors(costs: list[float], cells: list, works: list) -> dict:
    """Runs a fake sweep: each cell in 8 phases; at 20, 50 and 80 % of the total time, the ETA's
    relative error against the time actually left."""
    clock = FakeClock()
    display = progress.SweepProgress(cells, works, stream=io.StringIO(), clock=clock, cpu_clock=clock, tty=False)
    total = sum(costs)
    checkpoints, errors = [0.2, 0.5, 0.8], {}
    for cell, cost in zip(cells, costs):
        for step in range(8):
            display.show(cell, ["lossless check k=4", "noise control k=4", "warm-up 1", "repeat 2/10"][step % 4])
            clock.now += cost / 8
            while checkpoints and clock.now >= checkpoints[0] * total:
                left = total - clock.now
                errors[checkpoints.pop(0)] = (display.eta_seconds() - left) / left
        display.finish(cell, [{"spec_decode": "off", "tps": 1.0}])
    assert display.eta_seconds() == 0.0
    return errors


# The prior off by up to 3x in each coefficient (another machine), as the synthetic runs' true costs.
COEF_SCALES = [(1.0, 1.0, 1.0), (3.0, 0.5, 2.0), (0.4, 2.0, 0.5)]


def synthetic_run(coef_scale):
    cells = default_grid()
    works = progress.works_of(cells, N_PREDICT)
    coef = tuple(p * s for p, s in zip(progress.PRIOR, coef_scale))
    return cells, works, true_costs(cells, works, coef, np.random.default_rng(7))


@pytest.mark.parametrize("coef_scale", COEF_SCALES)
def test_eta_within_30_percent_at_20_50_80_percent(coef_scale):
    """The refits must bring the ETA within +-30 % of the real remaining time from 20 % of the run
    on, whatever the prior's error."""
    cells, works, costs = synthetic_run(coef_scale)
    errors = eta_errors(costs, cells, works)
    assert set(errors) == {0.2, 0.5, 0.8}
    for at, error in errors.items():
        assert abs(error) <= 0.30, f"ETA off by {error:+.0%} at {at:.0%} of the run"


@pytest.mark.parametrize("coef_scale", COEF_SCALES)
def test_a_per_cell_average_would_fail_the_same_runs(coef_scale):
    """The old ETA (elapsed / done x left) on each of the same synthetic runs, at the same
    checkpoints: off by more than 30 % at one of them at least, because the heaviest cells come
    last. Shows the test above can fail."""
    _, _, costs = synthetic_run(coef_scale)
    total, elapsed, checkpoints, errors = sum(costs), 0.0, [0.2, 0.5, 0.8], []
    for done, cost in enumerate(costs, 1):
        elapsed += cost
        while checkpoints and elapsed >= checkpoints[0] * total:
            checkpoints.pop(0)
            left = total - elapsed
            errors.append((elapsed / done * (len(costs) - done) - left) / left)
    assert len(errors) == 3 and max(abs(e) for e in errors) > 0.30, errors


def test_phases_are_timed_and_recorded():
    clock = FakeClock()
    cell = Cell(Path("t.gguf"), 0, 1, 0.0)
    display = progress.SweepProgress([cell], [progress.CellWork(100.0, 0.0)], stream=io.StringIO(), clock=clock,
                                     cpu_clock=clock, tty=False)
    for what, seconds in [("lossless check k=4", 2.0), ("noise control k=4", 1.0), ("warm-up 1", 0.5),
                          ("warm-up 2", 0.5), ("repeat 2/10 [0.9,1.1]", 3.0), ("cost curve k=4", 1.5)]:
        display.show(cell, what)
        clock.now += seconds
    display.finish(cell, [{"spec_decode": "off", "tps": 5.0}])
    (record,) = display.timing_record()
    phases = {name: value["wall_s"] for name, value in record["phases"].items()}
    assert phases == {"lossless check": 2.0, "noise control": 1.0, "warm-up": 1.0, "repeats": 3.0, "cost curve": 1.5}
    assert record["wall_s"] == pytest.approx(8.5)


def test_non_tty_output_is_one_line_per_finished_cell():
    clock = FakeClock()
    stream = io.StringIO()
    cells = [Cell(Path("t.gguf"), 0, c, 0.0) for c in (1, 4)]
    display = progress.SweepProgress(cells, progress.works_of(cells, N_PREDICT), stream=stream, clock=clock,
                                     cpu_clock=clock, tty=False)
    display.skip(cells[0])
    display.show(cells[1], "lossless check k=4")
    clock.now += 1.0
    display.finish(cells[1], [{"spec_decode": "off", "tps": 5.0},
                              {"spec_decode": "on", "k": 4, "speedup": 1.5, "draft_accept_rate": 0.7,
                               "verdict": "exact", "lossless_ok": True}])
    text = stream.getvalue()
    assert "\r" not in text and text.count("\n") == 1
    assert text.startswith("[2/2] t.gguf ctx=0 conc=4") and "speedup 1.50 alpha 0.70 exact" in text


@pytest.mark.parametrize("what, phase", [("lossless check k=4", "lossless check"), ("warm-up 3", "warm-up"),
                                         ("repeat 4/10 [0.13,1.21]", "repeats"), ("cost curve k=4", "cost curve"),
                                         ("check k=3", "check k"), ("distribution test k=2", "distribution test")])
def test_phase_names(what, phase):
    assert progress.phase_of(what) == phase


def test_timing_table_sums_phases_by_context_length():
    records = [{"cell": "t.gguf ctx=0 conc=1 T=0 mixed model", "wall_s": 3.0, "cpu_s": 2.0,
                "phases": {"repeats": {"wall_s": 2.0, "cpu_s": 1.5}, "warm-up": {"wall_s": 1.0, "cpu_s": 0.5}}},
               {"cell": "t.gguf ctx=8192 conc=1 T=0 mixed model", "wall_s": 5.0, "cpu_s": 4.0,
                "phases": {"repeats": {"wall_s": 5.0, "cpu_s": 4.0}}}]
    text = record_md.sweep_time_md(records)
    assert "| 0 | repeats | 2.0 | 1.5 | 25% |" in text and "| 8192 | repeats | 5.0 | 4.0 | 62% |" in text
    assert record_md.sweep_time_md([]) is None



def test_a_rejection_cells_distributional_test_counts_as_work():
    """At concurrency 1 the test makes dozens of runs (4096 positions / 31 a run): the ETA must
    know, or a T > 0 sweep's estimate is off several-fold."""
    from specnative.sweep.checks import dist_runs
    cfg = SweepConfig(targets=[Path("t.gguf")], draft=Path("d.gguf"), temperatures=[0.8], accept_rule="rejection",
                      n_predict=32)
    greedy, sampled, four_seqs = Cell(Path("t.gguf"), 0, 1, 0.0), Cell(Path("t.gguf"), 0, 1, 0.8), Cell(Path("t.gguf"), 0, 4, 0.8)
    assert dist_runs(cfg, greedy) == 0
    assert dist_runs(cfg, sampled) == -(-cfg.dist_positions // 31) and dist_runs(cfg, four_seqs) == -(-cfg.dist_positions // 124)
    assert dist_runs(dataclasses.replace(cfg, accept_rule="match"), sampled) == 0


def test_a_real_model_s_cells_are_predicted_by_its_size(tmp_path):
    """A token of a 1.1 GB model costs hundreds of the tiny preset's (decoding reads every weight):
    the prior, fitted on the tiny preset, must say so before any cell has run. Without the size the
    first ETA of a Qwen 1.5B sweep said minutes for hours, and stayed low for many cells."""
    tiny, real = tmp_path / "tiny.gguf", tmp_path / "real.gguf"
    tiny.write_bytes(b"\0" * 300_000)
    with open(real, "wb") as f:  # sparse: only its size matters
        f.truncate(1_100_000_000)
    cfg = SweepConfig(targets=[tiny, real], draft=Path("d.gguf"), ctx_lens=[0], concurrencies=[1])
    cells = cells_of(cfg)
    works = progress.works_of(cells, N_PREDICT)
    ratio = works[1].decode / works[0].decode
    # the same cell shape: the work differs by the token cost alone, which grows with the bytes
    # a decode reads (the file's size) ...
    assert ratio == pytest.approx(progress.token_cost_of(real) / progress.token_cost_of(tiny), rel=1e-12)
    half = tmp_path / "half.gguf"
    with open(half, "wb") as f:
        f.truncate(550_000_000)
    assert progress.token_cost_of(real) - progress.token_cost_of(half) == pytest.approx(
        progress.token_cost_of(half) - progress.token_cost_of(tmp_path / "missing.gguf"))
    # ... to hundreds of the tiny preset's for a 1.1 GB model (a Qwen 1.5B cell took 400-1000x the
    # tiny prior's prediction on the reference CPU): not the ~1x that said minutes for hours
    assert 100 < ratio < 1000, ratio
    assert progress.token_cost_of(tmp_path / "missing.gguf") == 1.0  # an estimate: never an error
