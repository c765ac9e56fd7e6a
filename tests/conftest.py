"""Shared fixtures: tiny generated models (written once per test session) and engines."""
from __future__ import annotations

import pytest

from specnative import Engine
from specnative.models import tiny_pair

PROMPTS = ["The city of", "Once upon a time there was a", "Hello"]


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
    with Engine(target, draft, n_ctx=4096, n_batch=256, n_seq_max=8, n_threads=1) as engine:
        yield engine


@pytest.fixture(scope="session")
def copy_engine(copy_pair):
    target, draft = copy_pair
    with Engine(target, draft, n_ctx=2048, n_batch=256, n_seq_max=4, n_threads=1) as engine:
        yield engine
