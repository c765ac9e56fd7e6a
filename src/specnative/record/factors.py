"""The grid's factors: the axes of how the speculative side drafts (the draft model's stop rule,
the spec policy), each declared by its row alone. They change only the on rows' runs; a cell's off
runs are the same at every value, so the factors' cells of a regime pair with one baseline. (The
axes of the pair itself, both sides' runs, are sweep/axes.py's: context, concurrency, temperature,
rule, task, drafter, a public set's batch, the prefix cache.) A row says everything the sweep, its
cell id, resume, provenance, the rows and the advice need to know of the axis:

- its flag, how the flag's text parses into values, and its help;
- its default: the value every run before the axis was measured at, so a cell at the default has
  the cell id it had before, the recorded grid names the axis only when a run leaves the default
  (older run folders still resume, merge and compare) and a row without the column reads as it;
- its part of the cell id at other values, and where in the id it sits (an axis that was a cell
  field before it was a row here keeps its spelling and its place: older run folders resume);
- its traces.csv column (declared in the traces.csv schema) and its generate() keyword (the same
  name: the engine's parameter);
- where it applies (which drafters, chains only or every on row) and whether it makes the draft
  length vary from round to round (no fixed-k prediction then);
- what a grid's values cannot run with (one line each, before any work);
- the columns its on rows add from their runs.

The sweep's flags, cells and measuring, the cell id (sweep/axes.py) and the advisor's regimes read
this table: a new axis is one row here, its engine parameter, its column, and its tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _nothing_added(value, runs) -> dict:
    return {}


def _no_problems(values: list, grid) -> list:
    return []


def _every_drafter(drafter: str) -> bool:
    return True


def _no_drafter(drafter: str) -> bool:
    return False


@dataclass(frozen=True)
class Factor:
    name: str                     # traces.csv column, Cell factor and generate() keyword
    flag: str                     # the sweep's flag
    parse: Callable[[str], object]  # one value of the flag's comma list, in its canonical spelling
    default: object               # the value of runs before the axis (the flag's default)
    help: str
    metavar: str = "V,V,..."
    chains_only: bool = False     # a value other than the default applies to chains only (no draft trees)
    lengths_vary: Callable[[object], bool] = lambda value: False  # drafts of varying length at this value
    # (values, the sweep's configuration: its ks, drafters, draft_shapes) -> what cannot run, one line each
    problems: Callable[[list, object], list] = _no_problems
    columns: Callable[[object, list], dict] = _nothing_added  # (value, an on row's runs) -> its columns
    drafters: Callable[[str], bool] = _every_drafter  # the drafters a value other than the default applies to
    column_always: Callable[[str], bool] = _no_drafter  # the drafters whose on rows carry the column at the default too
    spelling: Callable[[object], str] | None = None  # its cell-id part at another value (None: |name=value)
    key_after: str | None = None  # the cell axis its id part follows (sweep/axes.py; None: after them all)

    def values_from(self, text: str) -> list:
        """The flag's comma list parsed, in order, duplicates refused. A piece that is no value alone
        but continues the one before it belongs to it (a value's own options: adaptive:prior=0.6,weight=2)."""
        items = []
        for piece in split_list(text):
            if items and not self._parses(piece) and self._parses(items[-1] + "," + piece):
                items[-1] += "," + piece
            else:
                items.append(piece)
        values = [self.parse(item) for item in items]
        if len(set(values)) != len(values):
            raise ValueError(f"{self.flag}: a value is given twice in {text!r}")
        return values

    def _parses(self, text: str) -> bool:
        try:
            self.parse(text)
        except ValueError:
            return False
        return True

    def key(self, value) -> str:
        """Its part of the cell id: nothing at the default."""
        if value == self.default:
            return ""
        return self.spelling(value) if self.spelling else f"|{self.name}={value}"


def split_list(text: str) -> list[str]:
    """A flag's comma list, commas inside brackets kept (a by-batch schedule is one value)."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    items.append(current.strip())
    if any(not item for item in items):
        raise ValueError(f"empty value in {text!r}")
    return items


def _policy(text: str) -> str:
    from specnative.engine.spec_policy import parse  # the engine's own parser: one spelling everywhere

    return parse(text).text


def _policy_problems(values: list, grid) -> list:
    from specnative.engine.spec_policy import parse

    problems = []
    for value in values:
        try:
            for k in grid.ks:
                parse(value).check_k(k)
        except ValueError as error:
            problems.append(f"--spec-policy: {error}")
    return problems


def _policy_columns(value, runs) -> dict:
    from specnative.engine.spec_policy import choice_columns

    hist = sum(run.totals["k_chosen_hist"] for run in runs)
    times = {name: sum(run.times[name] for run in runs) for name in ("policy", "policy_startup")}
    return choice_columns(value, {"k_chosen_hist": hist}, times, sum(run.steps for run in runs))


def _p_min(text: str) -> float:
    from specnative.engine import check_draft_p_min

    return check_draft_p_min(text)


def _p_min_problems(values: list, grid) -> list:
    if not any(p > 0 for p in values):
        return []
    if "model" not in grid.drafters:
        return ["--draft-p-min applies to the draft model: add --drafter model"]
    if any(shape != "chain" for shape in grid.draft_shapes):
        return ["--draft-p-min > 0 with draft trees: the draft model's stop rule cuts a chain; a tree stops at its "
                "node budget (measure the trees with --draft-p-min 0, the stop rule in a sweep of chains)"]
    return []


FACTORS: tuple[Factor, ...] = (
    Factor("draft_p_min", "--draft-p-min", _p_min, 0.0,
           "the draft model's stop rule: a sequence stops drafting for the round at the first position whose top "
           "draft probability is below P (llama.cpp's --spec-draft-p-min; 0: always k). Cells with P > 0 get no "
           "which-k prediction (their drafts are not fixed-length)",
           metavar="P,P,...", chains_only=True, lengths_vary=lambda value: value > 0, problems=_p_min_problems,
           drafters=lambda drafter: drafter == "model", column_always=lambda drafter: drafter == "model",
           spelling=lambda value: f"|pmin={value:g}", key_after="drafter"),
    Factor("spec_policy", "--spec-policy", _policy, "static",
           "how many tokens each sequence drafts per round, one cell per policy: static (k every round), "
           "adaptive (k per sequence per round from its acceptance and the measured verify cost) or "
           "by-batch:[[lo,hi,k],...] (docs/adaptive.md); a non-static policy applies to chains",
           metavar="P,P,...", chains_only=True, lengths_vary=lambda value: value != "static",
           problems=_policy_problems, columns=_policy_columns),
)
FACTOR_NAMES: tuple[str, ...] = tuple(f.name for f in FACTORS)


def factor_named(name: str) -> Factor:
    return next(f for f in FACTORS if f.name == name)
