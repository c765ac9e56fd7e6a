"""Training hidden-state drafters for a target, on CPU with torch (the optional `train` extra).

train-drafter self-distills a llama-architecture GGUF target (its own greedy continuations by
llama.cpp, its layer inputs by a torch re-implementation checked against llama.cpp), trains an
EAGLE-3 head (with a training-time test) or a DFlash block drafter through one training loop, and
writes it in the GGUF format llama.cpp's draft-eagle3 or draft-dflash loads. Importing this package
does not import torch.
"""
from .deps import TORCH_HINT, MissingTorch
from .target_check import TargetError, check_target

__all__ = ["TORCH_HINT", "MissingTorch", "TargetError", "check_target"]
