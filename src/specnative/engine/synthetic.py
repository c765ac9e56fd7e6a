"""Synthetic acceptance profiles: what a requested acceptance means at each draft position.

A synthetic run keeps each draft with a requested probability instead of by what the target says
(the engine's rule: csrc/core/synthetic.h), to measure what a drafter of that acceptance would pay.
A profile follows llama.cpp's conventions (--spec-synth-rates, --spec-synth-len):

- ``rates:r1/r2/.../rk``: unconditional per-position rates, r_i = P(position i is accepted), finite,
  within [0, 1] and non-increasing; at least k of them (the first k are used).
- ``len:L``: a mean acceptance length L per round, the target's own token included (1 <= L <= k+1),
  turned into the rates r_i = p^i with the one constant p that gives 1 + sum_i p^i = L at k.
- a plain ``a`` (e.g. ``0.7``): a constant conditional rate a at every position, so the
  unconditional rates are r_i = a^i: the i.i.d. per-token alpha of the closed form.

The engine draws position i's decision with the conditional probability r_i / r_{i-1} (r_0 = 1;
0 after a zero rate), as llama.cpp converts its rates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from specnative.analysis import theory


class ProfileError(ValueError):
    """A synthetic acceptance profile that cannot be used (the message names what is wrong)."""


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"synthetic acceptance {what}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ProfileError(f"synthetic acceptance {what} must be finite, not {text!r}")
    return value


@dataclass(frozen=True)
class Profile:
    """One requested acceptance: `text` as written, `kind` alpha / rates / len, its numbers."""
    text: str
    kind: str
    values: tuple

    def rates(self, k: int) -> list[float]:
        """The unconditional per-position rates r_1..r_k at draft length k."""
        if k < 1:
            raise ProfileError("synthetic acceptance needs k >= 1")
        if self.kind == "alpha":
            return [self.values[0] ** i for i in range(1, k + 1)]
        if self.kind == "rates":
            if len(self.values) < k:
                raise ProfileError(f"synthetic acceptance {self.text!r} has {len(self.values)} rates; k = {k} "
                                   f"needs one per draft position")
            return list(self.values[:k])
        length = self.values[0]
        if length > k + 1:
            raise ProfileError(f"synthetic acceptance {self.text!r}: a mean length over k + 1 = {k + 1} cannot be "
                               f"reached at k = {k}")
        p = theory.alpha_for_tokens_per_round(length, k)
        return [p ** i for i in range(1, k + 1)]

    def conditional(self, k: int) -> list[float]:
        """The probability the engine keeps position i with, given positions 1..i-1 were kept."""
        out, previous = [], 1.0
        for rate in self.rates(k):
            out.append(min(1.0, rate / previous) if previous > 0 else 0.0)
            previous = rate
        return out

    def mean_length(self, k: int) -> float:
        """Expected tokens per round at k (the round's target token included): 1 + sum_i r_i."""
        return 1.0 + sum(self.rates(k))

    def alpha(self, k: int) -> float:
        """The constant per-token alpha with this profile's expected tokens per round at k: the
        profile's place on the speedup-against-alpha axis (a plain `a` is a itself)."""
        if self.kind == "alpha":
            return self.values[0]
        return theory.alpha_for_tokens_per_round(self.mean_length(k), k)


def parse_profile(text) -> Profile:
    """A profile from its text (module docstring); ProfileError names what is wrong."""
    raw = str(text).strip()
    if raw.startswith("rates:"):
        parts = [p for p in raw[len("rates:"):].split("/")]
        if not parts or any(not p.strip() for p in parts):
            raise ProfileError(f"synthetic acceptance {raw!r}: give rates as rates:r1/r2/... (one per position)")
        rates = tuple(_number(p.strip(), "rate") for p in parts)
        for r in rates:
            if not 0.0 <= r <= 1.0:
                raise ProfileError(f"synthetic acceptance rates must be within [0, 1], not {r:g} in {raw!r}")
        for a, b in zip(rates, rates[1:]):
            if b > a:
                raise ProfileError(f"synthetic acceptance rates are unconditional per-position rates and must not "
                                   f"increase: {b:g} after {a:g} in {raw!r}")
        return Profile(raw, "rates", rates)
    if raw.startswith("len:"):
        length = _number(raw[len("len:"):].strip(), "length")
        if length < 1.0:
            raise ProfileError(f"synthetic acceptance length counts the round's target token and must be >= 1, "
                               f"not {length:g}")
        return Profile(raw, "len", (length,))
    alpha = _number(raw, "rate")
    if not 0.0 <= alpha <= 1.0:
        raise ProfileError(f"synthetic acceptance rate must be within [0, 1], not {alpha:g}")
    return Profile(raw, "alpha", (alpha,))


def parse_profiles(text: str) -> list[Profile]:
    """A comma-separated list of profiles (the --synthetic-acceptance axis), in order, without repeats:
    two spellings of one profile (0.5 and 0.50) are one, as first written."""
    profiles = [parse_profile(part) for part in str(text).split(",") if part.strip()]
    if not profiles:
        raise ProfileError("--synthetic-acceptance needs at least one profile (e.g. 0.3,0.5,0.7,0.9)")
    seen = set()
    return [p for p in profiles if not ((p.kind, p.values) in seen or seen.add((p.kind, p.values)))]


def rates_text(rates) -> str:
    """Per-position rates as a traces.csv list (';'-separated)."""
    return ";".join(f"{r:.4f}" for r in rates)
