"""Workloads: the built-in suite by task, user prompt files (one-line errors naming the line),
chat templates through llama.cpp, shared long contexts from real documents, the task axis of
the sweep and the per-task report."""
from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from conftest import TEST_NGL
from synthetic_traces import PROVENANCE, off_row, on_row

from specnative import _core, sweep
from specnative.analysis import advisor
from specnative.record import schema
from specnative.report import drafter_sections
from specnative.report import summary as report_summary
from specnative.run import workloads
from specnative.run.workloads import ALL, MIXED, PromptFileError, Workload, suite
from specnative.run.workloads import prompts as sweep_prompts

SPEC_BENCH_LIKE = ("chat", "translation", "summarization", "qa", "math", "extraction")


# --------------------------------------------------------------------------------------------
# The built-in suite and documents

def test_builtin_suite_covers_the_categories_with_distinct_prompts():
    prompts = workloads.builtin_prompts()
    assert set(SPEC_BENCH_LIKE) | {"code-completion", "code-editing", "code-explanation"} == set(workloads.CATEGORIES)
    for category in workloads.CATEGORIES:
        mine = [p for p in prompts if p.category == category]
        assert len(mine) >= 3
        assert len({p.messages for p in mine}) == len(mine)
        for p in mine:
            assert p.messages[-1][0] == "user" and all(role in sweep_prompts.ROLES for role, _ in p.messages)
    assert any(len(p.messages) >= 3 for p in prompts if p.category == "chat")  # multi-turn
    assert workloads.builtin_prompts() == prompts  # deterministic


def test_builtin_documents_are_varied_text_not_one_sentence_repeated():
    docs = workloads.builtin_documents()
    assert len(docs.sources) >= 8 and len({s["sha256"] for s in docs.sources}) == len(docs.sources)
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", docs.text) if len(s.strip()) > 20]
    assert len(sentences) > 150
    assert max(sentences.count(s) for s in sentences) <= 2


# --------------------------------------------------------------------------------------------
# Prompt files

def test_jsonl_prompts_with_text_messages_and_categories():
    lines = ['{"text": "Write a haiku about rain.", "category": "poetry"}',
             "",
             '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}']
    prompts = workloads.parse_prompt_lines(lines, "mine.jsonl")
    assert [p.category for p in prompts] == ["poetry", "user"]
    assert prompts[0].messages == (("user", "Write a haiku about rain."),)
    assert prompts[1].messages == (("system", "Be brief."), ("user", "Hi"))
    assert [p.ident for p in prompts] == ["mine.jsonl:1", "mine.jsonl:3"]


def test_plain_text_is_one_prompt_per_line():
    prompts = workloads.parse_prompt_lines(["First prompt", "  ", "Second {prompt}"], "p.txt")
    assert [p.messages for p in prompts] == [(("user", "First prompt"),), (("user", "Second {prompt}"),)]
    assert [p.ident for p in prompts] == ["p.txt:1", "p.txt:3"]


@pytest.mark.parametrize("line, message", [
    ('{"text": "ok"', r"bad\.jsonl:2: not valid JSON"),
    ('["text"]', r"bad\.jsonl:2: expected a JSON object"),
    ('{"category": "x"}', r"bad\.jsonl:2: needs a non-empty \"text\""),
    ('{"text": "a", "prompt": "b"}', r"bad\.jsonl:2: unknown key\(s\) prompt"),
    ('{"messages": []}', r"bad\.jsonl:2: \"messages\" must be a non-empty list"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', r"bad\.jsonl:2: message 0 has role 'robot'"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}',
     r"bad\.jsonl:2: the last message must not be the assistant's"),
    ('{"text": "a", "category": "mixed"}', r"bad\.jsonl:2: \"category\" must be"),
])
def test_a_bad_line_is_a_one_line_error_naming_it(line, message):
    with pytest.raises(PromptFileError, match=message) as error:
        workloads.parse_prompt_lines(['{"text": "fine"}', line, '{"text": "also fine"}'], "bad.jsonl")
    assert "\n" not in str(error.value)


def test_missing_or_empty_prompt_files(tmp_path):
    with pytest.raises(PromptFileError, match="prompt file not found"):
        workloads.load_prompt_file(tmp_path / "none.jsonl")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(PromptFileError, match="empty.txt: no prompts"):
        workloads.load_prompt_file(tmp_path / "empty.txt")


def test_tasks_resolve_against_the_prompt_set():
    prompts = workloads.builtin_prompts()
    assert workloads.resolve_tasks([ALL], prompts) == list(workloads.CATEGORIES)
    assert workloads.resolve_tasks(["code-editing", MIXED, "code-editing"], prompts) == ["code-editing", MIXED]
    with pytest.raises(ValueError, match="unknown task 'poetry'; known: chat"):
        workloads.resolve_tasks(["poetry"], prompts)


def test_sequences_cycle_a_category_or_take_the_categories_in_turn():
    prompts = workloads.builtin_prompts()
    n_math = len(suite.BUILTIN["math"])
    chosen = workloads.prompts_for(prompts, "math", n_math + 1)
    assert [p.ident for p in chosen] == [f"math/{i}" for i in range(n_math)] + ["math/0"]
    n = len(workloads.CATEGORIES)
    mixed = workloads.prompts_for(prompts, MIXED, n + 1)
    assert [p.category for p in mixed] == list(workloads.CATEGORIES) + [workloads.CATEGORIES[0]]
    assert mixed[-1].ident == f"{workloads.CATEGORIES[0]}/1"


# --------------------------------------------------------------------------------------------
# llama.cpp's chat templates and the model's tokenizer

def test_chat_template_through_llama_cpp():
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    text = _core.chat_apply_template(chatml, [("system", "S"), ("user", "hi")], True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="does not support this chat template"):
        _core.chat_apply_template("{{ nothing llama.cpp knows }}", [("user", "hi")], True)


def test_vocab_only_tokenizer_matches_the_engine(noisy_pair, noisy_engine):
    vocab = _core.VocabModel(str(noisy_pair[0]))
    assert vocab.chat_template == ""  # the tiny models have none
    text = "The city of the river and the market"
    assert list(vocab.tokenize(text, True, True)) == noisy_engine.tokenize(text).tolist()
    with pytest.raises(ValueError, match="not a GGUF file"):
        _core.VocabModel(str(noisy_pair[0]) + ".missing")


def test_without_a_template_prompts_are_plain_role_lines(noisy_pair):
    workload = Workload(noisy_pair[0])
    assert workload.template_used.startswith("none")
    assert workload.render((("user", "Hi"), ("assistant", "Hello"), ("user", "Bye"))) == \
        "User: Hi\n\nAssistant: Hello\n\nUser: Bye\n\nAssistant:"


# --------------------------------------------------------------------------------------------
# Shared long contexts

def test_context_is_exactly_ctx_len_shared_tokens_of_the_documents(noisy_pair, noisy_engine):
    workload = Workload(noisy_pair[0])
    tokens, chosen = workload.token_prompts(MIXED, 3, 200)
    assert len({p.category for p in chosen}) == 3
    assert len({tuple(t[:200]) for t in tokens}) == 1  # one shared prefix ...
    assert len({tuple(t[200:]) for t in tokens}) == 3  # ... then each sequence's own prompt
    head = workload.split(chosen[0])[0]
    documents = noisy_engine.detokenize(tokens[0][len(head):200])
    assert documents in workload.documents.text and len(documents) > 100
    for t, p in zip(tokens, chosen):  # the own part is the chat after the documents
        assert noisy_engine.detokenize(t[200:]).endswith(workload.render(p.messages)[-40:])
    bare, _ = workload.token_prompts(MIXED, 3, 0)
    assert [len(b) for b in bare] == [len(workload.tokenize(workload.render(p.messages), True)) for p in chosen]


def test_a_short_document_file_is_cycled_and_says_so(noisy_pair, tmp_path):
    (tmp_path / "ctx.txt").write_text("A short note about the harbour wall and its stones.")
    docs = workloads.documents_from_file(tmp_path / "ctx.txt")
    workload = Workload(noisy_pair[0], documents=docs)
    tokens, _ = workload.token_prompts("qa", 1, 300)
    record = workload.record()
    assert record["context_max_cycles"] > 1 and record["context_sha256"] == docs.sha256
    assert workload.ctx_len_problem(3) and "use 0 or at least" in workload.ctx_len_problem(3)
    with pytest.raises(ValueError, match="document tokens after the"):
        workload.token_prompts("qa", 1, 3)


# --------------------------------------------------------------------------------------------
# The sweep: a user's prompt file drives it; a bad file fails before any work

def test_a_prompt_file_drives_a_sweep_with_a_task_column(noisy_pair, tmp_path):
    target, draft = noisy_pair
    prompt_file = tmp_path / "mine.jsonl"
    prompt_file.write_text("\n".join(json.dumps(e) for e in [
        {"text": "Write a list of the days of the week.", "category": "lists"},
        {"text": "Name three colours.", "category": "lists"},
        {"messages": [{"role": "user", "content": "Tell me about the river."}], "category": "prose"}]))
    out = tmp_path / "run"
    assert sweep.main(["-m", str(target), "-md", str(draft), "--prompts", str(prompt_file), "--ctx-len", "0,64",
                       "-np", "2", "-k", "3", "-n", "6", "--warmup", "0", "--repeats", "2", "--max-repeats", "2",
                       "-t", "1", "-ngl", str(TEST_NGL), "-o", str(out), "--no-report"]) == 0
    frame = schema.read_traces(out / "traces.csv")
    assert set(frame["task"]) == {"lists", "prose"} and len(frame) == 2 * 2 * 2
    lists = frame[(frame.task == "lists") & (frame.ctx_len == 0)].iloc[0]
    assert lists.prompt_ids == f"{prompt_file}:1;{prompt_file}:2"
    assert frame[frame.ctx_len == 0]["context_sha256"].isna().all()
    assert frame[frame.ctx_len == 64]["context_sha256"].nunique() == 1
    assert (frame[frame.ctx_len == 64]["prompt_tokens"] > 64).all()
    assert frame.groupby(["task", "ctx_len"])["prompts_sha256"].nunique().eq(1).all()
    assert frame["prompts_sha256"].nunique() == 4
    record = json.loads((out / "provenance.json").read_text())
    assert record["workload"]["source"] == str(prompt_file) and record["grid"]["task"] == ["lists", "prose"]


def test_a_bad_prompt_file_or_task_fails_before_any_work(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl:2: needs a non-empty \"text\""):
        sweep.main(["--prompts", str(bad), "-o", str(tmp_path / "never")])
    with pytest.raises(SystemExit, match="--tasks: unknown task 'poetry'"):
        sweep.main(["--tasks", "poetry", "-o", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()


# --------------------------------------------------------------------------------------------
# Per-task report and advice

def _task_cell(task, speedup, alpha, conc=1):
    counts = dict(drafted=400, accepted=int(400 * alpha), rejected=80, rounds=100, emitted=int(400 * alpha) + 100)
    cell_id = f"{task}-{conc}"
    return [off_row(conc=conc, task=task, cell_id=cell_id + "-off"),
            on_row(conc=conc, speedup=speedup, alpha=alpha, task=task, cell_id=cell_id + "-on", **counts)]


def test_by_task_pools_counts_and_says_on_for_code_off_for_chat(tmp_path):
    rows = (_task_cell("code-completion", 1.6, 0.9) + _task_cell("code-completion", 1.4, 0.8, conc=4)
            + _task_cell("code-editing", 1.5, 0.85) + _task_cell("chat", 0.8, 0.3)
            + _task_cell("chat", 0.7, 0.25, conc=4) + _task_cell("math", 1.3, 0.7) + _task_cell("math", 0.8, 0.4, conc=4))
    path = tmp_path / "traces.csv"
    schema.append_rows(path, rows)
    summary = advisor.by_task(path).set_index("task")
    code = summary.loc["code-completion"]
    assert code["alpha"] == pytest.approx((360 + 320) / 800)
    assert code["tau"] == pytest.approx((460 + 420) / 200)
    assert code["speedup_median"] == pytest.approx(1.5) and code["n_on"] == 2
    assert summary.loc["chat", "n_off"] == 2
    line = drafter_sections.task_advice(summary.reset_index())
    assert line.startswith("on for code (completion, editing)")
    assert "off for chat" in line and "depends on the regime for math" in line


def test_report_has_the_task_table_and_figure(tmp_path):
    rows = _task_cell("code-completion", 1.6, 0.9) + _task_cell("chat", 0.8, 0.3)
    schema.append_rows(tmp_path / "traces.csv", rows)
    (tmp_path / "provenance.json").write_text(json.dumps(PROVENANCE))
    out = report_summary.write_artifacts(tmp_path)
    assert out["by_task.png"].exists() and out["by_task.pdf"].exists()
    summary = out["summary.md"].read_text()
    assert "## By task category" in summary and "on for code-completion; off for chat" in summary
    fig = drafter_sections.plot_by_task(advisor.by_task(tmp_path / "traces.csv"))
    bars = [p.get_width() for p in fig.axes[0].patches]
    assert sorted(bars) == pytest.approx(sorted(advisor.by_task(tmp_path / "traces.csv")["alpha"]))


def test_old_traces_without_a_task_still_pair_and_report(tmp_path):
    rows = [off_row(), on_row(speedup=1.4)]
    schema.append_rows(tmp_path / "traces.csv", rows)
    frame = pd.read_csv(tmp_path / "traces.csv").drop(columns=["task"])
    frame.to_csv(tmp_path / "old.csv", index=False)
    cells = advisor.pair_cells(advisor.load_traces(tmp_path / "old.csv"))
    assert len(cells) == 1 and cells["tps_off"].notna().all()
    assert advisor.by_task(tmp_path / "old.csv")["task"].tolist() == ["(not recorded)"]


def test_undecided_tasks_say_which_way_they_lean():
    summary = pd.DataFrame([
        {"task": "code-editing", "speedup_median": 1.2, "n_on": 0, "n_off": 0, "n_measure_more": 2},
        {"task": "chat", "speedup_median": 0.7, "n_on": 0, "n_off": 0, "n_measure_more": 1},
        {"task": "qa", "speedup_median": 0.8, "n_on": 0, "n_off": 1, "n_measure_more": 0}])
    assert drafter_sections.task_advice(summary) == ("off for qa; measure more for code-editing (median speedup above 1 "
                                            "so far); measure more for chat (median speedup below 1 so far)")
