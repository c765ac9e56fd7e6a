"""Two runs side by side in one report (report --compare)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure  # Agg canvas on savefig; pyplot is never imported

from specnative.record.schema import is_serve_run
from specnative.report.advisor import REGIME_KEYS, advise, load_traces, pair_cells, verdicts_frame
from specnative.report.cells import key_text, label, lossless_cells
from specnative.report.figures import BAND_CAPTION, caption, empty_panel, new_figure, save
from specnative.report.record_md import ReportInputError, hardware, load_provenance
from specnative.report.text import fmt, md_table

COMPARE_COLUMNS = ("tps", "tps_off", "speedup", "speedup_lo", "speedup_hi", "draft_accept_rate",
                   "verify_cost_c", "c_draft", "decision", "rule")


def compare_runs(cells_a: pd.DataFrame, cells_b: pd.DataFrame, verdicts_a=None, verdicts_b=None):
    """Lossless cells of A and B joined on the regime keys they share values of. A key whose
    values do not overlap (quant 4 vs 8) is what the comparison is about: it is left out of the
    join and shown for each side. Returns (joined frame, join keys)."""
    sides = []
    for cells, verdicts in ((cells_a, verdicts_a), (cells_b, verdicts_b)):
        cells = lossless_cells(cells).reset_index(drop=True)
        if verdicts is not None:
            cells = cells.merge(verdicts[list(REGIME_KEYS) + ["decision", "rule"]],
                                on=list(REGIME_KEYS), how="left")
        else:
            cells = cells.assign(decision=pd.NA, rule=pd.NA)
        sides.append(cells)
    a, b = sides
    keys = [k for k in REGIME_KEYS
            if set(a[k].dropna().unique()) & set(b[k].dropna().unique())
            or (a[k].isna().all() and b[k].isna().all())]
    differing = [k for k in REGIME_KEYS if k not in keys]
    wanted = keys + differing + list(COMPARE_COLUMNS)
    joined = a[wanted].merge(b[wanted], on=keys, suffixes=("_a", "_b"))
    return joined.sort_values(keys).reset_index(drop=True), keys


def plot_compare(joined: pd.DataFrame, keys: list, label_a: str, label_b: str) -> Figure:
    """Grouped bars per joined regime: (a) speedup of A and B with their ranges, (b) spec-on tps."""
    fig, (ax_s, ax_t) = new_figure(12, 1.8 + 0.45 * max(len(joined), 1), 2)
    if joined.empty:
        for ax in (ax_s, ax_t):
            empty_panel(ax, "no regime in common")
        return fig
    y = np.arange(len(joined))[::-1].astype(float)
    shown = [k for k in keys if joined[k].nunique(dropna=False) > 1] or keys
    names = [label(r, shown) for _, r in joined.iterrows()]
    for side, offset, color, name in (("a", 0.2, "#4e79a7", label_a), ("b", -0.2, "#f28e2b", label_b)):
        s = joined[f"speedup_{side}"].to_numpy(float)
        err = np.nan_to_num(np.vstack([s - joined[f"speedup_lo_{side}"].to_numpy(float),
                                       joined[f"speedup_hi_{side}"].to_numpy(float) - s]).clip(0))
        ax_s.barh(y + offset, s, height=0.4, xerr=err, color=color, label=name, capsize=2)
        ax_t.barh(y + offset, joined[f"tps_{side}"].to_numpy(float), height=0.4, color=color,
                  label=name)
    ax_s.axvline(1.0, color="black", ls="--", lw=1, label="break-even (1.0)")
    ax_s.set_yticks(y, names, fontsize=8)
    ax_t.set_yticks(y, [""] * len(y))
    ax_s.set_xlabel("speedup tps(on) / tps(off)")
    ax_t.set_xlabel("tps with speculation (tokens/s, all sequences)")
    ax_s.set_title("(a) speedup")
    ax_t.set_title("(b) spec-on throughput")
    for ax in (ax_s, ax_t):
        ax.grid(axis="x", alpha=0.3)
    fig.legend(*ax_s.get_legend_handles_labels(), loc="outside upper center", ncol=3, fontsize=8)
    caption(fig, BAND_CAPTION.replace("points", "bars") + ". Each run self-measured on its own hardware.")
    return fig


def compare_md(joined: pd.DataFrame, keys: list, label_a: str, label_b: str) -> str:
    if joined.empty:
        return f"A = {label_a}, B = {label_b}: no lossless regime in common."
    differing = [c.removesuffix("_a") for c in joined if c.endswith("_a")
                 and c.removesuffix("_a") in REGIME_KEYS]
    rows = []
    for _, r in joined.iterrows():
        row = [label(r, keys)] + [f"{r[d + '_a']} / {r[d + '_b']}" for d in differing]
        for col in ("tps", "speedup", "draft_accept_rate", "verify_cost_c", "decision"):
            row.append(f"{fmt(r[col + '_a']) if col != 'decision' else r[col + '_a']} / "
                       f"{fmt(r[col + '_b']) if col != 'decision' else r[col + '_b']}")
        rows.append(row)
    head = (["regime"] + [f"{d} A / B" for d in differing]
            + ["t/s A / B [self-measured]", "speedup A / B", "α A / B", "c A / B", "advice A / B"])
    return (f"A = {label_a}; B = {label_b}. Joined on {', '.join(keys)}; lossless cells only.\n\n"
            + md_table(head, rows) + "\n\n![compare](compare.png)")


def _compare_source(other) -> tuple[pd.DataFrame, str]:
    """Run B's traces and label; a serve run is refused: its levels (request rates) are no regimes
    of a sweep's, and joining them would pair each cell with every level."""
    path = Path(other)
    traces = load_traces(path)
    if is_serve_run(traces):
        raise ReportInputError(f"--compare {other} is a serve run; --compare takes two sweep runs (compare serve "
                               f"runs with each other with specnative compare)")
    prov = load_provenance(path if path.is_dir() else path.parent)
    name = prov.get("run_id") or (path.name if path.is_dir() else path.parent.name + "/" + path.name)
    where = hardware(prov) if prov else "hardware not recorded"
    return traces, f"{name} ({where})"


def write_compare(run_dir, prov, cells, verdicts, compare, thresholds, out) -> str:
    traces_b, label_b = _compare_source(compare)
    label_a = f"{prov.get('run_id') or run_dir.name} ({hardware(prov) if prov else 'hardware not recorded'})"
    joined, keys = compare_runs(cells, pair_cells(traces_b), verdicts,
                                verdicts_frame(advise(traces_b, thresholds)))
    short = [f"{side}: {name.split(' (')[0]}" + "".join(
                 f", {key_text(k, v[0])}" for k in REGIME_KEYS if k not in keys
                 and len(v := joined[f"{k}_{side.lower()}"].unique()) == 1)
             for side, name in (("A", label_a), ("B", label_b))]
    out["compare.png"], out["compare.pdf"] = save(plot_compare(joined, keys, *short),
                                                  run_dir / "compare")
    out["compare.csv"] = run_dir / "compare.csv"
    joined.to_csv(out["compare.csv"], index=False)
    return compare_md(joined, keys, label_a, label_b)
