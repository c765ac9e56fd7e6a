"""The sweep's model files checked for the whole grid before any cell is measured: every model
goes through llama.cpp's own loader checks first (the vocabulary-only load that the prompts'
tokenizer uses refuses what an Engine refuses: a file without a tokenizer, an encoder, ...), then
the header fields llama.cpp would abort on (engine.gguf_checks), the sweep's GGUF header reader, then the draft's vocabulary against every target. A problem is a
SystemExit("error: ...") naming the file; nothing is measured, and no run-directory file has
been changed yet (a resume repairs traces.csv only after these checks).
"""
from __future__ import annotations

import sys
from pathlib import Path

from specnative.engine import gguf_checks, native
from specnative.record.provenance import sha256_file


def vocab_model(path: Path, role: str):
    """llama.cpp's vocabulary-only load of a model file (the Engine's checks), or SystemExit."""
    try:
        return native.VocabModel(str(path))
    except (ValueError, RuntimeError) as error:
        raise SystemExit(f"error: {role} {path}: {error}") from None


def header_checked(path: Path, role: str) -> None:
    """The header fields llama.cpp would abort on (engine.gguf_checks, the Engine's own check), for
    the whole grid before any engine is made: a SystemExit naming the file and the field."""
    try:
        gguf_checks.check_model_file(path, role)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None


def header_shape(read_shape, path: Path, role: str) -> dict:
    """read_shape(path) (the sweep's GGUF header reader), its failure on a damaged or unusual
    header said in one line instead of a numpy or gguf-py traceback."""
    try:
        return read_shape(path)
    except Exception as error:  # gguf-py raises whatever its parsing hits (ValueError, TypeError, ...)
        raise SystemExit(f"error: {role} {path}: its GGUF header lacks or mangles what the sweep needs to size "
                         f"the KV cache (context_length, block_count, head counts, embedding_length): "
                         f"{type(error).__name__}: {error}") from None


def check_vocabularies(draft_vocab, targets: dict) -> list[str]:
    """Refuses the grid if the draft cannot speculate for any target (all named at once, before
    the first target is measured); returns notes on what llama.cpp's check tolerates (token ids
    0-4, the EOS id), which the sweep prints and records. `targets`: {path: VocabModel}."""
    problems, notes = [], []
    for path, vocab in targets.items():
        why = draft_vocab.incompatibility_as_draft_of(vocab)
        if why:
            problems.append(f"the draft cannot speculate for target {path}: {why}")
        for difference in draft_vocab.tolerated_differences_as_draft_of(vocab):
            notes.append(f"draft vs target {Path(path).name}: {difference}; accepted as llama.cpp's own check "
                         f"accepts it (the target verifies every token and decides where a sequence ends, so "
                         f"the output is unchanged; acceptance may be lower)")
    if problems:
        raise SystemExit("error: " + "\n       ".join(problems))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return notes


def same_content(paths: list) -> str | None:
    """Why a list of target files holds one model twice (same path or same sha256), or None:
    the cells of both would get the same cell ids, so a resume would never measure the second."""
    seen: dict = {}
    for path in paths:
        try:
            digest = sha256_file(path)
        except OSError:
            continue  # a missing file is reported by the caller's own check
        if digest in seen:
            first = seen[digest]
            what = "names the same file twice" if Path(first).resolve() == Path(path).resolve() else \
                f"gives the same model twice: {first} and {path} have the same content (sha256 {digest[:16]}...)"
            return f"-m/--target {what}; its cells would be written twice under the same cell ids"
        seen[digest] = path
    return None
