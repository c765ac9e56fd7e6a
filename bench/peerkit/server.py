"""llama-server: the deployment path people measure, started and stopped by the benchmark.

Bounded and self-cleaning: it listens on 127.0.0.1 only (no other address is ever used), every
HTTP call has a timeout, the process runs in its own session and is killed on stop(), on exit of
the benchmark (atexit) and on SIGTERM; a server that does not come up within its start timeout
raises with the tail of its log instead of hanging.
"""
from __future__ import annotations

import atexit
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .common import log, ngl_arg

NAME = "llama-server"
HOST = "127.0.0.1"  # loopback only, on purpose: the benchmark never serves another address

_RUNNING: set = set()


def _kill_all() -> None:
    for server in list(_RUNNING):
        server.stop()


atexit.register(_kill_all)


def _on_sigterm(signum, frame):  # a killed benchmark takes its servers with it
    _kill_all()
    raise SystemExit(128 + signum)


def free_port() -> int:
    """A port the kernel says is free on loopback right now (the server binds it a moment later;
    a lost race shows up as a failed start, which is retried with another port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_cmd(tools, target, draft, k, n_parallel, n_ctx, a, swa_full) -> list:
    """llama-server for the target alone (draft None: the baseline) or with the draft model under
    draft-simple, k drafts per round, no minimum draft length or probability (like ours), greedy,
    n_parallel slots sharing one unified KV cache of n_ctx cells (like our engine), prompt cache
    off (per server and per request), metrics on. The port is added by LlamaServer.start."""
    cmd = [str(tools[NAME]), "-m", str(target), "--host", HOST,
           "-np", str(n_parallel), "-c", str(n_ctx), "--kv-unified",
           "-t", str(a.threads), "-tb", str(a.threads), "-b", str(a.n_batch), "-ub", str(a.n_batch),
           "-fa", a.flash_attn, "-ngl", ngl_arg(a.ngl), "-fit", "off",
           "--temp", "0", "--metrics", "--no-cache-prompt", "--cache-ram", "0", "--no-webui"]
    if draft is not None:
        cmd += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-ngld", ngl_arg(a.ngl),
                "-td", str(a.threads), "-tbd", str(a.threads)]
    if swa_full:
        cmd.append("--swa-full")
    return cmd


class LlamaServer:
    """One llama-server process: start() waits until /health answers 200, complete() posts one
    /completion, metrics() reads /metrics, stop() ends it (also on exit)."""

    def __init__(self, cmd: list, log_path: Path, start_timeout: float = 300.0,
                 request_timeout: float = 600.0):
        if HOST not in cmd:
            raise ValueError("llama-server must listen on 127.0.0.1")
        self.base_cmd = list(cmd)
        self.log_path = Path(log_path)
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self.proc = None
        self.port = None
        self.cmd = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, attempts: int = 2) -> "LlamaServer":
        for attempt in range(1, attempts + 1):
            self.port = free_port()
            self.cmd = self.base_cmd + ["--port", str(self.port)]
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "wb") as out:
                # own session: stop() can end the whole process group, never anything else
                self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            _RUNNING.add(self)
            try:
                self._wait_healthy()
                return self
            except RuntimeError:
                self.stop()
                if attempt == attempts or "bind" not in self.log_tail(4000).lower():
                    raise
                log(f"  llama-server could not bind port {self.port}; retrying on another")
        raise AssertionError("unreachable")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} while starting "
                                   f"({self.log_path}); log tail:\n{self.log_tail()}")
            try:
                status, _ = self._request("GET", "/health", timeout=5)
                if status == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass  # not listening yet
            time.sleep(0.25)
        raise RuntimeError(f"llama-server did not become healthy within {self.start_timeout:.0f} s "
                           f"({self.log_path}); log tail:\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        _RUNNING.discard(self)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, n_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return "(no log)"

    # -- HTTP -----------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout or self.request_timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", errors="replace")
        finally:
            conn.close()

    def complete(self, tokens: list, n_predict: int, ignore_eos: bool) -> dict:
        """One greedy /completion on token ids (no BOS added: the ids are sent as they are), with
        the generated token ids and the slot's timings in the answer. Raises on a non-200."""
        body = {"prompt": [int(t) for t in tokens], "n_predict": int(n_predict), "temperature": 0.0,
                "cache_prompt": False, "return_tokens": True, "ignore_eos": bool(ignore_eos), "stream": False}
        t0 = time.perf_counter()
        status, text = self._request("POST", "/completion", body)
        wall = time.perf_counter() - t0
        if status != 200:
            raise RuntimeError(f"llama-server /completion answered {status}: {text[:500]}")
        out = json.loads(text)
        out["client_wall_s"] = wall
        out["client_start"] = t0
        return out

    def stream(self, tokens: list, n_predict: int, ignore_eos: bool, t0: float) -> dict:
        """One greedy streamed /completion on token ids, as an open-loop serving client sees it:
        the send time and the time of every chunk that carried tokens, in ms since `t0`
        (time.perf_counter()), the tokens, and the final chunk's timings (draft_n,
        draft_n_accepted). The dict has the keys of specnative's serving records, so the same
        metrics apply (specnative.serving.metrics.request_metrics); admission is not visible from
        outside, so admitted_ms is the send time."""
        body = {"prompt": [int(t) for t in tokens], "n_predict": int(n_predict), "temperature": 0.0,
                "cache_prompt": False, "return_tokens": True, "ignore_eos": bool(ignore_eos), "stream": True}
        ms = lambda: (time.perf_counter() - t0) * 1000.0
        conn = http.client.HTTPConnection(HOST, self.port, timeout=self.request_timeout)
        record = {"emit_ms": [], "emit_tokens": [], "tokens": [], "timings": {}}
        try:
            record["arrival_ms"] = record["admitted_ms"] = ms()
            conn.request("POST", "/completion", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"llama-server /completion answered {resp.status}: {resp.read()[:500]!r}")
            while True:
                line = resp.readline()
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                chunk = json.loads(line[6:])
                got = [int(t) for t in chunk.get("tokens") or []]
                if got:
                    record["emit_ms"].append(ms())
                    record["emit_tokens"].append(len(got))
                    record["tokens"] += got
                if chunk.get("stop"):
                    record["timings"] = chunk.get("timings") or {}
                    break
        finally:
            conn.close()
        record["finish_ms"] = record["emit_ms"][-1] if record["emit_ms"] else ms()
        record["first_token_ms"] = record["emit_ms"][0] if record["emit_ms"] else record["finish_ms"]
        record["counts"] = {"drafted": int(record["timings"].get("draft_n", 0)),
                            "accepted": int(record["timings"].get("draft_n_accepted", 0))}
        return record

    def complete_concurrently(self, prompts: list, n_predict: int, ignore_eos: bool) -> tuple[list, float]:
        """All prompts at once, one HTTP connection each (so the server fills one slot each); the
        answers in prompt order and the wall seconds from the first send to the last answer."""
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            futures = [pool.submit(self.complete, p, n_predict, ignore_eos) for p in prompts]
            answers = [f.result() for f in futures]
        return answers, time.perf_counter() - t0

    def metrics(self) -> dict:
        """The Prometheus text of /metrics as {name: value}; per-position acceptance as
        {'spec_decode_num_accepted_tokens_per_pos_total': {position: value}}."""
        status, text = self._request("GET", "/metrics", timeout=30)
        if status != 200:
            raise RuntimeError(f"llama-server /metrics answered {status} (started without --metrics?): {text[:300]}")
        return parse_metrics(text)


_METRIC = re.compile(r'^llamacpp:(\w+)(?:\{position="(\d+)"\})?\s+(\S+)$')


def parse_metrics(text: str) -> dict:
    out: dict = {}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if not m:
            continue
        name, pos, value = m.group(1), m.group(2), float(m.group(3))
        if pos is None:
            out[name] = value
        else:
            out.setdefault(name, {})[int(pos)] = value
    return out


def metrics_delta(before: dict, after: dict) -> dict:
    """Counter increase between two /metrics reads (they are cumulative since the server started)."""
    out = {}
    for name, value in after.items():
        old = before.get(name, {} if isinstance(value, dict) else 0.0)
        if isinstance(value, dict):
            out[name] = {p: v - old.get(p, 0.0) for p, v in value.items()}
        elif name.endswith("_total"):
            out[name] = value - old
    return out


def install_sigterm_handler() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
