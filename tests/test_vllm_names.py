"""Serve results in `vllm bench serve`'s names (serving/vllm_result.py) and the advice in each
engine's config form (analysis/engine_forms.py): on a replay with known counts every vLLM key is
there with vLLM's definition and type; a real serve run writes vllm_results.jsonl beside
requests.jsonl (and with --save-result one file per level); the vLLM and SGLang forms agree with
the llama-server flags and the k per batch size they come from."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from specnative.serving import metrics as serve_metrics
from specnative.serving import vllm_result

K = 4


def _line(i, *, ttft, e2e, emit, n_out, hist, drafted_at, accepted_at, prompt_len=10, arrival=0.0):
    """A requests.jsonl line with known counts: hist[m] rounds accepted exactly m drafts."""
    accepted = sum(m * h for m, h in enumerate(hist))
    return {"run_id": "r", "cell_id": "on-cell", "spec_decode": "on", "request_rate": 4.0, "seed": 0,
            "request": i, "label": f"p{i}", "prompt_len": prompt_len, "slot": 0, "arrival_ms": arrival,
            "admitted_ms": arrival, "first_token_ms": arrival + ttft, "finish_ms": arrival + e2e,
            "queue_ms": 0.0, "ttft_ms": ttft, "e2e_ms": e2e,
            "tpot_ms": (e2e - ttft) / (n_out - 1) if n_out > 1 else None,
            "itl_ms": np.diff(emit).tolist(), "output_len": n_out, "emissions": len(emit),
            "drafted": sum(drafted_at), "accepted": accepted, "rounds": sum(hist), "drafts": drafted_at[0],
            "drafted_at": drafted_at, "accepted_at": accepted_at, "accept_len_hist": hist,
            "emit_tokens": [1] + [2] * (len(emit) - 1)}


def known_replay():
    """Two requests, k=4. Request 0: 3 rounds, all drafting 4 (accepted 4, 2, 0). Request 1: 2
    rounds, one drafting 4 (accepted 1), one drafting 2 (accepted 2: a capped last round)."""
    a = _line(0, ttft=10.0, e2e=40.0, emit=[10.0, 20.0, 30.0, 40.0], n_out=10,
              hist=[1, 0, 1, 0, 1], drafted_at=[3, 3, 3, 3], accepted_at=[2, 2, 1, 1])
    b = _line(1, ttft=20.0, e2e=60.0, emit=[20.0, 40.0, 60.0], n_out=6, arrival=5.0,
              hist=[0, 1, 1, 0, 0], drafted_at=[2, 2, 1, 1], accepted_at=[2, 1, 0, 0])
    row = {"run_id": "r", "cell_id": "on-cell", "spec_decode": "on", "request_rate": 4.0, "seed": 0, "k": K,
           "concurrency": 2, "n_requests": 2, "burstiness": 1.0, "duration_s": 0.065, "slo": "ttft:15",
           "prefix_cache": "off", "drafter": "model", "target_model": "t.gguf", "lossless_ok": True,
           "draft_accept_rate": 9 / 18, "mean_accept_len": 1.8, "rounds": 5, "drafted": 18, "accepted": 9}
    return [a, b], row


def test_request_metrics_carry_the_counts_vllm_needs():
    rec = {"arrival_ms": 0.0, "admitted_ms": 0.0, "first_token_ms": 5.0, "finish_ms": 25.0,
           "emit_ms": [5.0, 15.0, 25.0], "tokens": [1] * 6,
           "counts": {"drafted": 7, "accepted": 3, "rounds": 3, "drafted_at": np.array([2, 2, 2, 1]),
                      "accepted_at": np.array([2, 1, 0, 0]), "accept_len_hist": np.array([1, 1, 1, 0, 0])}}
    m = serve_metrics.request_metrics(rec)
    assert (m["rounds"], m["drafts"]) == (3, 2)  # one round drafted nothing (an n-gram drafter's miss)
    assert m["drafted_at"] == [2, 2, 2, 1] and m["accepted_at"] == [2, 1, 0, 0]
    assert m["accept_len_hist"] == [1, 1, 1, 0, 0]
    json.dumps(m)  # plain types: a requests.jsonl line


def test_known_replay_gives_vllms_keys_and_definitions():
    lines, row = known_replay()
    r = vllm_result.level_result(lines, row)
    # every key vLLM's result has, with its type
    ints = ("completed", "failed", "total_input_tokens", "total_output_tokens", "spec_decode_num_drafts",
            "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "max_concurrency", "num_prompts",
            "max_concurrent_requests")
    floats = ("duration", "request_rate", "request_throughput", "output_throughput", "total_token_throughput",
              "request_goodput", "spec_decode_acceptance_rate", "spec_decode_acceptance_length",
              "max_output_tokens_per_s", *[f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99")
                                           for m in ("ttft", "tpot", "itl", "e2el")])
    for key in ints:
        assert type(r[key]) is int, key
    for key in floats:
        assert type(r[key]) is float, key
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert r[f"percentiles_{m}_ms"] == [[99.0, r[f"p99_{m}_ms"]]]
    assert isinstance(r["spec_decode_per_position_acceptance_rates"], list) and len(
        r["spec_decode_per_position_acceptance_rates"]) == K
    json.dumps(r, allow_nan=False)
    # the counts: drafts are rounds that drafted a token, acceptance length 1 + accepted / drafts
    assert (r["spec_decode_num_drafts"], r["spec_decode_draft_tokens"], r["spec_decode_accepted_tokens"]) == (5, 18, 9)
    assert r["spec_decode_acceptance_length"] == pytest.approx(1 + 9 / 5)
    assert r["spec_decode_acceptance_rate"] == pytest.approx(100 * 9 / 18)  # percent, as vLLM reports it
    # per position: accepted at position i / drafts; from the histogram, rounds that accepted more than i
    hist = np.add(lines[0]["accept_len_hist"], lines[1]["accept_len_hist"])
    from_hist = [hist[i + 1:].sum() / 5 for i in range(K)]
    assert r["spec_decode_per_position_acceptance_rates"] == pytest.approx(from_hist)
    assert r["spec_decode_per_position_acceptance_rates"] == pytest.approx([4 / 5, 3 / 5, 1 / 5, 1 / 5])
    # the latencies: vLLM's numpy statistics over the requests; ITL one gap per emission (chunk)
    assert r["mean_ttft_ms"] == 15.0 and r["median_ttft_ms"] == 15.0 and r["std_ttft_ms"] == 5.0
    assert r["mean_e2el_ms"] == 50.0
    assert r["mean_tpot_ms"] == pytest.approx(np.mean([30 / 9, 40 / 5]))
    assert r["mean_itl_ms"] == pytest.approx(np.mean([10, 10, 10, 20, 20]))  # 5 gaps, not 14 tokens
    assert r["p99_itl_ms"] == pytest.approx(np.percentile([10, 10, 10, 20, 20], 99))
    # totals and rates over the duration
    assert (r["completed"], r["total_input_tokens"], r["total_output_tokens"]) == (2, 20, 16)
    assert r["duration"] == pytest.approx(0.065) and r["request_throughput"] == pytest.approx(2 / 0.065)
    assert r["total_token_throughput"] == pytest.approx(36 / 0.065)
    assert r["request_goodput"] == pytest.approx(1 / 0.065)  # ttft:15 met by request 0 only
    assert r["request_rate"] == 4.0 and r["max_concurrency"] == 2
    # ours under our names, where the definitions differ
    ours = r["specnative"]
    assert ours["draft_accept_rate"] == pytest.approx(9 / 18) and ours["mean_accept_len"] == 1.8
    assert ours["spec_decode"] == "on" and ours["cell_id"] == "on-cell"


def test_the_per_request_summary_has_each_requests_acceptance_and_its_histogram():
    lines, row = known_replay()
    per = vllm_result.level_result(lines, row)["spec_decode_per_request"]
    assert per["num_speculative_tokens"] == K
    first, second = per["requests"]
    assert first["mean_acceptance_length"] == pytest.approx(1 + 6 / 3)
    assert second["mean_acceptance_length"] == pytest.approx(1 + 3 / 2)
    assert first["draft_acceptance_rate"] == pytest.approx(6 / 12) and second["num_draft_tokens"] == 6
    # rounds by the number of tokens they drafted: drafted_at[n-1] - drafted_at[n]
    assert first["num_drafts_by_draft_length"] == [0, 0, 0, 0, 3]
    assert second["num_drafts_by_draft_length"] == [0, 0, 1, 0, 1]
    assert per["num_drafts_by_draft_length"] == [0, 0, 1, 0, 4]
    hist = per["acceptance_length_histogram"]
    assert len(hist["bin_edges"]) == len(hist["counts"]) + 1 and sum(hist["counts"]) == 2
    assert hist["bin_edges"][0] == 1.0 and hist["bin_edges"][-1] == K + 1
    json.dumps(per, allow_nan=False)


def test_an_off_level_has_no_speculative_block_and_no_goodput_without_an_slo():
    lines, row = known_replay()
    for line in lines:
        line.update(spec_decode="off", drafted=0, accepted=0, rounds=0, drafts=0, drafted_at=[0] * K,
                    accepted_at=[0] * K, accept_len_hist=[0] * (K + 1))
    row.update(spec_decode="off", k=None, slo=None)
    r = vllm_result.level_result(lines, row)
    assert not [key for key in r if key.startswith("spec_decode")]
    assert r["request_goodput"] is None  # vLLM writes null without --goodput
    assert r["request_rate"] == 4.0 and r["completed"] == 2


def test_records_without_per_request_counts_give_no_spec_block():
    lines, row = known_replay()
    for line in lines:
        for key in ("rounds", "drafts", "drafted_at", "accepted_at", "accept_len_hist"):
            del line[key]
    r = vllm_result.level_result(lines, row)
    assert "spec_decode_num_drafts" not in r and "spec_decode_per_request" not in r
    assert "drafts" in r["specnative"]["note"]


def test_inf_rate_is_written_as_vllm_writes_it():
    lines, row = known_replay()
    row["request_rate"] = math.inf
    assert vllm_result.level_result(lines, row)["request_rate"] == "inf"


def test_a_serve_run_writes_vllm_results_beside_requests_and_per_level_files(noisy_pair, tmp_path):
    from specnative.cli import main
    from specnative.record import schema
    target, draft = noisy_pair
    out, results = tmp_path / "serve", tmp_path / "vllm"
    argv = ["serve", "-m", str(target), "-md", str(draft), "--request-rate", "inf", "--max-concurrency", "2",
            "--num-requests", "3", "-r", "1", "-n", "6", "-k", "3", "-t", "1", "-o", str(out),
            "--save-result", "--result-dir", str(results)]
    assert main(argv) == 0
    rows = schema.read_traces(out / "traces.csv")
    lines = [json.loads(line) for line in (out / vllm_result.RESULTS_FILE).read_text().splitlines()]
    assert len(lines) == len(rows) == 2
    by_spec = {r["specnative"]["spec_decode"]: r for r in lines}
    on_row = rows[rows["spec_decode"] == "on"].iloc[0]
    on = by_spec["on"]
    assert on["spec_decode_draft_tokens"] == on_row["drafted"] and on["spec_decode_accepted_tokens"] == on_row["accepted"]
    assert on["spec_decode_acceptance_length"] == pytest.approx(
        1 + on["spec_decode_accepted_tokens"] / on["spec_decode_num_drafts"])
    assert on["completed"] == 3 and on["total_output_tokens"] == 18 and on["request_rate"] == "inf"
    assert on["duration"] == pytest.approx(on_row["duration_s"])
    assert on["mean_ttft_ms"] == pytest.approx(
        np.mean([json.loads(x)["ttft_ms"] for x in (out / "requests.jsonl").read_text().splitlines()
                 if json.loads(x)["spec_decode"] == "on"]))
    assert not [key for key in by_spec["off"] if key.startswith("spec_decode")]
    files = sorted(p.name for p in results.glob("*.json"))
    assert len(files) == 2 and all("infqps-concurrency2" in name for name in files)
    assert {json.loads((results / name).read_text())["specnative"]["cell_id"] for name in files} == set(rows["cell_id"])
    advice = json.loads((out / "advice.json").read_text())
    forms = advice["engine_forms"]
    paid = any(k > 0 for k in advice["k_by_batch_size"].values())
    assert (forms["vllm"]["speculative_config"] is not None) == paid == (forms["sglang"]["flags"] is not None)
    summary = (out / "summary.md").read_text()
    assert "In other engines' forms" in summary and forms["vllm"]["derived_from"] in summary


@pytest.mark.parametrize("extra, message", [(["--result-dir", "DIR"], "--result-dir"),
                                             (["--save-result", "--result-dir", "FILE"], "not a directory")])
def test_bad_result_flags_are_refused_before_anything_is_written(tmp_path, extra, message):
    from specnative.cli import main
    out = tmp_path / "serve"
    (tmp_path / "FILE").write_text("x")
    extra = [str(tmp_path / e) if e in ("DIR", "FILE") else e for e in extra]
    with pytest.raises(SystemExit, match=message):
        main(["serve", "--request-rate", "inf", "--num-requests", "2", "-r", "1", "-o", str(out), *extra])
    assert not out.exists() and not (tmp_path / "DIR").exists() and (tmp_path / "FILE").read_text() == "x"


# ---- the advice in each engine's form ------------------------------------------------------------------
def _advice(k_by_batch, threshold=None, k=4, drafter="model", bands=("on",)):
    return {"k": k, "drafter": drafter, "k_by_batch_size": k_by_batch, "disable_by_batch_size": threshold,
            "max_concurrency": len(k_by_batch),
            "load_bands": [{"speculation": b, "llama_server_flags": f"-md DRAFT.gguf --spec-draft-n-max {k}"}
                           for b in bands]}


def test_vllm_config_carries_k_and_the_measured_schedule():
    from specnative.analysis import engine_forms
    adv = _advice({"1": 4, "2": 4, "3": 4, "4": 0, "5": 0}, threshold=4, bands=("on", "off"))
    forms = engine_forms.engine_forms(adv, host="CPU X")
    v = forms["vllm"]
    cfg = v["speculative_config"]
    assert cfg["method"] == "draft_model" and cfg["num_speculative_tokens"] == 4
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 3, 4], [4, 5, 0]]
    assert cfg["disable_by_batch_size"] == 4
    assert v["flags"] == "--speculative-config '" + json.dumps(cfg) + "'"
    assert "llama.cpp" in v["derived_from"] and "CPU X" in v["derived_from"] and "starting point" in v["derived_from"]
    # the same k as the llama-server flags of the bands where it is on
    import re
    on_k = {int(re.search(r"--spec-draft-n-max (\d+)", b["llama_server_flags"]).group(1))
            for b in adv["load_bands"] if b["speculation"] == "on"}
    assert on_k == {cfg["num_speculative_tokens"]}
    assert f"--speculative-num-steps {cfg['num_speculative_tokens']} " in forms["sglang"]["flags"]
    # the schedule is the k per batch size, size by size
    for lo, hi, k in cfg["num_speculative_tokens_per_batch_size"]:
        assert all(adv["k_by_batch_size"][str(s)] == k for s in range(lo, hi + 1))
    # k at every measured size: no schedule to give
    flat = engine_forms.engine_forms(_advice({"1": 4, "2": 4}), host="h")["vllm"]["speculative_config"]
    assert "num_speculative_tokens_per_batch_size" not in flat and "disable_by_batch_size" not in flat
    # nothing pays: speculation left off, as the llama-server flags say
    off = engine_forms.engine_forms(_advice({"1": 0, "2": 0}, threshold=1, bands=("off",)), host="h")
    assert off["vllm"]["speculative_config"] is None and off["sglang"]["flags"] is None


def test_sglang_flags_for_chains_and_topk_trees():
    from specnative.analysis import engine_forms
    chain = engine_forms.engine_forms(_advice({"1": 4}), host="h")["sglang"]
    assert chain["flags"] == ("--speculative-algorithm STANDALONE --speculative-draft-model-path DRAFT "
                              "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5")
    tree = engine_forms.engine_forms(_advice({"1": 8}, k=8, drafter="eagle3"), host="h",
                                     draft_shape="tree:topk=4,depth=5,budget=8")
    s = tree["sglang"]
    assert s["flags"] == ("--speculative-algorithm EAGLE3 --speculative-draft-model-path EAGLE3_HEAD "
                          "--speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 9")
    assert tree["vllm"]["speculative_config"] is None and "tree" in tree["vllm"]["note"]
    split = engine_forms.engine_forms(_advice({"1": 8}, k=8), host="h", draft_shape="tree:branches=4,p_split=0.1,budget=8")
    assert split["sglang"]["flags"] is None
    ngram = engine_forms.engine_forms(_advice({"1": 4}, drafter="ngram-simple"), host="h")
    assert ngram["vllm"]["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4}
    mtp = engine_forms.engine_forms(_advice({"1": 2}, k=2, drafter="mtp"), host="h")
    assert mtp["vllm"]["speculative_config"]["method"] == "mtp"
    assert mtp["sglang"]["flags"].startswith("--speculative-algorithm NEXTN")


def test_the_summary_renders_both_forms_with_their_provenance():
    from specnative.analysis import engine_forms
    from specnative.serving.report import engine_forms_md
    forms = engine_forms.engine_forms(_advice({"1": 4, "2": 0}, threshold=2, bands=("on", "off")), host="CPU X")
    text = engine_forms_md(forms)
    assert "`--speculative-config '" in text and "`--speculative-algorithm STANDALONE" in text
    assert "derived from a llama.cpp measurement on CPU X" in text and "not a measured fact" in text
