"""`specnative report RUN_DIR`: the figures and summary.md of a sweep run again, with the advisor's
thresholds as flags (two runs side by side are `specnative compare A B`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specnative.analysis.advisor import Thresholds, threshold_fields
from specnative.record.schema import TracesError
from specnative.report.record_md import ReportInputError
from specnative.report.summary import write_report


def build_parser(prog: str = "specnative report") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Write a run folder's figures and summary.md again "
                                     "(a sweep's, or a serve run's).")
    parser.add_argument("run_dir", type=Path, help="directory holding traces.csv (and provenance.json)")
    for name, default, kind in threshold_fields():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                            help=f"advisor threshold (default {default})")
    return parser


def run(args: argparse.Namespace) -> int:
    thresholds = Thresholds(**{name: getattr(args, name) for name, _, _ in threshold_fields()})
    try:
        print(write_report(args.run_dir, thresholds))
    except (TracesError, ReportInputError) as error:  # a damaged run directory: one line, no traceback
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))
