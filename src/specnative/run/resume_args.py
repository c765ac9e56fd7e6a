"""`--resume --out DIR`: continue the run in DIR with the flags it was started with.

A run folder records its command line (provenance.json's `command`). Given `--resume` and `--out`
and nothing of the run's own (only --db, --no-db or --no-report may join them), the flags are read
from there, so `specnative sweep --resume --out DIR`, the line an interrupted run prints, works as
printed. Given flags are used as given (the resume's settings check refuses any that differ). A
folder that holds no run is refused before anything is written: a mistyped name does not start a
fresh run.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from specnative.record.provenance import ProvenanceError, read_provenance

OUT_FLAGS = ("-o", "--out")
# flags that may join --resume --out without changing what is measured
OWN_VALUE_FLAGS = ("--db",)
OWN_SWITCHES = ("--resume", "--no-db", "--no-report")


def resume_command(verb: str, out: Path) -> str:
    """The command that continues the run in `out` (what an interrupted run prints)."""
    return f"specnative {verb} --resume --out {shlex.quote(str(out))}"


def _split(argv: list[str]) -> tuple[str | None, list[str], list[str]]:
    """(the --out value, the tokens of the resume itself, every other token)."""
    out, own, other, i = None, [], [], 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=")
        if name in OUT_FLAGS + OWN_VALUE_FLAGS and token.startswith("--") and eq:
            out = value if name in OUT_FLAGS else out
            own += [] if name in OUT_FLAGS else [token]
        elif token in OUT_FLAGS + OWN_VALUE_FLAGS and i + 1 < len(argv):
            out = argv[i + 1] if token in OUT_FLAGS else out
            own += [] if token in OUT_FLAGS else [token, argv[i + 1]]
            i += 1
        elif token in OWN_SWITCHES:
            own.append(token)
        else:
            other.append(token)
        i += 1
    return out, own, other


def _without(tokens: list[str], value_flags: tuple, switches: tuple) -> list[str]:
    kept, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        if token in value_flags:
            i += 2
            continue
        if token in switches or (token.startswith("--") and token.partition("=")[0] in value_flags):
            i += 1
            continue
        kept.append(token)
        i += 1
    return kept


def resume_argv(verb: str, argv: list[str]) -> list[str]:
    """argv as the run goes on with it: unchanged without --resume or with flags of the run's own;
    for a bare `--resume --out DIR`, the recorded command's flags followed by these. Refuses (one
    line, nothing written) a folder that holds no run and a record without a command to read."""
    if "--resume" not in argv:
        return argv
    out, own, other = _split(argv)
    if out is None:
        return argv  # the flags' own check says that --resume needs --out
    folder = Path(out)
    if not (folder / "provenance.json").is_file() and not (folder / "traces.csv").is_file():
        raise SystemExit(f"error: --resume: {folder} holds no run to continue (no provenance.json or traces.csv); "
                         f"check the folder's name, or leave out --resume to start a new run there")
    if other:
        return argv
    try:
        recorded = read_provenance(folder)
    except ProvenanceError as error:
        raise SystemExit(f"error: cannot resume {folder}: unreadable: {error}") from None
    tokens = shlex.split(str((recorded or {}).get("command") or ""))
    if tokens[:2] != ["specnative", verb]:
        raise SystemExit(f"error: cannot resume {folder}: its provenance.json records no `specnative {verb}` command "
                         f"to read the run's flags from; give them again, with --resume --out {folder}")
    db_given = any(t in ("--db", "--no-db") or t.startswith("--db=") for t in own)
    flags = _without(tokens[2:], OUT_FLAGS + (OWN_VALUE_FLAGS if db_given else ()),
                     ("--resume",) + (("--no-db",) if db_given else ()))
    print(f"resuming {folder} with the flags it was started with: {' '.join(shlex.quote(t) for t in flags) or '(none)'}",
          file=sys.stderr)
    return flags + argv
