"""llama.cpp's hidden-state drafters (draft-dflash incl. DFlash2, draft-dspark, draft-eagle3,
draft-mtp) as values of the drafter axis, on tiny files the project writes itself
(tiny_drafters.py): acceptance by design, exact counts, timers that add up with the ingest
step, lossless verdicts under greedy, match and rejection, planted bugs caught, and pairs
llama.cpp cannot run refused before anything is loaded."""
from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
import pandas as pd
import pytest
from conftest import ENGINE_KW, assert_lossless_verdict, check_counts, check_spec_timers, injected
from scipy import stats

from specnative import Engine, _core, lossless
from specnative.engine import HIDDEN_DRAFTERS, drafter_name
from specnative.models import FORCED_TOKEN, tiny_vocab
from specnative.models.tiny_drafters import DRAFTER_KINDS, drafter_pair, write_tiny_drafter
from specnative.record import schema
from specnative.report import cells as report_cells
from specnative.sweep import main
from specnative.run.hidden_drafters import parse_drafter_files

PROMPTS = ["The city of", "Once upon a time there was a", "Hello", "In the year"]
BLOCK = 8  # write_tiny_drafter's default dflash.block_size: k up to BLOCK - 1
# file kind -> the drafter that runs it
DRAFTER_OF = {"dflash": "dflash", "dflash2": "dflash", "dspark": "dspark", "eagle3": "eagle3", "mtp": "mtp"}
KINDS = list(DRAFTER_OF)


@pytest.fixture(scope="session")
def hidden_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hidden")


@pytest.fixture(scope="module")
def engine_of(hidden_dir):
    """engine_of(kind, acceptance): one engine per (file kind, acceptance), made on first use."""
    opened = {}

    def get(kind: str, acceptance: str) -> Engine:
        if (kind, acceptance) not in opened:
            target, draft = drafter_pair(hidden_dir, "mtp" if kind == "mtp" else kind, acceptance=acceptance)
            opened[kind, acceptance] = Engine(target, draft, n_ctx=1024, n_batch=256, n_seq_max=4,
                                              mtp=kind == "mtp", **ENGINE_KW)
        return opened[kind, acceptance]

    yield get
    for engine in opened.values():
        engine.close()


def spec_run(engine, kind, prompts, **kw):
    return engine.generate(prompts, spec=True, drafter=DRAFTER_OF[kind], **kw)


# --- the files ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", DRAFTER_KINDS)
def test_factory_writes_what_llama_cpp_infers(hidden_dir, kind):
    _, draft = drafter_pair(hidden_dir, kind)
    assert _core.hidden_drafter_file_kind(str(draft)) == kind
    reader = gguf.GGUFReader(str(draft))
    names = {t.name for t in reader.tensors}
    arch = reader.get_field("general.architecture").contents()
    assert arch == ("eagle3" if kind == "eagle3" else "dflash")
    assert "fc.weight" in names and "token_embd.weight" not in names  # borrows the target's
    assert reader.get_field("tokenizer.ggml.tokens").contents() == tiny_vocab()[0]
    if kind != "eagle3":
        assert reader.get_field("tokenizer.ggml.mask_token_id").contents() == 0
    assert ("selector_hidden.weight" in names) == (kind == "dflash2")
    assert ("markov_w1.weight" in names) == (kind == "dspark")


def test_engine_says_what_it_inferred(engine_of):
    for kind in KINDS:
        assert engine_of(kind, "low").hidden_drafter == kind
    assert engine_of("dflash2", "low").draft_info["n_params"] > 0


def test_llama_cpp_spellings_are_accepted():
    assert drafter_name("draft-dflash") == "dflash" and drafter_name("draft-mtp") == "mtp"
    assert drafter_name("draft-simple") == "model" and drafter_name("ngram-mod") == "ngram-mod"


# --- acceptance by design -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_forced_high_accepts_everything_random_far_lower(engine_of, kind):
    k = 4
    high = spec_run(engine_of(kind, "high"), kind, PROMPTS[:2], n_predict=24, k=k)
    low = spec_run(engine_of(kind, "low"), kind, PROMPTS[:2], n_predict=24, k=k)
    assert all((t == FORCED_TOKEN).all() for t in high.tokens)
    assert high.draft_accept_rate >= 0.95
    assert low.totals["drafted"] > 0 and low.draft_accept_rate < 0.5
    sampled = spec_run(engine_of(kind, "high"), kind, PROMPTS[:2], n_predict=24, k=k, temperature=0.8,
                       accept_rule="rejection", seed=3)
    assert sampled.draft_accept_rate >= 0.95  # p(forced) ~ 1 even at T = 0.8; q is one-hot


@pytest.mark.parametrize("kind", KINDS)
def test_timers_add_up_with_the_ingest_step(engine_of, kind):
    spec = spec_run(engine_of(kind, "mid"), kind, PROMPTS, n_predict=24, k=4)
    check_spec_timers(spec)
    assert spec.times["draft_ingest"] > 0 and spec.times["prefill_draft"] > 0  # the ingest step, in both places
    check_counts(spec, 4)


def test_other_drafters_ingest_nothing(copy_engine):
    spec = copy_engine.generate(PROMPTS[:2], n_predict=12, spec=True, k=4)
    # a no-op's call (~0.1 us a round) against a verify decode (~1 ms): the bound is ~500x away
    assert spec.times["draft_ingest"] < 0.05 * spec.times["verify"]


# --- lossless -----------------------------------------------------------------------------------
RULES = [(0.0, "greedy"), (0.8, "match"), (0.8, "rejection")]


# (concurrency, k) pairs: each parametrisation runs two, and over the five file kinds every k at
# both concurrencies (k = BLOCK - 1: DFlash's longest block).
SHAPES = [[(1, 1), (4, BLOCK - 1)], [(1, 4), (4, 1)], [(1, BLOCK - 1), (4, 4)], [(1, 1), (4, 4)],
          [(1, 4), (4, BLOCK - 1)]]


@pytest.mark.parametrize("kind, shapes", list(zip(KINDS, SHAPES)))
@pytest.mark.parametrize("temperature, rule", RULES)
def test_no_fail_at_any_rule_concurrency_and_k(engine_of, kind, shapes, temperature, rule):
    engine = engine_of(kind, "mid")
    for n_seq, k in shapes:
        prompts = PROMPTS[:n_seq]
        base = engine.generate(prompts, n_predict=16, temperature=temperature, seed=5)
        spec = spec_run(engine, kind, prompts, n_predict=16, k=k, temperature=temperature, accept_rule=rule, seed=5)
        check_counts(spec, k)
        if rule == "rejection":  # lossless in distribution (below); per seed as the sweep: `match`
            spec = spec_run(engine, kind, prompts, n_predict=16, k=k, temperature=temperature,
                            accept_rule="match", seed=5)
        verdict, _ = lossless.verdict_after_run(engine, prompts, base.tokens, spec.tokens, temperature, 5, k,
                                                DRAFTER_OF[kind])
        assert verdict.verdict != lossless.FAIL, (kind, n_seq, k, verdict.reason)


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_rejection_with_one_hot_proposals_keeps_the_targets_distribution(engine_of, kind):
    """The token after the first round over many seeds: the baseline's and the rejection rule's
    (accept the drafter's x with probability p(x), else resample p without x) are one distribution."""
    engine = engine_of(kind, "mid")
    # 4 sequences a call (the keyed RNG draws each sequence's tokens apart): 300 draws in 75 calls
    seeds, prompts = range(75), ["Hello"] * 4
    base = [int(t[1]) for s in seeds for t in engine.generate(prompts, n_predict=3, temperature=1.0, seed=s).tokens]
    spec_runs = [spec_run(engine, kind, prompts, n_predict=3, k=1, temperature=1.0, accept_rule="rejection", seed=s)
                 for s in seeds]
    spec = [int(t[1]) for r in spec_runs for t in r.tokens]
    accepted = sum(r.totals["accepted"] for r in spec_runs)
    assert 0 < accepted < len(spec)  # both paths ran
    tokens = sorted(set(base) | set(spec))
    table = np.array([[base.count(t) for t in tokens], [spec.count(t) for t in tokens]])
    common = table.sum(axis=0) >= 10  # pool rare tokens
    table = np.column_stack([table[:, common], table[:, ~common].sum(axis=1)])
    table = table[:, table.sum(axis=0) > 0]
    assert stats.chi2_contingency(table).pvalue > 1e-3


PLANTED = ["rollback_short", "rollback_long", "verify_position", "seed_mixup", "bonus_from_q"]


@pytest.mark.parametrize("kind", ["dflash", "eagle3", "mtp"])
@pytest.mark.parametrize("fault", PLANTED)
def test_planted_bugs_fail(engine_of, kind, fault):
    engine = engine_of(kind, "mid")
    temperature = 0.8 if fault in ("seed_mixup", "bonus_from_q") else 0.0
    rule = "match" if temperature > 0 else "greedy"
    base = engine.generate(PROMPTS, n_predict=32, temperature=temperature, seed=11)
    with injected(engine, fault):
        spec = spec_run(engine, kind, PROMPTS, n_predict=32, k=4, temperature=temperature, accept_rule=rule, seed=11)
        verdict, _ = lossless.verdict_after_run(engine, PROMPTS, base.tokens, spec.tokens, temperature, 11, 4,
                                                DRAFTER_OF[kind])
    assert verdict.verdict == lossless.FAIL, verdict.reason


@pytest.mark.parametrize("kind", ["dflash", "dspark", "mtp"])
def test_skipping_the_draft_trim_is_refused_by_llama_cpp_not_a_silent_change(engine_of, kind):
    """The rollback contract after a draft (drop the draft cache's cells from pos0 on) is not a
    matter of draft quality at this llama.cpp commit: the next feature injection writes pos0 again,
    and llama.cpp refuses positions that do not follow the cache's last one. Skipping the trim
    (Fault::skip_draft_trim) must end in a clear error, never in a changed or aborted run; with the
    trim, the same run is lossless against the baseline (exact or numeric)."""
    engine = engine_of(kind, "mid")
    base = engine.generate(PROMPTS, n_predict=32)
    clean = spec_run(engine, kind, PROMPTS, n_predict=32, k=4)
    # verify batches vs 1-token steps: up to batch-shape near-ties (conftest)
    assert_lossless_verdict(engine, PROMPTS, base.tokens, clean.tokens, k=4, drafter=DRAFTER_OF[kind])
    with injected(engine, "skip_draft_trim"), pytest.raises(RuntimeError, match="consecutive"):
        spec_run(engine, kind, PROMPTS, n_predict=32, k=4)
    again = spec_run(engine, kind, PROMPTS, n_predict=32, k=4)  # the engine is still usable
    assert again.totals["accepted"] == clean.totals["accepted"]


def test_noise_control_covers_the_extraction_path(engine_of):
    """With a hidden-state drafter the control's verify-shaped pass runs under the drafter's target
    settings (feature extraction on), as the run's verify did. The engine keeps no cells across a
    change of settings: right after a plain run of the same prompts, a control under the settings
    prefills them again, a plain control reuses them."""
    engine = engine_of("dflash", "mid")
    prompts = PROMPTS[:2]
    base = engine.generate(prompts, n_predict=16)
    fed = engine._core._target_prompt_tokens_fed
    before = fed()
    plain = lossless.measure_noise(engine, prompts, base.tokens, 4)
    assert fed() == before  # the plain run's cells served both passes
    control = lossless.measure_noise(engine, prompts, base.tokens, 4, "dflash")
    assert fed() > before  # the extraction pass made cells of its own
    assert control.positions == plain.positions == sum(len(t) for t in base.tokens)


def test_speculation_leaves_the_target_without_extraction(engine_of, hidden_dir):
    """The honest baseline: after a hidden-state drafter's run (and a baseline under its settings)
    the target decodes as a plain target again, bit for bit."""
    engine = engine_of("eagle3", "mid")
    prompt = engine.tokenize("Hello there").tolist()
    before = engine.prompt_logits(prompt)
    spec_run(engine, "eagle3", PROMPTS[:2], n_predict=8, k=4)
    settings = engine.generate(PROMPTS[:2], n_predict=8, drafter="eagle3", drafter_settings=True)
    assert not settings.speculative and settings.step_ms > 0
    np.testing.assert_array_equal(engine.prompt_logits(prompt), before)


# --- refused before anything is loaded ----------------------------------------------------------
def write_header_only(path, arch: str, n_embd: int = 128, n_layer: int = 2):
    """A GGUF with a model's metadata and no tensors: enough for the checks that run before loading."""
    w = gguf.GGUFWriter(path, arch)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_context_length(1024)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def refusal(target, draft=None, mtp=False) -> str:
    with pytest.raises(ValueError) as info:
        Engine(target, draft, n_ctx=256, n_batch=64, n_seq_max=1, mtp=mtp, **ENGINE_KW)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unsupported_pairs_are_refused_with_one_line(hidden_dir, tmp_path):
    target, dflash = drafter_pair(hidden_dir, "dflash", acceptance="low")
    gemma3 = write_header_only(tmp_path / "gemma3.gguf", "gemma3")
    assert "architecture gemma3" in refusal(gemma3, dflash) and "layer inputs" in refusal(gemma3, dflash)
    message = refusal(target, mtp=True)
    assert "nextn" in message and "architecture llama" in message
    narrow = write_tiny_drafter(tmp_path / "narrow.gguf", "dflash", n_embd=64)
    assert "n_embd 64" in refusal(target, narrow)
    maskless = write_tiny_drafter(tmp_path / "maskless.gguf", "dflash", mask_token=None)
    assert "mask token" in refusal(target, maskless)
    deep = write_tiny_drafter(tmp_path / "deep.gguf", "dflash", target_layers=(0, 5))
    assert "target layer 5" in refusal(target, deep)
    narrow_eagle = write_tiny_drafter(tmp_path / "eagle-narrow.gguf", "eagle3", n_embd_target=96)
    assert "n_embd 96" in refusal(target, narrow_eagle)


def test_a_drafter_must_match_the_engine(engine_of, copy_engine):
    dflash = engine_of("dflash", "low")
    with pytest.raises(ValueError, match="use drafter='dflash'"):
        dflash.generate(PROMPTS[:1], n_predict=4, spec=True, drafter="eagle3")
    with pytest.raises(ValueError, match="use drafter='dflash'"):
        dflash.generate(PROMPTS[:1], n_predict=4, spec=True, drafter="model")
    with pytest.raises(ValueError, match="needs its draft file"):
        copy_engine.generate(PROMPTS[:1], n_predict=4, spec=True, drafter="dflash")
    with pytest.raises(ValueError, match="mtp=True"):
        copy_engine.generate(PROMPTS[:1], n_predict=4, spec=True, drafter="mtp")
    assert set(HIDDEN_DRAFTERS) == {"dflash", "dspark", "eagle3", "mtp"}


# --- the sweep ----------------------------------------------------------------------------------
SWEEP_FLAGS = ["--ctx-len", "0", "-np", "1,3", "-k", "3", "-n", "12", "--warmup", "1", "-r", "2",
               "--max-repeats", "2", "-t", "1", "--no-report"]


@pytest.fixture(scope="module")
def hidden_sweep(hidden_dir, tmp_path_factory):
    """--drafter model,dflash,dspark,eagle3 on the forced target (a DFlash2 file under dflash,
    llama.cpp's draft-eagle3 spelling), and --drafter mtp on the MTP target."""
    target, dflash2 = drafter_pair(hidden_dir, "dflash2")
    _, dspark = drafter_pair(hidden_dir, "dspark")
    _, eagle3 = drafter_pair(hidden_dir, "eagle3")
    mtp_target, _ = drafter_pair(hidden_dir, "mtp")
    out = tmp_path_factory.mktemp("hidden-sweep")
    assert main(["-m", str(target), "-md", str(target), "--drafter", "model,dflash,dspark,draft-eagle3",
                 "--drafter-file", f"dflash={dflash2}", "--drafter-file", f"dspark={dspark}",
                 "--drafter-file", f"eagle3={eagle3}", "--out", str(out / "a"), *SWEEP_FLAGS]) == 0
    assert main(["-m", str(mtp_target), "--drafter", "mtp", "--out", str(out / "b"), *SWEEP_FLAGS]) == 0
    return pd.concat([schema.read_traces(out / run / "traces.csv") for run in ("a", "b")], ignore_index=True)


def test_sweep_rows_for_every_hidden_drafter(hidden_sweep):
    on = hidden_sweep[hidden_sweep.spec_decode == "on"]
    assert sorted(set(on.drafter)) == ["dflash", "dspark", "eagle3", "model", "mtp"]
    assert len(on) == 5 * 2  # concurrency 1 and 3
    for column in ("draft_accept_rate", "mean_accept_len", "verify_cost_c", "speedup", "tps"):
        assert on[column].notna().all(), column
    assert (on.verdict != "fail").all() and on.lossless_ok.all()
    hidden = on[on.drafter != "model"]
    assert (hidden.draft_accept_rate >= 0.95).all()
    assert (hidden.draft_ingest_ms > 0).all() and hidden.settings_step_ms.notna().all()
    assert hidden.settings_step_cost.notna().all()
    kinds = dict(zip(hidden.drafter, hidden.drafter_kind))
    assert kinds == {"dflash": "dflash2", "dspark": "dspark", "eagle3": "eagle3", "mtp": "mtp"}
    mtp = hidden[hidden.drafter == "mtp"]
    assert mtp.draft_model.isna().all() and mtp.draft_sha256.isna().all()
    files = hidden[hidden.drafter != "mtp"]
    assert files.draft_model.str.startswith("tiny-").all() and (files.draft_type == "all F32").all()
    parts = ["prefill_target_ms", "prefill_draft_ms", "draft_ms", "draft_ingest_ms", "verify_ms", "resample_ms"]
    assert (on[parts].sum(axis=1) >= 0.99 * on.total_ms).all()
    for _, row in hidden.iterrows():  # the report's timing breakdown has the ingest step
        assert report_cells.step_parts(row)["draft_ingest_ms"] == pytest.approx(row.draft_ingest_ms)


def test_sweep_with_the_drafter_file_as_md(hidden_dir, tmp_path):
    """bench/gpu_check.sh's DFlash cell: -md names the DFlash file itself (llama.cpp's spelling)."""
    target, dflash2 = drafter_pair(hidden_dir, "dflash2")
    assert main(["-m", str(target), "-md", str(dflash2), "--drafter", "draft-dflash", "--out", str(tmp_path / "run"),
                 *SWEEP_FLAGS[:2], "-np", "1", *SWEEP_FLAGS[4:]]) == 0
    on = schema.read_traces(tmp_path / "run" / "traces.csv").query("spec_decode == 'on'")
    assert list(on.drafter) == ["dflash"] and list(on.drafter_kind) == ["dflash2"]
    assert on.draft_accept_rate.iloc[0] >= 0.95 and on.verdict.iloc[0] != "fail"


def test_sweep_refuses_an_unsupported_pair_before_any_work(hidden_dir, tmp_path, capsys):
    _, dflash = drafter_pair(hidden_dir, "dflash", acceptance="low")
    gemma3 = write_header_only(tmp_path / "gemma3.gguf", "gemma3")
    with pytest.raises(SystemExit) as info:
        main(["-m", str(gemma3), "-md", str(dflash), "--drafter", "dflash", "--out", str(tmp_path / "x"),
              *SWEEP_FLAGS])
    assert "architecture gemma3" in str(info.value) and not (tmp_path / "x").exists()
    target, _ = drafter_pair(hidden_dir, "dflash", acceptance="low")
    with pytest.raises(SystemExit, match="nextn"):
        main(["-m", str(target), "--drafter", "mtp", "--out", str(tmp_path / "y"), *SWEEP_FLAGS])


@pytest.mark.parametrize("items, message", [
    (["dflash"], "--drafter-file takes NAME=PATH, not 'dflash'"),
    (["dflash="], "--drafter-file takes NAME=PATH, not 'dflash='"),
    (["mtp=x.gguf"], "--drafter-file 'mtp=x.gguf': the name must be one of dflash, dspark, eagle3"),
    (["model=x.gguf"], "--drafter-file 'model=x.gguf': the name must be one of"),
    (["dflash=a.gguf", "draft-dflash=b.gguf"], "--drafter-file names dflash twice"),
])
def test_bad_drafter_file_flags_say_what_is_wrong(items, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_drafter_files(items)


def test_drafter_files_take_llama_cpp_spellings():
    assert parse_drafter_files(["draft-eagle3=e.gguf", "dspark=d.gguf"]) == {"eagle3": Path("e.gguf"),
                                                                             "dspark": Path("d.gguf")}
    assert parse_drafter_files(None) == {}


@pytest.mark.parametrize("flags, message", [
    (["--drafter-file", "dflash"], "--drafter-file takes NAME=PATH, not 'dflash'"),
    (["--drafter-file", "mtp=x.gguf"], "the name must be one of dflash, dspark, eagle3"),
    (["--drafter-file", "dflash={dflash}", "--drafter-file", "draft-dflash={dflash}"], "names dflash twice"),
    (["--drafter-file", "dflash={eagle3}"], "is a EAGLE-3 drafter file, not a DFlash one; run it as --drafter eagle3"),
    ([], "--drafter dflash: give its file with -md or --drafter-file dflash=GGUF"),
])
def test_the_sweep_refuses_bad_drafter_files_before_any_work(hidden_dir, tmp_path, flags, message):
    target, dflash = drafter_pair(hidden_dir, "dflash", acceptance="low")
    _, eagle3 = drafter_pair(hidden_dir, "eagle3")
    flags = [f.format(dflash=dflash, eagle3=eagle3) for f in flags]
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["-m", str(target), "--drafter", "dflash", *flags, "--out", str(tmp_path / "run"), *SWEEP_FLAGS])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("fault, acceptance, passes", [
    ("none", "mid", True), ("none", "low", True),
    ("accept_always", "low", False),  # keeps the random drafter's unlikely tokens
])
def test_rejection_rule_distributional_verdict_on_a_hidden_drafter(engine_of, fault, acceptance, passes):
    """lossless.rejection_distribution (the rejection rule's own verdict) on DFlash's one-hot
    proposals: the correct rule is consistent with p, a rule that keeps every draft is not."""
    engine = engine_of("dflash", acceptance)
    with injected(engine, fault):
        test = lossless.rejection_distribution(engine, PROMPTS, 1.0, 2, 400, n_predict=24, k=4,
                                               drafter="dflash")
    assert test.passed == passes, test.reason


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_a_prompt_longer_than_a_batch_feeds_the_drafter_every_chunk(hidden_dir, kind):
    """The target's prefill is cut into n_batch chunks; the drafter must read each one: a missed
    chunk leaves a hole in a file drafter's cache, which the drafter refuses at begin (checked:
    skipping full chunks fails this test). Cut in 32-token chunks, the run drafts as it does with
    the prompt in one batch and stays the baseline's output. (An MTP head keeps no such check: its
    memory may be the target's.)"""
    target, draft = drafter_pair(hidden_dir, kind, acceptance="mid")
    long_prompt = " ".join(["the city of words"] * 40)
    runs = {}
    for n_batch in (32, 256):
        with Engine(target, draft, n_ctx=1024, n_batch=n_batch, n_seq_max=2, mtp=kind == "mtp", **ENGINE_KW) as engine:
            assert len(engine.tokenize(long_prompt)) > 3 * 32
            base = engine.generate([long_prompt, "Hello"], n_predict=24)
            runs[n_batch] = spec_run(engine, kind, [long_prompt, "Hello"], n_predict=24, k=4)
            verdict, _ = lossless.verdict_after_run(engine, [long_prompt, "Hello"], base.tokens, runs[n_batch].tokens,
                                                    0.0, 0, 4, DRAFTER_OF[kind])
            assert verdict.verdict != lossless.FAIL, verdict.reason
    # Both shapes draft and accept alike: at T = 0 the forced token leads by ACCEPTANCE["mid"] (7
    # logits) in both models, far beyond any batch-shape noise, so every draft is the target's
    # choice whatever the chunking. (A missed chunk is caught above: the drafter refuses the hole.)
    for run in runs.values():
        assert 0 < run.totals["accepted"] == run.totals["drafted"], run.totals


def test_a_hidden_drafter_cell_runs_without_the_prefix_cache_on_both_sides(hidden_dir, tmp_path):
    """A hidden-state drafter prefills every whole prompt (its state comes from each sequence's own
    prefill), so its cell's spec-off runs must not share the context either: both sides prefill the
    same tokens, the rows say prefix_cache off, and --prefix-cache on,off gives the cell once."""
    from specnative.sweep.config import SweepConfig
    from specnative.sweep.grid import cells_of
    target, eagle3 = drafter_pair(hidden_dir, "eagle3")
    cfg = SweepConfig(targets=[str(target)], draft=target, drafters=["model", "eagle3"], prefix_caches=[True, False],
                      ctx_lens=[0], concurrencies=[2])
    modes = {(c.drafter, c.prefix_cache) for c in cells_of(cfg)}
    assert modes == {("model", True), ("model", False), ("eagle3", False)}
    out = tmp_path / "run"
    assert main(["-m", str(target), "-md", str(eagle3), "--drafter", "eagle3", "--ctx-len", "64", "-np", "2",
                 "-k", "3", "-n", "6", "--warmup", "0", "-r", "2", "--max-repeats", "2", "-t", "1",
                 "--prefix-cache", "on", "--no-report", "--no-db", "--out", str(out)]) == 0
    rows = schema.read_traces(out / "traces.csv")
    assert list(rows["prefix_cache"]) == ["off", "off"]
    off, on = rows[rows.spec_decode == "off"].iloc[0], rows[rows.spec_decode == "on"].iloc[0]
    assert off["kv_prompt_cells"] == on["kv_prompt_cells"] and off["prefill_tokens"] == on["prefill_tokens"]
    assert on["verdict"] != "fail"
    notes = __import__("json").loads((out / "provenance.json").read_text())["notes"]
    assert any("hidden-state drafters (eagle3)" in note for note in notes)
