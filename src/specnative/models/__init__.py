"""Models specnative runs without the user bringing files: tiny deterministic GGUF models for tests
and the default sweep (tiny.py), tiny hidden-state drafters (tiny_drafters.py), and the presets
(presets.py: the tiny pair, Gemma 3 270M and the Qwen2.5-Coder pair, fetched pinned and hashed).
"""
from specnative.models.tiny import (
                                    EOS_ID,
                                    FIRST_NORMAL_ID,
                                    FORCE_LOGIT,
                                    FORCED_TOKEN,
                                    tiny_pair,
                                    tiny_vocab,
                                    write_tiny_llama,
)

__all__ = ["EOS_ID", "FIRST_NORMAL_ID", "FORCE_LOGIT", "FORCED_TOKEN", "tiny_pair", "tiny_vocab", "write_tiny_llama"]
