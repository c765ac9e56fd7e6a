"""Reports from synthetic traces: the figures carry the CSV's series, the closed forms match hand
computation, lossless failures stay out of the curves and into summary.md."""
import re

import numpy as np
import pytest
from conftest import assert_real_figure
from synthetic_traces import PROVENANCE, assert_tables_well_formed, cell, grid_rows, off_row, on_row, write_run

from specnative import report
from specnative.analysis.advisor import advise, load_traces, pair_cells
from specnative.report import cells as report_cells
from specnative.report import cli, figures
from specnative.report import summary as report_summary

SPEEDUPS = {(0, 1): 1.8, (0, 4): 1.3, (0, 8): 0.85, (8192, 1): 1.4, (8192, 4): 1.1, (8192, 8): 0.7}


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def cells_of(rows, tmp_path):
    write_run(tmp_path, rows, provenance=None)
    return pair_cells(load_traces(tmp_path))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A written report: q4 grid, one cell (ctx 0, x4) failing the lossless check."""
    rows = grid_rows(4, speedups=SPEEDUPS, c_by_ctx={0: 0.6, 8192: 1.1})
    failing = next(r for r in rows if r["spec_decode"] == "on" and r["ctx_len"] == 0
                   and r["concurrency"] == 4)
    failing.update(lossless_ok=False, first_divergence=12, divergence_margin=0.0213)
    directory = write_run(tmp_path_factory.mktemp("run"), rows)
    return directory, report_summary.write_artifacts(directory)


def test_every_artifact_is_written(run):
    directory, written = run
    for stem in ("speedup_curve", "timing_breakdown", "theory_vs_measured", "acceptance_by_position"):
        for suffix in (".png", ".pdf"):
            path = directory / (stem + suffix)
            assert written[stem + suffix] == path
            assert_real_figure(path)
    assert (directory / "summary.md").is_file() and (directory / "advice.csv").is_file()


def test_speedup_curve_carries_the_csv_series(run):
    directory, _ = run
    fig = figures.plot_speedup_curve(pair_cells(load_traces(directory)))
    ax_conc, ax_ctx = fig.axes
    lines = lines_by_label(ax_conc)
    assert set(lines) == {"ctx 0", "ctx 8192", "break-even (1.0)"}
    # the failing cell (ctx 0, x4) is left out of its line
    assert list(lines["ctx 0"].get_xdata()) == [1, 8]
    assert list(lines["ctx 0"].get_ydata()) == pytest.approx([1.8, 0.85])
    assert list(lines["ctx 8192"].get_xdata()) == [1, 4, 8]
    assert list(lines["ctx 8192"].get_ydata()) == pytest.approx([1.4, 1.1, 0.7])
    assert list(lines["break-even (1.0)"].get_ydata()) == [1.0, 1.0]
    assert ax_conc.get_xscale() == "log"
    assert list(lines_by_label(ax_ctx)["×8"].get_ydata()) == pytest.approx([0.85, 0.7])


def test_speedup_curve_error_bars_are_the_repeat_range(tmp_path):
    cells = cells_of(cell(speedup=1.5), tmp_path)
    ax = figures.plot_speedup_curve(cells).axes[0]
    (bars,) = [c for c in ax.containers if c.get_label() == "_range ctx 0"]
    segment = bars.lines[2][0].get_segments()[0]  # the vertical bar at concurrency 1
    assert segment[:, 1] == pytest.approx([1.5 * 0.98 / 1.02, 1.5 * 1.02 / 0.98])


def with_ci(low, high, **on):
    """A regime whose on row carries a 95 % speedup interval, as an adaptive sweep writes it."""
    return [off_row(tps_ci_low=39.0, tps_ci_high=41.0, ci_level=0.95, repeats_used=4, warmup_used=1,
                    warmup_settled=True, stop_reason="below-break-even", n_outliers=0),
            on_row(speedup_ci_low=low, speedup_ci_high=high, tps_ci_low=30.0, tps_ci_high=34.0,
                   ci_level=0.95, repeats_used=4, warmup_used=1, warmup_settled=True,
                   stop_reason="below-break-even", **on)]


def test_speedup_curve_error_bars_are_the_interval_where_recorded(tmp_path):
    cells = cells_of(with_ci(0.70, 0.95, speedup=0.8), tmp_path)
    fig = figures.plot_speedup_curve(cells)
    (bars,) = [c for c in fig.axes[0].containers if c.get_label() == "_range ctx 0"]
    assert bars.lines[2][0].get_segments()[0][:, 1] == pytest.approx([0.70, 0.95])
    assert "confidence interval" in fig.get_supxlabel()


def test_summary_shows_intervals_repeats_and_outliers_with_their_reason(tmp_path, no_figure_files):
    note = "repeat 3: speedup 0.5 is 9.0 robust SDs below the median 0.8 (-38 %)"
    write_run(tmp_path, with_ci(0.70, 0.95, speedup=0.8, n_outliers=1, outlier_note=note),
              provenance=dict(PROVENANCE, max_repeats=10, ci_level=0.95, ci_width=0.05, warmup_tol=0.1))
    text = report.write_report(tmp_path).read_text()
    sure = text[text.index("## How sure"):text.index("## ", text.index("## How sure") + 3)]
    assert "| q4, ctx 0, ×1, k=4 | on | 32.00 (30.00–34.00) | 0.80 (0.70–0.95) | 4 | below-break-even | 1 | 1 |" in sure
    assert "| q4, ctx 0, ×1 | off | 40.00 (39.00–41.00) |  | 4 |" in sure
    assert f"- q4, ctx 0, ×1, k=4, spec on: {note}" in sure
    assert "0.80 (95% CI 0.70–0.95)" in text[text.index("## Advice"):]  # the verdict shows it
    assert "3–10 timed runs" in text and "95% interval" in text       # the record says how


def test_summary_says_when_a_file_has_no_intervals(run):
    directory, _ = run
    text = (directory / "summary.md").read_text()
    assert "No intervals recorded" in text


def test_curves_split_by_quant_when_the_sweep_varied_it(tmp_path):
    rows = grid_rows(4, speedups=SPEEDUPS) + grid_rows(8, speedups={k: v * 0.9 for k, v in SPEEDUPS.items()})
    for r in rows:
        r["cell_id"] += f"-{r['quant_bits']}"
    ax = figures.plot_speedup_curve(cells_of(rows, tmp_path)).axes[0]
    lines = lines_by_label(ax)
    assert {"ctx 0, q4", "ctx 0, q8", "ctx 8192, q4", "ctx 8192, q8"} <= set(lines)
    assert list(lines["ctx 8192, q8"].get_ydata()) == pytest.approx([1.26, 0.99, 0.63])


def test_timing_breakdown_stacks_the_csv_step_times(run):
    directory, _ = run
    traces = load_traces(directory)
    fig = figures.plot_timing_breakdown(traces)
    ax_run, ax_gen = fig.axes
    bars = {c.get_label(): c for c in ax_run.containers}
    shown = figures._bar_rows(traces)
    assert len(shown) == len(traces) - 1  # the failing on-cell is left out, off rows kept
    for step in ("prefill_target", "draft", "verify", "resample", "decode"):
        widths = [p.get_width() for p in bars[step.replace("_", " ")]]
        assert widths == pytest.approx(shown[step + "_ms"].fillna(0).to_numpy())
    # off bars sit beside their on bars: off first, then on, per regime
    assert list(shown["spec_decode"][:2]) == ["off", "on"]
    # 'other' closes the gap to total_ms; generation panel has no prefill
    total = np.sum([[p.get_width() for p in c] for c in ax_run.containers], axis=0)
    assert total == pytest.approx(shown["total_ms"].to_numpy())
    assert not any(c.get_label().startswith("prefill") for c in ax_gen.containers)


def test_closed_forms_against_hand_computed_numbers(tmp_path):
    # alpha 0.5, k 3, c 0.5: E[tau] = (1 - 0.5^4) / 0.5 = 1.875, predicted = 1.875 / 1.5 = 1.25
    # accepted 17 of 35 reached drafts (the engine's token_accept_rate)
    row = on_row(k=3, speedup=1.2, c=0.5, mean_accept_len=1.8, draft_accept_rate=0.5,
                 token_accept_rate=17 / 35, accept_len_hist="10;5;3;2", accept_at_pos="0.5;0.25;0.1")
    cells = cells_of([off_row(), row], tmp_path)
    (t,) = report_cells.theory_table(cells).to_dict("records")
    assert t["tau_expected"] == pytest.approx(1.875)
    assert t["predicted"] == pytest.approx(1.25)
    assert t["alpha_token"] == pytest.approx(17 / 35)
    a = 17 / 35
    assert t["tau_expected_token"] == pytest.approx((1 - a ** 4) / (1 - a))
    assert (t["speedup"], t["tau"]) == pytest.approx((1.2, 1.8))

    fig = figures.plot_theory(report_cells.theory_table(cells))
    ax_speed, ax_tau = fig.axes
    assert list(np.asarray(ax_speed.collections[0].get_offsets())[0]) == pytest.approx([1.25, 1.2])
    assert list(np.asarray(ax_tau.collections[0].get_offsets())[0]) == pytest.approx([1.875, 1.8])
    tau_token = (1 - a ** 4) / (1 - a)
    assert list(np.asarray(ax_tau.collections[1].get_offsets())[0]) == pytest.approx([tau_token, 1.8])
    assert "y = x" in lines_by_label(ax_speed)


def test_per_token_alpha_is_the_engine_count_not_accepted_over_drafted(tmp_path):
    cells = cells_of(cell(k=5, alpha=0.7), tmp_path)
    (t,) = report_cells.theory_table(cells).to_dict("records")
    assert t["alpha_token"] == pytest.approx(0.7, rel=1e-4)
    # accepted/drafted of the same draft is mean(0.7^i): lower, by construction
    assert t["alpha"] == pytest.approx(np.mean([0.7 ** i for i in range(1, 6)]), rel=1e-4)


def test_acceptance_by_position(tmp_path):
    assert report_cells.conditional_acceptance("0.8;0.4;0.1") == pytest.approx([0.8, 0.5, 0.25])
    assert report_cells.conditional_acceptance("") == []
    rows = cell(ctx=0, accept_at_pos="0.8;0.4;0.1", k=3) + cell(ctx=8192, k=3, alpha=0.6)
    fig = figures.plot_acceptance_by_position(cells_of(rows, tmp_path))
    raw, conditional = (lines_by_label(ax) for ax in fig.axes)
    assert list(raw["ctx 0, ×1"].get_ydata()) == pytest.approx([0.8, 0.4, 0.1])
    assert list(conditional["ctx 0, ×1"].get_ydata()) == pytest.approx([0.8, 0.5, 0.25])
    assert list(conditional["ctx 8192, ×1"].get_ydata()) == pytest.approx([0.6] * 3, rel=1e-4)


def test_slope_over_high_concurrency(tmp_path):
    speedups = {1: 2.0, 4: 1.4, 8: 1.2, 16: 1.0, 32: 0.6}  # x >= 4: speedup = 1.5 - 0.028 x, ~
    rows = [r for conc, s in speedups.items() for r in cell(conc=conc, speedup=s)]
    results = report_cells.speedup_slope(cells_of(rows, tmp_path))
    pooled = results[-1]
    from scipy import stats
    fit = stats.linregress([4, 8, 16, 32], [1.4, 1.2, 1.0, 0.6])
    assert (pooled["n"], pooled["concurrencies"]) == (4, 4)
    assert pooled["slope"] == pytest.approx(fit.slope)
    assert pooled["p_value"] == pytest.approx(fit.pvalue)
    assert pooled["note"] == "falls with concurrency"


def test_slope_needs_three_concurrencies(run):
    directory, _ = run
    results = report_cells.speedup_slope(pair_cells(load_traces(directory)))
    assert all(r["note"].startswith("not enough points") for r in results)
    assert "not enough points" in (directory / "summary.md").read_text()


def test_summary_lists_lossless_failures_and_provenance(run):
    directory, _ = run
    text = (directory / "summary.md").read_text()
    # the answer first (where speculation pays, best and worst cell, k, verdict counts), the cells,
    # and the reproducibility record last, with everything it holds
    assert text.index("## The answer") < text.index("## Cells") < text.index("## Reproducibility record")
    answer = text[text.index("## The answer"):text.index("\n## ", text.index("## The answer") + 1)]
    assert "Speculation pays in" in answer and "Best cell:" in answer and "1 fail" in answer
    for needle in ("0c1e57098", "-DGGML_NATIVE=OFF", "Synthetic CPU", "ab" * 32, "cd" * 32,
                   "python -m specnative.sweep --out runs/synthetic", "1 discarded / 3 timed"):
        assert needle in text
    assert PROVENANCE["notes"][0] in text
    # the failure, listed with its divergence, and left out
    section = text[text.index("## Lossless check"):text.index("## Speedup against")]
    assert "1 of 6 spec-on cells **failed**" in section
    assert re.search(r"\| q4, ctx 0, ×4.*\| exact-greedy \| 12 \| 0.021 \|", section)
    # every rate column is tagged, advice per regime is there
    assert "t/s [self-measured]" in text and "speedup [self-measured]" in text
    assert "| **off** |" in text and "lossless" in text


def test_summary_embeds_figures_by_relative_path(run):
    directory, _ = run
    text = (directory / "summary.md").read_text()
    embedded = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert set(embedded) == {"speedup_curve.png", "timing_breakdown.png", "theory_vs_measured.png",
                             "acceptance_by_position.png", "by_task.png"}
    assert all((directory / path).is_file() for path in embedded)


def test_every_table_in_the_summary_is_well_formed(run):
    directory, _ = run
    assert_tables_well_formed((directory / "summary.md").read_text())


def test_cells_table_has_every_row(run):
    directory, _ = run
    text = (directory / "summary.md").read_text()
    table = text[text.index("## Cells"):text.index("## Advice")]
    assert table.count("| off |") == 6 and table.count("| on |") == 6
    assert "| 72.00 ± 0.72 | 1.80 (range 1.73–1.87) |" in table  # ctx 0, x1: 40 t/s x 1.8


def test_missing_provenance_and_spec_rows_still_report(tmp_path, no_figure_files):
    write_run(tmp_path, [off_row(), off_row(conc=4, cell_id="x4")], provenance=None)
    text = report.write_report(tmp_path).read_text()
    assert "provenance.json is missing" in text
    assert "No spec-on cell to judge." in text


def test_cli_passes_thresholds(tmp_path, capsys, no_figure_files):
    write_run(tmp_path, cell(speedup=1.3, draft_accept_rate=0.6))
    assert not any(f.rule == "low-alpha" for f in advise(tmp_path)[0].findings)  # default 0.5
    assert cli.main([str(tmp_path), "--min-alpha", "0.7"]) == 0
    assert "alpha 0.60 < 0.7" in (tmp_path / "advice.csv").read_text()
    assert capsys.readouterr().out.strip() == str(tmp_path / "summary.md")


def test_unfinished_sweep_and_refused_cells_are_said(tmp_path, no_figure_files):
    prov = dict(PROVENANCE, completed=False, preset="tiny",
                refused_cells=[{"target": "t.gguf", "ctx_len": 32768, "concurrency": 8,
                                "reason": "KV cache over --max-kv-gib"}])
    write_run(tmp_path, cell(), prov)
    text = report.write_report(tmp_path).read_text()
    assert "The sweep did not finish" in text
    assert "| t.gguf | 32768 | 8 | KV cache over --max-kv-gib |" in text
    assert "| preset | tiny |" in text


def regimes_with_intervals(intervals: dict) -> list[dict]:
    """intervals[conc] = (speedup, low, high): one regime per concurrency with a recorded interval."""
    rows = []
    for conc, (speedup, low, high) in intervals.items():
        rows += [off_row(conc=conc, tps_ci_low=39.0, tps_ci_high=41.0, ci_level=0.95, repeats_used=4),
                 on_row(conc=conc, speedup=speedup, speedup_ci_low=low, speedup_ci_high=high, ci_level=0.95,
                        repeats_used=4)]
    return rows


def the_answer(tmp_path, rows) -> str:
    write_run(tmp_path, rows)
    text = report.write_report(tmp_path).read_text()
    return text[text.index("## The answer"):text.index("\n## ", text.index("## The answer") + 1)]


def test_the_best_cell_is_chosen_among_decided_cells_never_by_a_wide_interval(tmp_path, no_figure_files):
    # x1's point estimate is the highest, but its interval (a busy host) decides nothing
    answer = the_answer(tmp_path, regimes_with_intervals({1: (2.5, 0.15, 15.97), 4: (1.2, 1.1, 1.3)}))
    assert "Best cell: x4: 1.20x [1.10, 1.30]" in answer, answer


def test_the_best_cell_is_undecided_when_no_interval_lies_above_1(tmp_path, no_figure_files):
    answer = the_answer(tmp_path / "a", regimes_with_intervals({1: (2.5, 0.15, 15.97), 4: (0.9, 0.8, 1.05)}))
    assert "Best cell: undecided (no cell's speedup interval lies above 1)" in answer
    assert "worst: undecided (no cell's speedup interval lies below 1)" in answer


def test_speedup_curve_draws_ratios_on_a_log_axis_symmetric_about_1(tmp_path):
    cells = cells_of(regimes_with_intervals({1: (2.5, 0.15, 15.97), 4: (1.2, 1.1, 1.3), 8: (0.8, 0.7, 0.9)}),
                     tmp_path)
    fig = figures.plot_speedup_curve(cells)
    for ax in fig.axes:
        assert ax.get_yscale() == "log"
        low, high = ax.get_ylim()
        assert low * high == pytest.approx(1.0) and high >= 15.97 and low <= 0.15  # every bar drawn whole


def test_figure_footers_name_the_method_not_a_module(run):
    directory, _ = run
    traces = load_traces(directory)
    cells = pair_cells(traces)
    figs = [figures.plot_speedup_curve(cells), figures.plot_timing_breakdown(traces),
            figures.plot_acceptance_by_position(cells)]
    for fig in figs:
        texts = [fig.get_supxlabel()] + [t for ax in fig.axes for t in (ax.get_xlabel(), ax.get_ylabel())]
        assert not any(re.search(r"\w\.py\b", t) for t in texts), texts
    assert "Student t on the log ratios" in figs[0].get_supxlabel()
