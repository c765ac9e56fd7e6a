"""Every preset by name: what `--preset NAME` loads, and the sweep flags each is sized for (known
before any file is built or fetched)."""
from __future__ import annotations

from specnative.models import presets, smollm2

PRESETS = {"tiny": presets.tiny_preset, "gemma3-270m": presets.gemma_preset, "qwen2.5-coder": presets.qwen_preset,
           "smollm2": smollm2.smollm2_preset}
PRESET_DEFAULTS = {**presets.PRESET_DEFAULTS, "smollm2": smollm2.DEFAULTS}


def load_preset(name: str) -> presets.Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]()
