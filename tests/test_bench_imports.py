"""bench/peerkit's modules import one another without a circle, function-local imports included."""
from __future__ import annotations

import ast
from pathlib import Path

PEERKIT = Path(__file__).resolve().parents[1] / "bench" / "peerkit"


def imports_of(path: Path) -> set[str]:
    """The peerkit modules a module imports anywhere in it (`from .x import`, `from . import x`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return found & {p.stem for p in PEERKIT.glob("*.py")}


def test_peerkit_has_no_import_circle():
    graph = {p.stem: imports_of(p) for p in PEERKIT.glob("*.py")}
    done, path = set(), []

    def visit(name):
        if name in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        path.append(name)
        for other in sorted(graph.get(name, ())):
            visit(other)
        path.pop()
        done.add(name)
    for name in sorted(graph):
        visit(name)
    assert "serve_table" not in graph["serve_parity"] and "open_loop" in graph["serve_parity"]


def test_the_host_cpu_is_read_in_one_place():
    """provenance reads /proc/cpuinfo for every run record and bench table; a second reader would
    drift from it (one fell back to "unknown CPU", another to the machine type)."""
    root = Path(__file__).resolve().parents[1]
    readers = sorted(str(p.relative_to(root)) for folder in ("src", "bench") for p in (root / folder).rglob("*.py")
                     if 'Path("/proc/cpuinfo")' in p.read_text(encoding="utf-8")
                     or 'open("/proc/cpuinfo")' in p.read_text(encoding="utf-8"))
    assert readers == ["src/specnative/record/provenance.py"]
