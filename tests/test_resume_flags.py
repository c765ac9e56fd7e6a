"""An interrupted sweep prints a command that continues it as printed (`--resume --out DIR` reads
the run's flags from its folder), its report says how many cells were never measured, and
`--resume` on a folder that holds no run is refused before anything is written."""
from __future__ import annotations

import json
import shlex

import pytest
from conftest import TEST_NGL

from specnative import cli
from specnative.record import schema
from specnative.run import resume_args
from specnative.sweep import runner


def sweep_argv(pair, out) -> list[str]:
    target, draft = pair
    return ["-m", str(target), "-md", str(draft), "--ctx-len", "0", "-np", "1,2,3", "-k", "2", "-n", "6",
            "--warmup", "0", "-r", "1", "-t", "1", "-ngl", str(TEST_NGL), "-o", str(out), "--no-report", "--no-db"]


def test_the_printed_resume_command_continues_an_interrupted_sweep_as_printed(noisy_pair, tmp_path, monkeypatch,
                                                                             capsys):
    out = tmp_path / "run"
    real_measure, calls = runner.measure_cell, []

    def interrupt_second_cell(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(runner, "measure_cell", interrupt_second_cell)
    assert cli.main(["sweep", *sweep_argv(noisy_pair, out)]) == 130
    printed = capsys.readouterr().err.split("continue with: ")[1].strip()
    assert printed == f"specnative sweep --resume --out {shlex.quote(str(out))}"

    # the interrupted run's report: the missing cells said before the answer
    assert cli.main(["report", str(out)]) == 0
    summary = (out / "summary.md").read_text(encoding="utf-8")
    answer = summary.split("## The answer", 1)[1]
    assert answer.lstrip().startswith("**This sweep run did not finish: 2 of its 3 planned cells were never "
                                      "measured. Everything below covers the measured ones only (1)")

    monkeypatch.setattr(runner, "measure_cell", real_measure)
    assert cli.main(shlex.split(printed)[1:]) == 0  # as printed: no flag of the run's given again
    assert "with the flags it was started with" in capsys.readouterr().err
    rows = schema.read_traces(out / "traces.csv")
    assert len(rows) == 6 and rows["cell_id"].is_unique
    assert json.loads((out / "provenance.json").read_text())["completed"] is True


def test_resume_on_a_folder_without_a_run_is_refused_and_creates_nothing(noisy_pair, tmp_path):
    typo = tmp_path / "rnu"
    for argv in (["sweep", "--resume", "--out", str(typo)], ["sweep", *sweep_argv(noisy_pair, typo), "--resume"],
                 ["serve", "--resume", "-o", str(typo)]):
        with pytest.raises(SystemExit, match=r"^error: --resume: .*rnu holds no run to continue"):
            cli.main(argv)
        assert not typo.exists()
    typo.mkdir()  # an empty folder holds no run either
    with pytest.raises(SystemExit, match="holds no run to continue"):
        cli.main(["sweep", "--resume", "--out", str(typo)])
    assert list(typo.iterdir()) == []


def test_given_flags_are_used_as_given_and_a_bare_resume_reads_the_recorded_ones(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "provenance.json").write_text(json.dumps(
        {"command": f"specnative sweep --preset tiny -np 1,2 -o {out} --db other.sqlite"}))
    assert resume_args.resume_argv("sweep", ["-np", "4", "--resume", "-o", str(out)]) == \
        ["-np", "4", "--resume", "-o", str(out)]
    assert resume_args.resume_argv("sweep", ["--resume", "-o", str(out)]) == \
        ["--preset", "tiny", "-np", "1,2", "--db", "other.sqlite", "--resume", "-o", str(out)]
    assert resume_args.resume_argv("sweep", ["--resume", f"--out={out}", "--no-db"]) == \
        ["--preset", "tiny", "-np", "1,2", "--resume", f"--out={out}", "--no-db"]
    with pytest.raises(SystemExit, match="records no `specnative serve` command"):
        resume_args.resume_argv("serve", ["--resume", "-o", str(out)])


def test_version_prints_the_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"specnative {cli.version()}"
    assert cli.version()[0].isdigit()


def test_an_unfinished_serve_run_says_how_many_levels_were_never_measured():
    import pandas as pd

    from specnative.report.record_md import unfinished_md

    rows = pd.DataFrame({"request_rate": [1.0, 1.0, 1.0, 1.0, 2.0, 2.0], "seed": [0, 0, 1, 1, 0, 0],
                         "spec_decode": ["off", "on"] * 3})
    said = unfinished_md({"mode": "serve", "completed": False, "levels_planned": 6}, rows)
    assert said == ["**This serve run did not finish: 3 of its 6 planned levels (request rate, trace seed) were "
                    "never measured. Everything below covers the measured ones only (3), not all that was asked "
                    "for.** `specnative serve --resume --out RUN_DIR` measures the rest."]
    assert unfinished_md({"mode": "serve", "completed": True, "levels_planned": 6}, rows) == []
