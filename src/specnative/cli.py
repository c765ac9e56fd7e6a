"""`specnative <verb>`: one command, in the conventions of `vllm bench <verb>` and git.

Each verb has its own parser, so `specnative <verb> --help` shows only the flags it applies. This
module only dispatches; it is also where verbs are composed across concerns (a merge followed by
its report, the report of a serve run), so that the concerns themselves never import each other
in a circle. Verbs are imported when called: `specnative --help` need not load the C++ core,
pandas and matplotlib.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

VERBS = {
    "sweep": "measure speculation over a grid of regimes (closed batch); the main job",
    "bench": "llama-bench's tests and rows, with speculative rows beside them (-md, --spec-type)",
    "serve": "serving under load: request rates x spec on/off through continuous batching",
    "report": "write a run folder's figures and summary.md again",
    "merge": "join the run folders of a sweep's shards into one run",
    "compare": "compare two runs per regime, with intervals and decided regressions",
    "runs": "list the runs in the results database",
    "db": "the results database: import run folders, rebuild",
    "models": "presets and tiny models: list, fetch, where the cache is; train a drafter",
    "schema": "the traces.csv columns",
    "project": "a run's speedup projected to other hardware with the cost model [projected]",
}


def version() -> str:
    """The installed package's version, read without loading the C++ core."""
    from importlib import metadata

    try:
        return metadata.version("specnative")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from specnative import __version__

        return __version__


def usage() -> str:
    width = max(map(len, VERBS))
    lines = [f"  {verb:<{width}}  {text}" for verb, text in VERBS.items()]
    return ("usage: specnative <verb> [flags]   (specnative <verb> --help for the verb's flags; "
            "specnative --version)\n\n"
            "Measure speculative decoding from inside llama.cpp.\n\nverbs:\n" + "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"specnative {version()}")
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"specnative: unknown verb {verb!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return globals()[f"{verb}_main"](rest)


def sweep_main(argv: list[str] | None = None) -> int:
    """`specnative sweep`, and `python -m specnative.sweep` (the quick start's spelling)."""
    from specnative.sweep import cli

    return cli.main(argv)


def bench_main(argv: list[str] | None = None) -> int:
    from specnative.bench_verb import cli

    return cli.main(argv)


def serve_main(argv: list[str] | None = None) -> int:
    from specnative.serving import cli

    return cli.main(argv)


def is_serve_folder(run_dir: Path) -> bool:
    from specnative.analysis.advisor import load_traces
    from specnative.record.schema import is_serve_run

    return (Path(run_dir) / "traces.csv").is_file() and is_serve_run(load_traces(Path(run_dir) / "traces.csv"))


def write_any_report(run_dir: Path) -> Path:
    """The report of a run folder, a sweep's or a serve run's; returns summary.md."""
    if is_serve_folder(run_dir):
        from specnative.serving.report import write_report
    else:
        from specnative.report.summary import write_report
    return write_report(run_dir)


def report_main(argv: list[str] | None = None) -> int:
    """`specnative report`: a serve run's folder gets the serve report, any other the sweep's."""
    from specnative.record.schema import TracesError
    from specnative.report import cli
    from specnative.report.record_md import ReportInputError

    args = cli.build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if not is_serve_folder(args.run_dir):
            return cli.run(args)
        print(write_any_report(args.run_dir))
        return 0
    except (TracesError, ReportInputError) as error:  # a damaged run folder: one line, no traceback
        print(f"error: {error}", file=sys.stderr)
        return 1


def merge_main(argv: list[str] | None = None) -> int:
    from specnative.record import database, merge
    from specnative.run import options

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="specnative merge", description="Join the run directories of a sweep's "
                                     "shards (--shard i/N) into one run directory, checking that they belong "
                                     "together.")
    merge.add_arguments(parser)
    options.add_database_flags(parser.add_argument_group("results database"))
    args = parser.parse_args(argv)
    traces = merge.run(args, argv)
    if (db := options.database_path(args, args.out)) is not None:
        database.sync_or_warn(db, args.out, final=True)
    if not args.no_report:
        print(f"report: {write_any_report(args.out)}", file=sys.stderr)
    print(traces)
    return 0


def compare_main(argv: list[str] | None = None) -> int:
    from specnative.report import compare_cli

    return compare_cli.main(argv)


def runs_main(argv: list[str] | None = None) -> int:
    from specnative.record import database_cli

    return database_cli.runs_main(argv)


def db_main(argv: list[str] | None = None) -> int:
    from specnative.record import database_cli

    return database_cli.db_main(argv)


def models_main(argv: list[str] | None = None) -> int:
    from specnative.models import cli

    return cli.main(argv)


def project_main(argv: list[str] | None = None) -> int:
    from specnative.report import projection_cli

    return projection_cli.main(argv)


def schema_main(argv: list[str] | None = None) -> int:
    from specnative.record.schema import markdown_doc

    parser = argparse.ArgumentParser(prog="specnative schema", description="Print the traces.csv columns "
                                     "(name, type, meaning) as a Markdown table: the schema, defined once.")
    parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(markdown_doc())
    return 0
