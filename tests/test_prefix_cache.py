"""Prefix caching as a factor: with it on, a shared context is prefilled once, its cells shared by the
sequences and kept from one call to the next; off, every sequence prefills its own copy on every call
(a server without prompt caching). The prefill counts and KV cells show the difference, the output
stays lossless either way, and the sweep's rows say which."""
from __future__ import annotations

import pytest
from conftest import ENGINE_KW, TEST_NGL, assert_lossless_verdict

from specnative import Engine
from specnative.record import schema
from specnative.sweep import main

CONTEXT = list(range(300, 300 + 96))  # token ids of a shared context every sequence reads first
OWN = [[500 + s, 600 + s, 700 + s] for s in range(4)]


def prompts(n: int) -> list[list[int]]:
    return [CONTEXT + OWN[s] for s in range(n)]


@pytest.fixture(scope="module")
def engine(noisy_pair):
    with Engine(*noisy_pair, n_ctx=2048, n_batch=128, n_seq_max=4, **ENGINE_KW) as e:
        yield e


def test_off_prefills_one_copy_of_the_context_per_sequence_on_every_call(engine):
    n, total = 4, len(CONTEXT) + 3
    first_on = engine.generate(prompts(n), n_predict=8)
    again_on = engine.generate(prompts(n), n_predict=8)
    assert first_on.kv_prompt_cells == len(CONTEXT) + n * 3          # the context's cells once
    assert again_on.prefill_tokens == n * 3                           # the cached context is not fed again
    off = [engine.generate(prompts(n), n_predict=8, prefix_cache=False) for _ in range(2)]
    for run in off:
        assert run.kv_prompt_cells == n * total                       # n copies
        assert run.prefill_tokens == n * total                        # every call, every sequence
    assert off[1].times["prefill_target"] > again_on.times["prefill_target"]  # the cost shows in the timer


def test_off_stays_lossless_with_speculation(engine):
    base = engine.generate(prompts(4), n_predict=12, prefix_cache=False)
    spec = engine.generate(prompts(4), n_predict=12, spec=True, k=3, prefix_cache=False)
    assert spec.prefill_tokens == 4 * (len(CONTEXT) + 3)
    assert_lossless_verdict(engine, prompts(4), base.tokens, spec.tokens, k=3)


def test_the_sweep_measures_both_and_the_rows_say_which(noisy_pair, tmp_path):
    out = tmp_path / "run"
    argv = ["-m", str(noisy_pair[0]), "-md", str(noisy_pair[1]), "--ctx-len", "64", "-np", "2", "-k", "2",
            "-n", "6", "--warmup", "0", "-r", "2", "--max-repeats", "2", "-t", "1", "-ngl", str(TEST_NGL),
            "--prefix-cache", "on,off", "-o", str(out), "--no-report", "--no-db"]
    assert main(argv) == 0
    rows = schema.read_traces(out / "traces.csv")
    assert sorted(rows["prefix_cache"].unique()) == ["off", "on"]
    by_mode = {mode: group for mode, group in rows.groupby("prefix_cache")}
    assert by_mode["off"]["kv_prompt_cells"].min() > by_mode["on"]["kv_prompt_cells"].max()
    assert by_mode["off"]["prefill_tokens"].min() > by_mode["on"]["prefill_tokens"].max()
    assert all(cell.endswith("|prefix=off") or "|prefix=off|" in cell for cell in by_mode["off"]["cell_id"])
    assert (rows[rows["spec_decode"] == "on"]["verdict"] != "fail").all()
    assert rows["tps_repeats"].str.count(";").eq(1).all()  # both timed repeats, kept for paired statistics


def test_a_bad_prefix_cache_value_is_refused(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["--prefix-cache", "maybe"])
    assert refused.value.code == 2  # argparse's refusal of this flag's value, not of an unknown flag
    assert "argument --prefix-cache: expected on, off or on,off, got 'maybe'" in capsys.readouterr().err


def test_a_limit_keeps_only_the_context_between_calls_never_a_sequence_s_own_prompt(engine):
    """One sequence: its whole prompt is the common prefix. With the limit at the context's length a
    repeat feeds its own tokens again; at 0 nothing is kept, every call prefills the whole prompt."""
    one = prompts(1)
    kept = [engine.generate(one, n_predict=4, prefix_limit=len(CONTEXT)) for _ in range(3)]
    assert [run.prefill_tokens for run in kept[1:]] == [3, 3]
    assert kept[-1].kv_prompt_cells == len(CONTEXT) + 3
    none = [engine.generate(one, n_predict=4, prefix_limit=0) for _ in range(2)]
    assert [run.prefill_tokens for run in none] == [len(CONTEXT) + 3] * 2
    with pytest.raises(ValueError, match="prefix_limit must be an integer >= 0"):
        engine.generate(one, n_predict=4, prefix_limit=-1)


def test_the_sweep_prefills_every_repeat_s_own_prompt_at_concurrency_1(noisy_pair, tmp_path):
    """At ctx_len 0 the prefix cache keeps nothing between repeats (on and off prefill the same
    tokens); at ctx_len 64 it keeps the context only."""
    out = tmp_path / "run"
    argv = ["-m", str(noisy_pair[0]), "-md", str(noisy_pair[1]), "--ctx-len", "0,64", "-np", "1", "-k", "2",
            "-n", "6", "--warmup", "1", "-r", "2", "--max-repeats", "2", "-t", "1", "-ngl", str(TEST_NGL),
            "--prefix-cache", "on,off", "-o", str(out), "--no-report", "--no-db"]
    assert main(argv) == 0
    rows = schema.read_traces(out / "traces.csv")
    assert len(rows) == 8
    for _, row in rows.iterrows():
        kept = row["ctx_len"] if row["prefix_cache"] == "on" else 0
        assert row["prefill_tokens"] == row["prompt_tokens"] - kept, (row["cell_id"], row["prefill_tokens"])
