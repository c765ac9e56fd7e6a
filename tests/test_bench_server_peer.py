"""bench/peerkit/server.py: the llama-server harness starts, answers, fails and cleans up as it
says, checked against small stand-in processes on loopback (no llama.cpp, no network)."""
from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from peerkit import server as srv  # noqa: E402
from peerkit.server_table import compare_tokens  # noqa: E402

# The text layout of server_task_result_metrics::to_metrics() at the pinned llama.cpp commit.
METRICS = textwrap.dedent("""\
    # HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
    # TYPE llamacpp:spec_decode_num_draft_tokens_total counter
    llamacpp:spec_decode_num_draft_tokens_total 120
    llamacpp:spec_decode_num_accepted_tokens_total 90
    llamacpp:spec_decode_num_drafts_total 30
    llamacpp:n_busy_slots_per_decode 3.5
    # TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
    llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 28
    llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 25
    """)

# A stand-in for llama-server: /health, /metrics and /completion on the port it is given.
FAKE_SERVER = textwrap.dedent("""\
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port = int(sys.argv[sys.argv.index("--port") + 1])
    mode = sys.argv[sys.argv.index("--mode") + 1]
    if mode == "crash":
        print("fake: failed to load model", flush=True)
        sys.exit(3)
    if mode == "slow":
        time.sleep(60)
    drafted = [0]
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def reply(self, code, body, kind="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            if self.path == "/health":
                self.reply(200, "{}")
            else:
                self.reply(200, "llamacpp:spec_decode_num_draft_tokens_total %d\\n" % drafted[0], "text/plain")
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if mode == "hang":
                time.sleep(60)
            drafted[0] += 4
            n = req["n_predict"]
            self.reply(200, json.dumps({"tokens": list(req["prompt"])[:1] * n, "stop_type": "limit",
                                        "timings": {"predicted_n": n, "predicted_ms": 10.0 * n,
                                                    "predicted_per_second": 100.0, "prompt_n": len(req["prompt"])}}))
    HTTPServer(("127.0.0.1", port), H).serve_forever()
    """)


def fake_cmd(tmp_path, mode):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return [sys.executable, str(script), "--host", srv.HOST, "--mode", mode]


def test_parse_metrics_and_delta():
    after = srv.parse_metrics(METRICS)
    assert after["spec_decode_num_draft_tokens_total"] == 120
    assert after["spec_decode_num_accepted_tokens_per_pos_total"] == {0: 28, 1: 25}
    before = srv.parse_metrics(METRICS.replace(" 120", " 100").replace('"1"} 25', '"1"} 20'))
    delta = srv.metrics_delta(before, after)
    assert delta["spec_decode_num_draft_tokens_total"] == 20
    assert delta["spec_decode_num_accepted_tokens_per_pos_total"] == {0: 0, 1: 5}
    assert "n_busy_slots_per_decode" not in delta  # a gauge has no meaningful delta


def test_refuses_other_addresses(tmp_path):
    with pytest.raises(ValueError, match="127.0.0.1"):
        srv.LlamaServer(["llama-server", "--host", "0.0.0.0"], tmp_path / "log")


def test_server_that_exits_reports_its_log(tmp_path):
    server = srv.LlamaServer(fake_cmd(tmp_path, "crash"), tmp_path / "crash.log", start_timeout=30)
    with pytest.raises(RuntimeError, match="failed to load model"):
        server.start()
    assert server.proc is None and server not in srv._RUNNING


def test_server_that_never_answers_times_out(tmp_path):
    server = srv.LlamaServer(fake_cmd(tmp_path, "slow"), tmp_path / "slow.log", start_timeout=1.5)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not become healthy"):
        server.start()
    assert time.monotonic() - t0 < 30
    assert server.proc is None


def test_concurrent_requests_metrics_and_stop(tmp_path):
    with srv.LlamaServer(fake_cmd(tmp_path, "ok"), tmp_path / "ok.log", start_timeout=30) as server:
        proc = server.proc
        before = server.metrics()
        answers, wall = server.complete_concurrently([[1, 2, 3], [4, 5]], n_predict=3, ignore_eos=True)
        delta = srv.metrics_delta(before, server.metrics())
        assert [a["tokens"] for a in answers] == [[1, 1, 1], [4, 4, 4]]  # in prompt order
        assert [a["timings"]["prompt_n"] for a in answers] == [3, 2]
        assert delta["spec_decode_num_draft_tokens_total"] == 8
        assert wall > 0
    assert proc.poll() is not None  # stopped on leaving the block


def test_request_timeout_is_enforced(tmp_path):
    with srv.LlamaServer(fake_cmd(tmp_path, "hang"), tmp_path / "hang.log", start_timeout=30,
                         request_timeout=1.0) as server:
        t0 = time.monotonic()
        with pytest.raises(OSError):  # socket.timeout is an OSError
            server.complete([1, 2], n_predict=2, ignore_eos=True)
        assert time.monotonic() - t0 < 30


def test_compare_tokens():
    c = compare_tokens([[1, 2, 3], [4, 5, 6], [7, 8]], [[1, 2, 3], [4, 9, 6], [7, 8, 9]])
    assert c == {"same": 2, "n": 3, "first_diff": [1]}
