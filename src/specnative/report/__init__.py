"""The report of a sweep run folder: summary.md (the answer first, then the cells, then the
reproducibility record), the figures, advice.csv, and the advisor's decision per regime. The
decisions and the cost model are computed in specnative.analysis; this package renders them.

`specnative report RUN_DIR` writes them again; the sweep writes them when it finishes.
"""
from specnative.report.summary import write_report

__all__ = ["write_report"]
