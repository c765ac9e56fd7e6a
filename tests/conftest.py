"""Shared fixtures: tiny generated models (written once per test session) and engines."""
from __future__ import annotations

import os

import pytest

from specnative import Engine
from specnative.models import tiny_pair

PROMPTS = ["The city of", "Once upon a time there was a", "Hello"]
# One thread: robust on a shared 2-core machine. SPECNATIVE_TEST_NGL=-1 runs the suite with every
# layer offloaded to the GPU (bench/gpu_check.sh).
TEST_NGL = int(os.environ.get("SPECNATIVE_TEST_NGL", "0"))
ENGINE_KW = {"n_threads": 1, "n_gpu_layers": TEST_NGL}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def copy_pair(model_dir):
    """Target and an exact copy as draft: every draft token must be accepted."""
    return tiny_pair(model_dir, "copy")


@pytest.fixture(scope="session")
def noisy_pair(model_dir):
    """Draft = target + 3 % weight noise: accepts some drafts, rejects others."""
    return tiny_pair(model_dir, "noisy", noise=0.03)


@pytest.fixture(scope="session")
def noisy_engine(noisy_pair):
    target, draft = noisy_pair
    with Engine(target, draft, n_ctx=4096, n_batch=256, n_seq_max=8, **ENGINE_KW) as engine:
        yield engine


@pytest.fixture(scope="session")
def copy_engine(copy_pair):
    target, draft = copy_pair
    with Engine(target, draft, n_ctx=2048, n_batch=256, n_seq_max=4, **ENGINE_KW) as engine:
        yield engine


def assert_lossless_verdict(engine, prompts, base_tokens, other_tokens, temperature=0.0, seed=0, k=4, drafter=""):
    """Outputs that batch-shape noise may part (a verify batch vs 1-token steps, or sequences decoded
    alone vs together): llama.cpp's logits differ in the last bits between shapes, and how much
    depends on the CPU (CI runs on Intel and AMD hosts), so a near-tie one host keeps can flip on
    another. Such tests assert the lossless verdict, exact or numeric, never fail; strict token
    equality stays where the shapes are the same (a repeat, the batch-invariant build). The noise
    control compares 1-token steps with k+1-token chunks; for outputs parted by the number of rows
    per decode (alone vs together, prefill chunk sizes) k=1 stands for it: 1 row vs several is the
    kernel switch that moves the bits."""
    from specnative import lossless

    control = lossless.measure_noise(engine, prompts, base_tokens, k, drafter,  # a hidden drafter's settings too
                                     temperature=temperature, seed=seed)
    verdict = lossless.judge(engine, prompts, base_tokens, other_tokens, temperature, seed, control)
    assert verdict.verdict in (lossless.EXACT, lossless.NUMERIC), verdict.reason
    return verdict
