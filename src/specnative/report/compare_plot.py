"""compare --plot: the speedup ratio B/A per regime with its interval, against 1 and the threshold."""
from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: no display, no global state (works headless)

from specnative.analysis.compare import IMPROVEMENT, REGRESSION, Comparison

COLORS = {REGRESSION: "#d62728", IMPROVEMENT: "#2ca02c"}  # decided changes stand out; the rest grey
FORMATS_HINT = ".png, .pdf, .svg"


def supported_formats() -> set[str]:
    """The file suffixes matplotlib can write (without a dot: png, pdf, svg, ...)."""
    return set(Figure().canvas.get_supported_filetypes())


def plot_comparison(c: Comparison, path) -> Path:
    """Writes the figure (format from the file's suffix, e.g. .png or .pdf) and returns its path."""
    cells = [r for r in c.cells if math.isfinite(r.speedup_ratio.estimate)]
    fig = Figure(figsize=(8, 1.5 + 0.32 * max(len(cells), 1)), layout="constrained")
    ax = fig.subplots()
    for y, r in enumerate(reversed(cells)):
        iv = r.speedup_ratio
        err = [[iv.estimate - iv.low], [iv.high - iv.estimate]] if math.isfinite(iv.low) else None
        ax.errorbar(iv.estimate, y, xerr=err, fmt="o" if err else "x", capsize=3,
                    color=COLORS.get(r.status, "#555555"), label=r.status)
    ax.set_yticks(range(len(cells)), [("FAIL " if r.became_fail else "") + r.a.label for r in reversed(cells)],
                  fontsize=7)
    ax.axvline(1.0, color="black", lw=1)
    ax.axvline(1 - c.threshold, color="#d62728", ls="--", lw=1, label=f"1 − {c.threshold * 100:g} %")
    ax.axvline(1 + c.threshold, color="#2ca02c", ls=":", lw=1, label=f"1 + {c.threshold * 100:g} %")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="best")
    ax.set_xlabel("speedup of speculation, B / A (95 % interval)")
    ax.set_title(f"B = {c.label_b} over A = {c.label_a}", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path
