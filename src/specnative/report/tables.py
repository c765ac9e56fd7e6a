"""summary.md's tables of measured cells: the cells with their intervals, the verdicts and advice per
regime, failures, the timing and the engine's own share, theory against measurement."""
from __future__ import annotations

import pandas as pd

from specnative.analysis.advisor import K_ADVICE_KEYS, REGIME_KEYS, Thresholds, as_float, threshold_fields
from specnative.lossless.verdicts import VERDICTS
from specnative.report.cells import ENGINE_OWN_GOAL, failed_cells, label, ordered, step_parts
from specnative.report.record_md import hardware, params_text, size_text
from specnative.report.text import fmt, interval_text, md_table


def _tps(row) -> str:
    return f"{fmt(row['tps'])} ± {fmt(row['tps_std'])}"


def cells_md(traces: pd.DataFrame, cells: pd.DataFrame, prov: dict) -> str:
    """llama-bench-style table: every off row and every on cell (with its speedup); rates carry
    the self-measured tag. Size and params are the target's, from provenance."""
    files = {m.get("name"): m for m in prov.get("models") or []}
    rows = []
    for _, r in ordered(pd.concat([traces[traces["spec_decode"] == "off"], cells])).iterrows():
        on = r["spec_decode"] == "on"
        draft_cols = [fmt(r["k"], 0), f"{as_float(r['temperature']):g}", r["accept_rule"], _tps(r),
                      _speedup_range(r), fmt(r["draft_accept_rate"]), fmt(r["mean_accept_len"]),
                      fmt(r["verify_cost_c"]), fmt(r["c_draft"]),
                      {True: "yes", False: "**NO**"}.get(r["lossless_ok"], "?")]
        if not on:
            draft_cols = ["", f"{as_float(r['temperature']):g}", "", _tps(r)] + [""] * 6
        model = f"{r['target_model']} + {r['draft_model']}" if on else str(r["target_model"])
        target = files.get(r["target_model"], {})
        rows.append([model, r["target_type"], r["quant_bits"], size_text(target.get("size_bytes")),
                     params_text(target.get("n_params")), r["backend"], r["n_threads"],
                     f"tg{fmt(r['n_predict'], 0)} @ d{r['ctx_len']}" + (f" {r['task']}" if pd.notna(r["task"]) else ""),
                     r["concurrency"],
                     r["spec_decode"]] + draft_cols)
    head = ["model", "type", "bits", "size", "params", "backend", "threads", "test", "conc", "spec",
            "k", "T", "rule", "t/s [self-measured]", "speedup [self-measured]", "α (accepted/drafted)", "τ", "c", "c_draft", "lossless"]
    where = hardware(prov) if prov else "unrecorded hardware"
    intro = (f"Every rate below is **[self-measured]** on {where}, run {prov.get('run_id', 'n/a')}; "
             "it does not carry to other hardware. t/s: median ± sd over the timed repeats, "
             "decoding only (prefill excluded), all sequences together.")
    return intro + "\n\n" + md_table(head, rows)


def _speedup_range(r) -> str:
    kind = r.get("interval")
    kind = f"{kind} " if isinstance(kind, str) and kind else ""
    return f"{fmt(r['speedup'])} ({kind}{fmt(r['speedup_lo'])}–{fmt(r['speedup_hi'])})"


def measurement_md(traces: pd.DataFrame) -> str:
    """How sure each row is (stats.py columns): its intervals, the repeats and warm-up it took,
    why it stopped, and every run flagged as an outlier with the reason."""
    if "repeats_used" not in traces or traces["repeats_used"].isna().all():
        return ("No intervals recorded (a traces.csv from a fixed-count sweep): the advice uses the "
                "range over the repeats.")
    rows, notes = [], []
    for _, r in ordered(traces).iterrows():
        regime = label(r, ["quant_bits", "ctx_len", "concurrency"]) + (
            f", k={fmt(r['k'], 0)}" if r["spec_decode"] == "on" else "")
        settled = {True: "", False: " (not settled)"}.get(r["warmup_settled"], "")
        rows.append([regime, r["spec_decode"], f"{fmt(r['tps'])} ({interval_text(r['tps_ci_low'], r['tps_ci_high'])})",
                     f"{fmt(r['speedup'])} ({interval_text(r['speedup_ci_low'], r['speedup_ci_high'])})"
                     if r["spec_decode"] == "on" else "", fmt(r["repeats_used"], 0),
                     r["stop_reason"] if pd.notna(r["stop_reason"]) else "",
                     f"{fmt(r['warmup_used'], 0)}{settled}", fmt(r["n_outliers"], 0)])
        if pd.notna(r["outlier_note"]) and str(r["outlier_note"]):
            notes += [f"- {regime}, spec {r['spec_decode']}: {n.strip()}" for n in str(r["outlier_note"]).split(";")]
    levels = ", ".join(f"{x:.0%}" for x in sorted(traces["ci_level"].dropna().unique())) or "n/a"
    return (f"Intervals at {levels}: t/s is the geometric mean's over the repeats, the speedup's is over "
            "paired repeats (spec on and off run side by side), Student t on logs. A cell "
            "repeats until its speedup interval lies above or below 1 or is narrow enough (stop); "
            "max-repeats means it never did.\n\n"
            + md_table(["cell", "spec", "t/s (interval)", "speedup (interval)", "repeats", "stop",
                        "warm-up runs", "outliers"], rows)
            + "\n\n" + ("Outliers (kept in every number above; flagged when a run's modified z-score "
                         "exceeds 3.5):\n\n" + "\n".join(notes) if notes else "No run was flagged as an outlier."))


def _regime_id(row, keys) -> tuple:
    """A regime's keys as text that matches across frames (ints, floats and missing alike)."""
    def text(value):
        if value is None or (not isinstance(value, str) and pd.isna(value)):
            return ""
        try:
            return f"{float(value):g}"
        except (TypeError, ValueError):
            return str(value)
    return tuple(text(row[k]) for k in keys)


def recommended_k_text(verdict, advice: pd.DataFrame) -> str:
    """The advice table's "recommended k" cell of one regime (advisor.k_advice): the k, its
    predicted speedup and, with --check-k, the measured one; n/a where there is no prediction
    (n-gram drafters, the p_min stop rule, traces without a cost curve)."""
    drafter = verdict.get("drafter")
    if (drafter is not None and not pd.isna(drafter) and drafter != "model") or as_float(verdict.get("draft_p_min")) > 0:
        return "n/a"
    match = advice[[_regime_id(a, K_ADVICE_KEYS) == _regime_id(verdict, K_ADVICE_KEYS)
                    for _, a in advice.iterrows()]] if not advice.empty else advice
    if match.empty:
        return "n/a"
    a = match.iloc[0]
    if a["recommend"] == "none":
        return "none (no k pays)"
    text = f"**{a['recommend']}** (pred {fmt(a['predicted_speedup'])}"
    if pd.notna(a["check_k"]):
        text += f"; checked k={int(a['check_k'])}: {fmt(a['check_speedup'])}"
    return text + ")"


def verdicts_md(verdicts: pd.DataFrame, thresholds: Thresholds, k_table: pd.DataFrame | None = None) -> str:
    """The advice table; with k_table (advisor.k_advice, non-empty) a column with each regime's
    recommended k, its predicted speedup and the --check-k measurement."""
    if verdicts.empty:
        return "No spec-on cell to judge."
    used = ", ".join(f"{name}={getattr(thresholds, name)}" for name, _, _ in threshold_fields())
    keys = [k for k in REGIME_KEYS if verdicts[k].nunique(dropna=False) > 1] or ["concurrency"]
    with_k = k_table is not None and not k_table.empty
    rows = [[label(r, [k]) for k in keys]
            + [f"**{r['decision']}**", _speedup_range(r)]
            + ([recommended_k_text(r, k_table)] if with_k else [])
            + [r["rule"], r["reason"], r["also"]]
            for _, r in verdicts.iterrows()]
    k_note = (" Recommended k: the draft length predicted best for the regime from its run at the "
              "largest k (section \"Which k\"), its predicted speedup, and the measured speedup where "
              "--check-k ran it.") if with_k else ""
    return (f"From measured values only (advisor.py; thresholds: {used}). A lossless failure is "
            "always off; a noisy or unrepeated cell is measure-more; an off names its most "
            "actionable cause." + k_note + "\n\n"
            + md_table(keys + ["decision", "speedup (interval)"] + (["recommended k"] if with_k else [])
                       + ["rule", "why", "also fired"], rows))


def verdicts_of_cells_md(cells: pd.DataFrame) -> str:
    """The three-way lossless verdict (lossless.py) per cell: counts, and every numeric or failed
    cell with its evidence."""
    if "verdict" not in cells or cells["verdict"].isna().all():
        return ""
    counts = cells["verdict"].value_counts()
    head = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
    listed = cells[cells["verdict"].isin(["numeric", "fail"])]
    text = (f"Lossless verdicts: {head}. `numeric`: the output parts from the baseline only where the "
            "target's own numeric noise explains it (forced replay; tolerance = "
            "1.25 x the noise control's max logit-gap movement between the baseline's 1-token steps and "
            "a k+1-token verify batch, same tokens, this cell's concurrency); such cells stay in the "
            "curves (hollow markers). `exact-dist`: at T > 0, the emitted tokens were tested against the "
            "target's own distribution and passed (docs/lossless.md). `fail` cells give no number.")
    if listed.empty:
        return text
    rows = [[label(r, REGIME_KEYS), f"**{r['verdict']}**", fmt(r["first_divergence"], 0), fmt(r["mismatches"], 0),
             fmt(r["max_mismatch_gap"], 3), fmt(r["noise_tolerance"], 3), fmt(r["noise_max_abs_delta"], 3),
             fmt(r["noise_flips"], 0), str(r["verdict_reason"])] for _, r in listed.iterrows()]
    return text + "\n\n" + md_table(["cell", "verdict", "first divergence", "mismatches", "max gap", "tolerance",
                                      "noise max |Δ|", "noise flips", "evidence"], rows)


def failures_md(cells: pd.DataFrame) -> str:
    failed = failed_cells(cells)
    verdicts = verdicts_of_cells_md(cells)
    if failed.empty:
        methods = ", ".join(sorted(cells["lossless_method"].dropna().unique())) or "not recorded"
        return (f"All {len(cells)} spec-on cells passed the lossless check (method: {methods})."
                + (f"\n\n{verdicts}" if verdicts else ""))
    if verdicts:
        return verdicts
    rows = [[label(r, REGIME_KEYS), r["lossless_method"], fmt(r["first_divergence"], 0),
             fmt(r["divergence_margin"], 3)] for _, r in failed.iterrows()]
    return (f"{len(failed)} of {len(cells)} spec-on cells **failed** and are left out of every "
            "figure. A small top-2 margin at the first divergence can be a numeric near-tie "
            "(logits differ across batch shapes), a large one is a bug.\n\n"
            + md_table(["cell", "method", "first divergence", "top-2 margin"], rows))


def timing_md(traces: pd.DataFrame) -> str:
    shares = [(1 - step_parts(r)["other_ms"] / as_float(r["total_ms"]))
              for _, r in traces.iterrows() if as_float(r["total_ms"]) > 0]
    if not shares:
        return "Step timers: total_ms not recorded."
    return (f"Step timers account for {min(shares):.1%}–{max(shares):.1%} of each run's total_ms "
            "(the rest is 'other' in the breakdown).\n\n" + engine_own_md(traces))


def _fmt_sum(rows: pd.DataFrame, column: str) -> str:
    """A column's sum over rows, '-' where the traces predate it."""
    values = pd.to_numeric(rows[column], errors="coerce") if column in rows else pd.Series(dtype=float)
    return f"{values.sum():.2f}" if values.notna().any() else "-"


def engine_own_md(traces: pd.DataFrame) -> str:
    """Where the decoding time went: inside llama.cpp calls (of which the rollbacks' KV removal,
    apart) or the engine's own (batch building, sampling, acceptance), from the sweep's llama_ms /
    kv_removal_ms / engine_own_* columns; the share is per row (a round, or a baseline step),
    summarized per mode and drafter."""
    share = pd.to_numeric(traces["engine_own_share"], errors="coerce")
    rows_with = traces[share.notna()].assign(_share=share[share.notna()])
    if rows_with.empty:
        return "Engine's own time: not recorded (traces written before llama_ms / engine_own_ms)."
    rows_with = rows_with.assign(_drafter=rows_with["drafter"].fillna("model"))
    out = []
    for (mode, drafter), g in rows_with.groupby(["spec_decode", "_drafter"], sort=True):
        worst = g.loc[g["_share"].idxmax()]
        out.append([mode, drafter if mode == "on" else f"({drafter} cell)", len(g),
                    f"{pd.to_numeric(g['llama_ms'], errors='coerce').sum():.1f}",
                    _fmt_sum(g, "kv_removal_ms"),
                    f"{pd.to_numeric(g['engine_own_ms'], errors='coerce').sum():.2f}",
                    f"{g['_share'].median():.2%}", f"{worst['_share']:.2%}",
                    label(worst, ["quant_bits", "ctx_len", "concurrency"] + (["k"] if mode == "on" else []))])
    over = int((rows_with["_share"] > ENGINE_OWN_GOAL).sum())
    verdict = (f"every row within the goal of {ENGINE_OWN_GOAL:.0%}" if over == 0 else
               f"**{over} of {len(rows_with)} rows above the goal of {ENGINE_OWN_GOAL:.0%}**")
    return ("Engine's own time (decoding time not spent inside llama.cpp calls: batch building, sampling, "
            f"acceptance), per run: {verdict}. A rollback's KV removal is a llama.cpp call (a scan over every "
            "cell of the cache), shown apart.\n\n"
            + md_table(["mode", "drafter", "rows", "inside llama.cpp, ms (sum)", "of which KV removal, ms (sum)",
                        "engine's own, ms (sum)",
                        "own share, median", "own share, max", "max at"], out))


def theory_md(table: pd.DataFrame) -> str:
    if table.empty:
        return "No lossless spec-on cell."
    ngram = "drafter" in table and table["drafter"].notna().any() and (table["drafter"].fillna("model") != "model").any()
    note = ("n-gram drafters propose 0..k tokens per round: their predictions use the measured length mix, "
            "E[τ] = 1 + Σ_j α^j P(L ≥ j) with P(L ≥ j) from draft_reach (the fixed-k closed form would "
            "credit them k drafts in every round).\n\n" if ngram else "")
    keys = [k for k in REGIME_KEYS if table[k].nunique(dropna=False) > 1] or ["concurrency"]
    rows = [[label(r, keys), fmt(r["alpha"]), fmt(r["alpha_token"]), fmt(r["c"]),
             fmt(r["speedup"]), fmt(r["predicted"]), fmt(r["predicted_token"]),
             fmt(r["tau"]), fmt(r["tau_expected"]), fmt(r["tau_expected_token"])]
            for _, r in table.iterrows()]
    return note + md_table(["cell", "α", "α per position", "c", "speedup", "predicted (α)",
                            "predicted (α per position)", "τ", "E[τ] (α)", "E[τ] (α per position)"], rows)


def slope_md(results: list[dict]) -> str:
    rows = [[r["series"], r["n"], r["concurrencies"], fmt(r["slope"], 4), fmt(r["p_value"], 3),
             r["note"]] for r in results]
    return ("Linear fit of speedup on concurrency over the lossless cells with concurrency ≥ 4 (does batching "
            "flatten speculation's gain?).\n\n" + md_table(["series", "cells", "distinct conc.", "slope per unit "
                                           "concurrency", "p", "reading"], rows))
