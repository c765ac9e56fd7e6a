"""SPECNATIVE_BATCH_INVARIANT=ON promises logits that do not depend on the batch shape (CPU,
flash attention off, one KV stream per sequence). Checked bit for bit on a tiny model whose widths
let K-quants reach every matrix; skipped in a default build, which makes no such promise
(bench/batch_invariance.py measures how far it is off)."""
from __future__ import annotations

import numpy as np
import pytest

import specnative
from specnative import Engine
from specnative.models import write_tiny_llama

INVARIANT = "SPECNATIVE_BATCH_INVARIANT=ON" in specnative.build_info()["build_flags"]
pytestmark = pytest.mark.skipif(not INVARIANT, reason="not a SPECNATIVE_BATCH_INVARIANT=ON build")


@pytest.fixture(scope="module")
def k_quant_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("invariant")
    f32 = write_tiny_llama(directory / "tiny-256.gguf", n_embd=256, n_ff=512)
    return specnative.quantize(f32, directory / "tiny-256-Q4_K_M.gguf", "Q4_K_M")


def test_build_flags_name_the_switches():
    flags = specnative.build_info()["build_flags"]
    for switch in ("GGML_LLAMAFILE=OFF", "GGML_CPU_REPACK=OFF", "GGML_CPU_TILED_MM=0"):
        assert switch in flags


TEXT = "Dear team, following our meeting on Tuesday I would like to summarise the decisions"


def test_one_token_step_equals_the_same_position_in_a_batch(k_quant_model):
    # Prompts of 8..15 tokens: the K-quant tiled kernel (>= 8 rows) groups rows differently for
    # each length, which is where a build that keeps it differs (0.16 at 8 rows on this model).
    with Engine(k_quant_model, n_threads=1) as engine:
        text = engine.tokenize(TEXT).tolist()
        for n in range(8, 16):
            prompt = text[:n]
            generated = engine.generate([prompt], n_predict=1, stop_at_eos=False).tokens[0].tolist()
            step = np.asarray(engine.pending_logits(0))                  # 1-token step on the cache
            batch = np.asarray(engine.prompt_logits(prompt + generated))  # one prefill batch
            assert np.array_equal(step, batch), f"prompt of {n} tokens"


def test_other_sequences_in_the_step_change_nothing(k_quant_model):
    prompts = ["The city of", "Once upon a time there was a", "Hello", "A B C D E F G H I J"]
    with Engine(k_quant_model, n_threads=1, n_seq_max=4, kv_unified=False) as engine:
        alone = engine.generate(prompts[:1], n_predict=9, stop_at_eos=False).tokens[0].tolist()
        step = np.asarray(engine.pending_logits(0))
        together = engine.generate(prompts, n_predict=9, stop_at_eos=False)  # 4-row steps
        assert together.tokens[0].tolist() == alone
        assert np.array_equal(step, np.asarray(engine.pending_logits(0)))
