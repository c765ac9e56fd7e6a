"""A run's regimes, as compare matches them: each on row with the off row it is measured against
(sweep), or each request rate's replays (serve), with its estimates on the log scale.

A regime's spread comes from the run's own repeats (tps_repeats, speedup_repeats) where it recorded
them, else from its recorded interval (speedup_ci_low/high, tps_ci_low/high and repeats_used),
undone: se = (ln high - ln low) / (2 t_{n-1}); a serve level's from its seeds.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pandas as pd

from specnative.analysis.stats import Interval, LogEstimate, ratio_interval
from specnative.record.run_folder import RunRecord, base_cell, kind_of, row_verdict
from specnative.record.schema import real_rows

LEVEL = 0.95
# Where an interval's spread comes from: each run's repeats, its recorded interval undone, its
# seeds (serve), replays of the same traces in both runs (paired), or nowhere (a value alone).
REPEATS, RECORDED, SEEDS, PAIRED, SINGLE = "repeats", "recorded interval", "seeds", "paired traces", "no spread"
FAIL = "fail"
MODEL_COLUMNS = ("target_sha256", "draft_sha256")
# What was measured, beside the regime key: a difference makes the numbers incomparable.
SETTING_COLUMNS = ("n_predict", "n_threads", "flash_attn", "drafter_options", "prompt_ids", "dataset",
                   "context_sha256", "n_requests", "burstiness")
LATENCIES = ("ttft_p50_ms", "tpot_p50_ms")  # serve levels, spec on: lower is better


@dataclass
class Regime:
    key: str            # the cell_id of the on row (sweep) or the level (serve): run-independent
    target: str         # the key's parts: target file (sha256 prefix; serve levels: ""),
    bits: str           # its quantization,
    rest: str           # the regime without target and k,
    k: str              # and the draft length
    label: str
    tps_off_recorded: float     # the run's own columns (pooled over its repeats): tps of the off row,
    speedup_recorded: float     # speedup of the on row
    alpha: float
    c: float
    verdict: str
    verdict_reason: str
    speedup_log: LogEstimate | None
    tps_off_log: LogEstimate | None
    latency: dict = field(default_factory=dict)       # serve: name -> LogEstimate of the on rows
    identity: dict = field(default_factory=dict)      # model files
    settings: dict = field(default_factory=dict)
    by_trace: dict = field(default_factory=dict)      # serve: quantity -> {trace_sha256: value}

    def match_key(self, target: bool = True, bits: bool = True, k: bool = True) -> tuple:
        """The key with the target file, its quantization or k left out (matching across them)."""
        return (self.target if target else "", self.bits if bits else "", self.rest, self.k if k else "")

    # What compare shows and divides: the centers of the intervals (geometric means of the repeats,
    # or of the paired repeat ratios), which a noisy cell's pooled columns can differ from.
    @property
    def tps_off(self) -> float:
        return math.exp(self.tps_off_log.mean) if self.tps_off_log else math.nan

    @property
    def speedup(self) -> float:
        return math.exp(self.speedup_log.mean) if self.speedup_log else math.nan

    def estimate(self, quantity: str) -> LogEstimate | None:
        return {"speedup": self.speedup_log, "tps_off": self.tps_off_log}.get(quantity, self.latency.get(quantity))


def _num(value) -> float:
    try:
        return math.nan if value is None or value != value else float(value)
    except (TypeError, ValueError):  # pd.NA
        return math.nan


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _repeats(value) -> list | None:
    """A ';'-separated per-repeat column (tps_repeats, speedup_repeats), or None when absent."""
    values = [float(v) for v in _text(value).split(";") if v.strip()]
    return values or None


def _spread(row: dict, repeats_column: str, low: str, high: str, point: str) -> LogEstimate | None:
    """The run's own repeats where it recorded them; else its recorded interval, undone; else the
    value alone (a run that recorded no interval: a ratio without one)."""
    values = _repeats(row.get(repeats_column))
    if values:
        return LogEstimate.of_values(values, REPEATS)
    lo, hi = _num(row.get(low)), _num(row.get(high))
    n = _num(row.get("repeats_used"))
    n = int(n) if n == n else 0  # runs from before repeats_used: no interval to undo
    level = _num(row.get("ci_level"))
    if not (lo > 0 and hi >= lo and n >= 2):
        value = _num(row.get(point))
        return LogEstimate(math.log(value), math.nan, 1, SINGLE) if value > 0 else None
    interval = Interval(math.sqrt(lo * hi), lo, hi, level if level == level else LEVEL, n)
    return LogEstimate.of_interval(interval, RECORDED)


def _facts(row: dict, columns) -> dict:
    return {c: row[c] for c in columns if row.get(c) is not None and row.get(c) != ""}


def regimes_of(run: RunRecord) -> list[Regime]:
    """The run's regimes; synthetic acceptance rows (drafts kept at random, never the target's output)
    are no regimes: they are left out of the counts, the table and the regression gates."""
    real = real_rows(run.traces)
    rows = [{k: (None if pd.isna(v) else v) for k, v in row.items()} for row in real.to_dict("records")]
    regimes = serve_regimes(rows) if kind_of(run.provenance) == "serve" else sweep_regimes(rows)
    labels = [r.label for r in regimes]
    for r in regimes:  # the short label where it names one regime of the run
        if labels.count(r.label) > 1:
            r.label = r.key
    return regimes


def sweep_regimes(rows: list[dict]) -> list[Regime]:
    off = {row["cell_id"]: row for row in rows if row.get("spec_decode") == "off"}
    regimes = []
    for on in (row for row in rows if row.get("spec_decode") == "on"):
        key = on["cell_id"]
        base = off.get(base_cell(key), {})
        target, _, rest = base_cell(key).partition("|")
        bits, k = f"q{on.get('quant_bits')}", key[len(base_cell(key)) + 1:]
        regimes.append(Regime(
            key, target, bits, rest, k, f"{bits}|{rest}|{k}", _num(base.get("tps")), _num(on.get("speedup")),
            _num(on.get("draft_accept_rate")), _num(on.get("verify_cost_c")),
            row_verdict(on.get("verdict"), on.get("lossless_ok")), _text(on.get("verdict_reason")),
            _spread(on, "speedup_repeats", "speedup_ci_low", "speedup_ci_high", "speedup"),
            _spread(base, "tps_repeats", "tps_ci_low", "tps_ci_high", "tps"), identity=_facts(on, MODEL_COLUMNS),
            settings={**_facts(base, SETTING_COLUMNS), **_facts(on, SETTING_COLUMNS)}))
    return regimes


def serve_regimes(rows: list[dict]) -> list[Regime]:
    """A level: one request rate (and slots, k, drafter) over its replays, one per seed (the repeats)."""
    levels: dict = {}
    for row in rows:
        level = re.sub(r"/seed=[^/]*", "", base_cell(row["cell_id"]))
        levels.setdefault(level, {"on": [], "off": []})[row["spec_decode"]].append(row)
    regimes = []
    for level, sides in levels.items():
        on, off = sides["on"], sides["off"]
        if not on:
            continue
        speedup = LogEstimate.of_values([_num(r.get("speedup")) for r in on], SEEDS)
        tps_off = LogEstimate.of_values([_num(r.get("tps")) for r in off], SEEDS)
        verdicts = [row_verdict(r.get("verdict"), r.get("lossless_ok")) for r in on]
        worst = FAIL if FAIL in verdicts else "numeric" if "numeric" in verdicts else verdicts[0]
        alpha = ratio_interval([_num(r.get("accepted")) for r in on], [_num(r.get("drafted")) for r in on]).estimate
        c = [_num(r.get("verify_cost_c")) for r in on]
        found_k = re.search(r"/k=[^/]*", level)
        k = found_k.group(0) if found_k else ""
        on_traces = [r.get("trace_sha256") or f"seed {r.get('seed')}" for r in on]
        by_trace = {"speedup": dict(zip(on_traces, (_num(r.get("speedup")) for r in on))),
                    "tps_off": {r.get("trace_sha256") or f"seed {r.get('seed')}": _num(r.get("tps")) for r in off},
                    **{m: dict(zip(on_traces, (_num(r.get(m)) for r in on))) for m in LATENCIES}}
        regimes.append(Regime(
            level, "", f"q{on[0].get('quant_bits')}", level.replace(k, ""), k, level.removeprefix("serve/"),
            math.exp(tps_off.mean) if tps_off else math.nan, math.exp(speedup.mean) if speedup else math.nan,
            alpha, sum(c) / len(c), worst,
            "; ".join(dict.fromkeys(_text(r.get("verdict_reason")) for r in on if r.get("verdict_reason"))),
            speedup, tps_off, identity=_facts(on[0], MODEL_COLUMNS), settings=_facts(on[0], SETTING_COLUMNS),
            latency={m: LogEstimate.of_values([_num(r.get(m)) for r in on], SEEDS) for m in LATENCIES},
            by_trace=by_trace))
    return regimes
