"""The baseline engine (spec off): loading, determinism, seeded sampling, timers, bad input."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from conftest import ENGINE_KW, PROMPTS, assert_lossless_verdict, native_call_events

from specnative import Engine
from specnative.models import write_tiny_llama


def test_loads_and_describes_the_model(noisy_engine):
    info = noisy_engine.target_info
    assert info["n_vocab"] == 1024 and info["n_layer"] == 2
    assert "F32" in info["ftype"]


def test_greedy_generation_is_deterministic_and_printable(noisy_engine):
    first = noisy_engine.generate(PROMPTS, n_predict=24)
    second = noisy_engine.generate(PROMPTS, n_predict=24)
    for a, b in zip(first.tokens, second.tokens):
        assert a.dtype == np.int32 and len(a) == 24
        np.testing.assert_array_equal(a, b)
    assert all(text.strip() and text.isprintable() for text in first.texts)
    assert first.steps == 23 and first.decode_tokens == 3 * 23


def test_each_sequence_decodes_as_if_alone(noisy_engine):
    together = noisy_engine.generate(PROMPTS, n_predict=16)
    alone = [noisy_engine.generate([prompt], n_predict=16).tokens[0] for prompt in PROMPTS]
    # 1 row per decode vs 3: the same greedy choices up to batch-shape near-ties (conftest)
    assert_lossless_verdict(noisy_engine, PROMPTS, together.tokens, alone, k=1)


def test_token_prompts_equal_text_prompts(noisy_engine):
    ids = noisy_engine.tokenize(PROMPTS[0])
    as_text = noisy_engine.generate(PROMPTS[0], n_predict=8)
    as_array = noisy_engine.generate(ids, n_predict=8)
    as_list = noisy_engine.generate([ids.tolist()], n_predict=8)
    np.testing.assert_array_equal(as_text.tokens[0], as_array.tokens[0])
    np.testing.assert_array_equal(as_text.tokens[0], as_list.tokens[0])


def test_sampling_is_reproducible_by_seed(noisy_engine):
    a = noisy_engine.generate(PROMPTS, n_predict=24, temperature=0.9, seed=7)
    b = noisy_engine.generate(PROMPTS, n_predict=24, temperature=0.9, seed=7)
    c = noisy_engine.generate(PROMPTS, n_predict=24, temperature=0.9, seed=8)
    greedy = noisy_engine.generate(PROMPTS, n_predict=24)
    for x, y in zip(a.tokens, b.tokens):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(a.tokens, c.tokens))
    assert any(not np.array_equal(x, g) for x, g in zip(a.tokens, greedy.tokens))


def test_timers_account_for_wall_time(noisy_engine):
    result = noisy_engine.generate(PROMPTS, n_predict=32)
    t = result.times
    steps = t["prefill_target"] + t["decode"]
    assert t["decode"] > 0 and t["prefill_target"] > 0
    assert steps <= t["total"] * 1.0001
    assert steps >= 0.99 * t["total"]
    assert result.step_ms == pytest.approx(t["decode"] / result.steps)
    assert result.tps == pytest.approx(result.decode_tokens / (t["decode"] / 1000))


def test_long_prompt_is_chunked_to_n_batch(noisy_pair):
    target, _ = noisy_pair
    prompt = (np.arange(300) % 700 + 300).tolist()  # 300 tokens, n_batch 64
    with Engine(target, **ENGINE_KW, n_ctx=1024, n_batch=64, n_seq_max=2) as small, \
            Engine(target, **ENGINE_KW, n_ctx=1024, n_batch=512, n_seq_max=2) as large:
        chunked = small.generate([prompt, prompt[:-5]], n_predict=8)
        whole = large.generate([prompt, prompt[:-5]], n_predict=8)
        np.testing.assert_allclose(small.prompt_logits(prompt), large.prompt_logits(prompt),
                                   rtol=1e-4, atol=1e-4)
        # prefill chunks of another size: the same choices up to batch-shape near-ties (conftest)
        assert_lossless_verdict(large, [prompt, prompt[:-5]], whole.tokens, chunked.tokens, k=1)


def test_repeated_long_prefix_is_not_prefilled_again(noisy_engine):
    prefix = (np.arange(1000) % 700 + 300).tolist()
    prompts = [prefix + [400 + i] for i in range(4)]
    fed = noisy_engine._core._target_prompt_tokens_fed
    noisy_engine.generate(["Something else entirely"], n_predict=4)  # the cache holds other prompts
    before = fed()
    first = noisy_engine.generate(prompts, n_predict=8)
    after_first = fed()
    second = noisy_engine.generate(prompts, n_predict=8)
    # the shared 1000 tokens once and each sequence's own token; then the suffixes alone
    assert after_first - before == 1000 + 4
    assert fed() - after_first == 4
    # the prompts' cells and last logits are a prefill's either way: the same tokens
    assert_lossless_verdict(noisy_engine, prompts, first.tokens, second.tokens, k=1)


# --- bad input -------------------------------------------------------------------------------
def test_missing_model_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        Engine(tmp_path / "nope.gguf")


def test_non_gguf_file(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"this is not a model" * 10)
    with pytest.raises(ValueError, match="GGUF"):
        Engine(bogus)


@pytest.mark.parametrize("prompts, kwargs, message", [
    ([""], {}, "empty"),
    ([[]], {}, "empty"),
    ([], {}, "prompts"),
    (PROMPTS, {"n_predict": 0}, "n_predict"),
    (PROMPTS, {"n_predict": -3}, "n_predict"),
    (["x"] * 9, {}, "n_seq_max"),
    (["The"], {"n_predict": 5000}, "context"),
    ([[5, 99999]], {}, "vocabulary"),
    (PROMPTS, {"temperature": -1.0}, "temperature"),
    (PROMPTS, {"accept_rule": "bogus"}, "accept_rule"),
    (PROMPTS, {"seed": -1}, "seed"),
])
def test_bad_generate_arguments_raise(noisy_engine, prompts, kwargs, message):
    with pytest.raises(ValueError, match=message):
        noisy_engine.generate(prompts, **kwargs)


def test_context_overflow_over_all_sequences(noisy_pair):
    target, _ = noisy_pair
    with Engine(target, **ENGINE_KW, n_ctx=256, n_seq_max=4) as engine:
        engine.generate(["The"], n_predict=200)  # fits alone
        with pytest.raises(ValueError, match="KV cells"):
            engine.generate(["The", "A", "Hello", "So"], n_predict=200)


def test_bad_engine_arguments_raise(noisy_pair):
    target, _ = noisy_pair
    with pytest.raises(ValueError, match="n_seq_max"):
        Engine(target, n_seq_max=0)
    with pytest.raises(ValueError, match="flash_attn"):
        Engine(target, flash_attn="sometimes")


def test_closed_engine_refuses_work(noisy_pair):
    engine = Engine(noisy_pair[0], **ENGINE_KW, n_ctx=256, n_seq_max=1)
    engine.close()
    with pytest.raises(ValueError, match="closed"):
        engine.generate("The", n_predict=4)


# --- the GIL and Ctrl-C ----------------------------------------------------------------------
def test_generate_releases_the_gil(noisy_engine):
    """Another thread runs while generate() decodes: woken as the call begins, it finds the call
    still running. Were the GIL held through the call, it would run only after (conftest's events)."""
    seen = {}
    with native_call_events(noisy_engine) as (entered, left):
        def watch():
            entered.wait()
            seen["during"] = not left.is_set()

        watcher = threading.Thread(target=watch)
        watcher.start()
        result = noisy_engine.generate(PROMPTS, n_predict=100)
        watcher.join()
    assert result.decode_tokens == 3 * 99
    assert seen == {"during": True}


def test_ctrl_c_interrupts_a_long_generate(model_dir):
    deep = write_tiny_llama(model_dir / "deep-interrupt.gguf", extra_layers=6)
    # a non-interactive shell may start us with SIGINT ignored; Ctrl-C must reach Python here
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    with Engine(deep, **ENGINE_KW, n_ctx=8 * 3072, n_seq_max=8) as engine:
        fed = engine._core._target_prompt_tokens_fed()
        try:
            with native_call_events(engine) as (entered, _):
                # the signal comes once the call has begun (no timer to outlast), minutes before it could end
                sender = threading.Thread(target=lambda: (entered.wait(), os.kill(os.getpid(), signal.SIGINT)))
                sender.start()
                with pytest.raises(KeyboardInterrupt):
                    engine.generate(["The"] * 8, n_predict=3000)
                sender.join()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert engine._core._target_prompt_tokens_fed() > fed  # stopped inside the call, after its prefill
        # the engine is still usable afterwards
        assert len(engine.generate("The", n_predict=4).tokens[0]) == 4


def test_margins_are_recorded_only_on_request(noisy_engine):
    plain = noisy_engine.generate(PROMPTS, n_predict=12)
    assert all(len(m) == 0 for m in plain.margins)
    for spec in (False, True):
        result = noisy_engine.generate(PROMPTS, n_predict=12, spec=spec, record_margins=True)
        for tokens, margins in zip(result.tokens, result.margins):
            assert len(margins) == len(tokens) and np.all(margins >= 0)
        if spec:  # verify batches: up to batch-shape near-ties (conftest)
            assert_lossless_verdict(noisy_engine, PROMPTS, plain.tokens, result.tokens, k=4)
        else:
            np.testing.assert_array_equal(result.tokens[0], plain.tokens[0])
