"""`--shard i/N`: a deterministic share of a sweep's grid, for a batch scheduler's array jobs.

Every shard expands the whole grid in the same order (sweep.cells_of) and keeps the cells whose
index is i modulo N, so N shards started with the same flags on identical machines measure each
cell exactly once, and `specnative merge` can join their run directories into one run
(merge.py). Round-robin rather than contiguous blocks: the grid is ordered by target, then
ctx_len, so blocks would give one shard all the long contexts.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, grid_index: int) -> bool:
        return grid_index % self.count == self.index


def parse_shard(text: str) -> Shard:
    """argparse type for --shard i/N (0 <= i < N, as Slurm's --array=0-(N-1) numbers its tasks)."""
    index, slash, count = text.partition("/")
    try:
        shard = Shard(int(index), int(count))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/N with integers, e.g. 0/4, got {text!r}") from None
    if not slash or shard.count < 1 or not 0 <= shard.index < shard.count:
        raise argparse.ArgumentTypeError(f"expected i/N with 0 <= i < N, e.g. 0/4, got {text!r}")
    return shard


def select(cells: list, shard: Shard | None) -> list[tuple[int, object]]:
    """(grid index, cell) of the cells this shard measures, in grid order (all without a shard)."""
    return [(i, cell) for i, cell in enumerate(cells) if shard is None or shard.owns(i)]


def record(shard: Shard, grid_size: int, owned: list[tuple[int, str]]) -> dict:
    """provenance.json's "shard": which share this run directory holds, cell by cell (grid index
    and the cell's key without k), so a merge can check that shards are disjoint and complete."""
    return {"index": shard.index, "count": shard.count, "grid_cells": grid_size,
            "cells": [[i, key] for i, key in owned]}
