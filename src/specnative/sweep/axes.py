"""The sweep grid's axes of the pair (values that change both sides' runs), each declared once: where
its values come from, how provenance.json's grid records them, and its part of the cell id every
traces.csv row carries. The cell id, the recorded grid and the resume check (which compares
recorded grids) all read this table and the speculative side's factors (record/factors.py), whose
id parts sit after them or, for a factor placed after an axis, right after it.

An axis that came after runs were already measured names the value those runs were measured at
(`before`): the grid records the axis only when a run's values differ from it, and the cell id
names a value only where it differs, so older run folders still resume, merge and compare.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specnative.record.factors import FACTORS


@dataclass(frozen=True)
class Axis:
    name: str                                  # the Cell field (or the on row's kind)
    grid: str | None                           # its name in provenance.json's grid (None: not recorded)
    values: Callable | None = None             # its values in a SweepConfig (None: not recorded)
    key: Callable[[object], str] | None = None  # its part of the cell id (None: not in the id)
    record: Callable = list                    # how the grid writes the values
    before: object = None                      # the values of runs that predate the axis (None: always recorded)

    def recorded(self, cfg) -> bool:
        return self.grid is not None and (self.before is None or self.record(self.values(cfg)) != self.before)


def _on_off(values) -> list:
    return ["on" if on else "off" for on in values]


# The cell's axes in the cell id's order; accept_rule is the run's rule (one per run), named in the id
CELL_AXES = (
    Axis("ctx_len", "ctx_len", lambda cfg: cfg.ctx_lens, lambda v: f"|ctx{v}"),
    Axis("concurrency", "concurrency", lambda cfg: cfg.concurrencies, lambda v: f"|c{v}"),
    Axis("temperature", "temperature", lambda cfg: cfg.temperatures, lambda v: f"|T{v:g}"),
    Axis("accept_rule", "accept_rule", lambda cfg: cfg.accept_rule, lambda v: f"|{v}", record=lambda v: v),
    Axis("task", "task", lambda cfg: cfg.tasks, lambda v: f"|task={v}"),
    Axis("drafter", "drafter", lambda cfg: cfg.drafters, lambda v: "" if v == "model" else f"|drafter={v}"),
    Axis("batch", None, key=lambda v: f"|batch={v}" if v > 0 else ""),  # a public set's batch of items
    Axis("prefix_cache", "prefix_cache", lambda cfg: cfg.prefix_caches, lambda v: "" if v else "|prefix=off",
         record=_on_off, before=["on"]),
)
# What an on row drafts, after the cell's axes: a chain of k, a draft tree, a synthetic profile
ON_ROW_AXES = (
    Axis("k", "k", lambda cfg: cfg.ks),
    Axis("draft_shape", "draft_shape", lambda cfg: cfg.draft_shapes, before=["chain"]),
    Axis("synthetic_acceptance", "synthetic_acceptance", lambda cfg: cfg.synthetic,
         record=lambda profiles: [p.text for p in profiles], before=[]),
)
# Settings the grid records beside its axes (one value per run)
GRID_SETTINGS = (("n_predict", lambda cfg: cfg.n_predict),)


def grid_record(cfg) -> dict:
    """provenance.json's grid: every axis the run's values must be recorded for, and the settings."""
    grid = {axis.grid: axis.record(axis.values(cfg)) for axis in CELL_AXES + ON_ROW_AXES if axis.recorded(cfg)}
    for factor in FACTORS:  # a factor's values, where a run leaves its default
        values = cfg.factors.get(factor.name, [factor.default])
        if values != [factor.default]:
            grid[factor.name] = list(values)
    grid.update({name: value(cfg) for name, value in GRID_SETTINGS})
    return grid


def cell_key(target_sha: str, values: dict, kind=None, synthetic: str | None = None) -> str:
    """The cell id: the target's sha256 prefix and each keyed axis's part; with `kind` an on row's (a
    chain's k, or a draft tree's spelling), with `synthetic` (a profile's text) a synthetic row's."""
    chosen = dict(values.get("factors", ()))

    def factor_parts(after) -> str:  # the cell's factors whose id part follows this axis (None: the end)
        return "".join(f.key(chosen[f.name]) for f in FACTORS if f.key_after == after and f.name in chosen)

    base = target_sha[:16] + "".join(axis.key(values[axis.name]) + factor_parts(axis.name)
                                     for axis in CELL_AXES if axis.key) + factor_parts(None)
    if isinstance(kind, str):
        base += f"|shape={kind}"
    elif kind is not None:
        base += f"|k{kind}"
    return base if synthetic is None else f"{base}|synthetic={synthetic}"
