"""The spec policy: how many tokens each sequence may draft in a round (docs/adaptive.md).

    static                          one k every round (the default; the run's k)
    by-batch:[[1,2,8],[3,8,2]]      a k per occupancy band, in vLLM's [[lo, hi, k], ...] form: a round
                                    with lo..hi sequences decoding drafts at most k (0: none); an
                                    occupancy outside every band drafts the run's k
    by-batch:RUN/advice.json        the schedule a load sweep's advice.json carries (by_batch_schedule)
    adaptive                        chosen every round from the measured verify cost by rows and each
    adaptive:prior=0.6,weight=2     sequence's acceptance by position (a prior of `prior` at every
                                    position, `weight` pseudo-rounds behind it); it starts from what
                                    the engine's earlier adaptive runs under the same decoding
                                    settings learned, and leaves its own there
    adaptive:optimism=0             no bonus on acceptance estimates with few rounds behind them
                                    (default 0.3 standard errors at the prior's weight)
    adaptive:fresh                  the same from the prior alone, leaving nothing behind

The run's k is the most any round drafts. A policy changes when tokens are drafted, never which
tokens come out. Chains only: a draft tree drafts its whole shape every round.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from specnative import _core

KINDS = ("static", "by-batch", "adaptive")
ADAPTIVE_DEFAULTS = {"prior": 0.5, "weight": 2.0, "optimism": 0.3}


@dataclass(frozen=True)
class SpecPolicy:
    kind: str = "static"
    schedule: tuple = ()  # by-batch: ((lo, hi, k), ...)
    prior_alpha: float = ADAPTIVE_DEFAULTS["prior"]
    prior_weight: float = ADAPTIVE_DEFAULTS["weight"]
    optimism: float = ADAPTIVE_DEFAULTS["optimism"]
    remember: bool = True  # adaptive: carry what was learned from one run of the engine to the next

    @property
    def is_static(self) -> bool:
        return self.kind == "static"

    @property
    def text(self) -> str:
        """The policy's spelling in a cell id and traces.csv (a schedule inline, not its file)."""
        if self.kind == "by-batch":
            return "by-batch:" + json.dumps([list(band) for band in self.schedule], separators=(",", ":"))
        if self.kind == "adaptive":
            options = [] if self.remember else ["fresh"]
            if (self.prior_alpha, self.prior_weight) != (ADAPTIVE_DEFAULTS["prior"], ADAPTIVE_DEFAULTS["weight"]):
                options += [f"prior={self.prior_alpha:g}", f"weight={self.prior_weight:g}"]
            if self.optimism != ADAPTIVE_DEFAULTS["optimism"]:
                options.append(f"optimism={self.optimism:g}")
            return "adaptive" + (":" + ",".join(options) if options else "")
        return self.kind

    def check_k(self, k: int) -> None:
        for lo, hi, band_k in self.schedule:
            if band_k > k:
                raise ValueError(f"spec policy {self.text}: band [{lo}, {hi}, {band_k}] drafts more than k={k}, "
                                 f"the most a round drafts")

    def fill_core(self, p: _core.PolicyParams) -> None:
        p.kind = getattr(_core.PolicyKind, self.kind.replace("-", "_"))
        p.schedule = [_core.PolicyBand(lo, hi, k) for lo, hi, k in self.schedule]
        p.prior_alpha = self.prior_alpha
        p.prior_weight = self.prior_weight
        p.optimism = self.optimism
        p.remember = self.remember


def _band(item, where: str) -> tuple:
    if (not isinstance(item, (list, tuple)) or len(item) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)):
        raise ValueError(f"{where}: each band is [lo, hi, k] with integers, not {item!r}")
    lo, hi, k = item
    if not 1 <= lo <= hi:
        raise ValueError(f"{where}: band {list(item)} needs 1 <= lo <= hi")
    if k < 0:
        raise ValueError(f"{where}: band {list(item)} needs k >= 0")
    return lo, hi, k


def _schedule(text: str) -> tuple:
    """A by-batch schedule from its inline JSON or from an advice.json (a run folder or the file)."""
    where = f"by-batch:{text}"
    if text.lstrip().startswith("["):
        try:
            bands = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not a JSON list of [lo, hi, k] bands ({e.msg})") from None
    else:
        path = Path(text)
        path = path / "advice.json" if path.is_dir() else path
        if not path.is_file():
            raise ValueError(f"{where}: no such advice.json or run folder")
        try:
            advice = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"{where}: {path} is not JSON") from None
        if not isinstance(advice, dict) or "by_batch_schedule" not in advice:
            raise ValueError(f"{where}: {path} carries no by_batch_schedule (a load sweep's advice.json does)")
        bands = advice["by_batch_schedule"]
    if not isinstance(bands, list) or not bands:
        raise ValueError(f"{where}: the schedule needs at least one [lo, hi, k] band")
    return tuple(_band(item, where) for item in bands)


def _adaptive(options: str) -> SpecPolicy:
    values, remember = dict(ADAPTIVE_DEFAULTS), True
    for item in filter(None, options.split(",")):
        if item == "fresh":
            remember = False
            continue
        name, _, value = item.partition("=")
        if name not in values:
            raise ValueError(f"adaptive:{options}: unknown option {name!r} (known: {', '.join(values)}, fresh)")
        try:
            values[name] = float(value)
        except ValueError:
            raise ValueError(f"adaptive:{options}: {name} must be a number, not {value!r}") from None
    if not 0.0 <= values["prior"] <= 1.0:
        raise ValueError(f"adaptive:{options}: prior must be in [0, 1]")
    if not (values["weight"] > 0 and math.isfinite(values["weight"])):
        raise ValueError(f"adaptive:{options}: weight must be a finite number > 0")
    if not (values["optimism"] >= 0 and math.isfinite(values["optimism"])):
        raise ValueError(f"adaptive:{options}: optimism must be a finite number >= 0")
    return SpecPolicy("adaptive", prior_alpha=values["prior"], prior_weight=values["weight"],
                      optimism=values["optimism"], remember=remember)


def parse(value) -> SpecPolicy:
    """A SpecPolicy from its spelling (module docstring), None (static) or a SpecPolicy."""
    if value is None:
        return SpecPolicy()
    if isinstance(value, SpecPolicy):
        return value
    if not isinstance(value, str):
        raise ValueError(f"spec_policy must be a policy's spelling ({', '.join(KINDS)}), not {value!r}")
    kind, _, rest = value.strip().partition(":")
    if kind == "static" and not rest:
        return SpecPolicy()
    if kind == "adaptive":
        return _adaptive(rest)
    if kind == "by-batch" and rest:
        return SpecPolicy("by-batch", schedule=_schedule(rest))
    raise ValueError(f"spec_policy {value!r}: expected static, adaptive[:fresh,prior=A,weight=W,optimism=O], "
                     f"by-batch:[[lo,hi,k],...] or by-batch:RUN/advice.json")


def choice_columns(spelling: str, totals: dict, times: dict, rounds: int) -> dict:
    """The spec policy's spelling and choices from summed counts and step timers: sequence-rounds
    by the draft length it allowed, its k = 0 share, its own time per round (start-up apart)."""
    hist = [int(h) for h in totals.get("k_chosen_hist", [])]
    n = sum(hist)
    return {"spec_policy": spelling, "k_chosen_hist": ";".join(str(h) for h in hist),
            "k0_share": hist[0] / n if n else math.nan,
            "policy_ms_per_round": (times["policy"] - times["policy_startup"]) / rounds if rounds else math.nan,
            "policy_startup_ms": times["policy_startup"]}
