"""The sweep's side of llama.cpp's hidden-state drafters (dflash, dspark, eagle3, mtp).

Each of them needs its own engine: a DFlash/DSpark/EAGLE-3 drafter is a file loaded beside
the target (its context shares the target's), MTP is the target's own nextn head (the target
loaded with its MTP layers). The draft model and the n-gram drafters share one engine with
the draft GGUF (-md). This module says which engine a cell needs, what the file was inferred
to be, and measures what the drafter's target settings (feature extraction) cost the plain
decoding step: the honest baseline is the target without them, what a user runs with
speculation off.
"""

from __future__ import annotations

import math
from pathlib import Path

from specnative.engine import HIDDEN_DRAFTERS, gguf_checks, native

# What a file inferred as `kind` is called in rows and messages.
KIND_NAMES = {"dflash": "DFlash", "dflash2": "DFlash2", "dspark": "DSpark", "eagle3": "EAGLE-3", "mtp": "MTP"}
# The file kinds each --drafter runs (llama.cpp's hidden_kind_serves: dflash runs DFlash2 files too)
KINDS_SERVED = {"dflash": ("dflash", "dflash2"), "dspark": ("dspark",), "eagle3": ("eagle3",)}


def is_hidden(drafter: str) -> bool:
    return drafter in HIDDEN_DRAFTERS


# A hidden-state drafter keeps per-sequence state from each sequence's own prefill of its whole
# prompt, so its speculative runs cannot share a prefix; the baseline of its cell then prefills
# every whole prompt too, and the pair compares the same work (prefill, TTFT, end-to-end rate).
PREFIX_NOTE = ("the hidden-state drafters ({names}) read the target's features from each sequence's prefill of "
               "its whole prompt, so their runs share no prefix: their cells ran with the prefix cache off on both "
               "sides (spec off too), so the pair compares the same prefill; their rows say prefix_cache off")


def prefix_modes(prefix_caches, drafter: str) -> list:
    """The prefix-cache modes a cell of `drafter` runs in: a hidden-state drafter only without the
    prefix cache (PREFIX_NOTE), whatever --prefix-cache asked."""
    return [False] if is_hidden(drafter) else list(prefix_caches)


def prefix_note(prefix_caches, drafters) -> list[str]:
    """The provenance note when the prefix cache was asked for and a hidden-state drafter ran."""
    hidden = [d for d in drafters if is_hidden(d)]
    return [PREFIX_NOTE.format(names=", ".join(hidden))] if hidden and any(prefix_caches) else []


def parse_drafter_files(items) -> dict:
    """--drafter-file NAME=PATH (repeatable) -> {drafter: path}; ValueError names what is wrong."""
    files = {}
    for item in items or []:
        name, sep, path = str(item).partition("=")
        name = name[len("draft-"):] if name.startswith("draft-") else name
        if not sep or not path:
            raise ValueError(f"--drafter-file takes NAME=PATH, not {item!r}")
        if name not in HIDDEN_DRAFTERS or name == "mtp":
            raise ValueError(f"--drafter-file {item!r}: the name must be one of dflash, dspark, eagle3 "
                             f"(mtp drafts with the target's own head)")
        if name in files:
            raise ValueError(f"--drafter-file names {name} twice")
        files[name] = Path(path)
    return files


def pair_problems(drafters, targets, draft, drafter_files: dict) -> list[str]:
    """One line per hidden-state drafter that cannot run with a target (from the GGUF metadata,
    before anything is loaded: llama.cpp's check_hidden_pair in C++), whose file is another kind
    of drafter (an EAGLE-3 file given as --drafter dflash), or that has no file."""
    problems = []
    for drafter in (d for d in drafters if is_hidden(d)):
        path, _ = engine_draft(drafter, draft, drafter_files)
        if drafter != "mtp" and path is None:
            problems.append(f"--drafter {drafter}: give its file with -md or --drafter-file {drafter}=GGUF")
            continue
        if path is not None and Path(path).is_file():
            kind = gguf_checks.drafter_kind(path)
            if kind and kind not in KINDS_SERVED[drafter]:
                runs = next(d for d, kinds in KINDS_SERVED.items() if kind in kinds)
                problems.append(f"--drafter {drafter}: {path} is a {KIND_NAMES[kind]} drafter file, not a "
                                f"{KIND_NAMES[drafter]} one; run it as --drafter {runs}")
                continue
        for target in targets:
            if not Path(target).is_file() or (path is not None and not Path(path).is_file()):
                continue  # the missing file is reported on its own
            try:
                native.check_hidden_pair(str(target), str(path) if path is not None else "")
            except ValueError as error:
                problems.append(f"--drafter {drafter}: {error}")
    return problems


def needs_draft_file(drafters, drafter_file_flags) -> bool:
    """Whether -md is needed: the draft model, or a dflash/dspark/eagle3 without --drafter-file
    (the n-gram drafters and mtp need no file). Unparsable flags are reported elsewhere."""
    named = {str(item).partition("=")[0].removeprefix("draft-") for item in drafter_file_flags or []}
    names = {d.removeprefix("draft-") for d in drafters}
    names = {"model" if d == "simple" else d for d in names}
    return any(d == "model" or (is_hidden(d) and d != "mtp" and d not in named) for d in names)


def engine_draft(drafter: str, draft, drafter_files: dict) -> tuple:
    """(draft path or None, mtp) of the engine a cell with `drafter` runs on."""
    if drafter == "mtp":
        return None, True
    if is_hidden(drafter):
        return drafter_files.get(drafter, draft), False
    return draft, False


def engine_key(drafter: str, draft, drafter_files: dict) -> tuple:
    """Cells with the same key share an engine (by_ctx_len's grouping, refined)."""
    path, mtp = engine_draft(drafter, draft, drafter_files)
    return (str(path) if path is not None else None, mtp)


def inferred_line(drafter: str, engine) -> str:
    """What the engine's drafter file was inferred to be, for the sweep's log."""
    kind = engine.hidden_drafter
    where = Path(engine.draft_path).name if engine.draft_path else "the target's nextn head"
    return f"drafter {drafter}: {KIND_NAMES.get(kind, kind)} ({where})"


def draft_columns(drafter: str, engine) -> dict:
    """A hidden-state drafter's identity columns: its file (draft_model, draft_type: the file's
    weight type, draft_sha256; none for mtp) and what the file was inferred to be (drafter_kind)."""
    columns = {"drafter_kind": engine.hidden_drafter}
    if drafter == "mtp":
        columns.update(draft_model=None, draft_type=None, draft_sha256=None)
    return columns


def settings_step_columns(engine, prompts, common: dict, repeats: int, step_ms: float) -> dict:
    """The baseline step under the drafter's target settings (extraction on), its difference to
    the plain step (`step_ms`, the honest baseline), as on-row columns."""
    runs = [engine.generate(prompts, drafter_settings=True, **common) for _ in range(max(1, repeats))]
    ms = sum(r.steady["ms"] for r in runs)
    steps = sum(r.steady["steps"] for r in runs)
    settings_ms = ms / steps if steps else math.nan
    return {"settings_step_ms": settings_ms,
            "settings_step_cost": settings_ms / step_ms - 1.0 if step_ms and not math.isnan(settings_ms) else math.nan}
