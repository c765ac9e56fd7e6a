"""`specnative bench`: llama-bench's columns in its order, its grid, every -o format, the draft
columns of speculative rows with exact counts, refusals in one line, and compare-llama-bench.py
reading two runs' sql."""
from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from specnative import cli as top_cli
from specnative.bench_verb import cli
from specnative.bench_verb.fields import DRAFT_FIELDS, LLAMA_BENCH_FIELDS, field_type, fields_in_source, vendored_source
from specnative.bench_verb.grid import BenchError, parse, parse_int_range

ROOT = Path(__file__).resolve().parent.parent
RECORDED = Path(__file__).with_name("llama_bench_fields.txt")
SCRIPT = ROOT / "vendor" / "llama.cpp" / "scripts" / "compare-llama-bench.py"


def bench(argv, monkeypatch=None) -> tuple[int, str]:
    out = io.StringIO()
    rc = cli.main([*argv, "-t", "1"], out=out)
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def models(noisy_pair):
    return [str(p) for p in noisy_pair]


def test_columns_are_llama_benchs_in_its_order():
    assert list(LLAMA_BENCH_FIELDS) == RECORDED.read_text().split()
    source = vendored_source(ROOT)
    if source.is_file():  # the vendored tree is there wherever the package was built from this checkout
        assert fields_in_source(source.read_text()) == list(LLAMA_BENCH_FIELDS)
        text = source.read_text()
        body = text[text.index("static field_type get_field_type"):]
        ints = re.findall(r'field == "([a-z0-9_]+)"', body[:body.index("return INT")])
        assert {f for f in ints if f in LLAMA_BENCH_FIELDS} == {f for f in LLAMA_BENCH_FIELDS if field_type(f) == "INT"}


def test_int_ranges_as_llama_bench_reads_them():
    assert parse_int_range("1-16+1") == list(range(1, 17))
    assert parse_int_range("1-16") == list(range(1, 17))
    assert parse_int_range("16-128*2") == [16, 32, 64, 128]
    assert parse_int_range("512,1024,1-5+2") == [512, 1024, 1, 3, 5]
    assert parse_int_range("-1", allow_negative=True) == [-1]
    for bad in ("1-x", "", "4-8*1", "1,,2", "-1"):
        with pytest.raises(BenchError):
            parse_int_range(bad)


def test_grid_as_llama_bench_forms_it(models):
    plan = parse(["-m", models[0], "-p", "0,16,32", "-n", "8", "-pg", "16,8", "-pg", "4,2", "-t", "1,2",
                  "-md", models[1], "--spec-draft-n-max", "2,4"])
    assert [(t.n_prompt, t.n_gen) for t in plan.tests] == [(16, 0), (32, 0), (0, 8), (16, 8), (4, 2)]
    assert [s.n_threads for s in plan.settings] == [1, 2]
    assert [(s.spec_type, s.k) for s in plan.specs] == [("draft-simple", 2), ("draft-simple", 4)]
    defaults = parse(["-m", models[0]])
    assert [(t.n_prompt, t.n_gen) for t in defaults.tests] == [(512, 0), (0, 128)] and defaults.reps == 5
    assert defaults.specs == []


def run_rows(models, fmt: str, extra=()) -> str:
    rc, text = bench(["-m", models[0], "-md", models[1], "-p", "16", "-n", "8", "-r", "2",
                      "--spec-draft-n-max", "2,4", "-o", fmt, *extra])
    assert rc == 0
    return text


def check_spec(row: dict, k: int) -> None:
    assert row["spec_type"] == "draft-simple" and int(row["n_draft"]) == k
    drafted, accepted = int(row["n_drafted"]), int(row["n_accepted"])
    assert 0 <= accepted <= drafted and drafted > 0
    assert float(row["accept_rate"]) == pytest.approx(accepted / drafted, abs=1e-6)
    assert 1.0 <= float(row["mean_accept_len"]) <= k + 1
    assert float(row["speedup"]) > 0 and row["lossless"] in ("exact", "numeric")


def test_every_format_parses_with_draft_columns(models):
    rows = json.loads(run_rows(models, "json"))
    assert [(r["n_prompt"], r["n_gen"], r.get("n_draft")) for r in rows] == [(16, 0, None), (0, 8, None), (0, 8, 2),
                                                                              (0, 8, 4)]
    for row in rows:
        keys = list(LLAMA_BENCH_FIELDS) + ["samples_ns", "samples_ts"]
        assert list(row)[:len(keys)] == keys and len(row["samples_ns"]) == 2
        assert row["avg_ts"] == pytest.approx(sum(row["samples_ts"]) / 2)
        n = row["n_prompt"] + row["n_gen"]
        assert row["samples_ts"] == pytest.approx([1e9 * n / ns for ns in row["samples_ns"]])
        assert row["avg_ns"] == int(sum(row["samples_ns"]) / 2)
    assert all(k not in rows[0] for k in DRAFT_FIELDS)
    check_spec(rows[2], 2)
    check_spec(rows[3], 4)

    lines = [json.loads(line) for line in run_rows(models, "jsonl").splitlines()]
    assert [list(r)[:len(LLAMA_BENCH_FIELDS)] for r in lines] == [list(LLAMA_BENCH_FIELDS)] * 4
    check_spec(lines[3], 4)

    table = list(csv.DictReader(io.StringIO(run_rows(models, "csv"))))
    assert list(table[0]) == list(LLAMA_BENCH_FIELDS) + list(DRAFT_FIELDS) and len(table) == 4
    assert table[0]["spec_type"] == "" and table[0]["n_threads"] == "1"
    check_spec(table[2], 2)

    db = sqlite3.connect(":memory:")
    db.executescript(run_rows(models, "sql"))
    assert [c[1] for c in db.execute("PRAGMA table_info(llama_bench)")] == list(LLAMA_BENCH_FIELDS)
    assert db.execute("SELECT n_prompt, n_gen FROM llama_bench").fetchall() == [(16, 0), (0, 8)]
    spec = db.execute("SELECT n_draft, n_drafted, n_accepted, accept_rate FROM llama_bench_spec").fetchall()
    assert [s[0] for s in spec] == [2, 4] and all(a <= d and r == pytest.approx(a / d) for _, d, a, r in spec)

    md = run_rows(models, "md").splitlines()
    assert md[0].split("|")[1].strip() == "model" and "spec_type" in md[0] and len(md) == 2 + 4 + 2
    assert md[-1].startswith("build: ")


def test_plain_run_has_llama_benchs_columns_only(models):
    rc, text = bench(["-m", models[0], "-p", "8", "-n", "4", "-r", "1", "-o", "csv"])
    assert rc == 0
    assert text.splitlines()[0].split(",") == list(LLAMA_BENCH_FIELDS)


@pytest.mark.parametrize("argv", [
    ["-ctk", "q8_0"], ["-d", "512"], ["--foo"], ["-p", "1-x"], ["-o", "xml"], ["-ub", "128"], ["-pg", "512"],
    ["--spec-type", "eagle9"], ["--spec-draft-n-max", "4"], ["-fa", "maybe"], ["-r", "0"],
    ["--spec-type", "draft-simple"], ["-md", "/nonexistent.gguf"], ["-md", "DRAFT", "--spec-type", "draft-simple,draft-eagle3"],
])
def test_bad_flags_refused_in_one_line(models, argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    argv = [models[1] if a == "DRAFT" else a for a in argv]
    assert cli.main(["-m", models[0], *argv], out=out) == 2
    err = capsys.readouterr().err
    assert out.getvalue() == "" and len(err.strip().splitlines()) == 1 and err.startswith("specnative bench: error:")
    assert list(tmp_path.iterdir()) == []


def test_verb_is_dispatched(models, capsys):
    assert top_cli.main(["bench", "-m", models[0], "-ctk", "q4_0"]) == 2
    assert "f16 only" in capsys.readouterr().err


def test_compare_llama_bench_reads_two_runs(models, tmp_path):
    if not SCRIPT.is_file():
        pytest.skip("the vendored llama.cpp tree is not in this checkout")
    pytest.importorskip("git")  # the script's own imports (GitPython, tabulate)
    pytest.importorskip("tabulate")
    db = sqlite3.connect(tmp_path / "bench.sqlite")
    first = run_rows(models, "sql")
    commit = re.search(r"VALUES \('([^']*)'", first).group(1)
    db.executescript(first)
    db.executescript(run_rows(models, "sql").replace(f"VALUES ('{commit}'", "VALUES ('fedcba9'"))  # another build
    db.commit()
    db.close()
    p = subprocess.run([sys.executable, str(SCRIPT), "-i", "bench.sqlite", "-b", commit, "-c", "fedcba9"],
                       check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert re.search(r"\|\s*pp16\s*\|", p.stdout) and re.search(r"\|\s*tg8\s*\|", p.stdout)
