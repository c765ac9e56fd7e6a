"""train-drafter refuses what it cannot train for, before any training, in one clear line; and a
missing torch is one clear message. None of this needs torch."""
from __future__ import annotations

import argparse
import sys

import gguf
import numpy as np
import pytest

from specnative.models import write_tiny_llama
from specnative.models.train import cli, deps
from specnative.models.train.target_check import TargetError, check_target


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("refusals") / "target.gguf", n_embd=64, n_layer=4, n_head=4,
                            n_ff=128)


def _metadata_only(path, arch: str, n_embd: int = 64):
    """A GGUF with an architecture's basic keys and one tensor: enough for the metadata checks."""
    w = gguf.GGUFWriter(path, arch)
    w.add_embedding_length(n_embd)
    w.add_block_count(4)
    w.add_head_count(4)
    w.add_feed_forward_length(128)
    w.add_tensor("token_embd.weight", np.zeros((16, n_embd), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _run_cli(argv):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


def test_a_good_target_passes_with_eagle3s_default_layers(tiny_target):
    info, layers = check_target(tiny_target)
    assert info.arch == "llama" and info.n_embd == 64 and info.n_layer == 4
    assert layers == (2, 2, 1)  # 2, n/2, n-3 as llama.cpp's converter derives them


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(TargetError, match="is not a GGUF file"):
        check_target(path)


@pytest.mark.parametrize("arch", ["gemma3", "qwen2"])
def test_architectures_without_layer_input_extraction(tmp_path, arch):
    path = _metadata_only(tmp_path / f"{arch}.gguf", arch)
    with pytest.raises(TargetError, match="does not publish at this llama.cpp commit"):
        check_target(path)


def test_an_extracting_architecture_the_torch_graph_does_not_cover(tmp_path):
    path = _metadata_only(tmp_path / "qwen3.gguf", "qwen3")
    with pytest.raises(TargetError, match="re-implements only the llama graph"):
        check_target(path)


def test_another_n_embd_than_the_head_asks_for(tiny_target):
    with pytest.raises(TargetError, match="a head of n_embd 128 cannot borrow the token embeddings .* n_embd 64"):
        check_target(tiny_target, n_embd=128)


def test_layers_out_of_range(tiny_target):
    with pytest.raises(TargetError, match="target layer 4 does not exist"):
        check_target(tiny_target, layers=(0, 1, 4))


def test_the_command_refuses_before_any_training(tmp_path, capsys):
    path = _metadata_only(tmp_path / "gemma3.gguf", "gemma3")
    out = tmp_path / "head.gguf"
    assert _run_cli(["--target", str(path), "-o", str(out), "--max-tokens", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not publish at this llama.cpp commit" in err[0]
    assert not out.exists() and not (tmp_path / "head.gguf.train.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--read-share", "0.5"], "only ShareGPT has them; add sharegpt to --data"),
    (["--read-share", "1", "--data", "sharegpt:4"], "--read-share must be in [0, 1)"),
    (["--read-share", "-0.1", "--data", "sharegpt:4"], "--read-share must be in [0, 1)"),
])
def test_reading_replies_needs_a_set_that_records_them(tiny_target, tmp_path, capsys, argv, message):
    out = tmp_path / "head.gguf"
    assert _run_cli(["--target", str(tiny_target), "-o", str(out), "--max-tokens", "10", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()


def test_missing_torch_is_one_clear_message(tiny_target, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(deps.MissingTorch, match=r"^needs torch .*: python -m pip install 'torch>=2\.1'$"):
        deps.torch()
    assert _run_cli(["--target", str(tiny_target), "-o", str(tmp_path / "h.gguf"), "--max-tokens", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # one prefix, and a command that works from an installed package (no source checkout's '.[train]')
    assert err == ["train-drafter: needs torch (the [train] extra), which is not installed: "
                   "python -m pip install 'torch>=2.1'"]


@pytest.mark.parametrize("argv, message", [
    (["-o", "{tmp}/missing_dir/h.gguf"], "-o {tmp}/missing_dir/h.gguf: no folder {tmp}/missing_dir to write it in"),
    (["-o", "{tmp}"], "-o {tmp}: a folder; give the head's file name, e.g. {tmp}/head.gguf"),
    (["-t", "0"], "-t/--threads must be at least 1, not 0"),
    (["--budget-minutes", "nan"], "--budget-minutes must be a finite number > 0, not nan"),
    (["--budget-minutes", "inf"], "--budget-minutes must be a finite number > 0, not inf"),
    (["--budget-minutes", "0.001"], ("--budget-minutes 0.001 (0.06 s) leaves no time to distill or train: 5 s of a "
                                     "budget are kept for the final held-out measurement and writing the head; give "
                                     "at least 0.1")),
    (["--max-tokens", "-5"], "--max-tokens must be >= 0 (0 writes the untrained initialization), not -5"),
    (["--epochs", "0"], "--epochs must be at least 1, not 0"),
    (["--held-out", "1.5"], "--held-out is a share of the sequences: in [0, 1), not 1.5"),
    (["--held-out", "nan"], "--held-out is a share of the sequences: in [0, 1), not nan"),
    (["--lr", "0"], "--lr must be a finite number > 0, not 0"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be at least 1, not 0"),
])
def test_every_argument_is_refused_in_one_line_before_any_work(tiny_target, tmp_path, monkeypatch, capsys, argv,
                                                               message):
    from specnative.models.train import pipeline

    monkeypatch.setitem(sys.modules, "torch", None)  # refused before torch is even asked for
    monkeypatch.setattr(pipeline, "check_target", lambda *a, **k: pytest.fail("the target was read first"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    base = ["--target", str(tiny_target), "-o", str(tmp_path / "h.gguf"), "--max-tokens", "10"]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert _run_cli(base + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train-drafter: " + message.replace("{tmp}", str(tmp_path))]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_importing_the_package_does_not_import_torch(tmp_path):
    import subprocess

    code = ("import sys, specnative.models.train, specnative.models.train.cli, specnative.models.train.pipeline; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert done.stdout.strip() == "False"
