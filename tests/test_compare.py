"""compare: regimes matched across two runs, the ratio B/A with a Welch interval, decided
regressions only where the data decide them, a new lossless fail loudest."""
from __future__ import annotations

import csv
import io
import json
import math
import random

import pytest
import synthetic_runs
from scipy import stats as scipy_stats

from specnative import cli
from specnative.analysis.compare import (
    IMPROVEMENT,
    NO_CHANGE,
    REGRESSION,
    UNDECIDED,
    CompareError,
    classify,
    compare_runs,
)
from specnative.analysis.stats import Interval, LogEstimate, geometric_interval, welch_ratio
from specnative.record import database

SLOW = (0, 4)  # the regime a planted slowdown touches


def runs(tmp_path, changes_b=None, with_repeats=True, provenance_b=None, regimes_b=synthetic_runs.REGIMES):
    """Two runs of the same build (different noise); B with `changes_b` per regime."""
    a = synthetic_runs.write_run(tmp_path / "a", "run-a", synthetic_runs.sweep_rows("run-a", 1), with_repeats)
    b = synthetic_runs.write_run(tmp_path / "b", "run-b",
                                 synthetic_runs.sweep_rows("run-b", 2, regimes_b, changes_b), with_repeats,
                                 **(provenance_b or {}))
    return a, b


def compared(a, b, threshold=0.05, across=None):
    return compare_runs(database.read_run(a), database.read_run(b), threshold, across)


def statuses(comparison):
    return {r.a.label.split("|")[1] + "|" + r.a.label.split("|")[2]: r.status for r in comparison.cells}


# ---------------------------------------------------------------------------------------------
# The interval and the classification
# ---------------------------------------------------------------------------------------------
def test_welch_ratio_is_scipys_welch_interval_on_the_logs():
    rng = random.Random(3)
    a = [100 * math.exp(rng.gauss(0, 0.03)) for _ in range(4)]
    b = [90 * math.exp(rng.gauss(0, 0.01)) for _ in range(7)]
    ours = welch_ratio(LogEstimate.of_values(a, "repeats"), LogEstimate.of_values(b, "repeats"))
    theirs = scipy_stats.ttest_ind([math.log(v) for v in b], [math.log(v) for v in a], equal_var=False)
    low, high = theirs.confidence_interval(0.95)
    assert (math.log(ours.low), math.log(ours.high)) == pytest.approx((low, high), rel=1e-9)


def test_a_recorded_interval_undone_gives_the_repeats_own_spread():
    values = [101.0, 97.0, 104.0, 99.5, 100.2]
    from_values = LogEstimate.of_values(values, "repeats")
    iv = geometric_interval(values)
    from_interval = LogEstimate.of_interval(Interval(iv.estimate, iv.low, iv.high, 0.95, 5), "recorded interval")
    assert (from_interval.mean, from_interval.var) == pytest.approx((from_values.mean, from_values.var), rel=1e-9)


@pytest.mark.parametrize("estimate, low, high, status", [
    (0.80, 0.77, 0.83, REGRESSION), (0.93, 0.92, 0.94, REGRESSION), (0.93, 0.88, 0.98, UNDECIDED),
    (0.96, 0.955, 0.965, NO_CHANGE), (1.00, 0.90, 1.10, UNDECIDED), (1.20, 1.10, 1.30, IMPROVEMENT),
    (0.80, math.nan, math.nan, UNDECIDED)])
def test_classify(estimate, low, high, status):
    assert classify(Interval(estimate, low, high, 0.95, 10), 0.05) == status


# ---------------------------------------------------------------------------------------------
# What the comparison decides
# ---------------------------------------------------------------------------------------------
def test_two_runs_of_the_same_build_show_no_decided_change_anywhere(tmp_path):
    a, b = runs(tmp_path)
    comparison = compared(a, b)
    assert len(comparison.cells) == 6
    assert set(statuses(comparison).values()) == {NO_CHANGE}
    assert cli.main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 0


@pytest.mark.parametrize("with_repeats", [True, False])
def test_a_planted_slowdown_is_a_regression_there_and_nowhere_else(tmp_path, with_repeats, capsys):
    a, b = runs(tmp_path, {SLOW: {"slower": 0.8}}, with_repeats)
    comparison = compared(a, b, 0.10)
    found = statuses(comparison)
    assert found.pop("ctx0|c4") == REGRESSION
    assert set(found.values()) == {NO_CHANGE}
    assert cli.main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 1
    out, err = capsys.readouterr()
    assert "1 decided regression(s) beyond 10 %" in err
    assert ("derived from the run's recorded interval" in out) is (not with_repeats)
    assert cli.main(["compare", str(a), str(b)]) == 0  # no gate asked for


def test_a_slower_machine_is_a_slowdown_in_spec_off_tokens_not_a_speedup_regression(tmp_path, capsys):
    a, b = runs(tmp_path, {SLOW: {"decoding": 0.7}})
    comparison = compared(a, b, 0.10)
    assert set(statuses(comparison).values()) == {NO_CHANGE}  # speculation pays as much as before
    assert [c.a.label for c in comparison.slowdowns(0.10)] == [c.a.label for c in comparison.cells
                                                               if "ctx0|c4" in c.a.label]
    assert cli.main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 0
    assert cli.main(["compare", str(a), str(b), "--fail-on-slowdown", "10"]) == 1
    assert "spec-off tokens/s decided slower by more than 10 % in 1 regime(s)" in capsys.readouterr().err
    a2, b2 = runs(tmp_path / "same")
    assert cli.main(["compare", str(a2), str(b2), "--fail-on-slowdown", "10"]) == 0


def test_a_verdict_that_became_fail_is_the_first_and_loudest_line(tmp_path, capsys):
    a, b = runs(tmp_path, {(8192, 8): {"verdict": "fail"}})
    assert cli.main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 1
    out = capsys.readouterr().out
    assert out.index("LOSSLESS VERDICT BECAME FAIL in 1 regime(s)") < out.index("## What differs")
    assert "**FAIL: q4|ctx8192|c8|T0|greedy|task=mixed|k4**: exact → fail (planted)" in out
    assert cli.main(["compare", str(a), str(b)]) == 0


def test_cells_only_in_one_run_are_listed(tmp_path):
    a, b = runs(tmp_path, regimes_b=synthetic_runs.REGIMES[:-1] + ((0, 16),))
    comparison = compared(a, b)
    assert [r.label for r in comparison.only_a] == ["q4|ctx8192|c8|T0|greedy|task=mixed|k4"]
    assert [r.label for r in comparison.only_b] == ["q4|ctx0|c16|T0|greedy|task=mixed|k4"]
    rows = list(csv.DictReader(io.StringIO(cli_output(["compare", str(a), str(b), "-o", "csv"]))))
    assert [(r["regime"], r["status"]) for r in rows[-2:]] == [
        ("q4|ctx8192|c8|T0|greedy|task=mixed|k4", "only in A"), ("q4|ctx0|c16|T0|greedy|task=mixed|k4", "only in B")]


def cli_output(argv):
    import contextlib
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert cli.main(argv) == 0
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# What may be matched
# ---------------------------------------------------------------------------------------------
def test_another_draft_file_is_refused_unless_matched_across_models(tmp_path):
    a, b = runs(tmp_path, {SLOW: {"draft": "ef" * 32}})
    with pytest.raises(CompareError, match=r"1 regime\(s\) .* different model files .*\n  q4\|ctx0\|c4\|.*: "
                                           r"draft_sha256 A cdcdcdcdcdcdcdcd B efefefefefefefef"):
        compared(a, b)
    assert len(compared(a, b, across="models").cells) == 6


def test_another_target_file_is_refused_naming_the_regimes_then_matched_by_quantization(tmp_path):
    target = "12" * 32
    a, b = runs(tmp_path, {regime: {"target": target} for regime in synthetic_runs.REGIMES})
    with pytest.raises(SystemExit, match=r"^error: 6 regime\(s\) .*\n  q4\|ctx0\|c1\|.*target_sha256 A abab"):
        cli.main(["compare", str(a), str(b)])
    comparison = compared(a, b, across="models")
    assert len(comparison.cells) == 6 and not comparison.only_a
    assert comparison.cells[0].a.key.startswith("abababababababab|") and comparison.cells[0].b.key.startswith("1212")


def test_another_quantization_of_a_one_target_run_matches_across_models(tmp_path):
    a, b = runs(tmp_path, {regime: {"target": "34" * 32, "quant": 8} for regime in synthetic_runs.REGIMES})
    with pytest.raises(CompareError, match=r"6 regime\(s\)"):
        compared(a, b)
    comparison = compared(a, b, across="models")
    assert len(comparison.cells) == 6
    assert comparison.cells[0].a.label.startswith("q4|") and comparison.cells[0].b.label.startswith("q8|")


def test_another_k_is_refused_unless_matched_across_settings(tmp_path):
    a, b = runs(tmp_path, {regime: {"k": 8} for regime in synthetic_runs.REGIMES})
    with pytest.raises(CompareError, match=r"q4\|ctx0\|c1\|T0\|greedy\|task=mixed\|k4: k A 4 B 8"):
        compared(a, b)
    comparison = compared(a, b, across="settings")
    assert len(comparison.cells) == 6 and comparison.cells[0].b.key.endswith("|k8")


def test_a_new_regime_that_fails_is_as_loud_as_one_that_became_fail(tmp_path, capsys):
    a, b = runs(tmp_path, {(0, 16): {"verdict": "fail"}}, regimes_b=synthetic_runs.REGIMES + ((0, 16),))
    assert cli.main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 1
    assert "- **FAIL: q4|ctx0|c16|T0|greedy|task=mixed|k4**: not in A → fail" in capsys.readouterr().out


def test_other_settings_are_refused_unless_matched_across_settings(tmp_path):
    a, b = runs(tmp_path, {SLOW: {"n_threads": 4}})
    with pytest.raises(CompareError, match=r"n_threads A 2 B 4"):
        compared(a, b)
    assert len(compared(a, b, across="settings").cells) == 6
    assert len(compared(a, b, across="all").cells) == 6


def test_another_host_and_llama_cpp_commit_are_compared_and_stated(tmp_path):
    a, b = runs(tmp_path, provenance_b={"llama_cpp_commit": "b" * 40, "cpu_model": "Other CPU", "cpu_count": 8})
    comparison = compared(a, b)
    assert [what for what, _, _ in comparison.differences] == ["llama.cpp commit", "host", "CPUs"]
    out = cli_output(["compare", str(a), str(b)])
    assert "| llama.cpp commit | 0c1e57098bba43ac29e6e3b677cdceebdd22334f | " + "b" * 40 + " |" in out


def test_a_sweep_run_and_a_serve_run_are_refused(tmp_path):
    a, b = runs(tmp_path, provenance_b={"mode": "serve"})
    with pytest.raises(CompareError, match="A is a sweep run and B a serve run"):
        compared(a, b)


# ---------------------------------------------------------------------------------------------
# Outputs and how A and B are named
# ---------------------------------------------------------------------------------------------
def test_json_csv_and_the_plot(tmp_path):
    a, b = runs(tmp_path, {SLOW: {"slower": 0.8}})
    record = json.loads(cli_output(["compare", str(a), str(b), "-o", "json"]))
    assert record["summary"] == {REGRESSION: 1, IMPROVEMENT: 0, NO_CHANGE: 5, UNDECIDED: 0}
    slow = [c for c in record["cells"] if c["status"] == REGRESSION][0]
    assert slow["speedup_ratio"] == pytest.approx(0.8, abs=0.03)
    assert slow["speedup_ratio_high"] < 0.975 and slow["interval_from"] == "repeats"
    rows = list(csv.DictReader(io.StringIO(cli_output(["compare", str(a), str(b), "-o", "csv"]))))
    assert [r["status"] for r in rows].count(REGRESSION) == 1
    figure = tmp_path / "ratio.png"
    cli_output(["compare", str(a), str(b), "--plot", str(figure)])
    assert figure.read_bytes()[:4] == b"\x89PNG"


def test_runs_named_by_id_or_by_commit_from_the_database(tmp_path):
    a, b = runs(tmp_path, {SLOW: {"slower": 0.8}}, provenance_b={"llama_cpp_commit": "beef" * 10,
                                                              "date": "2026-12-02T10:00:00+00:00"})
    db = tmp_path / "db.sqlite"
    database.import_runs(db, [a, b])
    by_id = json.loads(cli_output(["compare", "run-a", "run-b", "--db", str(db), "-o", "json"]))
    by_commit = json.loads(cli_output(["compare", "-b", "0c1e570", "-c", "beefbe", "--db", str(db), "-o", "json"]))
    assert by_id["cells"] == by_commit["cells"]
    assert by_id["summary"][REGRESSION] == 1
    with pytest.raises(SystemExit, match=r"^error: run: 2 run ids in .* start so: run-a, run-b$"):
        cli.main(["compare", "run", "run-b", "--db", str(db)])
    with pytest.raises(SystemExit, match=r"^error: commit dead: no sweep run"):
        cli.main(["compare", "-b", "dead", "-c", "beef", "--db", str(db)])


def test_bad_names_are_one_error_line(tmp_path):
    a, _ = runs(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: nowhere: no such run folder, and no database at .*nothing\.sqlite"):
        cli.main(["compare", str(a), "nowhere", "--db", str(tmp_path / "nothing.sqlite")])
    with pytest.raises(SystemExit, match=r"^error: .*traces\.csv: a file, not a run folder$"):
        cli.main(["compare", str(a), str(a / "traces.csv")])
    with pytest.raises(SystemExit, match=r"^error: no run B"):
        cli.main(["compare", str(a)])


def _with_synthetic_rows(rows: list[dict], run_id: str, seed: int, slower: float) -> list[dict]:
    """The run's rows plus, per regime, a synthetic acceptance on row beside its real one."""
    rng, extra = random.Random(seed), []
    for ctx, conc in synthetic_runs.REGIMES:
        _, on = synthetic_runs.regime_rows(run_id, ctx, conc, rng, slower=slower)
        extra.append(dict(on, synthetic_acceptance="0.3", synthetic_alpha=0.3, verdict="synthetic", lossless_ok="",
                          cell_id=f"{on['cell_id']}|synthetic=0.3"))
    return rows + extra


def test_synthetic_rows_are_no_regimes_and_gate_nothing(tmp_path, capsys):
    """Synthetic acceptance rows keep drafts at random: a synthetic 'regression' (every real row the
    same) is no regression, and no off row is counted again for them."""
    a = synthetic_runs.write_run(tmp_path / "a", "run-a",
                                 _with_synthetic_rows(synthetic_runs.sweep_rows("run-a", 1), "run-a", 3, 1.0))
    b = synthetic_runs.write_run(tmp_path / "b", "run-b",
                                 _with_synthetic_rows(synthetic_runs.sweep_rows("run-b", 2), "run-b", 4, 0.5))
    comparison = compared(a, b, 0.10)
    assert len(comparison.cells) == len(synthetic_runs.REGIMES) and not comparison.only_a and not comparison.only_b
    assert set(statuses(comparison).values()) == {NO_CHANGE}
    assert "synthetic" not in " ".join(c.a.key for c in comparison.cells)
    assert cli.main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 0
