"""Prefix caching under load: requests that share a context of documents ahead of their own prompt
(built as the sweep's --ctx-len builds it: the context message's opening, then the documents, then
each prompt's own part). On: the prefix's cells are computed once, in a sequence of its own beside
the slots, and copied into every admitted slot, which prefills only its own part; off: every
request prefills its whole prompt. Lossless either way against each request decoded alone, and
every cell freed at the end (the prefix's too)."""
from __future__ import annotations

import pytest

from specnative import lossless
from specnative.run import workloads
from specnative.serving import arrivals
from specnative.serving.loop import serve
from specnative.serving.verdict import serving_verdict

CTX_LEN = 160
SLOTS = 3  # the noisy engine has 8 sequences: one to spare for the prefix


@pytest.fixture(scope="module")
def shared_prompts(noisy_pair):
    """Token prompts with CTX_LEN tokens of shared context (workloads.Workload.token_prompts' layout)."""
    workload = workloads.Workload(noisy_pair[0])
    chosen = [p for p in workload.prompts if p.answer_of is None and not p.completion][:4]
    return workload.context_prompts(chosen, CTX_LEN)


def common_prefix(prompts) -> int:
    n = min(len(p) for p in prompts) - 1
    for p in prompts:
        n = next((i for i in range(n) if p[i] != prompts[0][i]), n)
    return n


@pytest.mark.parametrize("rate", [float("inf"), 100.0])
@pytest.mark.parametrize("spec", [False, True])
def test_on_prefills_the_prefix_once_off_prefills_every_prompt_whole(noisy_engine, shared_prompts, rate, spec):
    trace = arrivals.build_trace(shared_prompts, [10, 6, 12, 8], rate, 7, seed=2)
    shared = common_prefix([r.prompt for r in trace])
    assert shared >= CTX_LEN
    on = serve(noisy_engine, trace, max_concurrency=SLOTS, spec=spec, k=3, prefix_cache=True)
    off = serve(noisy_engine, trace, max_concurrency=SLOTS, spec=spec, k=3, prefix_cache=False)
    assert on.shared_prefix == shared and off.shared_prefix == 0
    first = on.admission_order[0]
    for i, (record, request) in enumerate(zip(on.records, trace)):
        # the request whose admission started the prefix is charged with it; the others feed their own part
        assert record["prefill_tokens"] == len(request.prompt) - (0 if i == first else shared), i
    assert on.prefill_tokens == sum(r["prefill_tokens"] for r in on.records) == \
        shared + sum(len(r.prompt) - shared for r in trace)
    assert [r["prefill_tokens"] for r in off.records] == [len(r.prompt) for r in trace]
    assert off.prefill_tokens == sum(len(r.prompt) for r in trace)
    for run in (on, off):
        assert [len(t) for t in run.tokens] == [r.output_len for r in trace]
        assert run.kv_cells_left == 0  # the slots' cells and the prefix's holder all freed
        verdict = serving_verdict(noisy_engine, trace, run.tokens, k=3)
        assert verdict.verdict in (lossless.EXACT, lossless.NUMERIC), verdict.reason


def test_a_late_request_copies_the_prefix_without_feeding_it(noisy_engine, shared_prompts):
    """Requests far apart on the clock: each finds the prefix in the cache even when every slot has
    emptied since."""
    trace = [arrivals.Request(1000.0 * i, tuple(p), 5) for i, p in enumerate(shared_prompts[:3])]
    run = serve(noisy_engine, trace, max_concurrency=2, prefix_cache=True, virtual_clock=True)
    assert run.skipped_ms > 0  # every slot was free between arrivals
    assert [r["prefill_tokens"] for r in run.records[1:]] == [len(r.prompt) - run.shared_prefix for r in trace[1:]]
    assert run.kv_cells_left == 0


def test_prompts_without_a_common_prefix_share_nothing(noisy_engine):
    prompts = [[1, 5, 6, 7], [2, 8, 9], [3, 4]]
    trace = [arrivals.Request(0.0, tuple(p), 4) for p in prompts]
    run = serve(noisy_engine, trace, max_concurrency=SLOTS, prefix_cache=True)
    assert run.shared_prefix == 0
    assert [r["prefill_tokens"] for r in run.records] == [len(p) for p in prompts]


def test_the_prefix_needs_a_sequence_beside_the_slots(noisy_engine, shared_prompts):
    trace = [arrivals.Request(0.0, tuple(p), 4) for p in shared_prompts]
    with pytest.raises(ValueError, match=r"prefix_cache .* needs n_seq_max >= 9 \(it has 8\)"):
        serve(noisy_engine, trace, max_concurrency=8, prefix_cache=True)
    run = serve(noisy_engine, trace, max_concurrency=8, prefix_cache=False)  # off: all sequences are slots
    assert run.kv_cells_left == 0


def test_the_serve_verb_replays_each_trace_with_and_without_the_prefix_cache(noisy_pair, tmp_path):
    from specnative.cli import main
    from specnative.record import schema
    out = tmp_path / "serve"
    argv = ["serve", "-m", str(noisy_pair[0]), "-md", str(noisy_pair[1]), "--ctx-len", "96", "--prefix-cache", "on,off",
            "--request-rate", "inf", "--max-concurrency", "2", "--num-requests", "4", "-r", "1", "-n", "6", "-k", "2",
            "-t", "1", "-o", str(out), "--no-report", "--no-db"]
    assert main(argv) == 0
    rows = schema.read_traces(out / "traces.csv")
    assert sorted(rows["prefix_cache"]) == ["off", "off", "on", "on"] and (rows["ctx_len"] == 96).all()
    by_mode = {mode: group for mode, group in rows.groupby("prefix_cache")}
    assert by_mode["on"]["prefill_tokens"].max() < by_mode["off"]["prefill_tokens"].min()  # the context fed once
    assert rows["cell_id"].nunique() == 4 and (rows["kv_cells_left"] == 0).all()
    assert (rows[rows["spec_decode"] == "on"]["verdict"] != "fail").all()
    from specnative.serving.report import write_report
    summary = write_report(out).read_text()
    levers = summary[summary.index("## Do the levers add under load?"):summary.index("## Per load level")]
    assert "benefit, cache off" in levers and "log-linear model of output throughput" in levers
    assert summary.index("## Where speculation stops paying (prefix cache off)") < summary.index("## Reproducibility")
