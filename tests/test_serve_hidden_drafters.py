"""Serving under load with llama.cpp's hidden-state drafters (draft-dflash incl. DFlash2,
draft-dspark, draft-eagle3, draft-mtp), as llama-server runs them with continuous batching: the
drafter reads the features of every mixed batch (other slots' prompt chunks beside verify tokens),
keeps per-slot draft cells trimmed after each draft and verify, takes in a new request's prompt
from the target's prefill chunks and drops a finished request's cells. Lossless against each
request decoded alone, accepting under load what it accepts in the closed loop, no KV cell left
behind (the target's or the drafter's)."""
from __future__ import annotations

import pytest
from conftest import ENGINE_KW, PROMPTS, SPEC_PARTS

from specnative import Engine, lossless
from specnative.models.tiny_drafters import drafter_pair
from specnative.serving import arrivals, checks
from specnative.serving.arrivals import Request
from specnative.serving.loop import serve
from specnative.serving.verdict import sampled_serving_verdict, serving_verdict

# file kind -> the drafter that runs it
DRAFTER_OF = {"dflash": "dflash", "dflash2": "dflash", "dspark": "dspark", "eagle3": "eagle3", "mtp": "mtp"}
KINDS = list(DRAFTER_OF)
K = 4
N_BATCH = 24  # 3 slots' verify tokens (15) leave a few prompt tokens a batch: prompts span many batches


@pytest.fixture(scope="module")
def engine_of(tmp_path_factory):
    """engine_of(kind, acceptance): one engine per (file kind, acceptance), made on first use."""
    folder = tmp_path_factory.mktemp("serve-hidden")
    opened = {}

    def get(kind: str, acceptance: str) -> Engine:
        if (kind, acceptance) not in opened:
            target, draft = drafter_pair(folder, kind, acceptance=acceptance)
            opened[kind, acceptance] = Engine(target, draft, n_ctx=2048, n_batch=N_BATCH, n_seq_max=4,
                                              mtp=kind == "mtp", **ENGINE_KW)
        return opened[kind, acceptance]

    yield get
    for engine in opened.values():
        engine.close()


def token_prompts(engine) -> list:
    """The suite's short prompts and one longer than a batch (prefilled in chunks beside decoding)."""
    texts = PROMPTS + [" ".join(PROMPTS * 4)]
    prompts = [engine.tokenize(t).tolist() for t in texts]
    assert len(prompts[-1]) > 2 * N_BATCH
    return prompts


def trace_at(engine, rate: float, n: int = 7, seed: int = 3) -> list:
    return arrivals.build_trace(token_prompts(engine), [20, 14, 24, 12], rate, n, seed=seed)


def serve_spec(engine, kind, trace, max_concurrency=3, **kw):
    return serve(engine, trace, max_concurrency=max_concurrency, spec=True, k=K, drafter=DRAFTER_OF[kind], **kw)


def test_serve_no_longer_refuses_the_hidden_state_drafters():
    for drafter in ("dflash", "dspark", "eagle3", "mtp"):
        assert checks.hidden_drafter_refusal(drafter) is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rate", [float("inf"), 150.0])
def test_a_drafter_that_accepts_by_design_accepts_under_load_losslessly(engine_of, kind, rate):
    engine = engine_of(kind, "high")
    trace = trace_at(engine, rate)
    run = serve_spec(engine, kind, trace)  # 7 requests on 3 slots: every slot serves more than one
    assert [len(t) for t in run.tokens] == [r.output_len for r in trace]
    assert run.totals["drafted"] > 0 and run.draft_accept_rate >= 0.9, run.draft_accept_rate
    assert run.mean_accept_len > 3
    assert run.mixed_steps > 0  # prompt chunks rode along other slots' verify tokens
    assert run.kv_cells_left == 0  # the target's and the drafter's cells all freed
    verdict = serving_verdict(engine, trace, run.tokens, k=K)
    assert verdict.lossless_ok, verdict.reason


@pytest.mark.parametrize("kind", KINDS)
def test_mid_acceptance_is_lossless_with_exact_counts_and_the_ingest_step_timed(engine_of, kind):
    engine = engine_of(kind, "mid")
    trace = trace_at(engine, 300.0, n=6, seed=8)
    run = serve_spec(engine, kind, trace, max_concurrency=2)
    assert 0 < run.totals["accepted"] < run.totals["drafted"]
    assert run.kv_cells_left == 0
    for record, request in zip(run.records, trace):
        c = record["counts"]
        assert c["emitted"] == request.output_len - 1 and c["accept_len_hist"].sum() == c["rounds"]
        assert c["accepted"] + c["rejected"] <= c["drafted"] <= K * c["rounds"]
    t = run.times
    assert t["draft_ingest"] > 0 and t["prefill_draft"] > 0  # verify batches and prompt-only batches read
    assert sum(t[p] for p in SPEC_PARTS) + run.idle_ms == pytest.approx(t["total"], rel=0.01, abs=0.5)
    verdict = serving_verdict(engine, trace, run.tokens, k=K)
    assert verdict.verdict in (lossless.EXACT, lossless.NUMERIC), verdict.reason


@pytest.mark.parametrize("kind", KINDS)
def test_a_reused_slot_drafts_as_a_fresh_drafter_would(engine_of, kind):
    """Requests one after another through one slot: the same batches as each decoded alone (whose
    drafter starts empty), so a slot whose draft cells or deferred state leaked from its last
    request drafts differently. The random drafter's proposals depend on every cell it attends to.
    MTP carries its last feature row from one request of a sequence to the next (llama.cpp's
    process() pairs a new prompt's first token with it, as llama-server's slots do), so its later
    requests may draft otherwise: only the first is compared."""
    engine = engine_of(kind, "low")
    prompts = token_prompts(engine)
    trace = [Request(0.0, tuple(p), 16) for p in prompts]
    run = serve_spec(engine, kind, trace, max_concurrency=1)
    assert run.kv_cells_left == 0
    compared = trace[:1] if kind == "mtp" else trace
    for record, request in zip(run.records, compared):
        alone = engine.generate([list(request.prompt)], n_predict=16, spec=True, k=K, drafter=DRAFTER_OF[kind],
                                stop_at_eos=False)
        for key in ("drafted", "accepted", "rounds"):
            assert record["counts"][key] == alone.totals[key], (key, request.prompt[:4])


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_sampling_under_load_is_lossless_per_seed(engine_of, kind):
    engine = engine_of(kind, "mid")
    trace = trace_at(engine, float("inf"), n=5, seed=4)
    run = serve_spec(engine, kind, trace, temperature=0.8, accept_rule="match", seed=9)
    assert run.kv_cells_left == 0 and run.totals["accepted"] > 0
    verdict = sampled_serving_verdict(engine, trace, run.tokens, K, 0.8, 9)
    assert verdict.verdict in (lossless.EXACT, lossless.NUMERIC), verdict.reason


def test_the_prefix_is_not_shared_with_a_hidden_drafter(engine_of):
    """Its draft cells come from each slot's own prefill (as in the closed loop): every request
    prefills its whole prompt, the prefix cache on or off."""
    engine = engine_of("dflash", "high")
    shared = engine.tokenize(" ".join(PROMPTS * 3)).tolist()
    trace = [Request(0.0, tuple(shared + engine.tokenize(p, add_special=False).tolist()), 8) for p in PROMPTS]
    run = serve_spec(engine, "dflash", trace, prefix_cache=True)
    assert run.shared_prefix == 0
    assert [r["prefill_tokens"] for r in run.records] == [len(r.prompt) for r in trace]
    assert run.kv_cells_left == 0 and run.draft_accept_rate >= 0.9


def test_spec_off_after_a_hidden_drafter_run_leaves_no_cell(engine_of):
    engine = engine_of("eagle3", "mid")
    trace = trace_at(engine, float("inf"), n=4)
    engine.generate([PROMPTS[0]], n_predict=8, spec=True, drafter="eagle3")  # leaves draft cells behind
    off = serve(engine, trace, max_concurrency=3)
    assert off.kv_cells_left == 0 and off.totals["drafted"] == 0


@pytest.mark.parametrize("modes", ["on", "on,off"])
def test_serve_refuses_the_prefix_cache_with_a_hidden_drafter_before_any_work(engine_of, tmp_path, modes):
    """Speculation with a hidden-state drafter prefills every whole prompt, so the run without it
    would share a prefix the run with it cannot: TTFT, throughput and the levers would compare
    different prefills. Refused in one line, nothing written."""
    from specnative.cli import main
    engine = engine_of("eagle3", "high")
    out = tmp_path / "serve"
    with pytest.raises(SystemExit) as refused:
        main(["serve", "-m", str(engine.target_path), "-md", str(engine.draft_path), "--drafter", "eagle3",
              "--prefix-cache", modes, "--request-rate", "inf", "--num-requests", "2", "-n", "4", "-o", str(out)])
    assert "--prefix-cache on: --drafter eagle3 prefills every whole prompt" in str(refused.value.code)
    assert not out.exists()
    assert checks.hidden_prefix_refusal("eagle3", [False]) is None  # off on both sides pairs like with like
    assert checks.hidden_prefix_refusal("model", [True, False]) is None
