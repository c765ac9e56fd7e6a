"""Serving under load (csrc/serve.cpp, serve.py, arrivals.py, serve_metrics.py): admission order,
completion, KV cells freed, losslessness under continuous batching, traces, metrics, timers."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import PROMPTS, injected

from specnative import lossless
from specnative.serving import arrivals
from specnative.serving import metrics as serve_metrics
from specnative.serving.arrivals import Request
from specnative.serving.loop import serve
from specnative.serving.runner import serving_verdict

NGRAM_OPTIONS = {"spec-ngram-simple-size-n": 1, "spec-ngram-simple-size-m": 4}


def token_prompts(engine, texts=PROMPTS):
    return [engine.tokenize(t).tolist() for t in texts]


def in_flight_at(run, t_ms):
    return sum(r["admitted_ms"] <= t_ms < r["finish_ms"] for r in run.records)


# ---- arrivals -----------------------------------------------------------------------------------
def test_same_seed_gives_the_same_trace():
    a = arrivals.arrival_times(50, 4.0, burstiness=0.5, seed=7)
    b = arrivals.arrival_times(50, 4.0, burstiness=0.5, seed=7)
    c = arrivals.arrival_times(50, 4.0, burstiness=0.5, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    prompts = [[1, 2], [3, 4, 5], [6]]
    assert arrivals.build_trace(prompts, [3, 4, 5], 2.0, 9, seed=1) == arrivals.build_trace(prompts, [3, 4, 5], 2.0, 9,
                                                                                          seed=1)


def test_arrival_processes():
    np.testing.assert_array_equal(arrivals.arrival_times(5, math.inf), np.zeros(5))
    # Poisson at rate 10/s: mean gap 0.1 s; a burstier process (shape 0.2) has a larger spread
    poisson = np.diff(arrivals.arrival_times(4001, 10.0, 1.0, seed=3))
    bursty = np.diff(arrivals.arrival_times(4001, 10.0, 0.2, seed=3))
    assert poisson.mean() == pytest.approx(0.1, rel=0.1) and bursty.mean() == pytest.approx(0.1, rel=0.15)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.1)  # exponential: CV 1
    assert bursty.std() / bursty.mean() > 1.8                             # gamma(0.2): CV sqrt(5)
    for bad in (0, -1, "fast", float("nan")):
        with pytest.raises(ValueError, match="rate"):
            arrivals.arrival_times(3, bad)
    with pytest.raises(ValueError, match="burstiness"):
        arrivals.arrival_times(3, 1.0, burstiness=0)


def test_trace_file_round_trip_and_bad_lines(tmp_path):
    trace = arrivals.build_trace([[5, 6, 7], [8]], 4, 3.0, 6, seed=2, labels=["a", "b"])
    path = arrivals.write_trace(tmp_path / "trace.jsonl", trace)
    assert arrivals.read_trace(path) == trace
    path.write_text('{"arrival_s": 1.0, "prompt": [1], "output_len": 2}\n{"arrival_s": 0.5, "prompt": [1], '
                    '"output_len": 2}\n')
    with pytest.raises(ValueError, match="trace.jsonl:2: arrival_s goes back"):
        arrivals.read_trace(path)
    path.write_text('{"arrival_s": 0, "prompt": [], "output_len": 2}\n')
    with pytest.raises(ValueError, match="trace.jsonl:1: prompt"):
        arrivals.read_trace(path)


# ---- the serving loop ------------------------------------------------------------------------------
def test_known_trace_gives_the_expected_admission_order_and_completions(noisy_engine):
    prompts = token_prompts(noisy_engine)
    # three at t=0 on two slots (the third queues), two together much later, one alone after them
    times = [0.0, 0.0, 0.0, 1000.0, 1000.0, 2000.0]
    lens = [6, 12, 5, 7, 9, 3]
    trace = [Request(t, tuple(prompts[i % 3]), n) for i, (t, n) in enumerate(zip(times, lens))]
    for spec in (False, True):
        run = serve(noisy_engine, trace, max_concurrency=2, spec=spec, k=3, virtual_clock=True)
        assert run.admission_order == [0, 1, 2, 3, 4, 5]  # first come, first served
        assert [len(t) for t in run.tokens] == lens
        assert [sum(r["emit_tokens"]) for r in run.records] == lens
        assert run.kv_cells_left == 0
        rec = run.records
        # request 2 waited for a slot: it took the slot of whichever of 0 and 1 finished first
        first_free = min((0, 1), key=lambda i: rec[i]["finish_ms"])
        assert rec[2]["slot"] == rec[first_free]["slot"]
        assert rec[2]["admitted_ms"] >= rec[first_free]["finish_ms"]
        # later arrivals are admitted on arrival (the virtual clock jumps there), never before
        for i in (3, 4, 5):
            assert rec[i]["admitted_ms"] >= times[i] * 1000.0
            assert run.metrics[i]["queue_ms"] < 1000.0
        assert run.skipped_ms > 1_900_000  # two idle gaps jumped over
        assert max(in_flight_at(run, r["admitted_ms"]) for r in rec) <= 2
        for r, m in zip(rec, run.metrics):
            assert r["arrival_ms"] <= r["admitted_ms"] <= r["first_token_ms"] <= r["finish_ms"]
            assert m["ttft_ms"] == pytest.approx(r["first_token_ms"] - r["arrival_ms"])


def test_slots_refill_and_no_kv_cells_leak_over_hundreds_of_requests(noisy_engine):
    prompts = token_prompts(noisy_engine)
    trace = arrivals.build_trace(prompts, [2, 3, 4], float("inf"), 240, seed=5)
    for spec in (False, True):
        run = serve(noisy_engine, trace, max_concurrency=8, spec=spec, k=2, virtual_clock=True)
        assert len(run.records) == 240 and all(len(t) == r.output_len for t, r in zip(run.tokens, trace))
        assert run.kv_cells_left == 0
        assert sorted(r["slot"] for r in run.records[:8]) == list(range(8))
        assert run.mean_occupancy > 4  # the queue keeps the slots busy


def test_prompts_longer_than_n_batch_are_prefilled_in_chunks_beside_decoding(noisy_pair):
    from conftest import ENGINE_KW

    from specnative import Engine
    target, draft = noisy_pair
    with Engine(target, draft, n_ctx=2048, n_batch=32, n_seq_max=4, **ENGINE_KW) as engine:
        short = engine.tokenize(PROMPTS[2]).tolist()
        long = engine.tokenize(" ".join(PROMPTS * 12)).tolist()
        assert len(long) > 64
        trace = [Request(0.0, tuple(short), 30), Request(0.0, tuple(long), 4)]
        for spec in (False, True):
            run = serve(engine, trace, max_concurrency=2, spec=spec, k=3, virtual_clock=True)
            assert run.records[1]["prefill_batches"] >= math.ceil(len(long) / 32)
            assert run.mixed_steps >= 2  # the long prompt's chunks rode along the short one's decoding
            assert run.kv_cells_left == 0
            assert serving_verdict(engine, trace, run.tokens, k=3).lossless_ok


@pytest.mark.parametrize("drafter", ["model", "ngram-simple"])
def test_serving_is_lossless_against_each_request_decoded_alone(noisy_engine, drafter):
    prompts = token_prompts(noisy_engine)
    trace = arrivals.build_trace(prompts, [24, 16, 20], 400.0, 7, seed=11)
    options = NGRAM_OPTIONS if drafter != "model" else None
    off = serve(noisy_engine, trace, max_concurrency=3)
    on = serve(noisy_engine, trace, max_concurrency=3, spec=True, k=3, drafter=drafter, drafter_options=options)
    assert on.totals["drafted"] > 0 and 0 < on.draft_accept_rate <= 1
    for run in (off, on):
        verdict = serving_verdict(noisy_engine, trace, run.tokens, k=3)
        assert verdict.verdict in (lossless.EXACT, lossless.NUMERIC), verdict.reason
        assert verdict.lossless_ok


@pytest.mark.parametrize("fault", ["rollback_short", "rollback_long", "verify_position"])
def test_serving_verdict_fails_planted_bugs(noisy_engine, fault):
    prompts = token_prompts(noisy_engine)
    trace = arrivals.build_trace(prompts, [24, 16, 20], float("inf"), 4, seed=1)
    with injected(noisy_engine, fault):
        bad = serve(noisy_engine, trace, max_concurrency=2, spec=True, k=3)
    verdict = serving_verdict(noisy_engine, trace, bad.tokens, k=3)
    assert verdict.verdict == lossless.FAIL


def test_counts_and_timers_add_up(noisy_engine):
    prompts = token_prompts(noisy_engine)
    trace = arrivals.build_trace(prompts, [10, 14, 12], 200.0, 6, seed=4)  # real waits of a few ms
    run = serve(noisy_engine, trace, max_concurrency=2, spec=True, k=3)
    t = run.times
    steps = sum(t[b] for b in ("prefill_target", "prefill_draft", "draft", "verify", "resample", "decode"))
    assert steps + run.idle_ms == pytest.approx(t["total"], rel=0.01, abs=0.5)
    assert run.skipped_ms == 0 and run.duration_ms <= t["total"] + 1e-6
    assert 0 < t["llama"] <= t["draft"] + t["verify"] + t["resample"]
    totals = run.totals
    assert totals["drafted"] == sum(r["counts"]["drafted"] for r in run.records)
    assert totals["emitted"] == sum(len(tk) - 1 for tk in run.tokens)  # all but each first token
    assert run.mean_accept_len == pytest.approx(totals["emitted"] / totals["rounds"])
    for r in run.records:  # arrivals honoured on the real clock
        assert r["admitted_ms"] >= r["arrival_ms"] - 1e-9


def test_bad_serving_input_is_refused(noisy_engine):
    prompts = token_prompts(noisy_engine)
    ok = Request(0.0, tuple(prompts[0]), 4)
    with pytest.raises(ValueError, match="max_concurrency"):
        serve(noisy_engine, [ok], max_concurrency=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        serve(noisy_engine, [ok], max_concurrency=99)
    with pytest.raises(ValueError, match="arrival order"):
        serve(noisy_engine, [Request(1.0, ok.prompt, 4), ok], max_concurrency=2)
    with pytest.raises(ValueError, match="output length"):
        serve(noisy_engine, [Request(0.0, ok.prompt, 0)], max_concurrency=1)
    with pytest.raises(ValueError, match="exceed n_batch"):
        serve(noisy_engine, [ok], max_concurrency=8, spec=True, k=40)
    with pytest.raises(ValueError, match="KV cells"):
        serve(noisy_engine, [Request(0.0, ok.prompt, 1500)] * 8, max_concurrency=8)
    with pytest.raises(ValueError, match="no requests"):
        serve(noisy_engine, [], max_concurrency=1)
    # a refused call leaves the engine usable
    assert len(serve(noisy_engine, [ok], max_concurrency=1).tokens[0]) == 4


# ---- metrics -----------------------------------------------------------------------------------------
def test_request_metrics_and_goodput_by_hand():
    rec = {"arrival_ms": 10.0, "admitted_ms": 15.0, "first_token_ms": 40.0, "finish_ms": 100.0,
           "emit_ms": [40.0, 60.0, 100.0], "tokens": [1] * 7, "counts": {"drafted": 6, "accepted": 4}}
    m = serve_metrics.request_metrics(rec)
    assert (m["queue_ms"], m["ttft_ms"], m["e2e_ms"]) == (5.0, 30.0, 90.0)
    assert m["tpot_ms"] == pytest.approx(60.0 / 6)   # per token after the first
    assert m["itl_ms"] == [20.0, 40.0]               # per emission: several tokens came at once
    fast = dict(m, ttft_ms=10.0, tpot_ms=5.0)
    summary = serve_metrics.level_summary([m, fast], 2000.0, serve_metrics.parse_slo("ttft:20,tpot:8"))
    assert summary["goodput"] == pytest.approx(0.5)  # one of two met both targets, over 2 s
    assert summary["request_throughput"] == pytest.approx(1.0)
    assert summary["output_throughput"] == pytest.approx(7.0)
    assert summary["ttft_p50_ms"] == pytest.approx(20.0) and summary["itl_mean_ms"] == pytest.approx(30.0)
    for bad in ("ttft", "ttft:x", "speed:4", "tpot:-1", "ttft:1,ttft:2"):
        with pytest.raises(ValueError, match="--slo"):
            serve_metrics.parse_slo(bad)


# ---- the load sweep and its crossover --------------------------------------------------------------
def test_serve_sweep_writes_rows_requests_and_the_crossover_report(noisy_pair, tmp_path):
    import json

    from specnative.cli import main
    from specnative.record import schema
    target, draft = noisy_pair
    out = tmp_path / "serve"
    argv = ["serve", "-m", str(target), "-md", str(draft), "--request-rate", "inf,50", "--max-concurrency", "2",
            "--num-requests", "4", "-r", "2", "-n", "6", "-k", "3", "-t", "1", "--slo", "ttft:1000,tpot:100",
            "-o", str(out)]
    assert main(argv) == 0
    rows = schema.read_traces(out / "traces.csv")
    assert len(rows) == 2 * 2 * 2  # rates x seeded traces x spec off/on
    assert set(rows["request_rate"]) == {50.0, math.inf} and set(rows["seed"]) == {0, 1}
    assert (rows["concurrency"] == 2).all() and (rows["kv_cells_left"] == 0).all() and rows["lossless_ok"].all()
    for _, pair in rows.groupby(["request_rate", "seed"]):
        assert pair["trace_sha256"].nunique() == 1 and sorted(pair["spec_decode"]) == ["off", "on"]
    on = rows[rows["spec_decode"] == "on"]
    assert (on["drafted"] > 0).all() and on["draft_accept_rate"].between(0, 1).all()
    assert on["speedup"].tolist() == pytest.approx((on["tps"] / on["tps_baseline"]).tolist(), rel=1e-4)
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 8 * 4 and all(line["output_len"] == 6 for line in lines)
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["workload"] == {"source": "built-in", "dataset": None}  # --dataset: its record there
    assert set(lines[0]) >= {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "cell_id"}
    advice = json.loads((out / "advice.json").read_text())
    assert set(advice["crossover"]) == {"output_throughput", "tpot_p50_ms", "tpot_p99_ms", "goodput", "ttft_p50_ms"}
    assert set(advice["k_by_batch_size"]) == {"1", "2"}
    # the schedule in vLLM's form, which a replay takes as its spec policy
    schedule = advice["by_batch_schedule"]
    assert [size for lo, hi, _ in schedule for size in range(lo, hi + 1)] == [1, 2]
    assert {str(size): k for lo, hi, k in schedule for size in range(lo, hi + 1)} == advice["k_by_batch_size"]
    again = tmp_path / "replayed"
    assert main([*argv[:-1], str(again), "--request-rate", "inf", "-r", "1",
                 "--spec-policy", f"by-batch:{out / 'advice.json'}"]) == 0
    replay_rows = schema.read_traces(again / "traces.csv")
    replay_on = replay_rows[replay_rows["spec_decode"] == "on"]
    assert replay_on["spec_policy"].tolist() == [f"by-batch:{json.dumps(schedule, separators=(',', ':'))}"]
    hist = [int(h) for h in replay_on["k_chosen_hist"].iloc[0].split(";")]
    assert len(hist) == 4 and replay_rows["lossless_ok"].all()
    assert json.loads((again / "provenance.json").read_text())["serve"]["spec_policy"] == replay_on["spec_policy"].iloc[0]
    replayed = arrivals.read_trace(out / "trace_files" / "rate=50-seed=1.jsonl")
    assert len(replayed) == 4 and all(r.output_len == 6 for r in replayed)
    from specnative.serving.runner import trace_sha256
    assert set(rows.query("request_rate == 50 and seed == 1")["trace_sha256"]) == {trace_sha256(replayed)}
    summary = (out / "summary.md").read_text()
    assert "Where speculation stops paying" in summary and "latency_vs_rate.png" in summary
    assert (out / "goodput_vs_rate.png").is_file() and (out / "benefit_vs_rate.pdf").is_file()


def _synthetic_rows(benefits: dict, traces: int = 3):
    """Serve rows whose on/off throughput ratio at each rate is benefits[rate] (with a little
    spread over the traces); latencies inverse to throughput."""
    import pandas as pd
    rows = []
    for rate, b in benefits.items():
        for t in range(traces):
            wobble = 1 + 0.01 * (t - 1)
            for spec, tps in (("off", 100.0), ("on", 100.0 * b * wobble)):
                rows.append({"request_rate": rate, "trace_sha256": f"{rate}-{t}", "spec_decode": spec,
                             "output_throughput": tps, "goodput": tps / 10, "tpot_p50_ms": 1000 / tps,
                             "tpot_p99_ms": 2000 / tps, "ttft_p50_ms": 500 / tps, "mean_occupancy": min(rate, 8),
                             "concurrency": 8, "k": 4 if spec == "on" else None, "drafter": "model"})
    return pd.DataFrame(rows)


def test_advice_for_an_ngram_drafter_names_its_sizes():
    """llama-server runs an n-gram drafter at its own defaults unless told the sizes measured."""
    from specnative.analysis import crossover
    rows = _synthetic_rows({1.0: 1.5, 4.0: 0.7})
    rows["drafter"] = "ngram-simple"
    rows["drafter_options"] = "spec-ngram-mod-n-min=8;spec-ngram-simple-size-m=48;spec-ngram-simple-size-n=4"
    flags = crossover.advice(rows, crossover.benefit_table(rows))["load_bands"][0]["llama_server_flags"]
    assert flags == "--spec-type ngram-simple --spec-ngram-simple-size-m 48 --spec-ngram-simple-size-n 4 --spec-draft-n-max 4"


def test_crossover_is_found_between_the_rates_that_decide_it():
    from specnative.analysis import crossover
    rows = _synthetic_rows({1.0: 1.5, 2.0: 1.2, 4.0: 0.8, 8.0: 0.6, math.inf: 0.5})
    table = crossover.benefit_table(rows)
    c = crossover.crossover(table, "output_throughput")
    assert c["status"] == "crosses" and c["bracket"] == [2.0, 4.0]
    assert 2.0 < c["rate"] < 4.0  # b goes 1.2 -> 0.8: halfway in log rate
    assert c["rate"] == pytest.approx(2 * math.sqrt(2), rel=0.02)
    assert crossover.crossover(table, "tpot_p50_ms")["bracket"] == [2.0, 4.0]  # latency: off/on
    advice = crossover.advice(rows, table)
    assert advice["disable_by_batch_size"] == 4  # occupancy at the first rate where it loses
    assert advice["k_by_batch_size"]["3"] == 4 and advice["k_by_batch_size"]["4"] == 0
    assert [b["speculation"] for b in advice["load_bands"]] == ["on", "on", "off", "off", "off"]
    pays = crossover.benefit_table(_synthetic_rows({1.0: 1.5, 4.0: 1.3}))
    assert crossover.crossover(pays, "output_throughput")["status"] == "above-1-at-every-rate"
    late = crossover.benefit_table(_synthetic_rows({1.0: 1.5, math.inf: 0.7}))
    assert crossover.crossover(late, "goodput")["status"] == "crosses-beyond-last-finite-rate"


def md_rows(text: str) -> list[dict]:
    """The rows of the first markdown table in `text`, by header."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
    head = cells(lines[0])
    return [dict(zip(head, cells(line))) for line in lines[2:]]


def test_serving_report_tables():
    """The serving summary's tables from known rows: means per load level, where speculation stops
    paying (each metric, with the rates that decide it), and the advice per load band."""
    from synthetic_traces import assert_tables_well_formed

    from specnative.analysis import crossover
    from specnative.serving import report

    rows = _synthetic_rows({1.0: 1.5, 2.0: 1.2, 4.0: 0.8, 8.0: 0.6, math.inf: 0.5})
    rows = rows.assign(request_throughput=1.0, ttft_p99_ms=9.0, itl_p50_ms=3.0, e2e_p50_ms=50.0, queue_p50_ms=0.5,
                       mixed_step_frac=0.1, draft_accept_rate=0.7, mean_accept_len=2.5, verify_cost_c=0.4,
                       engine_own_share=0.01, verdict="exact", kv_cells_left=0)
    rows.loc[(rows.request_rate == 4.0) & (rows.spec_decode == "on") & (rows.trace_sha256 == "4.0-2"),
             ["verdict", "kv_cells_left"]] = ["numeric", 2]
    levels = report.levels_md(rows)
    assert_tables_well_formed(levels)
    by_level = {(r["rate"], r["spec"]): r for r in md_rows(levels)}
    assert len(by_level) == 10 and by_level["inf", "on"]["traces"] == "3"
    on1 = by_level["1", "on"]
    assert on1["out tok/s"] == "150" and on1["TPOT p50"] == "6.67" and on1["goodput"] == "15"  # means over traces
    assert (by_level["4", "on"]["verdicts"], by_level["4", "on"]["KV left"]) == ("exact,numeric", "2")
    assert (by_level["4", "off"]["verdicts"], by_level["4", "off"]["KV left"]) == ("exact", "0")

    table = crossover.benefit_table(rows)
    text = report.crossover_md(table, crossover.crossovers(table))
    assert_tables_well_formed(text)
    claims = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(claims) == len(crossover.METRICS)
    assert all("stops paying at about **2.83 req/s**" in line and "pays at 1, 2 and loses at 4, 8, inf req/s" in line
               for line in claims)
    bench = {(r["rate"], r["metric"]): r for r in md_rows(text)}
    assert len(bench) == 5 * len(crossover.METRICS)
    assert (bench["4", "output throughput"]["benefit"], bench["4", "output throughput"]["status"]) == ("0.8", "loses")
    assert bench["2", "p50 TPOT"]["status"] == "pays"  # latency: off / on, so a faster on-run pays
    for benefits, said in [({1.0: 0.7, 4.0: 0.6}, "never pays in the measured range"),
                           ({1.0: 1.5, 4.0: 1.3}, "above 1 at every rate"),
                           ({1.0: 1.5, math.inf: 0.7}, "the crossover lies beyond the largest finite rate")]:
        other = crossover.benefit_table(_synthetic_rows(benefits))
        assert said in report.crossover_md(other, crossover.crossovers(other))

    advice = report.advice_md(crossover.advice(rows, table))
    assert_tables_well_formed(advice)
    bands = md_rows(advice)
    assert [b["speculation"] for b in bands] == ["on", "on", "off", "off", "off"]
    assert bands[0]["p50 TPOT benefit"] == "1.5 (pays)" and bands[2]["throughput benefit"] == "0.8 (loses)"
    assert "--spec-draft-n-max 4" in bands[0]["llama-server flags"] and "none" in bands[2]["llama-server flags"]
    assert "`disable_by_batch_size`: **4**" in advice


def test_a_benefit_within_the_practical_margin_is_no_difference():
    from specnative.analysis import crossover, stats
    assert crossover.status(stats.Interval(0.999, 0.9985, 0.9995, 0.95, 3)) == crossover.TIE  # arrival-bound
    assert crossover.status(stats.Interval(0.9, 0.85, 0.95, 0.95, 3)) == crossover.LOSES
    assert crossover.status(stats.Interval(1.3, 1.1, 1.5, 0.95, 3)) == crossover.PAYS
    assert crossover.status(stats.Interval(1.3, 0.9, 1.8, 0.95, 3)) == crossover.TIE  # too wide to say


def test_a_dataset_feeds_requests_with_its_recorded_output_lengths(noisy_pair):
    from specnative.run import workloads
    from specnative.serving.runner import ServeConfig, traces_for, workload_requests
    first = workloads.Prompt("chat", (("user", "Hello there"),), "set/1", dataset="set", output_len=7)
    prompts = [first, workloads.Prompt("chat", (("user", "Tell me more"),), "set/2", dataset="set"),
               workloads.Prompt("chat", (("user", "x"), ("assistant", workloads.MODEL_ANSWER), ("user", "y")),
                                "set/1/turn2", dataset="set", turn=2, answer_of=first)]
    cfg = ServeConfig(target=noisy_pair[0], draft=noisy_pair[1], rates=[2.0], n_requests=6, n_predict=9, repeats=1,
                      prompts=prompts)
    tokens, labels, lens = workload_requests(cfg)
    assert labels == ["set/1", "set/2"] and lens == [7, 9]  # recorded length, else n_predict; no turn 2
    (rate, seed, trace), = traces_for(cfg, tokens, labels, lens)
    assert {(r.label, r.output_len) for r in trace} <= {("set/1", 7), ("set/2", 9)} and len(trace) == 6


def test_request_rate_inf_is_a_value_in_traces_csv(tmp_path):
    from specnative.record import schema
    path = tmp_path / "traces.csv"
    row = {"quant_bits": 4, "spec_decode": "off", "concurrency": 8, "ctx_len": 0, "tps": 100.0, "lossless_ok": True,
           "seed": 0}
    schema.append_rows(path, [dict(row, request_rate=math.inf), dict(row, request_rate=2.0)])
    assert schema.read_traces(path)["request_rate"].tolist() == [math.inf, 2.0]
    path.write_text(path.read_text().replace(",inf,", ",-inf,"))
    with pytest.raises(schema.TracesError, match="request_rate holds '-inf'"):
        schema.read_traces(path)


def test_close_from_another_thread_stops_a_serving_run_waiting_for_arrivals(noisy_pair):
    import threading

    from conftest import ENGINE_KW, inside_native_call

    from specnative import Engine
    target, draft = noisy_pair
    engine = Engine(target, draft, n_ctx=1024, n_batch=64, n_seq_max=2, **ENGINE_KW)
    prompt = tuple(engine.tokenize(PROMPTS[0]).tolist())
    trace = [Request(0.0, prompt, 4), Request(120.0, prompt, 4)]  # the second two minutes later, real clock
    with inside_native_call(engine, "serve") as inside:
        closer = threading.Thread(target=lambda: (inside.wait(), engine.close()))
        closer.start()  # closes once the serving call runs (an event from inside it, no sleep)
        with pytest.raises(RuntimeError, match="closed"):  # stopped in its wait for the second arrival
            serve(engine, trace, max_concurrency=1)
        closer.join(timeout=30)
    assert not closer.is_alive()
