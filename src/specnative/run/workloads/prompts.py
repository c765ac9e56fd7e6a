"""Prompts and task categories: the Prompt record, user prompt files (JSON lines or plain text),
which categories a grid measures, and how a cell's sequences take their prompts."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

MIXED = "mixed"


ALL = "all"


ROLES = ("system", "user", "assistant")


# Stands for the model's own answer in a turn-2 prompt until answer_with's engine has written it
MODEL_ANSWER = "[[specnative: the model's own answer to the previous turn]]"


class PromptFileError(ValueError):
    """A bad prompt file; the message names the file and line."""


@dataclass(frozen=True)
class Prompt:
    category: str
    messages: tuple       # ((role, content), ...)
    ident: str            # "category/index" (built-in), "file:line" or a public set's item id
    # Public sets (public_sets.py) only:
    dataset: str | None = None       # the set's name: its prompts are batched item by item
    completion: bool = False         # continue messages[0]'s text as is (HumanEval): no template
    turn: int | None = None          # MT-Bench: 1 or 2
    answer_of: "Prompt | None" = None  # turn 2: the turn whose model answer fills MODEL_ANSWER
    output_len: int | None = None    # ShareGPT: the request's output length (recorded, capped)
    reply: str | None = None         # ShareGPT: the recorded assistant reply to the prompt


# ---------------------------------------------------------------------------------------------
# User prompt files
# ---------------------------------------------------------------------------------------------
def _messages_of(entry: dict, where: str) -> tuple:
    if "messages" in entry:
        messages = entry["messages"]
        if not isinstance(messages, list) or not messages:
            raise PromptFileError(f"{where}: \"messages\" must be a non-empty list")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PromptFileError(f"{where}: message {i} needs a string \"role\" and \"content\"")
            if m["role"] not in ROLES:
                raise PromptFileError(f"{where}: message {i} has role {m['role']!r}; expected one of {', '.join(ROLES)}")
            out.append((m["role"], m["content"]))
        if out[-1][0] == "assistant":
            raise PromptFileError(f"{where}: the last message must not be the assistant's (the model answers it)")
        return tuple(out)
    text = entry.get("text")
    if not isinstance(text, str) or not text.strip():
        raise PromptFileError(f"{where}: needs a non-empty \"text\" string or a \"messages\" list")
    return (("user", text),)


def parse_prompt_lines(lines: list[str], name: str) -> list[Prompt]:
    """Prompts of a file's lines (JSONL when its first non-empty line starts with '{', plain text
    otherwise); blank lines are skipped. A bad line raises PromptFileError naming it."""
    content = [(n, line.rstrip("\r\n")) for n, line in enumerate(lines, start=1) if line.strip()]
    if not content:
        raise PromptFileError(f"{name}: no prompts (the file is empty)")
    jsonl = content[0][1].lstrip().startswith("{")
    prompts = []
    for n, line in content:
        where = f"{name}:{n}"
        if not jsonl:
            prompts.append(Prompt("user", (("user", line),), where))
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as error:
            raise PromptFileError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
        except RecursionError:
            raise PromptFileError(f"{where}: JSON nested too deeply to be a prompt") from None
        if not isinstance(entry, dict):
            raise PromptFileError(f"{where}: expected a JSON object with \"text\" or \"messages\"")
        unknown = set(entry) - {"text", "messages", "category"}
        if unknown:
            raise PromptFileError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                                  f"expected text, messages, category")
        category = entry.get("category", "user")
        if not isinstance(category, str) or not category.strip() or category in (MIXED, ALL) or "," in category:
            raise PromptFileError(f"{where}: \"category\" must be a non-empty string without commas, "
                                  f"not {MIXED!r} or {ALL!r}")
        prompts.append(Prompt(category.strip(), _messages_of(entry, where), where))
    return prompts


def load_prompt_file(path) -> list[Prompt]:
    path = Path(path)
    try:
        # utf-8-sig: a byte-order mark (spreadsheets and Windows editors write one) is not text
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise PromptFileError(f"{path}: prompt file not found") from None
    except IsADirectoryError:
        raise PromptFileError(f"{path}: is a directory, not a prompt file") from None
    except UnicodeDecodeError as error:
        raise PromptFileError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise PromptFileError(f"{path}: cannot read it ({error.strerror})") from None
    return parse_prompt_lines(file_lines(text), str(path))


def file_lines(text: str) -> list[str]:
    """A text file's lines: split at line ends only (\\n, \\r\\n, \\r), not at the other breaks
    str.splitlines knows (U+2028, U+0085, form feed, ...), which are characters of a prompt."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def prompts_sha256(prompts: list[Prompt]) -> str:
    """Identity of a prompt set by content (categories and messages, in order): what a resume
    compares, so that a file edited at the same path is not taken for the same prompts."""
    return sha256_text(json.dumps([[p.category, p.messages] for p in prompts], ensure_ascii=False))


def categories_of(prompts: list[Prompt]) -> list[str]:
    return list(dict.fromkeys(p.category for p in prompts))


def resolve_tasks(requested: list[str], prompts: list[Prompt]) -> list[str]:
    """`all` -> every category present; `mixed` and category names kept; unknown -> ValueError."""
    known = categories_of(prompts)
    tasks = []
    for task in requested:
        for name in (known if task == ALL else [task]):
            if name != MIXED and name not in known:
                raise ValueError(f"unknown task {name!r}; known: {', '.join(known + [MIXED, ALL])}")
            if name not in tasks:
                tasks.append(name)
    return tasks


def token_prompts_sha256(token_prompts: list[list[int]]) -> str:
    """Identity of exactly what a cell fed the models."""
    return sha256_text(json.dumps(token_prompts))


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
