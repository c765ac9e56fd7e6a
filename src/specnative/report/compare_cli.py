"""`specnative compare A B`: two runs per regime, with 95 % intervals from the repeats of both, verdict
changes, and decided regressions for CI (--fail-on-regression PCT). A and B are run folders, run ids
in the results database, or (-b/-c) two commits' latest runs."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specnative.analysis.compare import ACROSS, DEFAULT_THRESHOLD, CompareError, compare_runs
from specnative.record import database, run_folder
from specnative.report.compare_output import FORMATS

DB_HELP = f"the results database (default {database.DEFAULT_DB})"
BAD_INPUT = (database.DatabaseError, run_folder.RunFolderError, CompareError)  # each says what is wrong in one line


def _fail(error: Exception) -> SystemExit:
    return SystemExit(f"error: {error}")


# ---------------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------------
def _percent(text: str) -> float:
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage such as 10 or 10%, got {text!r}") from None
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"expected a percentage between 0 and 100, got {text!r}")
    return value / 100


def _plot_file(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file name such as ratio.png, got an empty one")
    return Path(text)


def check_plot_path(path: Path) -> None:
    """--plot, refused before any work: a folder, a suffix matplotlib cannot write, a missing folder."""
    from specnative.report.compare_plot import FORMATS_HINT, supported_formats  # matplotlib: only for a figure

    if path.is_dir():
        raise CompareError(f"--plot {path}: a folder; give a file name in it, e.g. {path / 'ratio.png'}")
    suffix = path.suffix.lstrip(".").lower()
    if suffix not in supported_formats():
        raise CompareError(f"--plot {path}: " + (f"cannot write a .{suffix} figure" if suffix else "no suffix")
                           + f"; name the format by the suffix ({FORMATS_HINT})")
    if not path.resolve().parent.is_dir():
        raise CompareError(f"--plot {path}: no folder {path.parent} to write it in")


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="A then B: a run folder, or a run id (a unique prefix will do) in the database")
    parser.add_argument("-b", "--baseline", metavar="COMMIT",
                        help="A: the latest completed run of this specnative or llama.cpp commit (prefix)")
    parser.add_argument("-c", "--compare", metavar="COMMIT", help="B: likewise")
    parser.add_argument("--kind", choices=("sweep", "serve"), default="sweep",
                        help="which runs -b/-c pick (default sweep)")
    parser.add_argument("--db", type=Path, default=database.DEFAULT_DB, help=DB_HELP)
    parser.add_argument("--match-across", choices=ACROSS,
                        help="match regimes measured on other model files (models: a run of one target matches "
                             "the other's, runs of several by quantization), with other settings or another k "
                             "(settings), or both (all)")
    parser.add_argument("-o", "--output", choices=tuple(FORMATS), default="md", help="format on stdout")
    parser.add_argument("--plot", type=_plot_file, metavar="FILE",
                        help="write the ratio B/A per regime (the format from the suffix: .png, .pdf, .svg ...)")
    parser.add_argument("--fail-on-regression", type=_percent, metavar="PCT",
                        help="exit 1 on a decided regression of more than PCT %% (the classification's threshold, "
                             f"default {DEFAULT_THRESHOLD * 100:g}) or on a lossless verdict that became fail")
    parser.add_argument("--fail-on-slowdown", type=_percent, metavar="PCT",
                        help="exit 1 where spec-off tokens/s fell by more than PCT %% (decided like a regression): "
                             "decoding itself got slower. Between runs made at different times this ratio carries "
                             "the host's drift too; the speedup does not")


def resolve_run(spec: str, db: Path) -> tuple[run_folder.RunRecord, str]:
    """A run folder, else a run id (or a unique prefix of one) in the database; with its label."""
    path = Path(spec)
    if path.is_dir():
        return run_folder.read_run(path), path.name or str(path)
    if path.exists():
        raise database.DatabaseError(f"{spec}: a file, not a run folder")
    if not Path(db).is_file():
        raise database.DatabaseError(f"{spec}: no such run folder, and no database at {db} to look it up as a run id")
    found = database.run_ids_with_prefix(db, spec)
    if len(found) != 1:
        raise database.DatabaseError(
            f"{spec}: no run folder or run id of that name in {db}" if not found else
            f"{spec}: {len(found)} run ids in {db} start so: {', '.join(found[:6])}{' ...' if len(found) > 6 else ''}")
    return database.load_run(db, found[0]), found[0]


def resolve_commit(commit: str, db: Path, kind: str) -> tuple[run_folder.RunRecord, str]:
    """The latest completed `kind` run whose specnative or llama.cpp commit starts with `commit`."""
    runs = [r for r in database.runs_of_commit(db, commit) if r["kind"] == kind]
    commits = {c for r in runs for c in (r["specnative_commit"], r["llama_cpp_commit"])
               if c and c.lower().startswith(commit.lower())}
    if not runs:
        raise database.DatabaseError(f"commit {commit}: no {kind} run of a specnative or llama.cpp commit "
                                     f"so named in {db}")
    if len(commits) > 1:
        raise database.DatabaseError(f"commit {commit} is ambiguous in {db}: {', '.join(sorted(commits))}")
    completed = [r for r in runs if r["completed"]]
    if not completed:
        raise database.DatabaseError(f"commit {commit}: no completed {kind} run (unfinished: "
                                     f"{', '.join(r['run_id'] for r in runs[:6])})")
    run_id = completed[0]["run_id"]
    return database.load_run(db, run_id), f"{commit} ({run_id})"


def _sides(args) -> tuple[tuple, tuple]:
    runs = list(args.runs)
    sides = []
    for commit, name in ((args.baseline, "A"), (args.compare, "B")):
        if commit is not None:
            sides.append(("commit", commit))
        elif runs:
            sides.append(("run", runs.pop(0)))
        else:
            raise database.DatabaseError(f"no run {name}: give two runs (folders or ids), or -b and -c commits")
    if runs:
        raise database.DatabaseError(f"too many runs given ({', '.join(args.runs)}): compare takes two")
    return sides[0], sides[1]


def run_compare(args) -> int:
    try:
        if args.plot is not None:
            check_plot_path(args.plot)
        loaded = [resolve_commit(spec, args.db, args.kind) if how == "commit" else resolve_run(spec, args.db)
                  for how, spec in _sides(args)]
        threshold = args.fail_on_regression or DEFAULT_THRESHOLD
        comparison = compare_runs(loaded[0][0], loaded[1][0], threshold, args.match_across,
                                  loaded[0][1], loaded[1][1])
        text = FORMATS[args.output](comparison)
        if args.plot:
            from specnative.report.compare_plot import plot_comparison  # matplotlib only when a figure is asked for
            plot_comparison(comparison, args.plot)
    except BAD_INPUT as error:
        raise _fail(error) from None
    except OSError as error:  # the figure's file
        raise SystemExit(f"error: --plot {args.plot}: cannot write it ({error.strerror})") from None
    sys.stdout.write(text)
    if args.output != "md":  # markdown says them at its top; csv and json readers get them here
        for note in comparison.notes:
            print(f"compare: note: {note}", file=sys.stderr)
    failed = 0
    if args.fail_on_regression is not None and comparison.gate_failed:
        print(f"compare: {len(comparison.regressions)} decided regression(s) beyond "
              f"{args.fail_on_regression * 100:g} %, "
              f"{len(comparison.became_fail) + len(comparison.new_fails)} lossless verdict(s) became fail",
              file=sys.stderr)
        failed = 1
    if args.fail_on_slowdown is not None and (slow := comparison.slowdowns(args.fail_on_slowdown)):
        print(f"compare: spec-off tokens/s decided slower by more than {args.fail_on_slowdown * 100:g} % in "
              f"{len(slow)} regime(s): {', '.join(c.a.label for c in slow)}", file=sys.stderr)
        failed = 1
    return failed



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specnative compare", description="Compare two runs per regime, with "
                                     "intervals and decided regressions.")
    add_compare_arguments(parser)
    return run_compare(parser.parse_args(sys.argv[1:] if argv is None else argv))
