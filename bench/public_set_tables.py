"""The per-category table (report's "Public set by category", category_table.section_md) over
several run folders of one public set: runs split by category, drafter or shard, measured at
different times, read as one. Cells present in more than one folder (the same items, drafter, k
and target) count once: the folder given last wins.

    python bench/public_set_tables.py FOLDER [FOLDER ...] > tables.md

The kept output is bench/results/public-sets-qwen/mt-bench-all.md (its README gives the folders).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from specnative.record import schema
from specnative.run.workloads import category_table

# A cell is its items (prompt_ids), not its prompts' hash: a turn-2 prompt holds the target's own
# turn-1 answer, generated anew by each run (batch-shape noise can change it)
CELL = ["target_model", "ctx_len", "concurrency", "temperature", "drafter", "k", "prompt_ids", "spec_decode"]


def merged(folders: list[Path]) -> pd.DataFrame:
    frames = [schema.read_traces(folder / "traces.csv").assign(folder=folder.name) for folder in folders]
    both = pd.concat(frames, ignore_index=True)
    return both.drop_duplicates(CELL, keep="last")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", type=Path, nargs="+")
    args = ap.parse_args(argv)
    missing = [str(f) for f in args.folders if not (f / "traces.csv").is_file()]
    if missing:
        ap.error(f"no traces.csv in {', '.join(missing)}")
    traces = merged(args.folders)
    on = traces[traces["spec_decode"] == "on"]
    print(f"Folders: {', '.join(f.name for f in args.folders)}; {len(on)} spec-on cells "
          f"({int((on['verdict'] == 'fail').sum())} fail).\n")
    print(category_table.section_md(traces) or "no public-set rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
