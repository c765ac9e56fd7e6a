"""A workload tokenized for one model: each cell's token prompts (shared context + own prompt in the
model's chat template), MT-Bench's second turns with the model's own first answer, and the
public sets as prompts."""
from __future__ import annotations

import json
from pathlib import Path

from specnative.engine import native
from specnative.run.workloads.batches import batches_of
from specnative.run.workloads.documents import CONTEXT_HEADER, MIN_DOCUMENT_TOKENS, Documents, builtin_documents
from specnative.run.workloads.prompts import MODEL_ANSWER, Prompt, categories_of, prompts_sha256, sha256_text
from specnative.run.workloads.suite import builtin_prompts

# Re-tokenizing an answer inside the template may take a few more tokens than were generated
ANSWER_SLACK = 16


def dataset_prompts(items, dataset: str) -> list[Prompt]:
    """Prompts of public_sets items: turn 1 of every item, then turn 2 (MT-Bench), each turn 2
    asked after turn 1 and the model's own answer to it."""
    firsts = [Prompt(item.category, (("user", item.turns[0]),), item.ident + ("/turn1" if len(item.turns) > 1 else ""),
                     dataset=dataset, completion=item.completion, turn=1 if len(item.turns) > 1 else None,
                     output_len=item.output_len, reply=item.reply) for item in items]
    seconds = [Prompt(item.category, (("user", item.turns[0]), ("assistant", MODEL_ANSWER), ("user", item.turns[1])),
                      f"{item.ident}/turn2", dataset=dataset, turn=2, answer_of=first)
               for item, first in zip(items, firsts) if len(item.turns) > 1]
    return firsts + seconds


def load_dataset(spec: str, model_path, n_predict: int = 32, **fetch) -> tuple[list[Prompt], dict]:
    """A public set ('mt-bench', 'humaneval:16', 'sharegpt:16', ...) as prompts, and its provenance
    record (public_sets.load). The model's tokenizer measures ShareGPT's requests (output lengths
    capped at n_predict; what does not fit is skipped and counted)."""
    from specnative.run.workloads import public_sets

    vocab = native.VocabModel(str(model_path))
    selection = public_sets.load(spec, count_tokens=lambda text: len(vocab.tokenize(text, False, False)),
                                 output_cap=n_predict, **fetch)
    record = {**selection.record, "tokenizer": Path(model_path).name}  # whose tokens ShareGPT's lengths count
    return dataset_prompts(selection.items, selection.source.name), record


def dataset_workload(spec: str, model_path, n_predict: int = 32, **fetch) -> "Workload":
    """The Python equivalent of the sweep's --dataset: a Workload of a public set for one model
    (turn-2 prompts need answer_with(engine) before they are tokenized)."""
    prompts, record = load_dataset(spec, model_path, n_predict, **fetch)
    return Workload(model_path, prompts, source=f"dataset {spec}", answer_tokens=n_predict, dataset=record)


# ---------------------------------------------------------------------------------------------
# Rendering and tokenizing for one model
# ---------------------------------------------------------------------------------------------
PLAIN_ASSISTANT_CUE = "\n\nAssistant:"


def plain_chat(messages, add_generation_prompt: bool = True) -> str:
    """The rendering for a model without a chat template."""
    text = "\n\n".join(f"{role.capitalize()}: {content}" for role, content in messages)
    return text + PLAIN_ASSISTANT_CUE if add_generation_prompt else text


class Workload:
    """Prompts and documents, tokenized for one model file (its own tokenizer and template,
    read by llama.cpp without loading the weights)."""

    MARK = "[[specnative: documents here]]"  # no NUL: the template API takes C strings

    def __init__(self, model_path, prompts: list[Prompt] | None = None, documents: Documents | None = None,
                 source: str = "built-in", answer_tokens: int = 32, dataset: dict | None = None):
        self.answer_tokens, self.dataset = answer_tokens, dataset
        self.answers: dict[str, str] = {}  # turn-1 ident -> the model's own answer (turn 2's context)
        self._answer = None
        self.prompts = list(prompts if prompts is not None else builtin_prompts())
        if not self.prompts:
            raise ValueError("no prompts")
        self.documents = documents or builtin_documents()
        self.source = source
        self.vocab = native.VocabModel(str(model_path))
        self.template = self.vocab.chat_template
        self.template_used = "none (plain 'Role: text' lines)"
        if self.template:
            try:
                native.chat_apply_template(self.template, [("user", "x")], True)
                self.template_used = "the model's chat template (llama_chat_apply_template)"
            except ValueError:
                self.template = ""
                self.template_used = "none: llama.cpp does not support the model's template; plain lines"
        self._document_tokens = None
        self.max_document_cycles = 0
        self._cells = {}

    # -- the model's own answers (MT-Bench turn 2) -----------------------------------------------
    def answer_with(self, engine) -> None:
        """Turn-1 answers come from `engine`'s target: greedy, answer_tokens long (or to its end of
        generation), once per prompt; turn 2 is asked after them."""
        self._answer = lambda tokens: engine.generate([tokens], n_predict=self.answer_tokens, temperature=0.0).texts[0]

    def answer(self, prompt: Prompt) -> str:
        if prompt.ident not in self.answers:
            if self._answer is None:
                raise ValueError(f"the turn after {prompt.ident} needs the model's own answer to it: "
                                 f"call answer_with(engine) first")
            self.answers[prompt.ident] = self._answer(self.tokenize(self.text_of(prompt), True))
        return self.answers[prompt.ident]

    def messages_of(self, prompt: Prompt, answer: str | None = None) -> tuple:
        """The prompt's chat, the model's own answer written in (or `answer`, for sizing)."""
        if prompt.answer_of is None:
            return prompt.messages
        answer = self.answer(prompt.answer_of) if answer is None else answer
        return tuple((role, answer if content == MODEL_ANSWER else content) for role, content in prompt.messages)

    def text_of(self, prompt: Prompt, answer: str | None = None) -> str:
        if prompt.completion:
            return prompt.messages[0][1]
        return self.render(self.messages_of(prompt, answer))

    # -- text ------------------------------------------------------------------------------------
    def render(self, messages, add_generation_prompt: bool = True) -> str:
        """The chat in the model's template, by default opened for the assistant's next turn (False:
        the last message closed as the template closes it, e.g. a recorded reply)."""
        messages = [tuple(m) for m in messages]
        if self.template:
            return native.chat_apply_template(self.template, messages, add_generation_prompt)
        return plain_chat(messages, add_generation_prompt)

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        return list(self.vocab.tokenize(text, add_special, True))  # parse the template's markers

    def document_tokens(self, n: int) -> list[int]:
        """The first n tokens of the documents (cycled, with the count kept, if they are shorter)."""
        if self._document_tokens is None:
            self._document_tokens = list(self.vocab.tokenize(self.documents.text, False, False))
        piece = self._document_tokens
        cycles = -(-n // len(piece))
        self.max_document_cycles = max(self.max_document_cycles, cycles)
        return (piece * cycles)[:n]

    # -- token prompts ---------------------------------------------------------------------------
    def split(self, prompt: Prompt) -> tuple[list[int], list[int]]:
        """(head, tail) tokens around the documents: head = BOS and the context message's opening
        (the same for every prompt), tail = the rest of the rendered chat."""
        if prompt.completion:  # no chat: the documents as plain text ahead of the text to continue
            text = CONTEXT_HEADER + self.MARK + "\n\n" + prompt.messages[0][1]
        else:
            text = self.render((("system", CONTEXT_HEADER + self.MARK),) + self.messages_of(prompt))
        if self.MARK not in text:
            raise ValueError(f"the chat template dropped the context message of {prompt.ident}")
        head, tail = text.split(self.MARK, 1)
        return self.tokenize(head, True), self.tokenize(tail, False)

    def token_prompts(self, task: str, concurrency: int, ctx_len: int,
                      batch: int = 0) -> tuple[list[list[int]], list[Prompt]]:
        """One token prompt per sequence: ctx_len tokens of shared context (0: none) then the
        sequence's own prompt (of the task's `batch`-th cell, batches_of)."""
        chosen = batches_of(self.prompts, task, concurrency)[batch]
        return self.context_prompts(chosen, ctx_len), chosen

    def context_prompts(self, chosen: list[Prompt], ctx_len: int) -> list[list[int]]:
        """Token prompts of `chosen`: ctx_len tokens of the shared documents (0: none), then each
        prompt's own part, in the model's chat template."""
        if ctx_len == 0:
            return [self.tokenize(self.text_of(p), True) for p in chosen]
        split = [self.split(p) for p in chosen]
        head = split[0][0]
        if any(h != head for h, _ in split):
            raise ValueError("the chat template renders the context message differently per prompt; "
                             "cannot share the documents between sequences")
        problem = self.ctx_len_problem(ctx_len)
        if problem:
            raise ValueError(problem)
        shared = head + self.document_tokens(ctx_len - len(head))
        return [shared + tail for _, tail in split]

    def cell_prompts(self, task: str, concurrency: int, ctx_len: int,
                     batch: int = 0) -> tuple[list[list[int]], list[Prompt]]:
        """token_prompts, computed once per cell shape (the sweep asks for them more than once)."""
        key = (task, concurrency, ctx_len, batch)
        if key not in self._cells:
            self._cells[key] = self.token_prompts(task, concurrency, ctx_len, batch)
        return self._cells[key]

    def ctx_len_problem(self, ctx_len: int) -> str | None:
        """Why ctx_len cannot hold the context header and some documents, or None."""
        if ctx_len == 0:
            return None
        head = len(self.split(self.prompts[0])[0])
        if ctx_len - head < MIN_DOCUMENT_TOKENS:
            return (f"ctx_len {ctx_len} leaves {ctx_len - head} document tokens after the {head}-token "
                    f"context header; use 0 or at least {head + MIN_DOCUMENT_TOKENS}")
        return None

    def max_own_tokens(self, tasks: list[str], concurrency: int) -> int:
        """The longest sequence's own part (after the shared context) over these tasks: sizes
        the KV cache before any model is loaded."""
        longest = 0
        for task in tasks:
            for p in {p: None for batch in batches_of(self.prompts, task, concurrency) for p in batch}:
                if p.answer_of is not None:  # before any answer exists: its room, as an upper bound
                    longest = max(longest, len(self.tokenize(self.text_of(p, answer=""), True))
                                  + self.answer_tokens + ANSWER_SLACK)
                    continue
                longest = max(longest, len(self.tokenize(self.text_of(p), True)), len(self.split(p)[1]))
        return longest

    def dataset_columns(self, chosen: list[Prompt]) -> dict:
        """traces.csv's public-set columns for a cell's prompts (none for the built-in suite)."""
        if self.dataset is None or not any(p.dataset for p in chosen):
            return {}
        lengths = [p.output_len for p in chosen]
        return {"dataset": f"{self.dataset['name']} ({self.dataset['package']}=={self.dataset['version']})",
                "dataset_sha256": self.dataset["sha256"], "turn": chosen[0].turn,
                "output_lens": ";".join(map(str, lengths)) if None not in lengths else None}

    def record(self) -> dict:
        """Provenance: which prompts, which documents (by sha256), which template."""
        public = {}
        if self.dataset is not None:
            public = {"dataset": self.dataset, "turn1_answers": {
                "rule": f"the target's greedy answer to turn 1 alone, at most {self.answer_tokens} tokens, is turn 2's "
                        f"context (a cell per turn)", "count": len(self.answers),
                "sha256": sha256_text(json.dumps(sorted(self.answers.items()), ensure_ascii=False))},
                "batching": "each item once per concurrency N: batches of N items of one category and turn, "
                            "the last batch filled up by cycling from the first item of its turn; a cell per batch"}
        return {"source": self.source, **public, "prompts": len(self.prompts),
                "categories": {c: sum(p.category == c for p in self.prompts) for c in categories_of(self.prompts)},
                "prompts_sha256": prompts_sha256(self.prompts), "chat_template": self.template_used,
                "chat_template_sha256": sha256_text(self.template) if self.template else None,
                "context_sha256": self.documents.sha256, "context_documents": list(self.documents.sources),
                "context_tokens": len(self._document_tokens) if self._document_tokens is not None else None,
                "context_max_cycles": self.max_document_cycles,
                "context_note": "ctx_len tokens of these documents (in order, cut to length; cycled "
                                "only where context_max_cycles > 1) precede every sequence's prompt"}
