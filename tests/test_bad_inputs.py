"""Bad input said in one line, before any work: arguments that
used to raise a traceback, prompt files read as the user wrote them, damaged model files refused
by llama.cpp's loader before the header reader, vocabularies checked for the whole grid, and
generate()'s seed and temperature types."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from test_sweep_safety import argv_for, no_engine

from specnative.models import EOS_ID, write_tiny_llama
from specnative.run import workloads
from specnative.sweep import main


def refused(argv, match: str, out: Path) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    message = str(exc.value.code)
    assert message.startswith("error: ") and match in message, message
    assert not (out / "traces.csv").exists()
    return message


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    (tmp_path / "nul.txt").write_bytes(b"some text\x00with a NUL")
    (tmp_path / "prompts-dir").mkdir()
    (tmp_path / "deep.jsonl").write_text('{"text": ' + "[" * 200_000 + "\n")
    return tmp_path


@pytest.mark.parametrize("extra, match", [
    (["-s", "-1"], "--seed"),
    (["--ci-width", "nan"], "--ci-width"),
    (["--warmup-tol", "nan"], "--warmup-tol"),
    (["--context", "{dir}/binary.txt"], "not UTF-8 text"),
    (["--context", "{dir}/nul.txt"], "NUL bytes"),
    (["--prompts", "{dir}/prompts-dir"], "is a directory"),
    (["--prompts", "{dir}/deep.jsonl"], "nested too deeply"),
])
def test_bad_arguments_are_one_line_before_any_work(noisy_pair, bad_files, monkeypatch, extra, match):
    no_engine(monkeypatch)
    extra = [e.replace("{dir}", str(bad_files)) for e in extra]
    refused(argv_for(noisy_pair, bad_files / "out", *extra), match, bad_files / "out")


def test_an_unknown_device_is_one_line(noisy_pair, tmp_path):
    refused(argv_for(noisy_pair, tmp_path / "out", "-ngl", "-1", "-dev", "NoSuchGPU0"),
            "unknown offload device 'NoSuchGPU0'", tmp_path / "out")


@pytest.mark.parametrize("cut", ["half", "header"])
def test_a_damaged_model_is_refused_by_llama_cpps_loader_first(noisy_pair, tmp_path, monkeypatch, cut):
    data = Path(noisy_pair[0]).read_bytes()
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(data[:len(data) // 2] if cut == "half" else data[:600])
    no_engine(monkeypatch)
    message = refused(argv_for((damaged, noisy_pair[1]), tmp_path / "out"), f"target {damaged}", tmp_path / "out")
    assert "could not read the vocabulary" in message
    assert "reshape" not in message and "NoneType" not in message


def test_a_vocabulary_mismatch_anywhere_in_the_grid_is_refused_first(noisy_pair, model_dir, tmp_path, monkeypatch):
    other = write_tiny_llama(model_dir / "vocab-960.gguf", n_vocab=960)
    no_engine(monkeypatch)  # the first target is not measured before the second is found wrong
    message = refused(argv_for(noisy_pair, tmp_path / "out", "-m", str(other)), f"target {other}", tmp_path / "out")
    assert "cannot speculate" in message


@pytest.fixture(scope="module")
def draft_other_eos(model_dir):
    """The target's tokenizer with EOS id 3 instead of 2 and token 4's text changed: what
    llama.cpp's compatibility check does not compare (ids below 5; EOS when not added)."""
    with pytest.MonkeyPatch.context() as patch:
        writer = gguf.GGUFWriter
        add_eos, add_tokens = writer.add_eos_token_id, writer.add_token_list
        patch.setattr(writer, "add_eos_token_id", lambda self, _id: add_eos(self, EOS_ID + 1))
        patch.setattr(writer, "add_token_list", lambda self, tokens: add_tokens(
            self, [t if i != 4 else "<other>" for i, t in enumerate(tokens)]))
        return write_tiny_llama(model_dir / "draft-other-eos.gguf")


def test_what_llama_cpp_tolerates_is_accepted_and_said(noisy_pair, draft_other_eos, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(argv_for((noisy_pair[0], draft_other_eos), out)) == 0
    err = capsys.readouterr().err
    assert "note: draft vs target" in err and "EOS ids differ" in err and "token 4 differs" in err
    notes = json.loads((out / "provenance.json").read_text())["notes"]
    assert any("EOS ids differ" in note and "as llama.cpp's own check" in note for note in notes)


# --- prompt files as written ------------------------------------------------------------------------
def test_a_jsonl_file_with_a_byte_order_mark_is_jsonl(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes("\ufeff".encode() + b'{"text": "first", "category": "a"}\n{"text": "second", "category": "b"}\n')
    prompts = workloads.load_prompt_file(path)
    assert [(p.category, p.messages) for p in prompts] == [("a", (("user", "first"),)), ("b", (("user", "second"),))]


def test_prompt_lines_split_at_line_ends_only(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("one\u2028still one\x85and\x0cone\r\ntwo\rthree\n", encoding="utf-8", newline="")
    texts = [p.messages[0][1] for p in workloads.load_prompt_file(path)]
    assert texts == ["one\u2028still one\x85and\x0cone", "two", "three"]


# --- generate(): types -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [(dict(seed=1.7), "seed must be an integer"),
                                           (dict(seed="3"), "seed must be an integer"),
                                           (dict(temperature="0.5"), "temperature must be a number")])
def test_generate_refuses_a_seed_or_temperature_of_another_type(noisy_engine, kwargs, match):
    with pytest.raises(ValueError, match=match):
        noisy_engine.generate(["Hello"], n_predict=2, **kwargs)
