"""llama.cpp's rpc-server processes on this machine (127.0.0.1), for tests and bench/rpc_bench.py:
found, started on free ports, waited for with a bound, and always stopped.

On a real cluster each host runs `ggml-rpc-server -H <address> -p <port>` itself (llama.cpp's
tools/rpc; never on an open network: it is unauthenticated) and Engine(rpc_servers=[...]) or
`python -m specnative.sweep --rpc host:port,...` points at them.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NAMES = ("ggml-rpc-server", "rpc-server")  # llama.cpp's tool, new and old name
ENV = "SPECNATIVE_RPC_SERVER"


def find_rpc_server() -> tuple[str | None, str]:
    """(path of the rpc-server binary, how it was found) or (None, why not): $SPECNATIVE_RPC_SERVER,
    then PATH, then this checkout's build dirs (SPECNATIVE_RPC builds it there)."""
    if os.environ.get(ENV):
        path = os.environ[ENV]
        return (path, f"${ENV}") if os.access(path, os.X_OK) else (None, f"${ENV}={path} is not executable")
    for name in NAMES:
        if found := shutil.which(name):
            return found, "PATH"
    # The checkout's build dirs: this file's (an editable install) or the working directory's
    # (`pip install .` puts the package in site-packages; tests and CI run from the checkout).
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        for pattern in ("build/*/rpc-server/ggml-rpc-server", "build/*/bin/ggml-rpc-server", "build/*/bin/rpc-server"):
            for path in sorted(glob.glob(str(root / pattern))):
                if os.access(path, os.X_OK):
                    return path, "build dir"
    return None, (f"no rpc-server binary: build with SPECNATIVE_RPC=ON (it lands in build/*/rpc-server/), "
                  f"put ggml-rpc-server on PATH, or set ${ENV}")


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the parent dies, even by SIGKILL, so that
    no server outlives a killed test or benchmark; elsewhere the finally block alone."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(process: subprocess.Popen, port: int, deadline: float, log: Path) -> None:
    """Until the server accepts a connection (one it closes at once, which rpc-server takes in
    its stride); a server that exits or does not listen by the deadline is an error with its log."""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rpc-server on port {port} exited with {process.returncode}: "
                               f"{log.read_text(errors='replace')[-800:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"rpc-server on port {port} did not start in time: {log.read_text(errors='replace')[-800:]}")


@contextlib.contextmanager
def local_rpc_servers(n: int, binary: str | None = None, threads: int = 1, start_timeout_s: float = 20.0,
                      log_dir: Path | None = None):
    """Starts `n` rpc-servers (CPU backend) on free ports of 127.0.0.1; yields their "host:port"
    endpoints; stops them (terminate, then kill) however the block ends."""
    binary = binary or find_rpc_server()[0]
    if binary is None:
        raise FileNotFoundError(find_rpc_server()[1])
    log_dir = Path(log_dir) if log_dir else Path(os.environ.get("TMPDIR", "/tmp"))
    processes, endpoints = [], []
    try:
        for _ in range(n):
            port = free_port()
            log = log_dir / f"rpc-server-{port}.log"
            with open(log, "w") as out:
                processes.append(subprocess.Popen(
                    [binary, "-H", "127.0.0.1", "-p", str(port), "-t", str(threads), "-d", "CPU"],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent))
            _wait_listening(processes[-1], port, time.monotonic() + start_timeout_s, log)
            endpoints.append(f"127.0.0.1:{port}")
        yield endpoints
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
