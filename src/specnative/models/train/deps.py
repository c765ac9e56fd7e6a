"""Everything the trainer takes from outside the standard library, numpy and gguf, in one place.

torch is an optional extra: importing the package never imports it, and every torch-using entry
point asks for it through `torch()`, which turns a missing install into one clear message.
"""
from __future__ import annotations

from specnative.engine import Engine
from specnative.models.tiny import tiny_vocab, write_tiny_llama
from specnative.run import workloads as workloads_module
from specnative.run.workloads import public_sets as public_sets_module

TORCH_HINT = "needs torch (the [train] extra), which is not installed: python -m pip install 'torch>=2.1'"


class MissingTorch(RuntimeError):
    """torch is not installed (the optional `train` extra)."""


def torch():
    """The torch module, or MissingTorch with the install hint."""
    try:
        import torch as module  # the optional [train] extra: imported only by the steps that train
    except ImportError:
        raise MissingTorch(TORCH_HINT) from None
    return module


def engine_class():
    """specnative's public Engine (llama.cpp in-process)."""
    return Engine


def workloads():
    """specnative.run.workloads: the built-in prompt suite, prompt files, public sets and chat rendering."""
    return workloads_module


def public_sets():
    """specnative.run.workloads.public_sets: the pinned public sets (MT-Bench, ShareGPT, HumanEval)."""
    return public_sets_module


def tiny_models():
    """(write_tiny_llama, tiny_vocab): the tiny deterministic llama target factory."""
    return write_tiny_llama, tiny_vocab
