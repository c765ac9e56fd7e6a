"""What the sequences of a cell read: prompts by task category and the long-context documents.

Acceptance depends on the task (a draft guesses code and copied facts far better than open
chat), so the sweep measures per category. The built-in suite was written for specnative, in
the spirit of Spec-Bench's categories (multi-turn chat, translation, summarization, question
answering, math reasoning, retrieval-style extraction) plus three code categories for code
models. Every prompt is a chat (role, content) list; the target model's chat template is applied
with llama.cpp (llama_chat_apply_template) where the model has one, plain "Role: text" lines
where it has none.

A cell's `task` is a category (every sequence gets a prompt of it, cycled) or `mixed` (the
sequences take the categories in turn). A `ctx_len` > 0 puts exactly ctx_len tokens of shared
context ahead of every sequence's own prompt: a system message (where the template has one)
holding real, varied documents (texts/, or a user's --context file), cut to length;
the documents are identified by sha256 in provenance.

User prompt files (`--prompts FILE`): JSON lines {"text": ...} or {"messages": [{"role", "content"},
...]} with an optional "category", or plain text, one prompt per line. A text is one user message.

Public sets (`--dataset mt-bench|humaneval|sharegpt[:N]`, public_sets.py; workload.dataset_prompts):
each item is used once per concurrency, in batches of N different items of one category (and one
MT-Bench turn): a cell per batch, the last batch filled up by cycling from the category's first
item (batches_of). HumanEval prompts are continued as is (no template); an MT-Bench turn-2 prompt
holds turn 1, the target's own greedy turn-1 answer (answer_tokens long, generated once per model
by answer_with's engine) and turn 2; a ShareGPT prompt carries its request's output length.
"""
from specnative.run.workloads.batches import batches_of, n_predict_for, prompts_for
from specnative.run.workloads.documents import Documents, builtin_documents, documents_from_file
from specnative.run.workloads.prompts import (
                                          ALL,
                                          MIXED,
                                          MODEL_ANSWER,
                                          Prompt,
                                          PromptFileError,
                                          categories_of,
                                          load_prompt_file,
                                          parse_prompt_lines,
                                          prompts_sha256,
                                          resolve_tasks,
                                          token_prompts_sha256,
)
from specnative.run.workloads.suite import CATEGORIES, CODE_CATEGORIES, SEQUENCE_PROMPTS, builtin_prompts
from specnative.run.workloads.workload import Workload, dataset_prompts, dataset_workload, load_dataset, plain_chat

__all__ = ["Documents", "builtin_documents", "documents_from_file", "ALL", "MIXED", "MODEL_ANSWER", "Prompt",
           "PromptFileError", "batches_of", "categories_of", "load_prompt_file", "n_predict_for", "parse_prompt_lines",
           "prompts_for", "prompts_sha256", "resolve_tasks", "token_prompts_sha256", "CATEGORIES", "CODE_CATEGORIES",
           "SEQUENCE_PROMPTS", "builtin_prompts", "Workload", "dataset_prompts", "dataset_workload", "load_dataset",
           "plain_chat"]
