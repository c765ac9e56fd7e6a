"""What one generate() call decodes: the DecodeSpec, checked field by field, and the native
core's GenerateParams it becomes (the one path from Python to the engine's decoding loops).

    spec = DecodeSpec(n_predict=64, spec=True, k=4)
    engine.generate(prompts, spec)                 # or engine.generate(prompts, n_predict=64, spec=True, k=4)
    engine.generate(prompts, spec, temperature=0.8)  # fields given beside a spec replace its own

A bad field is one ValueError naming it, raised when the spec is made (dataclasses.replace checks
again). Fields are kept in their checked form: drafter in our spelling (draft-simple -> model),
drafter_options by llama.cpp's CLI names, draft_shape as a DraftShape, numbers as int/float.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specnative import _core
from specnative.engine import synthetic
from specnative.engine.draft_shape import TREE_DRAFTERS, DraftShape
from specnative.engine.draft_shape import parse as parse_draft_shape
from specnative.engine.drafters import check_draft_p_min, checked_drafter_options, drafter_name
from specnative.engine.spec_policy import SpecPolicy
from specnative.engine.spec_policy import parse as parse_spec_policy

ACCEPT_RULES = ("greedy", "match", "rejection")
_INT32 = (-2**31, 2**31)


def _c_int(value, name: str) -> int:
    """An integer argument for the C++ core: out-of-range values are a ValueError here rather
    than a TypeError from the binding."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    if not _INT32[0] <= int(value) < _INT32[1]:
        raise ValueError(f"{name}={value} is out of range")
    return int(value)


def _seed(value) -> int:
    """An integer seed in [0, 2**64): 1.7 or "3" are refused, not truncated or parsed."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"seed must be an integer in [0, 2**64), not {value!r}")
    if not 0 <= int(value) < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), not {value}")
    return int(value)


def _temperature(value) -> float:
    """A temperature as a number (the core checks its range): a string such as '0.5' is refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"temperature must be a number, not {value!r}")
    return float(value)


def synthetic_probabilities(profile, k: int, spec: bool) -> list[float]:
    """The probability the engine keeps each of the k draft positions with (given the earlier ones
    were kept) under a synthetic acceptance profile; [] for None (the acceptance rule decides)."""
    if profile is None:
        return []
    if not spec:
        raise ValueError("synthetic acceptance applies to speculative runs (spec=True)")
    if not isinstance(profile, synthetic.Profile):
        profile = synthetic.parse_profile(profile)
    return profile.conditional(k)


@dataclass(frozen=True)
class DecodeSpec:
    """The decoding settings of one generate() call (Engine.generate documents each field)."""

    n_predict: int = 32
    temperature: float = 0.0
    seed: int = 0
    spec: bool = False
    k: int = 4
    accept_rule: str = "greedy"
    stop_at_eos: bool = True
    record_margins: bool = False
    drafter: str = "model"
    drafter_options: dict = field(default_factory=dict)
    draft_p_min: float = 0.0
    draft_temperature: float | None = None
    drafter_settings: bool = False
    record_pit: bool = False
    prefix_cache: bool = True
    synthetic: object = None  # a synthetic.Profile or its text
    prefix_limit: int | None = None
    draft_shape: DraftShape | str | None = None
    spec_policy: SpecPolicy | str | None = None  # engine/spec_policy.py; None: static

    def __post_init__(self):
        put = object.__setattr__  # frozen: each field is stored once, in its checked form
        put(self, "draft_p_min", check_draft_p_min(self.draft_p_min))  # range and drafter in C++ too
        if self.accept_rule not in ACCEPT_RULES:
            raise ValueError(f"accept_rule must be one of {ACCEPT_RULES}, not {self.accept_rule!r}")
        put(self, "seed", _seed(self.seed))
        put(self, "temperature", _temperature(self.temperature))
        if self.draft_temperature is not None:  # what it applies to, said before the value (the core checks both)
            if not _temperature(self.draft_temperature) > 0:
                raise ValueError(f"draft_temperature must be > 0 (None: the generation temperature), "
                                 f"not {self.draft_temperature!r}")
            if drafter_name(self.drafter) != "model":
                raise ValueError(f"draft_temperature applies to the draft model (drafter 'model'); drafter "
                                 f"{self.drafter!r} has no draft distribution to sample at another temperature")
            if not self.temperature > 0:
                raise ValueError("draft_temperature applies when sampling (temperature > 0); at temperature 0 "
                                 "the draft model proposes greedily")
            put(self, "draft_temperature", _temperature(self.draft_temperature))
        if self.record_pit and not (self.spec and self.accept_rule == "rejection" and self.temperature > 0):
            raise ValueError("record_pit applies to the rejection rule when sampling (spec=True, temperature > 0)")
        put(self, "n_predict", _c_int(self.n_predict, "n_predict"))
        put(self, "k", _c_int(self.k, "k"))
        put(self, "drafter", drafter_name(self.drafter))
        put(self, "drafter_options", checked_drafter_options(self.drafter, self.drafter_options))
        synthetic_probabilities(self.synthetic, self.k, self.spec)  # refused here, kept as given
        limit = self.prefix_limit
        if limit is not None and (isinstance(limit, (bool, np.bool_)) or not isinstance(limit, (int, np.integer))
                                  or limit < 0):
            raise ValueError(f"prefix_limit must be an integer >= 0 (None: the whole common prefix), "
                             f"not {limit!r}")
        if limit is not None:
            put(self, "prefix_limit", _c_int(limit, "prefix_limit"))
        shape = parse_draft_shape(self.draft_shape)
        if shape.is_tree and self.spec and self.drafter not in TREE_DRAFTERS:
            raise ValueError(f"a draft tree is drafted by the draft model (drafter 'model') or an EAGLE-3 head "
                             f"(drafter 'eagle3'), not {self.drafter!r}")
        put(self, "draft_shape", shape)
        policy = parse_spec_policy(self.spec_policy)
        if not policy.is_static:
            if not self.spec:
                raise ValueError(f"spec_policy {policy.text!r} applies to speculative runs (spec=True)")
            if shape.is_tree:
                raise ValueError(f"spec_policy {policy.text!r} applies to chains: a draft tree drafts its whole "
                                 f"shape every round")
            policy.check_k(self.k)
        put(self, "spec_policy", policy)
        for name in ("spec", "stop_at_eos", "record_margins", "drafter_settings", "record_pit", "prefix_cache"):
            put(self, name, bool(getattr(self, name)))

    def core_params(self) -> _core.GenerateParams:
        """The native core's GenerateParams (a bound C++ struct) for this spec."""
        p = _core.GenerateParams()
        p.n_predict = self.n_predict
        p.temperature = self.temperature
        p.seed = self.seed
        p.spec = self.spec
        p.k = self.k
        p.rule = getattr(_core.AcceptRule, self.accept_rule)
        p.stop_at_eog = self.stop_at_eos
        p.record_margins = self.record_margins
        p.drafter.type = self.drafter
        p.drafter.options = dict(self.drafter_options)
        p.draft_p_min = self.draft_p_min
        p.draft_temperature = 0.0 if self.draft_temperature is None else self.draft_temperature  # 0: the same
        p.drafter_settings = self.drafter_settings
        p.record_pit = self.record_pit
        p.reuse_prompts = self.record_pit  # a distributional-test run: its prefill is no measurement
        p.prefix_cache = self.prefix_cache
        p.prefix_limit = -1 if self.prefix_limit is None else self.prefix_limit
        p.synthetic = synthetic_probabilities(self.synthetic, self.k, self.spec)
        if not self.spec_policy.is_static:
            self.spec_policy.fill_core(p.policy)
        if self.spec and self.draft_shape.is_tree:  # a baseline has no tree
            self.draft_shape.fill_core(p.tree)
        return p
