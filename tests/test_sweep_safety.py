"""Sweeps never mix runs or fail late, and reports say in one line what is wrong with a damaged
run directory: grid checks before loading, the run-directory lock, --resume only with
the same settings, torn and partial cells repaired, every cell refused, damaged traces.csv."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from conftest import TEST_NGL
from synthetic_traces import grid_rows, write_run
from test_reliability import byte_model  # noqa: F401  (fixture)

from specnative.record import rundir, schema
from specnative.report import cli
from specnative.sweep import main, runner


def argv_for(pair, out, *extra) -> list[str]:
    target, draft = pair
    return ["-m", str(target), "-md", str(draft), "--ctx-len", "0", "-np", "1,2", "-k", "2", "-n", "6",
            "--warmup", "0", "-r", "1", "--max-repeats", "1", "-t", "1", "-ngl", str(TEST_NGL),
            "-o", str(out), "--no-report", *extra]


def no_engine(monkeypatch):
    """Makes loading a model fail the test: what is checked here must be checked before."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the grid was checked")
    monkeypatch.setattr(runner, "Engine", refuse)


def rows_by_cell(path) -> dict:
    frame = schema.read_traces(path)
    return {cell: sorted(group["spec_decode"]) for cell, group in
            frame.groupby(frame["cell_id"].str.replace(r"\|k\d+$", "", regex=True))}


@pytest.fixture(scope="module")
def finished_run(noisy_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished")
    assert main(argv_for(noisy_pair, out)) == 0
    return out, (out / "traces.csv").read_bytes()


def fresh_copy(finished_run, tmp_path):
    out, data = finished_run
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "traces.csv").write_bytes(data)
    (copy / "provenance.json").write_bytes((out / "provenance.json").read_bytes())
    return copy


# --- the grid is checked before anything is loaded ---------------------------------------------
@pytest.mark.parametrize("extra, message", [
    (["--temp", "nan", "--accept-rule", "match"], "finite"),
    (["--temp", "0,inf", "--accept-rule", "match"], "finite"),
    (["-np", "300", "-b", "4096"], "most sequences"),
    (["--temp", "0.5,0.5", "--accept-rule", "match"], "--temp has duplicates"),
])
def test_impossible_grids_fail_before_loading(noisy_pair, tmp_path, monkeypatch, extra, message):
    no_engine(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        main(argv_for(noisy_pair, tmp_path / "out") + extra)
    assert message in str(exc.value.code)
    assert not (tmp_path / "out").exists()


def test_the_same_target_twice_fails_before_loading(noisy_pair, tmp_path, monkeypatch):
    no_engine(monkeypatch)
    with pytest.raises(SystemExit, match="same file twice"):
        main(argv_for(noisy_pair, tmp_path / "out") + ["-m", str(noisy_pair[0])])


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_an_output_path_that_is_a_file_fails_before_loading(noisy_pair, tmp_path, monkeypatch, where):
    no_engine(monkeypatch)
    (tmp_path / "taken").write_text("not a directory")
    out = tmp_path / "taken" if where == "file" else tmp_path / "taken" / "run"
    with pytest.raises(SystemExit, match="is a file"):
        main(argv_for(noisy_pair, out))


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (a place nobody can write)")
def test_an_unwritable_output_path_fails_before_loading(noisy_pair, monkeypatch):
    no_engine(monkeypatch)
    with pytest.raises(SystemExit, match="not writable"):
        main(argv_for(noisy_pair, "/proc/specnative-cannot-write-here"))


def test_every_cell_refused_is_a_clear_error(noisy_pair, tmp_path, monkeypatch, capsys):
    no_engine(monkeypatch)
    out = tmp_path / "out"
    argv = argv_for(noisy_pair, out)
    argv[argv.index("--ctx-len") + 1] = "200000"  # beyond the models' training context
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert "every cell was refused" in str(exc.value.code)
    assert not (out / "traces.csv").exists()
    refused = json.loads((out / "provenance.json").read_text())["refused_cells"]
    assert len(refused) == 2 and "training context" in refused[0]["reason"]


def test_a_ctx_len_shorter_than_the_prompts_is_refused_before_loading(noisy_pair, tmp_path, monkeypatch):
    no_engine(monkeypatch)
    argv = argv_for(noisy_pair, tmp_path / "out")
    argv[argv.index("--ctx-len") + 1] = "8"
    with pytest.raises(SystemExit, match="every cell was refused"):
        main(argv)
    reason = json.loads((tmp_path / "out" / "provenance.json").read_text())["refused_cells"][0]["reason"]
    assert "ctx_len 8" in reason


# --- one sweep per run directory -----------------------------------------------------------------
def test_a_second_sweep_on_the_same_out_fails_at_once(noisy_pair, tmp_path, monkeypatch):
    out = tmp_path / "out"
    with rundir.locked(out):  # what a running sweep holds (flock: also across processes)
        no_engine(monkeypatch)
        with pytest.raises(SystemExit, match="another sweep is writing"):
            main(argv_for(noisy_pair, out))
    assert not (out / "traces.csv").exists()
    with rundir.locked(out):  # released when the first holder finished
        pass


# --- --resume only with the same settings ----------------------------------------------------------
@pytest.mark.parametrize("change, expected", [
    (["-n", "7"], "n_predict: recorded 6, now 7"),
    (["-k", "3", "-np", "1,2"], "grid.k: recorded [2], now [3]"),
    (["-s", "5"], "settings.seed: recorded 0, now 5"),
])
def test_resume_with_other_settings_is_refused(noisy_pair, finished_run, tmp_path, monkeypatch, change, expected):
    out = fresh_copy(finished_run, tmp_path)
    before = (out / "traces.csv").read_bytes()
    argv = argv_for(noisy_pair, out) + ["--resume"]
    for flag, value in zip(change[::2], change[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    no_engine(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert "settings differ" in str(exc.value.code) and expected in str(exc.value.code)
    assert (out / "traces.csv").read_bytes() == before


def test_resume_with_another_draft_is_refused(noisy_pair, copy_pair, finished_run, tmp_path, monkeypatch):
    out = fresh_copy(finished_run, tmp_path)
    no_engine(monkeypatch)
    with pytest.raises(SystemExit, match="draft_sha256"):
        main(argv_for((noisy_pair[0], copy_pair[1]), out, "--resume"))


def test_resume_with_the_same_settings_measures_nothing_again(noisy_pair, finished_run, tmp_path, monkeypatch):
    out = fresh_copy(finished_run, tmp_path)
    monkeypatch.setattr(runner, "measure_cell", lambda *a, **k: pytest.fail("a finished cell was measured again"))
    assert main(argv_for(noisy_pair, out, "--resume")) == 0
    assert (out / "traces.csv").read_bytes() == finished_run[1]


# --- torn and partial cells ------------------------------------------------------------------------
def test_a_torn_last_row_is_repaired_and_its_cell_measured_again(noisy_pair, finished_run, tmp_path, capsys):
    out = fresh_copy(finished_run, tmp_path)
    data = (out / "traces.csv").read_bytes()
    (out / "traces.csv").write_bytes(data[:-40])  # a crash in the middle of the last row
    with pytest.raises(schema.TracesError, match="fields where the header has"):
        schema.read_traces(out / "traces.csv")
    assert main(argv_for(noisy_pair, out, "--resume")) == 0
    assert "half-written last row" in capsys.readouterr().err
    cells = rows_by_cell(out / "traces.csv")
    assert cells == rows_by_cell(finished_run[0] / "traces.csv")  # every cell, each off + on once
    assert all(rows == ["off", "on"] for rows in cells.values())


def test_a_cell_with_only_its_off_row_is_not_done(noisy_pair, finished_run, tmp_path, capsys):
    out = fresh_copy(finished_run, tmp_path)
    lines = (out / "traces.csv").read_bytes().splitlines(keepends=True)
    (out / "traces.csv").write_bytes(b"".join(lines[:-1]))  # the on row never landed
    first_run = schema.read_traces(out / "traces.csv")["run_id"].iloc[0]
    assert main(argv_for(noisy_pair, out, "--resume")) == 0
    assert "not complete" in capsys.readouterr().err
    frame = schema.read_traces(out / "traces.csv")
    assert frame["cell_id"].is_unique and len(frame) == len(lines) - 1
    last_cell = frame.iloc[-2:]  # measured again: off and on from the resumed run
    assert sorted(last_cell["spec_decode"]) == ["off", "on"] and (last_cell["run_id"] != first_run).all()
    assert (frame.iloc[:-2]["run_id"] == first_run).all()


# --- non-UTF-8 output still gives rows ---------------------------------------------------------------
def test_a_sampling_sweep_on_byte_output_writes_its_rows(byte_model, tmp_path):  # noqa: F811
    argv = argv_for((byte_model, byte_model), tmp_path / "out", "--temp", "1", "--accept-rule", "match")
    assert main(argv) == 0
    frame = schema.read_traces(tmp_path / "out" / "traces.csv")
    assert len(frame) == 4 and (frame["tps"] > 0).all()


# --- report on a damaged run directory: one line naming the file, exit 1 -------------------------------
def _rewrite(path, edit):
    rows = list(csv.reader(io.StringIO(path.read_text(), newline="")))
    buffer = io.StringIO()
    csv.writer(buffer).writerows(edit(rows))
    path.write_text(buffer.getvalue())


def _drop_column(name):
    def edit(rows):
        at = rows[0].index(name)
        return [row[:at] + row[at + 1:] for row in rows]
    return edit


def _set_value(line, name, value):
    def edit(rows):
        rows[line - 1][rows[0].index(name)] = value
        return rows
    return edit


DAMAGE = {
    "no traces.csv": (lambda d: (d / "traces.csv").unlink(), "traces.csv: no such file"),
    "empty file": (lambda d: (d / "traces.csv").write_text(""), "traces.csv: the file is empty"),
    "header only": (lambda d: _rewrite(d / "traces.csv", lambda rows: rows[:1]), "no rows"),
    "garbage line": (lambda d: (d / "traces.csv").open("a").write("garbage\n"), "traces.csv:14: 1 fields"),
    "half-written line": (lambda d: (d / "traces.csv").write_bytes((d / "traces.csv").read_bytes()[:-30]),
                          "traces.csv:13:"),
    "missing tps": (lambda d: _rewrite(d / "traces.csv", _drop_column("tps")), "required column(s) tps"),
    "empty tps": (lambda d: _rewrite(d / "traces.csv", _set_value(5, "tps", "")), "traces.csv:5: column tps is empty"),
    "bad spec_decode": (lambda d: _rewrite(d / "traces.csv", _set_value(4, "spec_decode", "maybe")),
                        "traces.csv:4: spec_decode is 'maybe'"),
    "text in a number": (lambda d: _rewrite(d / "traces.csv", _set_value(3, "tps", "fast")),
                         "traces.csv:3: column tps holds 'fast'"),
    "corrupt provenance": (lambda d: (d / "provenance.json").write_text('{"run_id": "x",\n  oops'),
                           "provenance.json:2: not valid JSON"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_report_on_a_damaged_run_dir_says_what_in_one_line(tmp_path, capsys, damage):
    directory = write_run(tmp_path / "run", grid_rows(4))  # 12 rows: lines 2..13
    breaks, expected = DAMAGE[damage]
    breaks(directory)
    assert cli.main([str(directory)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert expected in err


def test_report_on_a_directory_that_does_not_exist(tmp_path, capsys):
    assert cli.main([str(tmp_path / "nope")]) == 1
    assert "not a directory" in capsys.readouterr().err
