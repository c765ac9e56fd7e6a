"""bench/peerkit/serve_table.py: the open-loop streaming client that replays a serve run's traces
against llama-server, checked against a small stand-in that streams on loopback (no llama.cpp)."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from peerkit import open_loop, serve_table
from peerkit import server as srv

from specnative.serving.arrivals import Request

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
    records = open_loop.replay_open_loop(streaming_server, trace)
    assert [r["tokens"] for r in records] == [[7] * 5, [9] * 4]
    assert [r["emit_tokens"] for r in records] == [[2, 2, 1], [2, 2]]  # one emission per chunk
    assert records[1]["arrival_ms"] >= 150.0  # sent at its arrival time, not with the first
    for r, chunks in zip(records, (3, 2)):
        # the stand-in sleeps 20 ms before each chunk: the last cannot arrive sooner after the send
        assert r["finish_ms"] - r["arrival_ms"] >= 20.0 * chunks
        assert r["arrival_ms"] <= r["first_token_ms"] <= r["finish_ms"] == r["emit_ms"][-1]
    level = open_loop.server_level(records, {"tpot": 1.0})
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
    with pytest.raises(SystemExit, match="draft-lookup"):
        serve_table.replay_cmd(tools, {"target": "t.gguf"}, {**serve, "drafter": "draft-lookup"}, True, 1024, a)
    # a hidden-state drafter: its file as -md under llama.cpp's own spec type; mtp reads the target's own head
    eagle3 = serve_table.replay_cmd(tools, {"target": "t.gguf", "draft": "head.gguf"},
                                    {"drafter": "eagle3", "k": 3, "max_concurrency": 2}, True, 512, a)
    assert _flag(eagle3, "-md") == "head.gguf" and _flag(eagle3, "--spec-type") == "draft-eagle3"
    assert _flag(eagle3, "--spec-draft-n-max") == "3" and _flag(eagle3, "--spec-draft-p-min") == "0"
    mtp = serve_table.replay_cmd(tools, {"target": "t.gguf", "draft": None},
                                 {"drafter": "mtp", "k": 3, "max_concurrency": 2}, True, 512, a)
    assert "-md" not in mtp and _flag(mtp, "--spec-type") == "draft-mtp"


# ---------------------------------------------------------------------------------------------
# The interleaved comparison: schedule, measurement loop, paired table
# ---------------------------------------------------------------------------------------------
from peerkit import serve_paired, serve_parity

OURS, SERVER = serve_paired.OURS, serve_paired.SERVER


def test_schedule_alternates_which_side_goes_first_and_reverses_every_second_trace():
    even, odd = serve_parity.schedule(0), serve_parity.schedule(1)
    assert even == [(OURS, "off"), (SERVER, "off"), (OURS, "on"), (SERVER, "on")]
    assert odd == list(reversed(even)) and serve_parity.schedule(2) == even
    first = []  # which side runs first within each (trace, spec) pair
    for index in range(4):
        order = serve_parity.schedule(index)
        for spec in ("off", "on"):
            first.append(next(side for side, s in order if s == spec))
    assert first.count(OURS) == first.count(SERVER) == 4
    with pytest.raises(ValueError, match="trace index"):
        serve_parity.schedule(-1)


def _fake_traces(n: int, rate: float = 2.0) -> list:
    return [(rate, seed, [Request(0.0, (seed + 1, 5), 3), Request(0.1, (seed + 2,), 2)]) for seed in range(n)]


def test_measure_runs_both_sides_back_to_back_in_schedule_order_and_counts_identical_outputs():
    calls = []

    def run(side, spec, trace):
        calls.append((side, "on" if spec else "off", trace[0].prompt[0]))
        tokens = [[1, 2, 3], [4, 5]]
        if side == SERVER and spec:
            tokens = [[1, 2, 3], [4, 6]]  # the second request's output differs with speculation
        counts = [(4, 3), (2, 2)] if side == OURS else [(4, 2), (2, 1)]
        return {"output_throughput": 10.0, "tpot_p50_ms": 5.0, "ttft_p50_ms": 50.0, "tokens": tokens,
                "request_counts": counts}

    rows = serve_parity.measure(_fake_traces(2), run, before=lambda: {"busy_cores": 0.1}, progress=lambda msg: None)
    assert calls == [(s, spec, 1) for s, spec in serve_parity.schedule(0)] + \
                    [(s, spec, 2) for s, spec in serve_parity.schedule(1)]
    assert len(rows) == 8 and all("tokens" not in r and r["busy_cores"] == 0.1 for r in rows)
    assert [r["position"] for r in rows] == [0, 1, 2, 3] * 2
    assert {r["identical"] for r in rows if r["spec_decode"] == "off"} == {2}
    assert {r["identical"] for r in rows if r["spec_decode"] == "on"} == {1}
    # counts over the requests generated alike: both with spec off, the first alone with spec on
    on = {r["side"]: r for r in rows if r["spec_decode"] == "on" and r["trace_index"] == 0}
    assert (on[OURS]["drafted_identical"], on[OURS]["accepted_identical"]) == (4, 3)
    assert (on[SERVER]["drafted_identical"], on[SERVER]["accepted_identical"]) == (4, 2)
    table = serve_paired.alpha_table(pd.DataFrame([{**r, "drafted": 6, "accepted": 4} for r in rows])).iloc[0]
    assert table["identical_requests"] == 2 and table["requests"] == 4
    assert table["alpha_ours_identical"] == pytest.approx(0.75) and table["alpha_server_identical"] == 0.5
    # one trace hash per trace, the same on both sides
    assert len({r["trace_sha256"] for r in rows}) == 2


def _rows(values: dict, rate: float = float("inf")) -> pd.DataFrame:
    """Runs with per-trace metric values: values[(side, spec)][metric] = [trace 0, trace 1, ...]."""
    out = []
    for (side, spec), metrics in values.items():
        n = len(next(iter(metrics.values())))
        for i in range(n):
            out.append({"side": side, "spec_decode": spec, "request_rate": rate, "trace_index": i,
                        **{m: v[i] for m, v in metrics.items()}})
    return pd.DataFrame(out)


def test_paired_ratio_table_pairs_by_trace_and_orients_latencies():
    server_tps = [40.0, 60.0, 50.0, 45.0]          # the host drifts a lot between traces ...
    ours_tps = [t * 0.97 for t in server_tps]       # ... but ours is 3 % below on every one
    server_tpot = [20.0, 30.0, 25.0, 22.0]
    rows = _rows({
        (OURS, "off"): {"output_throughput": ours_tps, "tpot_p50_ms": [t * 1.25 for t in server_tpot],
                        "ttft_p50_ms": [100.0, 140.0, 90.0, 120.0]},
        (SERVER, "off"): {"output_throughput": server_tps, "tpot_p50_ms": server_tpot,
                          "ttft_p50_ms": [110.0, 120.0, 100.0, 115.0]},
    })
    table = serve_paired.ratio_table(rows).set_index("metric")
    tps = table.loc["output_throughput"]
    # paired: the drift cancels, a tight interval around 0.97; unpaired means would not show it
    assert tps["ratio"] == pytest.approx(0.97) and tps["high"] < 1.0 and tps["low"] > 0.95
    assert tps["outcome"] == serve_paired.WITHIN and tps["traces"] == 4
    tpot = table.loc["tpot_p50_ms"]  # ours 25 % slower per token: ratio 1.25, oriented 0.8
    assert tpot["ratio"] == pytest.approx(1.25) and tpot["outcome"] == serve_paired.BELOW
    assert table.loc["ttft_p50_ms"]["outcome"] == serve_paired.SAME  # noisy, straddles 1
    assert table.loc["ttft_p50_ms"]["low"] < 1.0 < table.loc["ttft_p50_ms"]["high"]
    assert table.loc["goodput"]["outcome"] == serve_paired.NA  # not measured: no interval
    verdict = serve_paired.verdict(serve_paired.ratio_table(rows), pd.DataFrame())
    assert not verdict["parity"] and len(verdict["failing"]) == 1 and "TPOT p50" in verdict["failing"][0]


def test_outcome_of_a_latency_faster_on_our_side_and_a_zero_goodput():
    faster = serve_paired.ratio([9.0, 9.1, 8.9], [10.0, 10.0, 10.0])  # ours lower latency: better
    assert serve_paired.outcome(faster, higher_better=False) == serve_paired.BETTER
    assert serve_paired.outcome(faster, higher_better=True) == serve_paired.BELOW  # as a rate: 10 % lower
    zero = serve_paired.ratio([0.0, 1.0, 1.0], [1.0, 1.0, 1.0])  # no log of 0: no interval
    assert serve_paired.outcome(zero, True) == serve_paired.NA and zero.n == 3
    one = serve_paired.ratio([1.0], [2.0])
    assert one.estimate == pytest.approx(0.5) and serve_paired.outcome(one, True) == serve_paired.NA


def test_alpha_table_gives_each_sides_pooled_alpha_and_the_paired_difference_in_points():
    rows = _rows({
        (OURS, "on"): {"accepted": [80, 90, 70], "drafted": [100, 100, 100]},
        (SERVER, "on"): {"accepted": [79, 88, 70], "drafted": [100, 100, 100]},
    }, rate=1.0)
    alpha = serve_paired.alpha_table(rows).iloc[0]
    assert alpha["alpha_ours"] == pytest.approx(0.8) and alpha["alpha_server"] == pytest.approx(237 / 300)
    assert alpha["diff_points"] == pytest.approx(1.0) and alpha["within"]
    assert alpha["diff_low"] < 1.0 < alpha["diff_high"]
    far = _rows({(OURS, "on"): {"accepted": [80, 90, 70], "drafted": [100] * 3},
                 (SERVER, "on"): {"accepted": [70, 80, 61], "drafted": [100] * 3}}, rate=1.0)
    table = serve_paired.alpha_table(far)
    assert not table.iloc[0]["within"]
    verdict = serve_paired.verdict(pd.DataFrame(columns=["spec_decode", "metric"]), table)
    assert not verdict["parity"] and "α" in verdict["failing"][0]


def test_benefit_table_shows_speculation_on_each_side():
    rows = _rows({
        (OURS, "off"): {"output_throughput": [40.0, 42.0, 41.0], "tpot_p50_ms": [20.0, 21.0, 20.5]},
        (OURS, "on"): {"output_throughput": [60.0, 63.0, 61.0], "tpot_p50_ms": [10.0, 10.5, 10.2]},
        (SERVER, "off"): {"output_throughput": [40.0, 42.0, 41.0], "tpot_p50_ms": [20.0, 21.0, 20.5]},
        (SERVER, "on"): {"output_throughput": [40.0, 42.0, 41.0], "tpot_p50_ms": [20.0, 21.0, 20.5]},
    })
    table = serve_paired.benefit_table(rows).set_index(["side", "metric"])
    assert table.loc[(OURS, "output_throughput")]["benefit"] == pytest.approx(1.5, rel=0.01)
    assert table.loc[(OURS, "tpot_p50_ms")]["status"] == "pays"
    assert table.loc[(SERVER, "output_throughput")]["benefit"] == pytest.approx(1.0)
    assert "pays" in serve_paired.benefit_md(serve_paired.benefit_table(rows))


def test_server_settings_are_read_from_its_log():
    log_text = ("llama_context: n_seq_max             = 4\nllama_context: n_ctx                 = 1536\n"
                "llama_context: n_batch               = 512\nllama_context: n_ubatch              = 512\n"
                "llama_context: flash_attn            = disabled\nllama_context: kv_unified            = true\n"
                "llama_kv_cache_iswa: using full-size SWA cache (ref: ...)\n"
                "system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : AVX2 = 1\n"
                "llama_context: n_ctx                 = 9999\n")  # a later (draft) context does not override
    got = serve_table.server_settings(log_text)
    assert got == {"n_seq_max": "4", "n_ctx": "1536", "n_batch": "512", "n_ubatch": "512", "flash_attn": "disabled",
                   "kv_unified": "true", "swa_full": "true", "n_threads": "2", "n_threads_batch": "2"}
    assert serve_table.server_settings("")["swa_full"].startswith("false")


def test_comparable_refuses_what_llama_server_cannot_run_alike_and_drops_an_ngram_runs_draft(tmp_path):
    from specnative.serving.runner import ServeConfig
    cfg = ServeConfig(target=tmp_path / "t.gguf", draft=tmp_path / "d.gguf", rates=[1.0], drafter="ngram-simple")
    assert serve_table.comparable(cfg).draft is None
    model = serve_table.comparable(ServeConfig(target=tmp_path / "t.gguf", draft=tmp_path / "d.gguf", rates=[1.0]))
    assert model.draft == tmp_path / "d.gguf"
    with pytest.raises(SystemExit, match="greedy"):
        serve_table.comparable(ServeConfig(target=tmp_path / "t.gguf", draft=None, rates=[1.0], temperature=0.7,
                                           drafter="ngram-simple"))
    with pytest.raises(SystemExit, match="the eagle3 comparison needs its drafter file"):
        serve_table.comparable(ServeConfig(target=tmp_path / "t.gguf", draft=None, rates=[1.0], drafter="eagle3"))
    head = serve_table.comparable(ServeConfig(target=tmp_path / "t.gguf", draft=tmp_path / "h.gguf", rates=[1.0],
                                              drafter="eagle3"))
    assert head.draft == tmp_path / "h.gguf"  # the engine loads the head, as the server does
    with pytest.raises(SystemExit, match="-md"):
        serve_table.comparable(ServeConfig(target=tmp_path / "t.gguf", draft=None, rates=[1.0]))


def _run_folder(tmp_path, temperature: float = 0.0) -> Path:
    run = tmp_path / "run"
    (run / "trace_files").mkdir(parents=True)
    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF")
    prov = {"serve": {"max_concurrency": 2, "k": 3, "drafter": "ngram-simple", "n_requests": 2, "repeats": 1,
                      "drafter_options": {"spec-ngram-simple-size-n": "3"}, "temperature": temperature,
                      "accept_rule": "greedy", "n_predict": 4, "slo": {}},
            "settings": {"seed": 5, "n_batch": 256}, "n_threads": 1,
            "models": [{"role": "target", "path": str(target)}]}
    (run / "provenance.json").write_text(json.dumps(prov))
    (run / "trace_files" / "rate=inf-seed=5.jsonl").write_text(
        '{"arrival_s": 0, "prompt": [1, 2], "output_len": 4}\n{"arrival_s": 0, "prompt": [3], "output_len": 2}\n')
    return run


def test_a_run_folder_gives_its_settings_and_traces_and_refuses_flags_that_would_not_apply(tmp_path):
    run = _run_folder(tmp_path)
    p = serve_table.build_parser()
    cfg, replays = serve_table.config_of_run(p, p.parse_args([str(run), "-t", "2"]))
    assert (cfg.max_concurrency, cfg.k, cfg.drafter, cfg.seed, cfg.n_batch, cfg.threads) == (2, 3, "ngram-simple",
                                                                                             5, 256, 2)
    assert cfg.drafter_options == {"spec-ngram-simple-size-n": "3"}
    assert [(rate, seed, len(trace)) for rate, seed, trace in replays] == [(float("inf"), 5, 2)]
    assert serve_table.config_of_run(p, p.parse_args([str(run)]))[0].threads == 1  # the run's own
    with pytest.raises(SystemExit, match="--request-rate.*would not"):
        serve_table.config_of_run(p, p.parse_args([str(run), "--request-rate", "2"]))
    with pytest.raises(SystemExit, match="not a run folder"):
        serve_table.config_of_run(p, p.parse_args([str(tmp_path)]))


def test_main_refuses_bad_input_before_building_or_measuring(tmp_path, monkeypatch):
    monkeypatch.setattr(serve_table, "find_tools", lambda *a: pytest.fail("nothing may be built"))
    with pytest.raises(SystemExit, match="--resume"):
        serve_table.main(["--resume", "-o", str(tmp_path / "x")])
    sampled = _run_folder(tmp_path, temperature=0.7)
    with pytest.raises(SystemExit, match="greedy"):
        serve_table.main([str(sampled), "-o", str(tmp_path / "y")])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_the_server_side_runner_measures_the_stand_in_and_pairs_with_ours(streaming_server):
    traces = _fake_traces(2)

    def ours(spec, trace):  # a stand-in for the engine: the same tokens the stand-in server streams
        return {"output_throughput": 1.0, "tokens": [[r.prompt[0]] * r.output_len for r in trace]}

    server = serve_parity.server_runner({False: streaming_server, True: streaming_server}, {})
    rows = serve_parity.measure(traces, serve_parity.both(ours, server), before=dict,
                                progress=lambda msg: None)
    theirs = [r for r in rows if r["side"] == SERVER]
    assert len(theirs) == 4 and all(r["identical"] == 2 for r in rows)
    assert all(r["completed"] == 2 and r["output_throughput"] > 0 for r in theirs)
    on = [r for r in theirs if r["spec_decode"] == "on"]
    assert all(r["drafted"] == 16 and r["accepted"] == 12 for r in on)  # the stand-in's timings, per request
    assert all(r["drafted_identical"] == 16 for r in on)
    with pytest.raises(ValueError, match="unknown side"):
        serve_parity.both(ours, server)("other", False, traces[0][2])


def test_our_side_runs_the_serving_loop_on_the_open_engine(target_only, noisy_pair):
    from specnative.serving.runner import ServeConfig
    cfg = ServeConfig(target=noisy_pair[0], draft=None, rates=[float("inf")], max_concurrency=2, k=3,
                      drafter="ngram-simple", threads=1)
    prompts = [tuple(int(t) for t in target_only.tokenize(text)) for text in ("The city of", "Hello")]
    trace = [Request(0.0, prompts[0], 6), Request(0.0, prompts[1], 4), Request(0.0, prompts[0], 3)]
    run = serve_parity.ours_runner(target_only, cfg)
    off, on = run(False, trace), run(True, trace)
    for result in (off, on):
        assert [len(t) for t in result["tokens"]] == [6, 4, 3]
        assert result["completed"] == 3 and result["kv_cells_left"] == 0
        assert result["ms_per_iteration"] > 0 and result["prefill_tokens"] == 2 * len(prompts[0]) + len(prompts[1])
    assert off["drafted"] == 0 and off["iterations"] >= 6  # one token per iteration for the longest request
    assert 0 <= on["accepted"] <= on["drafted"]


def test_render_writes_every_table_from_synthetic_runs(tmp_path):
    from specnative.serving.runner import ServeConfig
    values = {"output_throughput": [40.0, 42.0, 41.0], "tpot_p50_ms": [20.0, 21.0, 20.5],
              "ttft_p50_ms": [100.0, 90.0, 95.0], "accepted": [8, 9, 7], "drafted": [10, 10, 10],
              "busy_cores": [0.1, 0.2, 0.1], "iterations": [50, 51, 50]}
    frame = _rows({(side, spec): values for side in (OURS, SERVER) for spec in ("off", "on")})
    cfg = ServeConfig(target=tmp_path / "t.gguf", draft=None, rates=[float("inf")], drafter="ngram-simple",
                      drafter_options={"spec-ngram-simple-size-n": "3"}, max_concurrency=4, n_requests=12)
    got = {"ours_context": {"n_ctx": 1536, "n_batch": 512, "kv_unified": True}, "quiet": "quiet",
           "specnative_git": "abc", "date": "2026-01-01 00:00",
           "server_context": {"off": {"n_ctx": "1536"}, "on": {"n_ctx": "1536"}},
           "server_cmds": {"off": "llama-server -m t.gguf", "on": "llama-server -m t.gguf --spec-type ngram-simple"},
           "loadavg_start": (1.0, 1.0, 1.0), "loadavg_end": (2.0, 2.0, 2.0)}
    text = serve_table.render(cfg, [(float("inf"), s, []) for s in range(3)], got, frame, {"prebuilt": "x"},
                              ["--preset", "gemma3-270m"])
    assert "**Parity**" in text and "| inf | off | output tok/s | 3 | 41 | 41 | 1 [1, 1] | contains 1 |" in text
    assert "--spec-ngram-simple-size-n 3" in text and "| specnative (both settings, one engine) | " in text
    assert "3 at inf req/s" in text and "+0.0 [0, 0]" in text


def test_the_servers_settings_come_from_a_probe_start_at_higher_verbosity(streaming_server, tmp_path):
    a = argparse.Namespace(start_timeout=30, request_timeout=30)
    got = serve_table.probe_settings(streaming_server.base_cmd, tmp_path / "probe.log", a)
    assert got == {"swa_full": "false (or no SWA)"}  # the stand-in logs nothing
    assert (tmp_path / "probe.log").exists() and not srv._RUNNING - {streaming_server}  # stopped again


def test_report_only_writes_the_table_again_from_a_folder_and_refuses_other_flags(tmp_path):
    values = {"output_throughput": [40.0, 44.0, 41.0], "tpot_p50_ms": [20.0, 21.0, 20.5], "seed": [0, 1, 2],
              "n_requests": [12, 12, 12], "busy_cores": [0.1, 0.2, 0.1]}
    _rows({(side, spec): values for side in (OURS, SERVER) for spec in ("off", "on")}).to_csv(
        tmp_path / "runs.csv", index=False)
    prov = {"serve": {"drafter": "ngram-simple", "k": 4, "max_concurrency": 4, "drafter_options": {}},
            "models": [{"role": "target", "path": str(tmp_path / "t.gguf")}], "n_threads": 2,
            "server_cmds": {"off": "llama-server -m x", "on": "llama-server -m x --spec-type ngram-simple"},
            "server_context": {"off": {}, "on": {}}, "ours_context": {}, "loadavg_start": [1, 1, 1],
            "loadavg_end": [1, 1, 1], "specnative_git": "abc", "date": "2026-01-01T10:00:00+00:00",
            "command": "python bench/peers.py serve --preset gemma3-270m -t 2"}
    (tmp_path / "provenance.json").write_text(json.dumps(prov))
    assert serve_table.main(["--report-only", str(tmp_path)]) == 0
    text = (tmp_path / "parity.md").read_text()
    assert "2026-01-01 10:00" in text and "3 at inf req/s, 12 requests each" in text
    assert "python bench/peers.py serve --preset gemma3-270m -t 2" in text
    with pytest.raises(SystemExit, match="-t would not apply|--threads would not apply"):
        serve_table.main(["--report-only", str(tmp_path), "-t", "1"])
    with pytest.raises(SystemExit, match="no comparison"):
        serve_table.main(["--report-only", str(tmp_path / "missing")])
