"""Model headers llama.cpp would abort on (GGML_ASSERT ends the interpreter) are refused before
llama.cpp sees them (engine.gguf_checks), by the Engine and by the sweep and serve up front: a
block count of 0, kv heads that do not divide the heads, a DFlash mask token outside the
vocabulary, a DFlash block of fewer than 2 tokens, and the other fields load_hparams asserts on.
The cases that used to abort run in a child interpreter, so a regression fails the test rather
than the suite."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest

from specnative.engine import gguf_checks
from specnative.models import write_tiny_llama
from specnative.models.tiny_drafters import write_tiny_drafter

BOUND_S = 120


def with_field(src, dst, key: str, value):
    """A copy of `src` with the scalar header field `key` set to `value` (same type, in place)."""
    shutil.copy(src, dst)
    reader = gguf.GGUFReader(str(dst), "r+")
    field = reader.get_field(key)
    assert field is not None, key
    field.parts[field.data[0]][0] = value
    reader.data.flush()
    return dst


def header_only(path, arch: str, fields: dict):
    """A GGUF holding only key/value fields (the header checks read nothing else)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in fields.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_uint32(key, value)
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def run_child(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter: an abort there is a negative return code, not a dead suite."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for more than {BOUND_S} s")
    assert done.returncode >= 0, f"killed by signal {-done.returncode}:\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("headers")
    target = write_tiny_llama(d / "target.gguf")
    dflash = write_tiny_drafter(d / "dflash.gguf", "dflash")
    eagle3 = write_tiny_drafter(d / "eagle3.gguf", "eagle3")
    return {
        "target": target, "dflash": dflash, "eagle3": eagle3, "dir": d,
        # each of these aborted the interpreter while the engine loaded or at the first draft round
        "dflash mask": with_field(dflash, d / "dflash-mask.gguf", "tokenizer.ggml.mask_token_id", 5000),
        "dflash layers 0": with_field(dflash, d / "dflash-blk0.gguf", "dflash.block_count", 0),
        "dflash kv 3": write_tiny_drafter(d / "dflash-kv3.gguf", "dflash", n_head_kv=3),
        "eagle3 kv 3": write_tiny_drafter(d / "eagle3-kv3.gguf", "eagle3", n_head_kv=3),
        "eagle3 layers 0": with_field(eagle3, d / "eagle3-blk0.gguf", "eagle3.block_count", 0),
        "target layers 0": with_field(target, d / "target-blk0.gguf", "llama.block_count", 0),
        # DFlash drafts at most block_size - 1: these never draft
        "dflash block 1": with_field(dflash, d / "dflash-bs1.gguf", "dflash.block_size", 1),
        "dflash block 0": with_field(dflash, d / "dflash-bs0.gguf", "dflash.block_size", 0),
    }


REFUSALS = {  # file -> (role as the engine loads it, the field the message must name)
    "dflash mask": ("drafter", "tokenizer.ggml.mask_token_id 5000"),
    "dflash layers 0": ("drafter", "dflash.block_count is 0"),
    "dflash kv 3": ("drafter", "dflash.attention.head_count_kv 3 does not divide"),
    "eagle3 kv 3": ("drafter", "eagle3.attention.head_count_kv 3 does not divide"),
    "eagle3 layers 0": ("drafter", "eagle3.block_count is 0"),
    "target layers 0": ("draft", "llama.block_count is 0"),
    "dflash block 1": ("drafter", "dflash.block_size is 1"),
    "dflash block 0": ("drafter", "dflash.block_size is 0"),
}


def test_sound_files_pass(files):
    for name in ("target", "dflash", "eagle3"):
        assert gguf_checks.header_problems(files[name]) == []
    assert gguf_checks.architecture(files["eagle3"]) == "eagle3"


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_the_engine_refuses_each_in_one_line_naming_file_and_field(files, name):
    role, needle = REFUSALS[name]
    drafter = "dflash" if name.startswith("dflash") else "eagle3" if name.startswith("eagle3") else "model"
    done = run_child(f"""
        from specnative import Engine
        try:
            with Engine({str(files['target'])!r}, {str(files[name])!r}, n_ctx=256, n_seq_max=1, n_threads=1) as e:
                e.generate(["Hello"], n_predict=6, spec=True, k=4, drafter={drafter!r})
        except ValueError as error:
            print("refused:", error)
        else:
            print("accepted")
        """)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip()
    assert line.startswith(f"refused: {role} model {files[name]}: ") and needle in line, line


def test_a_damaged_target_header_is_refused_too(files, tmp_path):
    bad = with_field(files["target"], tmp_path / "t-kv3.gguf", "llama.attention.head_count_kv", 3)
    done = run_child(f"""
        from specnative import Engine
        try:
            Engine({str(bad)!r}, n_ctx=256, n_threads=1)
        except ValueError as error:
            print("refused:", error)
        """)
    assert f"refused: target model {bad}: llama.attention.head_count_kv 3 does not divide" in done.stdout


@pytest.mark.parametrize("fields, needle", [
    ({"llama.block_count": 600}, "llama.block_count is 600"),
    ({"llama.block_count": 2, "llama.nextn_predict_layers": 3}, "nextn_predict_layers 3 exceeds"),
    ({"llama.block_count": 2, "llama.attention.head_count": 0}, "head_count is 0"),
    ({"llama.block_count": 2, "llama.attention.head_count": [4, 4, 4]}, "has 3 entries for 2 layers"),
    ({"llama.block_count": 2, "llama.embedding_length": 100, "llama.attention.head_count": 3},
     "embedding_length 100 is not a multiple"),
    ({"llama.block_count": 2, "llama.embedding_length": 96, "llama.attention.head_count": 4,
      "llama.attention.head_count_kv": [4, 3]}, "head_count_kv 3 does not divide llama.attention.head_count 4 (layer 1)"),
    ({"llama.block_count": 2, "llama.rope.scaling.type": "cubic"}, "rope.scaling.type is 'cubic'"),
    ({"llama.block_count": 2, "llama.expert_used_count": 2}, "expert_used_count 2 exceeds llama.expert_count 0"),
    ({"llama.block_count": 2, "llama.expert_group_count": 2}, "expert_count is 0 but"),
    ({"llama.block_count": 2, "llama.expert_count": 8}, "no expert would run"),
    ({"llama.block_count": 2, "llama.expert_count": 8, "llama.expert_used_count": 9}, "exceeds llama.expert_count"),
    ({"llama.block_count": 2, "llama.expert_count": 8, "llama.expert_used_count": 2, "llama.expert_group_count": 3,
      "llama.expert_group_used_count": 1}, "must divide llama.expert_count"),
])
def test_general_fields_llama_cpp_asserts_on(tmp_path, fields, needle):
    path = header_only(tmp_path / "h.gguf", "llama", fields)
    problems = gguf_checks.header_problems(path)
    assert any(needle in p for p in problems), problems
    with pytest.raises(ValueError, match=f"target model {path}: "):
        gguf_checks.check_model_file(path, "target")


@pytest.mark.parametrize("arch, fields, needle", [
    ("eagle3", {"eagle3.block_count": 1, "eagle3.target_layers": [0, 1]}, "has 2 entries"),
    ("eagle3", {"eagle3.block_count": 1, "eagle3.target_hidden_size": 0}, "target_hidden_size is 0"),
    ("dflash", {"dflash.block_count": 1, "dflash.target_layers": [0, -1]}, "holds a negative layer"),
])
def test_drafter_fields(tmp_path, arch, fields, needle):
    problems = gguf_checks.header_problems(header_only(tmp_path / "d.gguf", arch, fields))
    assert any(needle in p for p in problems), problems


def test_a_recurrent_layer_without_heads_is_not_an_error(tmp_path):
    """Hybrid models give 0 heads to their recurrent layers: only attention architectures need them."""
    path = header_only(tmp_path / "hybrid.gguf", "jamba", {"jamba.block_count": 2, "jamba.embedding_length": 64,
                                                          "jamba.attention.head_count": [0, 4]})
    assert gguf_checks.header_problems(path) == []


def test_the_light_reader_agrees_with_gguf_py(files):
    """The reader skips the vocabulary's strings (gguf-py parses each: 34 s for 262k tokens); every
    scalar and short array it keeps is gguf-py's value."""
    for name in ("target", "dflash", "eagle3"):
        header = gguf_checks.read_header(files[name])
        reader = gguf.GGUFReader(str(files[name]))
        assert header.n_vocab() == len(reader.get_field("tokenizer.ggml.tokens").data)
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            value = field.contents()
            if isinstance(value, list) and (len(value) > 4096 or (value and isinstance(value[0], str))):
                assert header.get(key) is None
            elif isinstance(value, float):
                assert header.get(key) == pytest.approx(value)
            else:
                assert header.get(key) == value, key


def test_files_that_are_no_gguf_are_left_to_llama_cpps_loader(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model")
    cut = tmp_path / "cut.gguf"
    write_tiny_llama(tmp_path / "whole.gguf")
    cut.write_bytes((tmp_path / "whole.gguf").read_bytes()[:200])
    assert gguf_checks.header_problems(junk) == [] and gguf_checks.header_problems(cut) == []


def test_the_sweep_refuses_before_any_work(files, tmp_path, noisy_pair):
    from specnative.sweep import main
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="draft model .*target-blk0.gguf: llama.block_count is 0"):
        main(["-m", str(noisy_pair[0]), "-md", str(files["target layers 0"]), "--ctx-len", "0", "-np", "1", "-n", "4",
              "-o", str(out), "--no-report", "-t", "1"])
    assert not (out / "traces.csv").exists() and not (out / "provenance.json").exists()
    with pytest.raises(SystemExit, match="dflash-mask.gguf: tokenizer.ggml.mask_token_id 5000"):
        main(["-m", str(files["target"]), "--drafter", "dflash", "--drafter-file", f"dflash={files['dflash mask']}",
              "--ctx-len", "0", "-np", "1", "-n", "4", "-o", str(out), "--no-report", "-t", "1"])
    assert not (out / "traces.csv").exists()


@pytest.mark.parametrize("given, file_kind, runs", [("dflash", "eagle3", "eagle3"), ("eagle3", "dflash", "dflash")])
def test_a_drafter_file_of_the_other_kind_is_refused_from_its_header(files, tmp_path, given, file_kind, runs):
    from specnative.sweep import main
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=f"--drafter {given}: .* is a .* drafter file, not .*; run it as "
                                         f"--drafter {runs}"):
        main(["-m", str(files["target"]), "--drafter", given, "--drafter-file", f"{given}={files[file_kind]}",
              "--ctx-len", "0", "-np", "1", "-n", "4", "-o", str(out), "--no-report", "-t", "1"])
    assert not out.exists()
