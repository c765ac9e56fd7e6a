"""Training prompts from the sources specnative already knows, rendered for one target.

A data spec is a comma-separated list of sources: `builtin` (specnative's built-in suite), a
public set `mt-bench[:N]`, `sharegpt[:N]`, `humaneval[:N]` (pinned and fetched by specnative's
public_sets), or the path of a prompt file in specnative's prompt-file format. Every prompt is
rendered with the target's own chat template (or continued as is: HumanEval) and tokenized by
llama.cpp, exactly as specnative renders prompts when it measures, so that the head trains on
the token sequences it will later see.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .deps import public_sets, workloads

PUBLIC_SET_NAMES = ("mt-bench", "sharegpt", "humaneval")


@dataclass(frozen=True)
class TokenPrompt:
    ident: str      # where it came from: "chat/0", "sharegpt/abc_0", "prompts.jsonl:3"
    tokens: tuple   # the rendered, tokenized prompt (BOS included where the model adds one)
    reply: tuple = ()  # ShareGPT: the recorded assistant reply's tokens as the template closes it


def reply_tokens(workload, prompt, prompt_tokens: tuple, max_tokens: int) -> tuple:
    """The recorded reply of a ShareGPT prompt as tokens that follow prompt_tokens, rendered in the
    model's template with the turn closed, cut to max_tokens; () where there is none or the closed
    chat does not begin with the prompt's own tokens (a template that rewrites earlier turns)."""
    if not prompt.reply or prompt.completion or prompt.answer_of is not None:
        return ()
    closed = workload.tokenize(workload.render(prompt.messages + (("assistant", prompt.reply),),
                                               add_generation_prompt=False), True)
    if tuple(closed[:len(prompt_tokens)]) != prompt_tokens:
        return ()
    return tuple(int(t) for t in closed[len(prompt_tokens):len(prompt_tokens) + max_tokens])


def split_spec(spec: str) -> list[str]:
    """'builtin,sharegpt:200' -> ['builtin', 'sharegpt:200']; ValueError for an empty spec."""
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not parts:
        raise ValueError("--data names no source (builtin, mt-bench[:N], sharegpt[:N], humaneval[:N] or a file)")
    return parts


def _is_public(part: str) -> bool:
    return part.partition(":")[0] in PUBLIC_SET_NAMES


def check_spec(spec: str) -> None:
    """Everything about a data spec that can be checked without fetching or loading anything."""
    for part in split_spec(spec):
        if part == "builtin":
            continue
        if _is_public(part):
            public_sets().parse_spec(part)
        elif not Path(part).is_file():
            raise ValueError(f"--data {part!r} is neither builtin, a public set (mt-bench, sharegpt, humaneval "
                             f"[:N]) nor an existing prompt file")


def _source_prompts(part: str, target, n_predict: int) -> tuple[list, dict]:
    """specnative Prompt objects of one source and its provenance record."""
    wl = workloads()
    if part == "builtin":
        prompts = wl.builtin_prompts()
        return prompts, {"source": "builtin", "prompts": len(prompts)}
    if _is_public(part):
        prompts, record = wl.load_dataset(part, target, n_predict=n_predict)
        # an MT-Bench turn 2 needs the model's own turn-1 answer first: turn 1 only here
        prompts = [p for p in prompts if p.answer_of is None]
        return prompts, {"source": part, "package": record["package"], "version": record["version"],
                         "sha256": record["sha256"], "prompts": len(prompts)}
    prompts = wl.load_prompt_file(part)
    return prompts, {"source": part, "sha256": hashlib.sha256(Path(part).read_bytes()).hexdigest(),
                     "prompts": len(prompts)}


def load_prompts(spec: str, target, *, n_predict: int, max_prompt_tokens: int, replies: bool = False,
                 exclude=frozenset()) -> tuple[list[TokenPrompt], dict]:
    """The token prompts of `spec` for `target` (duplicates and the token prompts in `exclude`
    dropped, longer than max_prompt_tokens skipped and counted) and a provenance record. replies:
    each ShareGPT prompt also carries its recorded reply (at most n_predict tokens)."""
    wl = workloads()
    records, prompts = [], []
    for part in split_spec(spec):
        found, record = _source_prompts(part, target, n_predict)
        prompts += found
        records.append(record)
    workload = wl.Workload(target, prompts)
    out, seen, too_long, excluded = [], set(), 0, 0
    for p in prompts:
        tokens = tuple(int(t) for t in workload.tokenize(workload.text_of(p), True))
        if tokens in seen:
            continue
        seen.add(tokens)
        if tokens in exclude:
            excluded += 1
        elif len(tokens) > max_prompt_tokens:
            too_long += 1
        else:
            out.append(TokenPrompt(p.ident, tokens, reply_tokens(workload, p, tokens, n_predict) if replies else ()))
    if not out:
        raise ValueError(f"--data {spec}: no prompt left (of {len(prompts)}, {too_long} longer than "
                         f"{max_prompt_tokens} tokens)")
    return out, {"spec": spec, "sources": records, "chat_template": workload.template_used,
                 "kept": len(out), "skipped_too_long": too_long,
                 "skipped_duplicate": len(prompts) - len(out) - too_long - excluded,
                 "skipped_as_evaluation_prompts": excluded,
                 "with_recorded_reply": sum(bool(p.reply) for p in out),
                 "max_prompt_tokens": max_prompt_tokens,
                 "sha256": hashlib.sha256(json.dumps([p.tokens for p in out]).encode()).hexdigest()}
