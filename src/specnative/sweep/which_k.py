"""Which k, measured: the verify-cost curve of a cell, the speedup predicted at every k' <= k
(analysis/pick_k.py) and, with --check-k, the best predicted k measured."""
from __future__ import annotations

from specnative.analysis import pick_k, theory
from specnative.sweep.config import SweepConfig
from specnative.sweep.rows import pooled_steady

# ---------------------------------------------------------------------------------------------
# Which k (pick_k.py): the cost curve, the speedup predicted at every k' <= k, and --check-k
# ---------------------------------------------------------------------------------------------
COST_CURVE_REPEATS = 5  # timed decodes per shape; the median is kept


def k_prediction(engine, prompts, runs: list, step_ms: float, k: int) -> tuple[dict, "pick_k.KPrediction"]:
    """The cost curve at the cell's prompts and concurrency, and the speedup predicted at
    k' = 1..k from the timed runs at k (their histogram, steady T_round and tau, resample time)."""
    curve = engine._core.cost_curve(prompts, k, COST_CURVE_REPEATS)
    hist = sum(r.totals["accept_len_hist"] for r in runs)
    resample_per_round = sum(r.times["resample"] for r in runs) / max(sum(r.steps for r in runs), 1)
    steady = pooled_steady(runs)
    prediction = pick_k.predict(hist, k, curve["verify_ms"], curve["draft_ms_per_pos"], resample_per_round,
                                steady["iteration_ms"], step_ms, steady["tau"])
    columns = {"verify_ms_by_len": ";".join(f"{v:.4g}" for v in curve["verify_ms"]),
               "draft_ms_per_pos": curve["draft_ms_per_pos"], "predicted_speedup_by_k": prediction.text(),
               "recommended_k": prediction.recommended_k, "recommended_speedup": prediction.recommended_speedup}
    return columns, prediction


def measured_speedup_at(engine, prompts, cfg: SweepConfig, common: dict, k: int, repeats: int) -> float:
    """Steady speedup at k measured the sweep's way: a warm-up, then spec off and on at k side by
    side `repeats` times, pooled (pooled_steady)."""
    spec = dict(spec=True, k=k, accept_rule=cfg.accept_rule, **common)
    engine.generate(prompts, **spec)
    off, on = [], []
    for _ in range(repeats):
        off.append(engine.generate(prompts, **common))
        on.append(engine.generate(prompts, **spec))
    return theory.measured_speedup(pooled_steady(on)["tps"], pooled_steady(off)["tps"])


def add_k_columns(engine, prompts, cfg: SweepConfig, common: dict, runs: dict, rows: list, on_progress) -> None:
    """Fills the which-k columns of the cell's on rows; with --check-k, measures the best k of each
    (a k the grid measured already is not run again)."""
    off = rows[0]
    measured = {row["k"]: row["speedup"] for row in rows[1:]}
    for row in rows[1:]:
        on_progress(f"cost curve k={row['k']}")
        columns, prediction = k_prediction(engine, prompts, runs[row["k"]], off["step_ms"], row["k"])
        row.update(columns)
        if cfg.check_k and prediction.best_k > 0:
            if prediction.best_k not in measured:
                on_progress(f"check k={prediction.best_k}")
                measured[prediction.best_k] = measured_speedup_at(engine, prompts, cfg, common, prediction.best_k,
                                                                  max(int(row.get("repeats_used") or 0), cfg.repeats))
            row.update(check_k=prediction.best_k, check_k_speedup=measured[prediction.best_k])
