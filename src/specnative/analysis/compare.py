"""Two runs side by side, regime by regime: did the change make speculation faster or slower, and is
the difference decided?

A regime is a cell with its k (a traces.csv on row and the off row it is measured against), keyed by
its cell_id, which does not depend on the run; a serve level is a request rate's replays (one per
seed). Per matched regime: the ratio B/A of the speedups and of the spec-off tokens/s, each with a
Welch interval on the log scale from both runs' repeats, and a status against a threshold PCT:

    regression         B/A < 1 - PCT and the interval's upper end < 1 - PCT/2
    improvement        B/A > 1 + PCT and the interval's lower end > 1 + PCT/2
    no decided change  the whole interval within 1 +- PCT
    undecided          anything else: the interval is too wide to say (more repeats would tell)

Regimes measured on different model files or settings are refused unless asked to match across
them; a different host, build or llama.cpp commit is what a comparison is for, and is stated.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from specnative.analysis.compare_regimes import FAIL, LATENCIES, LEVEL, PAIRED, Regime, regimes_of
from specnative.analysis.stats import Interval, speedup_interval, welch_ratio
from specnative.record.run_folder import RunRecord, host_of, kind_of, models_summary

DEFAULT_THRESHOLD = 0.05
REGRESSION, IMPROVEMENT, NO_CHANGE, UNDECIDED = "regression", "improvement", "no decided change", "undecided"
ACROSS = ("models", "settings", "all")
RUN_FACTS = (("specnative version", lambda p: p.get("specnative_version")),
             ("specnative commit", lambda p: p.get("specnative_commit")),
             ("llama.cpp commit", lambda p: p.get("llama_cpp_commit")),
             ("build flags", lambda p: p.get("build_flags")), ("backend", lambda p: p.get("backend")),
             ("host", host_of), ("CPUs", lambda p: p.get("cpu_count")), ("models", models_summary))


class CompareError(Exception):
    """Two runs that cannot be compared as asked; the message says why, naming the cells."""


def classify(interval: Interval, threshold: float) -> str:
    low, high, ratio = interval.low, interval.high, interval.estimate
    if not (math.isfinite(low) and math.isfinite(high)):
        return UNDECIDED
    if ratio < 1 - threshold and high < 1 - threshold / 2:
        return REGRESSION
    if ratio > 1 + threshold and low > 1 + threshold / 2:
        return IMPROVEMENT
    if low >= 1 - threshold and high <= 1 + threshold:
        return NO_CHANGE
    return UNDECIDED


# --- Matching and the comparison ------------------------------------------------------------------
def _differences(a: dict, b: dict) -> list[str]:
    return [f"{name} A {str(a[name])[:16]} B {str(b[name])[:16]}"
            for name in sorted(set(a) & set(b)) if str(a[name]) != str(b[name])]  # unrecorded is not different


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def _unique(regimes: list[Regime], key) -> bool:
    keys = [key(r) for r in regimes]
    return len(keys) == len(set(keys))


def match_keys(a: list[Regime], b: list[Regime], across: str | None):
    """The loosest key that still names one regime in each run: across models, a run of one target
    matches the other's only target, runs of several targets match them by quantization; across
    settings, k is left out where each cell ran one k. Strict: the cell_id."""
    models, settings = across in ("models", "all"), across in ("settings", "all")
    for bits in ((False, True) if models else (True,)):
        for k in ((False, True) if settings else (True,)):
            def key(r, bits=bits, k=k):
                return r.match_key(not models, bits, k)
            if _unique(a, key) and _unique(b, key):
                return key
    doubled = next(r.key for run in (a, b) for r in run if [x.key for x in run].count(r.key) > 1)
    raise CompareError(f"a run holds regime {doubled} twice (a damaged traces.csv?)")


def match(a: list[Regime], b: list[Regime], across: str | None = None):
    """(pairs, only in A, only in B); refuses pairs measured on other model files or settings, and
    regimes that differ only in their target file or k, unless `across` allows it."""
    models, settings = across in ("models", "all"), across in ("settings", "all")
    key = match_keys(a, b, across)
    index_b = {key(r): r for r in b}
    pairs = [(r, index_b[key(r)]) for r in a if key(r) in index_b]
    matched = {key(r) for r in a}
    only_a, only_b = [r for r in a if key(r) not in index_b], [r for r in b if key(r) not in matched]
    problems = []
    for ra, rb in pairs:
        diffs = (_differences(ra.identity, rb.identity) if not models else []) + \
                (_differences(ra.settings, rb.settings) if not settings else [])
        if diffs:
            problems.append(f"{ra.label}: {'; '.join(diffs)}")
    # the same regime on another file or with another k: keys that differ only there
    same_bits, loosest = ({r.match_key(False, bits, False): r for r in only_b} for bits in (True, False))
    for ra in only_a:
        rb = same_bits.get(ra.match_key(False, True, False)) or loosest.get(ra.match_key(False, False, False))
        if rb is not None:
            diffs = (_differences(ra.identity, rb.identity) if not models else []) + \
                    ([f"k A {_digits(ra.k)} B {_digits(rb.k)}"] if ra.k != rb.k and not settings else [])
            problems += [f"{ra.label}: {'; '.join(diffs)}"] if diffs else []
    if problems:
        shown = problems[:8] + ([f"... and {len(problems) - 8} more"] if len(problems) > 8 else [])
        raise CompareError(f"{len(problems)} regime(s) of A and B were measured on different model files or "
                           f"settings; pass --match-across models, settings or all to compare them anyway:\n  "
                           + "\n  ".join(shown))
    return pairs, only_a, only_b


@dataclass
class CellResult:
    a: Regime
    b: Regime
    speedup_ratio: Interval
    tps_off_ratio: Interval
    latency_ratios: dict
    status: str
    tps_off_status: str
    sources: str        # where the speedup interval's spread came from (A/B where they differ)

    @property
    def became_fail(self) -> bool:
        return self.b.verdict == FAIL and self.a.verdict != FAIL


def _ratio(a: Regime, b: Regime, quantity: str) -> tuple[Interval, str]:
    """B/A of one quantity: paired where both runs replayed the same traces (what each trace's
    arrivals did to A and B cancels), else Welch on the two runs' log estimates."""
    pa, pb = a.by_trace.get(quantity) or {}, b.by_trace.get(quantity) or {}
    if len(pa) >= 2 and set(pa) == set(pb):
        try:
            return speedup_interval([pb[t] for t in pa], [pa[t] for t in pa], LEVEL), PAIRED
        except ValueError:  # a missing or zero value: the unpaired estimates below
            pass
    ea, eb = a.estimate(quantity), b.estimate(quantity)
    found = [e.source if e else "none" for e in (ea, eb)]
    source = found[0] if found[0] == found[1] else "/".join(found)
    if not (ea and eb):
        return Interval(math.nan, math.nan, math.nan, LEVEL, 0), source
    return welch_ratio(ea, eb), source


def compare_pair(a: Regime, b: Regime, threshold: float) -> CellResult:
    (speedup, source), (tps_off, _) = _ratio(a, b, "speedup"), _ratio(a, b, "tps_off")
    latency = {m: _ratio(a, b, m)[0] for m in LATENCIES if m in a.latency}
    return CellResult(a, b, speedup, tps_off, latency, classify(speedup, threshold), classify(tps_off, threshold),
                      source)


@dataclass
class Comparison:
    run_a: RunRecord
    run_b: RunRecord
    label_a: str
    label_b: str
    kind: str
    threshold: float
    across: str | None
    cells: list
    only_a: list
    only_b: list
    differences: list       # (what, A, B) of the runs' build, host and models that differ
    notes: list             # what a reader must know before the numbers: one run on both sides, an unfinished run

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.cells)

    @property
    def became_fail(self) -> list:
        return [c for c in self.cells if c.became_fail]

    @property
    def new_fails(self) -> list:
        """Regimes only B measured whose lossless verdict is fail: as loud as one that became fail."""
        return [r for r in self.only_b if r.verdict == FAIL]

    @property
    def regressions(self) -> list:
        return [c for c in self.cells if c.status == REGRESSION]

    def slowdowns(self, threshold: float) -> list:
        """Regimes whose spec-off tokens/s B/A is a decided regression at `threshold`. Unlike the
        speedup (paired within each run), this ratio also carries whatever the host did between
        the two runs."""
        return [c for c in self.cells if classify(c.tps_off_ratio, threshold) == REGRESSION]

    @property
    def gate_failed(self) -> bool:
        """What --fail-on-regression exits non-zero on: a decided regression or a new lossless fail."""
        return bool(self.regressions or self.became_fail or self.new_fails)


def run_differences(a: dict, b: dict) -> list[tuple]:
    """(what, A, B) for each fact of build, host and models in which the two provenance records differ."""
    shown = [(what, *("unrecorded" if v is None else str(v) for v in (fact(a), fact(b)))) for what, fact in RUN_FACTS]
    return [row for row in shown if row[1] != row[2]]


def run_notes(run_a: RunRecord, run_b: RunRecord) -> list[str]:
    """The same run on both sides (every ratio is 1 by construction), and a run that did not finish
    (its regimes never measured are missing from the comparison, not unchanged)."""
    notes, same = [], run_a.run_id == run_b.run_id
    if same:
        notes.append(f"A and B are the same run ({run_a.run_id}): every ratio compares it with itself")
    for side, run in (("A and B", run_a),) if same else (("A", run_a), ("B", run_b)):
        if run.provenance.get("completed") is False:
            notes.append(f"run {side} ({run.run_id}) did not finish (interrupted, or still running): the regimes "
                         f"it never measured are missing here, not unchanged")
    return notes


def compare_runs(run_a: RunRecord, run_b: RunRecord, threshold: float = DEFAULT_THRESHOLD,
                 across: str | None = None, label_a: str = "", label_b: str = "") -> Comparison:
    if across not in (None, *ACROSS):
        raise CompareError(f"--match-across must be one of {', '.join(ACROSS)}, not {across!r}")
    if not 0 < threshold < 1:
        raise CompareError(f"the threshold must be between 0 and 100 %, got {threshold * 100:g} %")
    kind_a, kind_b = kind_of(run_a.provenance), kind_of(run_b.provenance)
    if kind_a != kind_b:
        raise CompareError(f"A is a {kind_a} run and B a {kind_b} run: their cells measure different things")
    regimes = []
    for run, side in ((run_a, "A"), (run_b, "B")):
        found = regimes_of(run)
        if not found:
            raise CompareError(f"run {side} ({run.run_dir}) holds no speculative measurement (no spec-on row)")
        regimes.append(found)
    pairs, only_a, only_b = match(*regimes, across)
    return Comparison(run_a, run_b, label_a or run_a.run_id, label_b or run_b.run_id, kind_a, threshold, across,
                      [compare_pair(a, b, threshold) for a, b in pairs], only_a, only_b,
                      run_differences(run_a.provenance, run_b.provenance), run_notes(run_a, run_b))

