"""compare says what a reader must know before its numbers (one run on both sides, a run that did
not finish), and refuses a figure it cannot write or a damaged repeats column in one line, before
writing anything."""
from __future__ import annotations

import csv
import hashlib
import json

import pytest
import synthetic_runs

from specnative import cli
from specnative.record import database


def hashes(root) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def two_runs(tmp_path, provenance_b=None):
    a = synthetic_runs.write_run(tmp_path / "a", "run-a", synthetic_runs.sweep_rows("run-a", 1))
    b = synthetic_runs.write_run(tmp_path / "b", "run-b", synthetic_runs.sweep_rows("run-b", 2), **(provenance_b or {}))
    return a, b


def test_b_and_c_naming_the_same_run_say_so(tmp_path, capsys):
    a, b = two_runs(tmp_path, {"llama_cpp_commit": "beef" * 10, "date": "2026-12-02T10:00:00+00:00"})
    db = tmp_path / "db.sqlite"
    database.import_runs(db, [a, b])
    assert cli.main(["compare", "-b", "beef", "-c", "beef", "--db", str(db)]) == 0
    assert "**Note: A and B are the same run (run-b): every ratio compares it with itself.**" in capsys.readouterr().out
    assert cli.main(["compare", "-b", "beef", "-c", "beef", "--db", str(db), "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["notes"] == ["A and B are the same run (run-b): every ratio compares it with itself"]
    assert "compare: note: A and B are the same run" in captured.err
    assert cli.main(["compare", "-b", "0c1e570", "-c", "beef", "--db", str(db)]) == 0  # two runs: no note
    assert "Note:" not in capsys.readouterr().out


def test_compare_of_an_interrupted_run_says_so(tmp_path, capsys):
    a, b = two_runs(tmp_path, {"completed": False})
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "**Note: run B (run-b) did not finish (interrupted, or still running): the regimes it never measured " \
           "are missing here, not unchanged.**" in out
    assert "run A" not in out


@pytest.mark.parametrize("plot, message", [
    ("ratio.xyz", r"--plot .*ratio\.xyz: cannot write a \.xyz figure; name the format by the suffix \(\.png, \.pdf"),
    ("ratio", r"--plot .*ratio: no suffix; name the format by the suffix"),
    ("{dir}", r"--plot .*figs: a folder; give a file name in it, e\.g\. .*figs/ratio\.png"),
    ("nowhere/ratio.png", r"--plot .*nowhere/ratio\.png: no folder .*nowhere to write it in"),
])
def test_a_plot_it_cannot_write_is_refused_before_anything_is_written(tmp_path, monkeypatch, plot, message):
    a, b = two_runs(tmp_path)
    (tmp_path / "figs").mkdir()
    monkeypatch.chdir(tmp_path)
    before = hashes(tmp_path)
    with pytest.raises(SystemExit, match="^error: " + message):
        cli.main(["compare", str(a), str(b), "--plot", plot.replace("{dir}", str(tmp_path / "figs"))])
    assert hashes(tmp_path) == before and not list((tmp_path / "figs").iterdir())


def test_an_empty_plot_name_is_an_argument_error(tmp_path, monkeypatch, capsys):
    a, b = two_runs(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = hashes(tmp_path)
    with pytest.raises(SystemExit):
        cli.main(["compare", str(a), str(b), "--plot", ""])
    assert "--plot: expected a file name such as ratio.png, got an empty one" in capsys.readouterr().err
    assert hashes(tmp_path) == before  # no ".png"


@pytest.mark.parametrize("column, value", [("tps_repeats", "inf;410"), ("speedup_repeats", "1.2;-inf"),
                                           ("speedup_repeats", "fast;1.1"), ("repeats", "inf")])
def test_an_infinity_in_a_repeats_column_is_one_error_line(tmp_path, column, value):
    a, b = two_runs(tmp_path)
    path = b / "traces.csv"
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    rows[1][column] = value
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(SystemExit, match=rf"^error: .*traces\.csv:3: column {column} holds '{value}', not"):
        cli.main(["compare", str(a), str(b)])
    assert cli.main(["report", str(b)]) == 1  # the report: the same one line, no traceback
