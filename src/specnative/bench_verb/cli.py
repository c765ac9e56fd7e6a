"""`specnative bench`: llama-bench's tests and rows, with speculative rows beside the plain ones.
Rows go to stdout in the -o format as each test finishes, as llama-bench prints them; a refused
command line is one line on stderr, exit 2, before any model is loaded."""
from __future__ import annotations

import sys

from specnative.bench_verb.grid import BenchError, parse


def main(argv: list[str] | None = None, out=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    out = sys.stdout if out is None else out
    if any(a in ("-h", "--help") for a in argv):  # argparse's help: printed, then SystemExit(0)
        from specnative.bench_verb.grid import build_parser
        build_parser().parse_args(["--help"])
    try:
        plan = parse(argv)
    except BenchError as error:
        print(f"specnative bench: error: {error}", file=sys.stderr)
        return 2
    from specnative.bench_verb import measure, output

    host = measure.host_values()
    printer = output.Printer(plan.output, out, bool(plan.specs),
                             output.md_columns(plan.flags, host["backends"]))
    printer.header()
    try:
        measure.run_plan(plan, printer.row)
    except (ValueError, FileNotFoundError) as error:  # a model llama.cpp cannot load, a pair it cannot run
        print(f"specnative bench: error: {error}", file=sys.stderr)
        return 1
    printer.footer(host["build_commit"], 0)
    return 0
