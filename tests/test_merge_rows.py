"""merge checks each shard's rows against the cells its provenance says it measured, and a
refused merge or report changes no file."""
from __future__ import annotations

import math
import shutil

import pytest
from synthetic_traces import grid_rows, write_run
from test_resume_history import snapshot
from test_shards import runs  # noqa: F401  (fixture: shards 0/2 and 1/2 of a 4-cell grid)
from test_sweep_safety import DAMAGE as REPORT_DAMAGE

from specnative.cli import merge_main
from specnative.record import merge
from specnative.report import cli


def _damaged_copy(runs, tmp_path, damage) -> str:  # noqa: F811
    copy = tmp_path / "shard1"
    shutil.copytree(runs / "shard1", copy)
    traces = copy / "traces.csv"
    damage(traces, traces.read_bytes().split(b"\r\n")[:-1])
    return str(copy)


def _write(traces, lines) -> None:
    traces.write_bytes(b"".join(line + b"\r\n" for line in lines))


DAMAGE = {
    "missing": (lambda t, lines: t.unlink(), "is missing"),
    "header only": (lambda t, lines: _write(t, lines[:1]), "lacks 2 row(s)"),
    "a row lacking": (lambda t, lines: _write(t, lines[:-1]), "lacks 1 row(s)"),
    "a row twice": (lambda t, lines: _write(t, lines + lines[-1:]), "is there twice"),
    "torn last row": (lambda t, lines: t.write_bytes(b"\r\n".join(lines)[:-20]), "ends in a torn row"),
    "short row": (lambda t, lines: _write(t, lines[:-1] + [lines[-1][:30]]), "a torn or damaged row"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_shard_whose_rows_do_not_match_its_cells_is_refused(runs, tmp_path, damage):  # noqa: F811
    edit, message = DAMAGE[damage]
    damaged = _damaged_copy(runs, tmp_path, edit)
    before = {d: snapshot(d) for d in (runs / "shard0", damaged)}
    with pytest.raises(SystemExit) as exc:
        merge_main([str(tmp_path / "merged"), str(runs / "shard0"), damaged, "--no-report"])
    assert message in str(exc.value.code) and str(exc.value.code).startswith("error: ")
    assert not (tmp_path / "merged").exists()
    assert {d: snapshot(d) for d in before} == before


def test_a_shard_whose_cells_were_all_refused_needs_no_rows(runs, tmp_path):  # noqa: F811
    record = merge.load_shard(runs / "shard1")
    record["refused_cells"] = [{"cell": key} for _, key in record["shard"]["cells"]]
    assert merge.expected_rows(record) == {}
    recorded = merge.load_shard(runs / "shard1")
    measured = len(recorded["shard"]["cells"]) - len(recorded["refused_cells"])
    assert measured >= 1 and len(merge.expected_rows(recorded)) == 2 * measured  # off + on (one k) per cell


@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_a_refused_report_changes_no_file(tmp_path, capsys, value):
    rows = grid_rows()
    rows[1]["prefill_target_ms"] = value  # it used to crash matplotlib's axis limits midway
    run = write_run(tmp_path / "run", rows)
    before = snapshot(run)
    assert cli.main([str(run)]) == 1
    assert "not a finite number" in capsys.readouterr().err
    assert snapshot(run) == before


@pytest.mark.parametrize("damage", sorted(REPORT_DAMAGE))
def test_every_refused_report_changes_no_file(tmp_path, capsys, damage):
    directory = write_run(tmp_path / "run", grid_rows(4))
    REPORT_DAMAGE[damage][0](directory)
    before = snapshot(directory)
    assert cli.main([str(directory)]) == 1
    assert capsys.readouterr().err.startswith("error: ")
    assert snapshot(directory) == before


def test_a_deeply_nested_provenance_is_one_line_everywhere(runs, tmp_path, capsys, monkeypatch):  # noqa: F811
    """json.loads raises RecursionError, not JSONDecodeError, on deep nesting: report, merge and
    --resume each say it in one line and change nothing."""
    from test_sweep_safety import argv_for, no_engine

    from specnative import sweep
    deep = '{"a": ' + "[" * 200_000 + "\n"
    run = write_run(tmp_path / "run", grid_rows())
    (run / "provenance.json").write_text(deep)
    before = snapshot(run)
    assert cli.main([str(run)]) == 1 and "nested too deeply" in capsys.readouterr().err
    shard = tmp_path / "shard1"
    shutil.copytree(runs / "shard1", shard)
    (shard / "provenance.json").write_text(deep)
    with pytest.raises(SystemExit, match="unreadable"):
        merge_main([str(tmp_path / "merged"), str(runs / "shard0"), str(shard), "--no-report"])
    no_engine(monkeypatch)
    record = merge.load_shard(runs / "shard0")
    pair = (record["models"][0]["path"], record["models"][1]["path"])
    with pytest.raises(SystemExit, match="unreadable"):
        sweep.main(argv_for(pair, run, "--resume"))
    assert snapshot(run) == before and not (tmp_path / "merged").exists()
