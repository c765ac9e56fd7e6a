"""Where a number came from (the reproducibility record): software, build, hardware, model files, command."""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from specnative import __version__
from specnative.engine import native


@functools.lru_cache(maxsize=None)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_file(path) -> str:
    """sha256 of a file, computed once per (path, size, mtime) in this process."""
    stat = os.stat(path)
    return _sha256_cached(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def quant_bits(ftype: str) -> int:
    """Bits per weight of a llama.cpp file type name: 'Q4_K - Medium' -> 4, 'Q8_0' -> 8,
    'F16'/'BF16' -> 16, 'all F32' -> 32."""
    match = re.search(r"\b[IT]?Q(\d)", ftype)
    if match:
        return int(match.group(1))
    if "F16" in ftype:
        return 16
    if "F32" in ftype:
        return 32
    raise ValueError(f"cannot tell the bits per weight of file type {ftype!r}")


def model_record(info: dict, role: str) -> dict:
    path = Path(info["path"])
    return {
        "role": role, "path": str(path), "name": path.name, "sha256": sha256_file(path),
        "type": info["ftype"], "quant_bits": quant_bits(info["ftype"]),
        "n_params": int(info["n_params"]), "size_bytes": int(info["size_bytes"]),
    }


def cpu_model() -> str:
    """The host's CPU model name: read here once for provenance and for bench/'s result headers."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def gpu_info() -> dict | None:
    """Name, memory and driver of the first NVIDIA GPU, if nvidia-smi answers."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True).stdout.strip().splitlines()
    except (subprocess.SubprocessError, OSError):
        return None
    if not out:
        return None
    name, memory_mib, driver = [part.strip() for part in out[0].split(",")]
    return {"name": name, "memory_gb": round(float(memory_mib) / 1024, 1), "driver": driver}


def source_commit(built: str) -> str:
    """specnative's commit: the source tree's HEAD where the package runs from a git checkout (an
    editable install; "+changes" when its sources differ from HEAD), else the commit it was built
    from."""
    here = Path(__file__).resolve().parents[3]  # src/specnative/record -> the repository root
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no", "--",
                                  "src", "csrc", "CMakeLists.txt"], capture_output=True, text=True,
                                 timeout=10, check=True).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return built
    return head + ("+changes" if changed else "") if head else built


def environment() -> dict:
    """Software and hardware of this process: what every rate is tagged with."""

    build = native.build_info()
    return {
        "specnative_version": __version__,
        "specnative_commit": source_commit(build.get("specnative_commit", "unknown")),
        "llama_cpp_commit": build["llama_commit"],
        "build_flags": build["build_flags"].strip(),
        "backend": build["backend"],
        "system_info": build["system_info"].strip(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "gpu": gpu_info() if build["backend"] == "CUDA" else None,
        "os": platform.platform(),
        "python": sys.version.split()[0],
    }


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json(path, record: dict) -> None:
    """`record` as JSON at `path`, replaced atomically and flushed to disk (a crash leaves the old
    file or the new one, never half of one)."""
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(record, indent=2, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


class ProvenanceError(ValueError):
    """A provenance.json that cannot be read as a record: the message names the file and why."""


def read_provenance(run_dir) -> dict | None:
    """A run folder's provenance.json as a dict; None when the folder has none. A damaged one is a
    ProvenanceError: numbers must never be read under a record that cannot be read."""
    path = Path(run_dir) / "provenance.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as error:
        raise ProvenanceError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    except RecursionError:
        raise ProvenanceError(f"{path}: JSON nested too deeply to be a run's record") from None
    except UnicodeDecodeError as error:
        raise ProvenanceError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise ProvenanceError(f"{path}: cannot read it ({error.strerror or error})") from None
    if not isinstance(record, dict):
        raise ProvenanceError(f"{path}: expected a JSON object, found a {type(record).__name__}")
    return record
