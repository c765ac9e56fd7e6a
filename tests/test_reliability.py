"""Misuse must not crash the interpreter or lose a result: threads sharing an engine,
parameter combinations llama.cpp would abort on, non-UTF-8 output, draft vocabularies of another
size, prompts of the wrong shape. Whatever could crash runs in a subprocess, so that a crash
fails the test instead of killing pytest."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest
from conftest import ENGINE_KW, PROMPTS, assert_lossless_verdict

from specnative import Engine
from specnative.models import write_tiny_llama

BYTE_E4 = 3 + 0xE4  # the tiny vocabulary's byte token <0xE4>: a UTF-8 lead byte, never valid alone


def run_isolated(code: str, timeout: float = 90) -> str:
    """Runs `code` in a fresh interpreter; a signal (SIGSEGV, SIGABRT) or an exception fails the
    test with its output. Returns stdout."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode < 0:
        pytest.fail(f"the interpreter died with signal {-proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def byte_model(model_dir):
    """The tiny target with the byte token <0xE4> made the overwhelming favourite: every
    generated token is that byte, so no generated text is valid UTF-8."""
    path = model_dir / "byte-e4.gguf"
    if not path.exists():
        source = write_tiny_llama(model_dir / "byte-e4-source.gguf")
        shutil.copy(source, path)
        reader = gguf.GGUFReader(path, "r+")
        output = next(t for t in reader.tensors if t.name == "output.weight").data
        output[BYTE_E4, :] = 0.0
        output[BYTE_E4, 0] = 50.0  # reads the constant residual channel: a large logit everywhere
        del output, reader
    return path


@pytest.fixture(scope="module")
def byte_engine(byte_model):
    with Engine(byte_model, byte_model, n_ctx=512, n_seq_max=2, **ENGINE_KW) as engine:
        yield engine


# --- threads -----------------------------------------------------------------------------------
def test_threads_sharing_an_engine_are_serialized(noisy_pair):
    target, draft = noisy_pair
    out = run_isolated(f"""
        import threading, time
        import numpy as np
        from specnative import Engine
        engine = Engine({str(target)!r}, {str(draft)!r}, n_ctx=2048, n_batch=256, n_seq_max=4, n_threads=1)
        prompts = ["The city of", "Hello"]
        reference = {{spec: engine.generate(prompts, n_predict=30, spec=spec, k=3).tokens for spec in (False, True)}}
        results, errors = [], []

        def work(spec):
            try:
                for _ in range(4):
                    results.append((spec, engine.generate(prompts, n_predict=30, spec=spec, k=3).tokens))
                    engine.tokenize("more text"), engine.n_ctx
            except Exception as error:
                errors.append(repr(error))

        threads = [threading.Thread(target=work, args=(i % 2 == 1,)) for i in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        assert len(results) == 16
        for spec, tokens in results:  # no run saw another's KV state
            assert all(np.array_equal(a, b) for a, b in zip(tokens, reference[spec]))
        print("serialized ok")
        """)
    assert "serialized ok" in out


def test_close_during_generate_stops_it_and_later_calls_raise(noisy_pair):
    target, draft = noisy_pair
    # The close comes from inside the main thread's run (conftest.inside_native_call, spelled out for
    # a fresh interpreter): its SIGUSR1 handler runs only where that call polls for Ctrl-C, so the
    # close finds it running. An event, not a sleep.
    out = run_isolated(f"""
        import os, signal, sys, threading
        from specnative import Engine
        engine = Engine({str(target)!r}, {str(draft)!r}, n_ctx=2048, n_batch=256, n_seq_max=4, n_threads=1)
        outcome = {{}}
        entered, inside, core = threading.Event(), threading.Event(), engine._core

        class Watched:
            def __getattr__(self, name):
                return getattr(core, name)

            def generate(self, *args, **kwargs):
                if threading.current_thread() is threading.main_thread():
                    entered.set()
                return core.generate(*args, **kwargs)

        engine._core = Watched()
        sys.setswitchinterval(1000.0)  # the signal goes once the main run has released the GIL in C++
        signal.signal(signal.SIGUSR1, lambda *args: inside.set())

        def long_run(spec):
            try:
                outcome[spec] = engine.generate(["The"] * 4, n_predict=480, spec=spec, k=3)
            except Exception as error:
                outcome[spec] = error

        other = threading.Thread(target=long_run, args=(True,))

        def closer():
            entered.wait()
            other.start()           # a second run, queued behind the main thread's
            os.kill(os.getpid(), signal.SIGUSR1)
            inside.wait()
            engine.close()          # returns only once no call runs

        runs = [threading.Thread(target=closer)]
        runs[0].start()
        long_run(False)
        runs.append(other)
        for t in runs: t.join(timeout=30)
        assert not any(t.is_alive() for t in runs)
        for spec, result in outcome.items():
            # stopped mid-way (RuntimeError), refused (closed first), or finished before close
            assert isinstance(result, (RuntimeError, ValueError)) or result.decode_tokens > 0, result
            print(spec, type(result).__name__, result if isinstance(result, Exception) else "finished")
        assert isinstance(outcome[False], RuntimeError) and "closed" in str(outcome[False])  # stopped mid-way
        for call in (lambda: engine.generate("The", n_predict=2), lambda: engine.tokenize("x"),
                     lambda: engine.prompt_logits([5, 6]), lambda: engine.n_ctx, engine.close):
            try:
                call()
            except ValueError as error:
                assert "closed" in str(error)
            else:
                assert call == engine.close  # closing twice is harmless
        print("close ok")
        """)
    assert "close ok" in out


def test_close_from_a_signal_handler_during_generate(noisy_pair):
    # the handler runs on the generating thread itself, while generate() polls for Ctrl-C
    out = run_isolated(f"""
        import signal
        from specnative import Engine
        engine = Engine({str(noisy_pair[0])!r}, n_ctx=2048, n_batch=256, n_seq_max=4, n_threads=1)
        signal.signal(signal.SIGALRM, lambda *args: engine.close())
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        try:
            for _ in range(200):  # each call ~0.2 s here: the alarm lands inside one on any machine
                engine.generate(["The"] * 4, n_predict=480)
        except RuntimeError as error:
            assert "closed" in str(error)
            print("stopped")
        signal.setitimer(signal.ITIMER_REAL, 0)  # never a late alarm at interpreter exit
        try:
            engine.tokenize("x")
        except ValueError as error:
            print("closed:", error)
        """, timeout=60)
    assert "stopped" in out and "closed: the engine is closed" in out


# --- parameters llama.cpp would abort on -----------------------------------------------------------
def test_combinations_llama_cpp_asserts_on_are_refused(noisy_pair):
    target, draft = noisy_pair
    out = run_isolated(f"""
        from specnative import Engine
        T, D = {str(target)!r}, {str(draft)!r}

        def refused(make, needle):
            try:
                make()
            except ValueError as error:
                assert needle in str(error), error
                print("refused:", error)
            else:
                raise AssertionError("accepted: " + needle)

        refused(lambda: Engine(T, n_ctx=256, n_batch=2, n_seq_max=4, n_threads=1), "n_seq_max")
        refused(lambda: Engine(T, n_ctx=16, n_batch=512, n_seq_max=32, n_threads=1), "capped at n_ctx")
        with Engine(T, D, n_ctx=256, n_batch=64, n_seq_max=2, n_threads=1) as engine:
            refused(lambda: engine.prompt_logits([]), "empty")
            refused(lambda: engine.generate([[]], n_predict=2), "empty")
            refused(lambda: engine.generate("The", n_predict=2, spec=True, k=2**31 - 1), "k=")
            refused(lambda: engine.generate("The", n_predict=2**31), "n_predict")
            refused(lambda: engine.pending_logits(0), "no sequence")
        # n_batch above n_ctx: llama.cpp caps it at n_ctx; a prompt longer than the cap is chunked
        with Engine(T, n_ctx=16, n_batch=512, n_seq_max=1, n_threads=1) as engine:
            result = engine.generate([list(range(300, 400))], n_predict=4)
            assert len(result.tokens[0]) == 4
        print("all refused")
        """)
    assert "all refused" in out


# --- texts never cost the measurement --------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    {}, {"temperature": 1.0, "seed": 3}, {"spec": True, "k": 3},
    {"spec": True, "k": 3, "temperature": 1.0, "accept_rule": "rejection"},
])
def test_non_utf8_output_keeps_tokens_counts_and_timers(byte_engine, kwargs):
    result = byte_engine.generate(["The city of", "Hello"], n_predict=7, **kwargs)
    for tokens, text in zip(result.tokens, result.texts):
        assert tokens.tolist() == [BYTE_E4] * 7
        assert text == "\ufffd" * 7  # each lone lead byte decodes to U+FFFD
    assert result.decode_tokens == 2 * 6 and result.tps > 0
    if kwargs.get("spec"):
        assert result.totals["drafted"] > 0


def test_detokenize_replaces_a_character_cut_in_the_middle(noisy_engine):
    euro = [3 + b for b in "€".encode()]  # three byte tokens
    assert noisy_engine.detokenize(euro) == "€"
    assert noisy_engine.detokenize(euro[:2]) == "\ufffd"
    ids = noisy_engine.tokenize("Hello", add_special=False).tolist()
    assert noisy_engine.detokenize(ids + euro[:1]).startswith("Hello")


# --- vocabularies of another size: refused at load, both directions --------------------------------
@pytest.mark.parametrize("target_vocab, draft_vocab, word", [(960, None, "larger"), (None, 960, "smaller")])
def test_draft_vocabulary_of_another_size_is_refused_at_load(model_dir, target_vocab, draft_vocab, word):
    target = write_tiny_llama(model_dir / f"vocab-t{target_vocab}.gguf", n_vocab=target_vocab)
    draft = write_tiny_llama(model_dir / f"vocab-d{draft_vocab}.gguf", n_vocab=draft_vocab)
    with pytest.raises(ValueError, match=f"draft vocabulary .* is {word} than the target's"):
        Engine(target, draft, n_ctx=256, **ENGINE_KW)


def test_a_model_without_a_tokenizer_is_refused_at_load(model_dir, monkeypatch):
    # llama.cpp's tokenizer and vocabulary queries GGML_ASSERT on a "no_vocab" model
    writer = gguf.GGUFWriter
    add_model = writer.add_tokenizer_model
    monkeypatch.setattr(writer, "add_tokenizer_model", lambda self, name: add_model(self, "no_vocab"))
    for name in ("add_token_list", "add_token_scores", "add_token_types", "add_unk_token_id",
                 "add_bos_token_id", "add_eos_token_id", "add_add_bos_token", "add_add_eos_token",
                 "add_add_space_prefix"):
        monkeypatch.setattr(writer, name, lambda self, *args, **kwargs: None)
    path = write_tiny_llama(model_dir / "no-vocab.gguf")
    monkeypatch.undo()
    out = run_isolated(f"""
        from specnative import Engine
        for draft in (None, {str(path)!r}):
            try:
                Engine({str(path)!r}, draft, n_ctx=256, n_threads=1)
            except ValueError as error:
                assert "no tokenizer" in str(error), error
                print("refused")
        """)
    assert out.split() == ["refused", "refused"]


# --- prompt shapes ----------------------------------------------------------------------------------
def test_a_2d_array_is_one_prompt_per_row(noisy_engine):
    rows = np.array([[300, 301, 302], [310, 311, 312]], dtype=np.int64)
    assert noisy_engine.to_token_prompts(rows) == rows.tolist()
    assert noisy_engine.to_token_prompts(rows[0]) == [rows[0].tolist()]
    together = noisy_engine.generate(rows, n_predict=5)
    assert len(together.tokens) == 2
    alone = noisy_engine.generate(rows[1], n_predict=5).tokens[0]
    assert_lossless_verdict(noisy_engine, rows[1:].tolist(), [together.tokens[1]], [alone], k=1)  # conftest


@pytest.mark.parametrize("prompts, message", [
    (np.zeros((2, 2, 2), dtype=np.int32), "3-D"),
    ([True, False, True], "integer token ids"),
    (np.array([True, False]), "integer token ids"),
    ([[300, True]], "integer token ids"),
    (np.array([300.0, 301.0]), "integer token ids"),
    ([[[300, 301]]], "1-D"),
    ([[300, 2**40]], "outside the vocabulary"),
    (["a\ud800"], "UTF-8"),
])
def test_malformed_prompts_are_refused(noisy_engine, prompts, message):
    with pytest.raises(ValueError, match=message):
        noisy_engine.generate(prompts, n_predict=2)


def test_out_of_range_integers_are_value_errors(noisy_engine):
    for kwargs, message in [({"n_predict": 2**40}, "n_predict=1099511627776 is out of range"),
                            ({"k": 2**33, "spec": True}, "k=8589934592 is out of range"),
                            ({"seed": 2**64}, r"seed must be in \[0, 2\*\*64\)"),
                            ({"n_predict": True}, "n_predict must be an integer, not True"),
                            ({"temperature": 1e-45}, "too small to sample with"),
                            ({"temperature": 1e39}, "temperature must be a finite number"),
                            ({"temperature": float("nan")}, "temperature must be a finite number")]:
        with pytest.raises(ValueError, match=message):
            noisy_engine.generate(PROMPTS[0], **kwargs)
    for ids in ([99999], [-1], [300, 2**40]):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            noisy_engine.detokenize(ids)


def test_out_of_range_engine_sizes_are_value_errors(noisy_pair):
    with pytest.raises(ValueError, match="n_ctx"):
        Engine(noisy_pair[0], n_ctx=2**40, **ENGINE_KW)
