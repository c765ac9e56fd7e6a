"""The long shared context: real, varied documents (the built-in texts/ or a user's --context file)
that a cell with ctx_len > 0 puts ahead of every sequence's own prompt, identified by sha256."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specnative.run.workloads.prompts import sha256_text

DOCUMENTS_DIR = Path(__file__).with_name("texts")


CONTEXT_HEADER = "Reference documents for the conversation below:\n\n"


# Below this many document tokens a "long context" is not one.
MIN_DOCUMENT_TOKENS = 16


# ---------------------------------------------------------------------------------------------
# Long-context documents
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Documents:
    text: str
    sources: tuple  # ({"name", "sha256", "chars"}, ...)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def builtin_documents() -> Documents:
    parts, sources = [], []
    for path in sorted(DOCUMENTS_DIR.glob("*.txt")):
        body = path.read_text(encoding="utf-8").strip()
        parts.append(body)
        sources.append({"name": path.name, "sha256": sha256_text(body), "chars": len(body)})
    return Documents("\n\n---\n\n".join(parts), tuple(sources))


def documents_from_file(path) -> Documents:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig").strip()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: the context file is not UTF-8 text (byte {error.start}): a binary file?") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot read the context file ({error.strerror})") from None
    if not text:
        raise ValueError(f"{path}: the context file is empty")
    if "\x00" in text:
        raise ValueError(f"{path}: the context file holds NUL bytes (a binary file, not text)")
    return Documents(text, ({"name": path.name, "sha256": sha256_text(text), "chars": len(text)},))
