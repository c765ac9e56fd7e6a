"""Formatting shared by the report's tables and figures: numbers, intervals, `;`-separated lists
from traces.csv, and Markdown tables."""
from __future__ import annotations

import math

import pandas as pd

from specnative.analysis.advisor import as_float


def fmt(value, digits=2) -> str:
    value = as_float(value)
    return "n/a" if not math.isfinite(value) else f"{value:.{digits}f}"


def floats(text) -> list[float]:
    """'0.91;0.85' -> [0.91, 0.85]; empty or missing -> []."""
    if text is None or pd.isna(text) or not str(text).strip():
        return []
    return [float(x) for x in str(text).split(";") if x.strip()]


def md_table(headers: list, rows: list) -> str:
    lines = ["| " + " | ".join(str(h).replace("|", "\\|") for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


def interval_text(low, high) -> str:
    return "" if not (math.isfinite(as_float(low)) and math.isfinite(as_float(high))) else \
        f"{fmt(low)}–{fmt(high)}"
