"""Where a round's time goes: inside llama.cpp calls (times["llama"], of which the
rollbacks' KV removal, times["kv_removal"]) or the engine's own (batch building, sampling,
acceptance). A planted fault (slow_accept: a busy-wait of
2 ms per sequence per iteration in the accept phase) must show up as engine time, not llama time."""
from __future__ import annotations

import math

import pytest
from conftest import PROMPTS, injected

from specnative import _core
from specnative.analysis import advisor
from specnative.engine import decoding_ms, engine_own_time
from specnative.report import tables
from specnative.sweep.rows import median_row as _median_row

# The busy-wait of Fault::slow_accept, per sequence per iteration (the C++ core's kSlowAcceptMs; read
# from the core where it says it, else its value).
SLOW_ACCEPT_MS = float(_core.slow_accept_ms)  # the C++ constant, not a copy of it
RUNS = [pytest.param({"spec": False}, id="off"),
        pytest.param({"spec": True, "k": 4}, id="on-model"),
        pytest.param({"spec": True, "k": 4, "drafter": "ngram-simple"}, id="on-ngram"),
        # a tree's round runs the same accept phase as a chain's (one round loop for every shape)
        pytest.param({"spec": True, "draft_shape": "tree:topk=2,depth=3,budget=4"}, id="on-tree")]


def _generate(engine, **kw):
    return engine.generate(PROMPTS[:2], n_predict=24, **kw)


def _check_account(r):
    """llama time is a part of the decoding time; the shares are shares."""
    decoding = decoding_ms(r.times)
    own = r.engine_own
    assert 0.0 <= own["llama_ms"] <= decoding
    assert own["engine_own_ms"] == pytest.approx(decoding - own["llama_ms"])
    assert 0.0 <= own["engine_own_share"] <= 1.0
    assert r.times["llama"] > 0.0  # every iteration decodes (a baseline step, or a verify)


@pytest.mark.parametrize("kw", RUNS)
def test_slow_accept_is_engine_time_not_llama_time(noisy_engine, kw):
    _generate(noisy_engine, **kw)  # so that both runs below follow a run of the same prompts
    with injected(noisy_engine, "slow_accept"):
        slow = _generate(noisy_engine, **kw)
    plain = _generate(noisy_engine, **kw)
    # a delay, not a bug: the same calls on the same cache history, so the same tokens bit for bit
    assert [list(t) for t in slow.tokens] == [list(t) for t in plain.tokens]
    _check_account(plain)
    _check_account(slow)
    sequence_iterations = round(slow.occupancy * slow.steps * len(slow.tokens))
    added = SLOW_ACCEPT_MS * sequence_iterations
    # Each busy-wait spins on the clock for SLOW_ACCEPT_MS at least, outside every llama.cpp call:
    # all of it is the engine's own time, and none of it llama.cpp's, on a loaded machine too (no
    # other run's timings compared). Were it counted as llama time, the own time would be the
    # engine's bookkeeping alone: well under the busy-waits (a tiny model's round is ~1 ms).
    assert slow.engine_own["engine_own_ms"] >= added * (1 - 1e-9)
    assert slow.times["llama"] <= decoding_ms(slow.times) - added * (1 - 1e-9)


def test_kv_removal_is_timed_only_where_a_rollback_removes_cells(noisy_engine, copy_engine):
    """A rejected tail is removed from the target's and the draft's caches (llama.cpp time, shown
    apart); a baseline never removes; an exact-copy draft at T = 0 never has a tail to remove."""
    rejecting = noisy_engine.generate(PROMPTS[:2], n_predict=24, spec=True, k=4)
    assert rejecting.totals["rejected"] > 0
    assert 0.0 < rejecting.times["kv_removal"] <= rejecting.times["llama"]
    assert rejecting.engine_own["kv_removal_ms"] == rejecting.times["kv_removal"]
    assert noisy_engine.generate(PROMPTS[:2], n_predict=24, spec=False).times["kv_removal"] == 0.0
    exact = copy_engine.generate(PROMPTS[:2], n_predict=24, spec=True, k=4)
    assert exact.totals["rejected"] == 0 and exact.times["kv_removal"] == 0.0


def test_prefill_is_not_counted(noisy_engine):
    """times["llama"] covers decoding only: a long prompt's prefill decodes stay out of it."""
    long_prompt = " ".join(["word"] * 300)
    r = noisy_engine.generate([long_prompt], n_predict=4, spec=False)
    _check_account(r)
    assert r.times["llama"] <= r.times["decode"]


def test_engine_own_time_definition():
    assert engine_own_time(10.0, 9.5, 2.0) == {"llama_ms": 9.5, "kv_removal_ms": 2.0, "engine_own_ms": 0.5,
                                               "engine_own_share": 0.05}
    assert math.isnan(engine_own_time(0.0, 0.0)["engine_own_share"])


@pytest.mark.parametrize("kw", RUNS)
def test_sweep_rows_carry_engine_own_time(noisy_engine, kw):
    """The sweep's row (off and on) fills llama_ms, engine_own_ms and engine_own_share from the
    repeats' means, by the one definition."""
    results = [_generate(noisy_engine, **kw) for _ in range(2)]
    row = _median_row(results)
    decoding = sum(decoding_ms(r.times) for r in results) / 2
    llama = sum(r.times["llama"] for r in results) / 2
    assert row["llama_ms"] == pytest.approx(llama)
    assert row["kv_removal_ms"] == pytest.approx(sum(r.times["kv_removal"] for r in results) / 2)
    assert row["engine_own_ms"] == pytest.approx(decoding - llama)
    assert row["engine_own_share"] == pytest.approx((decoding - llama) / decoding)
    assert 0.0 <= row["engine_own_share"] <= 1.0


def test_context_info_and_graph_reuse(noisy_engine):
    """The context's parameters as llama.cpp set them, and its graph-reuse counter: a baseline
    decodes one token per step with the same graph shape, which llama.cpp reuses."""
    before = noisy_engine.context_info()
    assert before["n_seq_max"] == 8 and before["n_threads"] == 1 and before["swa_full"] is True
    assert before["n_ctx"] >= 4096 and 1 <= before["n_ubatch"] <= before["n_batch"] <= 256
    noisy_engine.generate(PROMPTS[:1], n_predict=16, stop_at_eos=False)
    after = noisy_engine.context_info()
    steps = after["n_eval"] - before["n_eval"]
    assert steps >= 14  # 15 single-token decodes after the prefill
    assert 0 < after["n_reused"] - before["n_reused"] <= steps
    assert noisy_engine.context_info(draft=True)["n_seq_max"] == 8


def test_report_shows_engine_own_share():
    import pandas as pd
    from synthetic_traces import cell

    frame = pd.DataFrame(cell() + cell(conc=4))
    frame["llama_ms"], frame["engine_own_ms"] = 99.0, 1.0
    frame["engine_own_share"] = [0.005 if on == "off" else 0.02 for on in frame["spec_decode"]]
    text = tables.engine_own_md(advisor.load_traces(frame))
    assert "rows above the goal of 1%" in text and "2.00%" in text and "0.50%" in text
    empty = frame.assign(engine_own_share=float("nan"))
    assert "not recorded" in tables.engine_own_md(advisor.load_traces(empty))


def _first_argmax(x):
    """The reference: the first index of the largest non-NaN value; the last index if none."""
    import numpy as np
    finite = np.where(np.isnan(x), -np.inf, x)
    top = finite.max()
    hits = np.flatnonzero(x == top)
    return int(hits[0]) if len(hits) else len(x) - 1


def test_argmax_is_the_first_index_of_the_max():
    """The vectorized argmax (blocks of 256, 16 lanes) picks what a plain scan picks: ties across
    and within blocks, NaNs, signed zeros, -inf, lengths around the block size, Gemma's vocabulary."""
    import numpy as np

    from specnative import _core

    rng = np.random.default_rng(17)
    for n in [1, 2, 15, 16, 17, 255, 256, 257, 511, 513, 1024, 4097, 32000, 262144]:
        for _ in range(20):
            x = np.round(rng.normal(size=n) * 2) / 2  # many ties
            x[rng.random(n) < 0.02] = np.nan
            x[rng.random(n) < 0.02] = -0.0
            x[rng.random(n) < 0.01] = -np.inf
            x = x.astype(np.float32)
            assert _core._argmax(x) == _first_argmax(x), n
        peak = rng.integers(n)
        x = np.full(n, -1.0, dtype=np.float32)
        x[peak] = 3.0
        x[-1] = 3.0  # a later tie
        assert _core._argmax(x) == min(peak, n - 1)
    assert _core._argmax(np.full(300, np.nan, dtype=np.float32)) == 299
    assert _core._argmax(np.array([np.nan, -np.inf, -np.inf], dtype=np.float32)) == 1
    assert _core._argmax(np.array([-0.0, 0.0, -1.0], dtype=np.float32)) == 0
