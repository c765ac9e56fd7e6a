"""Which prompts the sequences of a cell read: every category's prompts cycled over the
concurrency, or a public set's items in batches of N different items (a cell per batch), and the
tokens a batch generates."""
from __future__ import annotations

from specnative.run.workloads.prompts import MIXED, Prompt, categories_of
from specnative.run.workloads.suite import builtin_prompts


def batches_of(prompts: list[Prompt] | None, task: str, concurrency: int) -> list[list[Prompt]]:
    """The sequences' prompts of every cell of (task, concurrency). Built-in and user prompts: one
    cell (prompts_for). A public set: each item once, in batches of `concurrency` items of the task
    (and of one turn), the last batch filled up by cycling from the start of its turn."""
    prompts = builtin_prompts() if prompts is None else prompts
    if not any(p.dataset for p in prompts):
        return [prompts_for(prompts, task, concurrency)]
    chosen = [p for p in prompts if task in (MIXED, p.category)]
    batches = []
    for turn in dict.fromkeys(p.turn for p in chosen):
        group = [p for p in chosen if p.turn == turn]
        batches += [[group[(start + i) % len(group)] for i in range(concurrency)]
                    for start in range(0, len(group), concurrency)]
    return batches


def n_predict_for(chosen: list[Prompt], default: int) -> int:
    """Tokens a cell generates: the longest of its requests' output lengths where they carry one
    (ShareGPT; the engine takes one length per call, so at concurrency > 1 the shorter requests
    run on to it), else the sweep's n_predict."""
    lengths = [p.output_len for p in chosen if p.output_len is not None]
    return max(lengths) if lengths else default


def prompts_for(prompts: list[Prompt], task: str, concurrency: int) -> list[Prompt]:
    """One prompt per sequence: a category's prompts cycled, or for `mixed` the categories in
    turn (sequence i: category i mod n, its (i div n)-th prompt)."""
    by_category = {c: [p for p in prompts if p.category == c] for c in categories_of(prompts)}
    if task != MIXED:
        chosen = by_category[task]
        return [chosen[i % len(chosen)] for i in range(concurrency)]
    names = list(by_category)
    return [by_category[names[i % len(names)]][(i // len(names)) % len(by_category[names[i % len(names)]])]
            for i in range(concurrency)]
