"""Drafter names and options, checked before llama.cpp sees them: the draft model, llama.cpp's
model-free n-gram drafters (their options and defaults at the pinned commit) and the hidden-state
drafters; the draft model's stop rule p_min."""
from __future__ import annotations

import os

import numpy as np

from specnative import _core

# "model" (the draft GGUF) and llama.cpp's model-free n-gram drafters by their --spec-type names
# (an extension built before the drafters knows only "model")
DRAFTERS = tuple(getattr(_core, "drafter_names", ["model"]))


# llama.cpp's drafters that read the target's hidden states (its --spec-type names without "draft-")
HIDDEN_DRAFTERS = ("dflash", "dspark", "eagle3", "mtp")


def drafter_name(name: str) -> str:
    """Our spelling of a drafter: llama.cpp's --spec-type names are accepted too (draft-dflash ->
    dflash, draft-simple -> model)."""
    if not isinstance(name, str):
        raise ValueError(f"drafter must be a string, not {name!r}")
    if name == "draft-simple":
        return "model"
    return name[len("draft-"):] if name.startswith("draft-") else name


def check_draft_p_min(value) -> float:
    """draft_p_min as a float in [0, 1) (0 = off), or ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"draft_p_min must be a number in [0, 1), not {value!r}")
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"draft_p_min must be a number in [0, 1), not {value!r}") from None
    if not 0.0 <= p < 1.0:  # NaN fails too
        raise ValueError(f"draft_p_min must be in [0, 1) (0 = off), not {value!r}")
    return p


def drafter_defaults() -> dict:
    """llama.cpp's n-gram drafter options (CLI names without dashes, e.g. spec-ngram-mod-n-min)
    with their defaults at the pinned commit (common/common.h); empty without its common library."""
    return dict(_core.drafter_defaults()) if hasattr(_core, "drafter_defaults") else {}


def checked_drafter_options(drafter, options) -> dict:
    """{llama.cpp CLI name: value as text}; '--' and underscores are accepted for the name."""
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter must be one of {DRAFTERS}, not {drafter!r}")
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"drafter_options must be a dict, not {type(options).__name__}")
    out = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise ValueError(f"drafter option names are strings, not {name!r}")
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer, str, os.PathLike)):
            raise ValueError(f"drafter option {name} must be an integer or a path, not {value!r}")
        out[name.lstrip("-").replace("_", "-")] = str(os.fspath(value) if isinstance(value, os.PathLike) else value)
    return out


def drafter_options_problem(drafters: list, options: dict) -> str | None:
    """An n-gram option given for a drafter the grid does not run (llama.cpp would ignore it)."""
    for name in sorted(options):
        owner = _core.drafter_of_option(name)
        if owner and owner not in drafters:
            return f"--{name} belongs to drafter {owner}, which --drafter does not include"
    return None


def drafter_options_text(drafter: str, options: dict) -> str | None:
    """traces.csv's drafter_options: llama.cpp's defaults overlaid with the given options."""
    if not drafter.startswith("ngram-"):
        return None
    return ";".join(f"{name}={value}" for name, value in sorted({**drafter_defaults(), **options}.items()))
