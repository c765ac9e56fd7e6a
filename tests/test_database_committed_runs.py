"""The database and compare on the repository's committed run folders: a sweep of the tiny preset
(written before per-repeat values existed: its intervals are undone from the recorded ones) and a
serve run of it (levels paired over the traces both runs replayed)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import specnative.record.schema as schema
from specnative import cli
from specnative.record import database

SWEEP_RUN, SERVE_RUN = "20261130-060704-db30ec", "20261201-162536-64ba39"


def committed_run(run_id: str) -> Path:
    """The committed folder of a run, wherever the repository keeps it."""
    for start in (Path(__file__).resolve(), Path(schema.__file__).resolve()):
        for root in start.parents:
            results = root / "bench" / "results"
            if results.is_dir():
                for provenance in results.rglob("provenance.json"):
                    try:
                        if json.loads(provenance.read_text()).get("run_id") == run_id:
                            return provenance.parent
                    except (OSError, ValueError):
                        continue
    pytest.skip(f"the committed run {run_id} is not in this checkout")


@pytest.fixture
def copies(tmp_path):
    """traces.csv, provenance.json and requests.jsonl of both runs, copied (the originals stay untouched)."""
    out = {}
    for name, run_id in (("tiny-sweep", SWEEP_RUN), ("tiny-serve", SERVE_RUN)):
        source = committed_run(run_id)
        (tmp_path / name).mkdir()
        for file in ("traces.csv", "provenance.json", "requests.jsonl"):
            if (source / file).exists():
                shutil.copy(source / file, tmp_path / name / file)
        out[name] = tmp_path / name
    return out


def test_db_import_of_the_committed_runs(tmp_path, copies, capsys):
    db = tmp_path / "runs" / "specnative.sqlite"
    assert cli.main(["db", "import", str(copies["tiny-sweep"]), str(copies["tiny-serve"]), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"synced {SWEEP_RUN}" in out and "36 rows, 0 requests" in out
    assert f"synced {SERVE_RUN}" in out and "30 rows, 720 requests" in out
    for run_id, name in ((SWEEP_RUN, "tiny-sweep"), (SERVE_RUN, "tiny-serve")):
        from_file = schema.read_traces(copies[name] / "traces.csv")
        pd.testing.assert_frame_equal(database.load_run(db, run_id).traces[list(from_file.columns)], from_file)
    listed = {r["run_id"]: r for r in database.list_runs(db)}
    assert (listed[SWEEP_RUN]["kind"], listed[SWEEP_RUN]["cells"], listed[SWEEP_RUN]["verdicts"]) == \
        ("sweep", 18, {"exact": 18})
    assert (listed[SERVE_RUN]["kind"], listed[SERVE_RUN]["cells"]) == ("serve", 15)
    assert listed[SERVE_RUN]["grid"].startswith("rate 1,2,4,8,inf × np 8 × k 4")


def test_a_committed_sweep_compared_with_itself_decides_no_regression(copies, capsys):
    assert cli.main(["compare", str(copies["tiny-sweep"]), str(copies["tiny-sweep"]), "--fail-on-regression", "5"]) == 0
    out = capsys.readouterr().out
    assert "18 regime(s) in both runs: 0 regression, 0 improvement" in out
    assert "derived from the run's recorded interval" in out


def test_a_committed_serve_run_compared_with_itself_pairs_its_traces(copies, capsys):
    assert cli.main(["compare", str(copies["tiny-serve"]), str(copies["tiny-serve"]), "-o", "json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [c["regime"] for c in record["cells"]] == [f"rate={r}/np=8/k=4/model" for r in ("1", "2", "4", "8", "inf")]
    assert {c["status"] for c in record["cells"]} == {"no decided change"}
    assert {c["interval_from"] for c in record["cells"]} == {"paired traces"}
    assert all(c["tpot_p50_ms_ratio"] == pytest.approx(1.0) for c in record["cells"])
