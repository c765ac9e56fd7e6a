"""`specnative runs` and `specnative db import|rebuild`: the results database (SQLite), a view of run
folders that can always be rebuilt from them (record/database.py). Bad input (a missing folder, a
folder that is not a run, an unreadable database) is one line, before anything is written."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specnative.record import database, run_folder

DB_HELP = f"the results database (default {database.DEFAULT_DB})"
BAD_INPUT = (database.DatabaseError, run_folder.RunFolderError)  # each says what is wrong in one line


def _fail(error: Exception) -> SystemExit:
    return SystemExit(f"error: {error}")


# ---------------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------------
def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", type=Path, default=database.DEFAULT_DB, help=DB_HELP)
    parser.add_argument("-o", "--output", choices=("md", "json"), default="md", help="format on stdout")


def run_runs(args) -> int:
    try:
        runs = database.list_runs(args.db)
    except BAD_INPUT as error:
        raise _fail(error) from None
    if args.output == "json":
        print(json.dumps(runs, indent=2))
        return 0
    head = ["run", "date", "kind", "commit", "llama.cpp", "host", "models", "grid", "cells", "verdicts", "done"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        values = [r["run_id"], (r["date"] or "")[:16], r["kind"], (r["specnative_commit"] or "–")[:9],
                  (r["llama_cpp_commit"] or "–")[:9], r["host"] or "–", r["models"] or "–", r["grid"] or "–",
                  str(r["cells"]), ", ".join(f"{v} {n}" for v, n in sorted(r["verdicts"].items())) or "–",
                  {1: "yes", 0: "no"}.get(r["completed"], "–")]
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |")
    print("\n".join(lines) if runs else f"no runs in {args.db}")
    return 0


# ---------------------------------------------------------------------------------------------
# db import | rebuild
# ---------------------------------------------------------------------------------------------
def add_db_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="db_verb", required=True, metavar="{import,rebuild}")
    imp = verbs.add_parser("import", help="sync run folders into the database (run folders written before it)")
    imp.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    rebuild = verbs.add_parser("rebuild", help="empty the database and import every run folder under RUNS_DIR")
    rebuild.add_argument("runs_dir", type=Path, metavar="RUNS_DIR")
    imp.add_argument("--db", type=Path, default=database.DEFAULT_DB, help=DB_HELP)
    rebuild.add_argument("--db", type=Path, default=None,
                         help="the results database (default: specnative.sqlite in RUNS_DIR, where the runs wrote it)")


def _not_the_database(paths: list[Path], db: Path) -> list[Path]:
    """`db import runs/*` also names database files (runs/ holds its default database, whichever
    --db is written): they are not run folders, and are skipped with one line saying so."""
    own = {Path(str(db) + suffix).resolve() for suffix in ("", *database.COMPANION_SUFFIXES)}
    kept, skipped = [], []
    for p in paths:
        (skipped if p.resolve() in own or database.is_database_file(p) else kept).append(p)
    if skipped:
        print(f"skipped {len(skipped)} database file(s), not run folders: {', '.join(map(str, skipped))}",
              file=sys.stderr)
    return kept


def run_db(args) -> int:
    try:
        if args.db_verb == "import":
            results = database.import_runs(args.db, _not_the_database(args.run_dirs, args.db))
        else:
            args.db = args.db if args.db is not None else args.runs_dir / "specnative.sqlite"
            results = database.rebuild(args.db, args.runs_dir)
    except BAD_INPUT as error:
        raise _fail(error) from None
    for r in results:
        torn = f", {r.torn_lines} half-written last line(s) skipped" if r.torn_lines else ""
        print(f"synced {r.run_id} ({r.run_dir}): {r.rows} rows, {r.requests} requests{torn}")
    print(f"{args.db}: {len(results)} run(s) {'imported' if args.db_verb == 'import' else 'rebuilt'}",
          file=sys.stderr)
    return 0




def verb_main(verb: str, add, run, text: str, argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog=f"specnative {verb}", description=text)
    add(parser)
    return run(parser.parse_args(sys.argv[1:] if argv is None else argv))


def runs_main(argv: list[str] | None = None) -> int:
    return verb_main("runs", add_runs_arguments, run_runs, "List the runs in the results database.", argv)


def db_main(argv: list[str] | None = None) -> int:
    return verb_main("db", add_db_arguments, run_db, "The results database: import run folders, or rebuild it "
                     "from every run folder under a directory.", argv)
