"""bench/peerkit/serve_table.py: the open-loop streaming client that replays a serve run's traces
against llama-server, checked against a small stand-in that streams on loopback (no llama.cpp)."""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from peerkit import serve_table  # noqa: E402
from peerkit import server as srv  # noqa: E402

from specnative.serving.arrivals import Request  # noqa: E402

# Streams n_predict tokens (the first prompt token repeated) in chunks of two, 20 ms apart, then a
# final chunk with llama-server's timings, as server-sent events.
STREAMING_SERVER = textwrap.dedent("""\
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        def log_message(self, *a):
            pass
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert req["stream"] is True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            n = req["n_predict"]
            for i in range(0, n, 2):
                time.sleep(0.02)
                got = req["prompt"][:1] * min(2, n - i)
                self.wfile.write(b"data: " + json.dumps({"tokens": got, "stop": False}).encode() + b"\\n\\n")
                self.wfile.flush()
            final = {"tokens": [], "stop": True, "timings": {"draft_n": 8, "draft_n_accepted": 6}}
            self.wfile.write(b"data: " + json.dumps(final).encode() + b"\\n\\n")
    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """)


@pytest.fixture
def streaming_server(tmp_path):
    script = tmp_path / "streaming_server.py"
    script.write_text(STREAMING_SERVER)
    with srv.LlamaServer([sys.executable, str(script), "--host", srv.HOST], tmp_path / "s.log",
                         start_timeout=30) as server:
        yield server


def test_open_loop_streaming_replay_measures_like_the_engine(streaming_server):
    trace = [Request(0.0, (7, 8), 5), Request(0.15, (9,), 4)]
    records = serve_table.replay_open_loop(streaming_server, trace)
    assert [r["tokens"] for r in records] == [[7] * 5, [9] * 4]
    assert [r["emit_tokens"] for r in records] == [[2, 2, 1], [2, 2]]  # one emission per chunk
    assert records[1]["arrival_ms"] >= 150.0  # sent at its arrival time, not with the first
    for r, chunks in zip(records, (3, 2)):
        # the stand-in sleeps 20 ms before each chunk: the last cannot arrive sooner after the send
        assert r["finish_ms"] - r["arrival_ms"] >= 20.0 * chunks
        assert r["arrival_ms"] <= r["first_token_ms"] <= r["finish_ms"] == r["emit_ms"][-1]
    level = serve_table.server_level(records, {"tpot": 1.0})
    assert level["completed"] == 2 and level["draft_accept_rate"] == pytest.approx(12 / 16)
    assert level["goodput"] == 0.0  # no request streams a token per ms
    assert level["e2e_mean_ms"] >= 50.0


def test_trace_files_are_found_by_rate_and_seed(tmp_path):
    (tmp_path / "trace_files").mkdir()
    for name in ("rate=inf-seed=0.jsonl", "rate=2-seed=1.jsonl", "rate=2-seed=0.jsonl", "notes.txt"):
        (tmp_path / "trace_files" / name).write_text("")
    found = [(rate, seed) for rate, seed, _ in serve_table.trace_files(tmp_path)]
    assert found == [(2.0, 0), (2.0, 1), (float("inf"), 0)]
    with pytest.raises(SystemExit, match="no traces"):
        serve_table.trace_files(tmp_path / "elsewhere")


def _flag(cmd: list, name: str):
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_replay_of_an_ngram_run_starts_the_server_with_its_type_and_options_and_no_draft_model():
    a = argparse.Namespace(threads=1, n_batch=512, flash_attn="off", ngl=0)
    tools = {srv.NAME: "/opt/llama-server"}
    serve = {"drafter": "ngram-simple", "k": 4, "max_concurrency": 3,  # as specnative serve records them
             "drafter_options": {"spec-ngram-simple-size-n": "3", "spec-ngram-simple-size-m": "5"}}
    on = serve_table.replay_cmd(tools, {"target": "t.gguf"}, serve, True, 1024, a)
    off = serve_table.replay_cmd(tools, {"target": "t.gguf"}, serve, False, 1024, a)
    assert "-md" not in on and "-md" not in off
    assert _flag(on, "--spec-type") == "ngram-simple" and _flag(off, "--spec-type") is None
    assert _flag(on, "--spec-ngram-simple-size-n") == "3" and _flag(on, "--spec-ngram-simple-size-m") == "5"
    assert _flag(on, "--spec-draft-n-max") == "4" and _flag(on, "-np") == _flag(off, "-np") == "3"
    assert on[:on.index("--spec-type")] == off  # the same server otherwise
    # the draft model's run keeps -md with draft-simple
    model = serve_table.replay_cmd(tools, {"target": "t.gguf", "draft": "d.gguf"},
                                   {"drafter": "model", "k": 2, "max_concurrency": 1}, True, 512, a)
    assert _flag(model, "-md") == "d.gguf" and _flag(model, "--spec-type") == "draft-simple"
    # a run that did not record its options, or a drafter the replay does not cover: refused
    older = {key: value for key, value in serve.items() if key != "drafter_options"}
    with pytest.raises(SystemExit, match="drafter_options"):
        serve_table.replay_cmd(tools, {"target": "t.gguf"}, older, True, 1024, a)
    with pytest.raises(SystemExit, match="eagle3"):
        serve_table.replay_cmd(tools, {"target": "t.gguf"}, {**serve, "drafter": "eagle3"}, True, 1024, a)
