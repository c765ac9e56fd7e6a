"""bench/draft_step.py: refuses a bad count before loading anything or writing its table."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "draft_step.py"


def load():
    spec = importlib.util.spec_from_file_location("draft_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("args", [["-r", "0"], ["-t", "0"], ["-n", "4"]])
def test_a_bad_count_is_one_line_and_writes_nothing(tmp_path, args):
    out = tmp_path / "split.md"
    with pytest.raises(SystemExit, match="^error: "):
        load().main([*args, "-o", str(out)])
    assert not out.exists()
