"""`specnative <verb>`: the verbs are listed, each verb's --help shows its own flags only, and each
verb has one spelling (`python -m specnative.sweep` runs the sweep, as the quick start does)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from specnative import cli


def help_text(capsys, argv) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_the_bare_command_lists_every_verb(capsys):
    assert cli.main(["--help"]) == 0
    listed = capsys.readouterr().out
    for verb in ("sweep", "serve", "report", "merge", "compare", "runs", "db", "models", "schema"):
        assert f"\n  {verb} " in listed


def test_an_unknown_verb_is_one_line_and_exit_2(capsys):
    assert cli.main(["swep"]) == 2
    assert "unknown verb 'swep'" in capsys.readouterr().err


@pytest.mark.parametrize("verb, own, foreign", [
    ("sweep", ["--ctx-len", "--which-k", "--shard", "--draft-p-min"], ["--request-rate", "--slo", "--trace"]),
    ("serve", ["--request-rate", "--max-concurrency", "--slo", "--trace"], ["--which-k", "--shard", "--draft-p-min"]),
])
def test_each_verb_shows_only_its_own_flags(capsys, verb, own, foreign):
    text = help_text(capsys, [verb, "--help"])
    assert all(flag in text for flag in own)
    assert not any(flag in text for flag in foreign)


def test_every_verb_has_a_help(capsys):
    for verb in cli.VERBS:
        text = help_text(capsys, [verb, "--help"])
        assert f"specnative {verb}" in text  # each verb's own parser, under its own name


def test_serving_is_its_own_verb_and_no_sweep_flag(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(cli, "serve_main", lambda argv: ran.append(argv) or 0)
    with pytest.raises(SystemExit) as stop:
        cli.main(["sweep", "--serve", "--request-rate", "1", "-n", "4"])
    assert stop.value.code == 2 and not ran
    assert "--serve" in capsys.readouterr().err
    assert cli.main(["serve", "--request-rate", "1", "-n", "4"]) == 0 and ran == [["--request-rate", "1", "-n", "4"]]


def test_report_takes_one_run_folder_and_no_compare_flag(tmp_path, capsys):
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(SystemExit) as stop:
        cli.main(["report", str(tmp_path), "--compare", str(tmp_path)])
    assert stop.value.code == 2
    assert "unrecognized arguments: --compare" in capsys.readouterr().err
    assert {p.name for p in tmp_path.iterdir()} == before
    assert "--compare" not in help_text(capsys, ["report", "--help"])
    assert "[RUN ...]" in help_text(capsys, ["compare", "--help"])  # two runs side by side: specnative compare A B


def test_one_console_script_and_one_module_per_command():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {"specnative": "specnative.cli:main"}
    assert importlib.util.find_spec("specnative.report.__main__") is None
    out = subprocess.run([sys.executable, "-m", "specnative.report", "--help"], check=False, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and "cannot be directly executed" in out.stderr


def test_the_module_spellings_run_the_same_commands():
    for module in ("specnative", "specnative.sweep"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], check=False, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "specnative" in out.stdout
