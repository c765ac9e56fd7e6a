"""vendor/fetch_llama_cpp.py: a matching tree is reused offline, a wrong hash is refused."""
from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path

import pytest

FETCH = Path(__file__).resolve().parents[1] / "vendor" / "fetch_llama_cpp.py"


@pytest.fixture(scope="module")
def fetch():
    spec = importlib.util.spec_from_file_location("fetch_llama_cpp", FETCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_sdist(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in [("pkg-1.0/vendor/llama.cpp/include/llama.h", "// header\n"),
                           ("pkg-1.0/vendor/llama.cpp/.git", "gitdir: nowhere\n"),
                           ("pkg-1.0/other/file.txt", "not extracted\n")]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_lock_file_records_the_pin(fetch):
    lock = json.loads(fetch.LOCK_FILE.read_text())
    assert lock["package"] == "llama-cpp-python" and lock["version"] == "0.3.36"
    assert lock["sha256"] == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert lock["upstream_commit"].startswith("0c1e57098")


def test_wrong_hash_is_a_clear_error(fetch, tmp_path):
    archive = fake_sdist(tmp_path / "pkg-1.0.tar.gz")
    with pytest.raises(SystemExit, match="sha256 mismatch"):
        fetch.fetch(tmp_path / "llama.cpp", archive)
    assert not (tmp_path / "llama.cpp").exists()


def test_matching_archive_extracts_only_the_vendored_tree(fetch, tmp_path, monkeypatch):
    archive = fake_sdist(tmp_path / "pkg-1.0.tar.gz")
    lock = {**fetch.read_lock(), "sha256": fetch.sha256_of(archive)}
    monkeypatch.setattr(fetch, "read_lock", lambda: lock)
    dest = fetch.fetch(tmp_path / "llama.cpp", archive)
    assert (dest / "include" / "llama.h").read_text() == "// header\n"
    assert not (dest / ".git").exists() and not (tmp_path / "other").exists()
    # a present, matching tree is reused: no archive and no network needed
    monkeypatch.setattr(fetch, "download_sdist", lambda *a: pytest.fail("must not download"))
    assert fetch.fetch(dest, None) == dest
