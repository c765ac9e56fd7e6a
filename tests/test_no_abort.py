"""Inputs that used to end the interpreter with a signal or hang it, each run in a child
interpreter with a time bound so that a regression fails the test instead of the suite: a lookup
cache path that is a directory or a FIFO, a target without a tokenizer in the sweep, an RPC peer
that is not an rpc-server, and an rpc-server killed in the middle of a sweep."""
from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gguf
import pytest
from conftest import TEST_NGL

from specnative import _core
from specnative.engine.rpc_servers import find_rpc_server, free_port
from specnative.models import write_tiny_llama
from specnative.record import schema

BOUND_S = 120  # no case here may take longer; a hang fails the test at this bound


def run_child(code: str, *args: str, timeout: float = BOUND_S) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter; a signal (abort) or a hang past the bound fails the test."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for more than {timeout} s")
    assert done.returncode >= 0, f"killed by signal {-done.returncode}:\n{done.stderr[-2000:]}"
    return done


def sweep_child(pair, out, *extra) -> subprocess.CompletedProcess:
    target, draft = pair
    argv = ["-m", str(target), "-md", str(draft), "--ctx-len", "0", "-np", "1", "-k", "2", "-n", "4", "--warmup",
            "0", "-r", "1", "--max-repeats", "1", "-t", "1", "-ngl", str(TEST_NGL), "-o", str(out), "--no-report",
            *extra]
    return run_child("import sys; from specnative.sweep import main; sys.exit(main(sys.argv[1:]))", *argv)


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one line a refused sweep ends with (SystemExit: exit status 1)."""
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") or "error: " in done.stderr, done.stderr[-2000:]
    return done.stderr[done.stderr.index("error: "):].strip()


# --- a lookup cache path that is not a regular file ----------------------------------------
@pytest.fixture
def not_files(tmp_path):
    directory = tmp_path / "cache-dir"
    directory.mkdir()
    fifo = tmp_path / "cache-fifo"
    os.mkfifo(fifo)
    return {"a directory": directory, "not a regular file": fifo}


def test_a_lookup_cache_that_is_not_a_file_is_refused_by_the_engine(noisy_pair, not_files):
    for what, path in not_files.items():
        done = run_child(f"""
            from specnative import Engine
            with Engine({str(noisy_pair[0])!r}, n_ctx=256, n_threads=1) as engine:
                try:
                    engine.generate(["Hello"], n_predict=4, spec=True, k=2, drafter="ngram-cache",
                                    drafter_options={{"lookup-cache-static": {str(path)!r}}})
                except ValueError as error:
                    print("refused:", error)
            """)
        assert f"refused: lookup-cache-static: '{path}' is {what}" in done.stdout, done.stderr[-2000:]


def test_a_lookup_cache_that_is_not_a_file_is_refused_by_the_sweep(noisy_pair, not_files, tmp_path):
    for what, path in not_files.items():
        done = sweep_child(noisy_pair, tmp_path / "out", "--drafter", "ngram-cache", "--lookup-cache-static", str(path))
        assert f"is {what}" in error_line(done)
        assert not (tmp_path / "out").exists()


def test_an_option_of_another_ngram_drafter_is_refused(noisy_engine, noisy_pair, tmp_path):
    with pytest.raises(ValueError, match="belongs to drafter ngram-mod, not ngram-simple"):
        noisy_engine.generate(["Hello"], n_predict=4, spec=True, k=2, drafter="ngram-simple",
                              drafter_options={"spec-ngram-mod-n-min": 4})
    done = sweep_child(noisy_pair, tmp_path / "out", "--drafter", "ngram-simple", "--spec-ngram-mod-n-min", "4")
    assert "belongs to drafter ngram-mod" in error_line(done)


# --- a target without a tokenizer, in the sweep --------------------------------------------
@pytest.fixture(scope="module")
def no_vocab_model(tmp_path_factory):
    """A tiny llama GGUF whose tokenizer model is "no_vocab" (llama.cpp's tokenizer asserts on it)."""
    with pytest.MonkeyPatch.context() as patch:
        writer = gguf.GGUFWriter
        add_model = writer.add_tokenizer_model
        patch.setattr(writer, "add_tokenizer_model", lambda self, name: add_model(self, "no_vocab"))
        for name in ("add_token_list", "add_token_scores", "add_token_types", "add_unk_token_id",
                     "add_bos_token_id", "add_eos_token_id", "add_add_bos_token", "add_add_eos_token",
                     "add_add_space_prefix"):
            patch.setattr(writer, name, lambda self, *args, **kwargs: None)
        return write_tiny_llama(tmp_path_factory.mktemp("novocab") / "no-vocab.gguf")


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_sweep_on_a_model_without_a_tokenizer_is_refused(noisy_pair, no_vocab_model, tmp_path, role):
    pair = (no_vocab_model, noisy_pair[1]) if role == "target" else (noisy_pair[0], no_vocab_model)
    line = error_line(sweep_child(pair, tmp_path / "out"))
    assert role in line and "no tokenizer" in line and str(no_vocab_model) in line
    assert not (tmp_path / "out" / "traces.csv").exists()


def test_the_prompt_tokenizer_makes_the_engines_checks(no_vocab_model):
    with pytest.raises(ValueError, match="no tokenizer"):
        _core.VocabModel(str(no_vocab_model))


def test_model_checks_on_real_files(noisy_pair, no_vocab_model, model_dir, capsys):
    """The grid's model checks (run/model_checks.py) on tiny files: a good pair passes every check, a
    draft whose vocabulary does not match the target's and a file without a tokenizer are each
    refused in a line that names the file."""
    from specnative.models import tiny_pair
    from specnative.run import model_checks

    target, draft = noisy_pair
    for path, role in ((target, "target"), (draft, "draft")):
        model_checks.header_checked(path, role)
    vocabs = {path: model_checks.vocab_model(path, role) for path, role in ((target, "target"), (draft, "draft"))}
    assert model_checks.check_vocabularies(vocabs[draft], {target: vocabs[target]}) == []
    assert capsys.readouterr().err == ""
    shuffled, _ = tiny_pair(model_dir, "copy", vocab="shuffled")  # the same size, other token texts
    with pytest.raises(SystemExit, match=f"^error: the draft cannot speculate for target {re.escape(str(target))}: "):
        model_checks.check_vocabularies(model_checks.vocab_model(shuffled, "draft"), {target: vocabs[target]})
    with pytest.raises(SystemExit, match=f"^error: target {re.escape(str(no_vocab_model))}: .*no tokenizer"):
        model_checks.vocab_model(no_vocab_model, "target")


# --- RPC peers that are not rpc-servers ------------------------------------------------------
def fake_peer(behaviour: str) -> tuple[str, socket.socket]:
    """A TCP listener on 127.0.0.1 that accepts and then: never answers ("silent"), closes
    ("close"), answers HTTP ("garbage"), or answers ggml-rpc's hello with protocol 6 ("old")."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve():
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            client.recv(64)
            if behaviour == "close":
                client.close()
            elif behaviour == "garbage":
                client.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                client.close()
            elif behaviour == "old":
                client.sendall(struct.pack("<Q", 28) + bytes([6, 0, 0, 0]) + bytes(24))
                client.close()
            # "silent": keep the connection open and say nothing

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{server.getsockname()[1]}", server


RPC_CASES = {"silent": "sent no handshake reply within", "close": "closed the connection",
             "garbage": "not ggml-rpc's reply", "old": "speaks ggml-rpc protocol 6.0.0"}
needs_rpc_backend = pytest.mark.skipif(not _core.supports_rpc(), reason="this build has no RPC backend")


@needs_rpc_backend
def test_a_peer_that_is_not_an_rpc_server_is_refused_by_the_engine(noisy_pair):
    done = run_child(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_no_abort import fake_peer, RPC_CASES
        from specnative import Engine
        for behaviour in RPC_CASES:
            endpoint, _ = fake_peer(behaviour)
            try:
                Engine({str(noisy_pair[0])!r}, n_gpu_layers=-1, rpc_servers=[endpoint], rpc_timeout_s=1,
                       n_ctx=256, n_threads=1)
            except ValueError as error:
                print(behaviour, "|", error)
        """)
    lines = dict(line.split(" | ", 1) for line in done.stdout.splitlines())
    assert set(lines) == set(RPC_CASES), done.stderr[-2000:]
    for behaviour, what in RPC_CASES.items():
        assert lines[behaviour].startswith("RPC server 127.0.0.1:") and what in lines[behaviour]


@needs_rpc_backend
@pytest.mark.parametrize("behaviour", sorted(RPC_CASES))
def test_a_peer_that_is_not_an_rpc_server_is_one_line_from_the_sweep(noisy_pair, tmp_path, behaviour):
    endpoint, listener = fake_peer(behaviour)
    with listener:
        target, draft = noisy_pair
        done = run_child("import sys; from specnative.sweep import main; sys.exit(main(sys.argv[1:]))",
                         "-m", str(target), "-md", str(draft), "-ngl", "-1", "--rpc", endpoint,
                         "-o", str(tmp_path / "out"), timeout=60)
    line = error_line(done)
    assert len(line.splitlines()) == 1 and endpoint in line and RPC_CASES[behaviour] in line
    assert not (tmp_path / "out").exists()


# --- an rpc-server killed in the middle of a sweep loses no finished row ---------------------
BINARY, HOW = find_rpc_server()


@pytest.mark.skipif(not _core.supports_rpc() or BINARY is None, reason=HOW)
def test_a_server_killed_mid_sweep_loses_no_finished_row(noisy_pair, tmp_path):
    """ggml's RPC client aborts the process when its server goes away mid-run (that cannot be
    bounded from outside it); what the sweep guarantees is that every finished cell's rows are on
    disk (appended and fsynced per cell), and that --resume with a server back continues."""
    target, draft = noisy_pair
    out = tmp_path / "out"
    port = free_port()
    argv = ["-m", str(target), "-md", str(draft), "--ctx-len", "0", "-np", "1,2,3,4", "-k", "2", "-n", "24",
            "--warmup", "0", "-r", "3", "--max-repeats", "3", "-t", "1", "-ngl", "-1", "-devd", "none",
            "--rpc", f"127.0.0.1:{port}", "-o", str(out), "--no-report"]
    sweep = [sys.executable, "-c", "import sys; from specnative.sweep import main; sys.exit(main(sys.argv[1:]))"]
    server = subprocess.Popen([BINARY, "-H", "127.0.0.1", "-p", str(port), "-t", "1", "-d", "CPU"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        child = subprocess.Popen(sweep + argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + BOUND_S
        traces = out / "traces.csv"
        while time.monotonic() < deadline and child.poll() is None:
            if traces.exists() and traces.read_bytes().count(b"\n") >= 3:  # header + one whole cell
                break
            time.sleep(0.02)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        try:
            child.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            child.kill()
            pytest.fail("the sweep hung after its rpc-server was killed")
        finished_before = traces.read_bytes()
    finally:
        server.kill()
    if child.returncode == 0:
        pytest.skip("the sweep finished before the server was killed (a faster machine): nothing to show")
    from specnative.record import rundir
    plan = rundir.plan_resume(traces, {})  # the rows on disk read whole (a torn last row is cut on resume)
    cells_kept = len(plan.rows) // 2  # off + on row per cell (one k)
    assert cells_kept >= 1, f"no finished cell survived:\n{child.stderr[-2000:]}"
    kept = b"".join(finished_before.splitlines(keepends=True)[:1 + 2 * cells_kept])
    # resume with a server back on the same port (--rpc is a setting): finished cells are kept as they were
    server = subprocess.Popen([BINARY, "-H", "127.0.0.1", "-p", str(port), "-t", "1", "-d", "CPU"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not _wait_port(port, required=False):
            pytest.skip("the port could not be taken again for the resume")
        done = subprocess.run(sweep + argv + ["--resume"], capture_output=True, text=True, timeout=BOUND_S)
    finally:
        server.kill()
    assert done.returncode == 0, done.stderr[-2000:]
    frame = schema.read_traces(traces)
    assert frame["cell_id"].is_unique and len(frame) == 8  # 4 cells, off + on each
    assert traces.read_bytes().startswith(kept)


def _wait_port(port: int, required: bool = True) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    if required:
        pytest.fail(f"rpc-server on port {port} did not start")
    return False


# --- concurrent preset builds sharing a cache ------------------------------------------------
def test_concurrent_builds_of_one_derived_file_all_succeed(noisy_pair, tmp_path):
    """Eight processes derive the same quantized file at once (sweeps or array tasks sharing a
    cache): each gets the finished file, one of them built it, no temporary file is left."""
    src = tmp_path / "model.gguf"
    src.write_bytes(Path(noisy_pair[0]).read_bytes())
    ready, built = tmp_path / "ready", tmp_path / "built"
    ready.mkdir()
    built.mkdir()
    # all at once once every child has imported (a barrier of files); each build takes 0.5 s at least
    code = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from specnative.models import presets
        from specnative.record.provenance import sha256_file
        quantize = presets.quantize
        def slow_quantize(*args):
            quantize(*args)
            (Path({str(built)!r}) / str(os.getpid())).touch()
            time.sleep(0.5)
        presets.quantize = slow_quantize
        (Path({str(ready)!r}) / str(os.getpid())).touch()
        while len(list(Path({str(ready)!r}).iterdir())) < 8:
            time.sleep(0.01)
        print(sha256_file(presets._quantized(Path({str(src)!r}), "Q8_0")))
        """)
    children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(8)]
    results = []
    for child in children:
        out, err = child.communicate(timeout=BOUND_S)
        assert child.returncode == 0, err[-2000:]
        results.append(out.strip())
    assert len(set(results)) == 1
    assert len(list(built.iterdir())) == 1  # one quantized, the others waited and took its file
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == \
        ["built", "model-Q8_0.gguf", "model.gguf", "ready"]
