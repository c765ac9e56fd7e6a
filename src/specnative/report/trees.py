"""summary.md's "Trees or chains?": every draft tree's on row against the chain of the same cell at
the same verify budget (k = the tree's node budget), with the paired interval of their ratio (both
timed in the same repeats, so load that hits one hits the other)."""
from __future__ import annotations

import math

import pandas as pd

from specnative.analysis import stats
from specnative.record.schema import is_tree_row
from specnative.report.text import fmt, md_table


def has_trees(traces: pd.DataFrame) -> bool:
    return bool(is_tree_row(traces).any())


def _repeats(text) -> list[float]:
    return [float(v) for v in str(text).split(";") if v] if isinstance(text, str) else []


def _regime(cell_id: str) -> str:
    """The cell of an on row: its cell_id without the k or shape suffix."""
    base = str(cell_id)
    for marker in ("|shape=", "|k"):
        if marker in base:
            base = base[:base.rindex(marker)]
    return base


def _interval_text(iv) -> str:
    return f"{fmt(iv.estimate)} [{fmt(iv.low)}, {fmt(iv.high)}]" if not math.isnan(iv.estimate) else "n/a"


def comparisons(traces: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """One row per draft tree's on row: the same cell's chain at k = its budget (or the largest k
    below it, said so), tau, c, speedup and the paired tree/chain tps ratio with its interval."""
    on = traces[traces["spec_decode"] == "on"].copy()
    on["regime"] = on["cell_id"].map(_regime)
    trees = on[is_tree_row(on)]
    chains = on[~is_tree_row(on)]
    if "synthetic_acceptance" in chains:  # synthetic rows are no chain's measurement of the rule
        chains = chains[chains["synthetic_acceptance"].isna()]
    out = []
    for _, tree in trees.iterrows():
        same = chains[chains["regime"] == tree["regime"]]
        budget = int(tree["k"])
        fits = same[same["k"] <= budget]
        chain = fits.loc[fits["k"].idxmax()] if not fits.empty else None
        record = {"target": tree.get("target_model"), "quant_bits": tree["quant_bits"], "ctx_len": tree["ctx_len"],
                  "concurrency": tree["concurrency"], "temperature": tree["temperature"], "shape": tree["draft_shape"],
                  "tree_tau": tree["mean_accept_len"], "tree_c": tree["verify_cost_c"],
                  "tree_speedup": tree["speedup"], "nodes": tree.get("nodes_per_round"),
                  "tree_lossless": bool(tree["lossless_ok"]), "chain_k": math.nan}
        ratio = stats.Interval(math.nan, math.nan, math.nan, level, 0)
        if chain is not None:
            record.update(chain_k=int(chain["k"]), chain_tau=chain["mean_accept_len"], chain_c=chain["verify_cost_c"],
                          chain_speedup=chain["speedup"], chain_lossless=bool(chain["lossless_ok"]))
            try:
                ratio = stats.speedup_interval(_repeats(tree["tps_repeats"]), _repeats(chain["tps_repeats"]), level)
            except ValueError:  # too few repeats or a run without a rate
                pass
        record.update(ratio=ratio.estimate, ratio_low=ratio.low, ratio_high=ratio.high)
        if chain is None:
            answer = "no chain measured"
        elif not (record["tree_lossless"] and record["chain_lossless"]):
            answer = "not lossless: left out"
        elif ratio.low > 1:
            answer = "trees"
        elif ratio.high < 1:
            answer = "chains"
        else:
            answer = "undecided"
        record["answer"] = answer
        out.append(record)
    return pd.DataFrame(out)


def trees_md(traces: pd.DataFrame) -> str:
    table = comparisons(traces)
    intro = ("Each draft tree is an on row of its cell, timed in the same repeats as the chains, so the ratio "
             "tree tps / chain tps is paired (geometric mean of the per-repeat ratios, 95 % t interval). The "
             "chain compared is the one at the same verify budget (k = the tree's node budget: both put "
             "budget + 1 positions through the target per round), or the largest k below it (then k says so). "
             "A tree buys acceptance length (tau) with verify width: where a wider verify batch costs little "
             "more than a narrow one (a memory-bound GPU) trees pay; where the target is compute-bound (small "
             "models on a CPU) the extra nodes cost almost their full price (c). trees / chains: the interval "
             "lies above / below 1; undecided: it contains 1.")
    if table.empty:
        return intro + "\n\nNo tree was measured."
    rows = []
    for _, r in table.iterrows():
        rows.append([f"{r['target']} ({r['quant_bits']}b)", str(r["ctx_len"]), str(r["concurrency"]),
                     f"{r['temperature']:g}", str(r["shape"]), fmt(r["nodes"]), fmt(r["tree_tau"]), fmt(r["tree_c"]),
                     fmt(r["tree_speedup"]),
                     "" if math.isnan(r["chain_k"]) else str(int(r["chain_k"])),
                     fmt(r.get("chain_tau", math.nan)), fmt(r.get("chain_c", math.nan)),
                     fmt(r.get("chain_speedup", math.nan)),
                     _interval_text(stats.Interval(r["ratio"], r["ratio_low"], r["ratio_high"], 0.95, 0)),
                     f"**{r['answer']}**"])
    header = ["target", "ctx", "conc", "T", "tree", "nodes/round", "tree tau", "tree c", "tree speedup", "chain k",
              "chain tau", "chain c", "chain speedup", "tree / chain [95 % CI]", "answer"]
    return intro + "\n\n" + md_table(header, rows)


def tree_verdicts_md(traces: pd.DataFrame) -> str:
    """The draft trees' lossless verdicts, counted as the chains' are, every failing tree named;
    empty when the run has no tree."""
    trees = traces[is_tree_row(traces) & (traces["spec_decode"] == "on")]
    if trees.empty:
        return ""
    verdicts = trees["verdict"].fillna("").astype(str) if "verdict" in trees else pd.Series("", index=trees.index)
    ok = trees["lossless_ok"].astype(str).str.lower().isin(["true", "1", "1.0"])
    verdicts = verdicts.where(verdicts != "", ok.map({True: "lossless", False: "fail"}))
    counts = verdicts.value_counts()
    text = (f"Draft trees: {len(trees)} verdicts: "
            + ", ".join(f"{int(n)} {v}" for v, n in counts.items()) + ".")
    failed = trees[verdicts == "fail"]
    if not failed.empty:
        text += " **Failed (a bug: those trees give no number):** " + "; ".join(
            f"{r['cell_id']} ({r.get('verdict_reason') or 'no reason recorded'})" for _, r in failed.iterrows())
    return text
