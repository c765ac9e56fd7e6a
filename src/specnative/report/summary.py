"""summary.md and the figures of one sweep run folder (traces.csv + provenance.json): what the
sweep writes when it finishes and `specnative report` writes again."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from specnative.analysis import factorial
from specnative.analysis.advisor import Thresholds, advise, by_task, k_advice, load_traces, pair_cells, verdicts_frame
from specnative.analysis.break_even import break_even_table, with_break_even
from specnative.record.schema import is_serve_run, is_tree_row
from specnative.report import break_even, levers
from specnative.report.cells import speedup_slope, theory_table
from specnative.report.drafter_sections import (
    by_drafter,
    drafters_md,
    has_k_prediction,
    has_p_min,
    has_several_drafters,
    p_min_md,
    plot_by_drafter,
    plot_by_task,
    plot_which_k,
    task_md,
    which_k_md,
)
from specnative.report.figures import (
    plot_acceptance_by_position,
    plot_speedup_curve,
    plot_theory,
    plot_timing_breakdown,
    save,
)
from specnative.report.record_md import (
    ReportInputError,
    hardware,
    load_provenance,
    notes_md,
    provenance_md,
    sweep_time_md,
    unfinished_md,
)
from specnative.report.tables import cells_md, failures_md, measurement_md, slope_md, theory_md, timing_md, verdicts_md
from specnative.report.trees import has_trees, tree_verdicts_md, trees_md
from specnative.report.verdict_block import verdict_block
from specnative.run.workloads import category_table


def write_report(run_dir, thresholds: Thresholds | None = None) -> Path:
    """Writes the report into run_dir (see write_artifacts); returns the summary.md path."""
    return write_artifacts(run_dir, thresholds)["summary.md"]


def write_artifacts(run_dir, thresholds: Thresholds | None = None) -> dict:
    """Writes figures, advice.csv and summary.md into run_dir; returns {file name: path}."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportInputError(f"{run_dir}: not a directory (give the sweep's run directory)")
    prov = load_provenance(run_dir)
    with_synthetic = load_traces(run_dir / "traces.csv", synthetic=True)
    traces = load_traces(with_synthetic)  # the real rows: every verdict and advice is about them
    if traces.empty:
        raise ReportInputError(f"{run_dir / 'traces.csv'}: a header but no rows: nothing was measured")
    if is_serve_run(traces):  # specnative report hands these to serving.report
        raise ReportInputError(f"{run_dir}: a serve run (specnative serve); its report is specnative report's "
                               f"serving report")
    tree_rows = is_tree_row(traces)  # their own section; every other section reads the chains
    all_traces, traces = traces, traces[~tree_rows].reset_index(drop=True)
    cells = pair_cells(traces)
    verdicts = verdicts_frame(advise(traces, thresholds))
    note = f"Self-measured on {hardware(prov)}." if prov else "Hardware not recorded."
    table = theory_table(cells)
    figures = {"speedup_curve": plot_speedup_curve(cells, note),
               "timing_breakdown": plot_timing_breakdown(traces, note),
               "theory_vs_measured": plot_theory(table, note),
               "acceptance_by_position": plot_acceptance_by_position(cells, note),
               "by_task": plot_by_task(by_task(traces, thresholds), note)}
    if has_several_drafters(traces):
        figures["by_drafter"] = plot_by_drafter(by_drafter(cells), note)
    if has_k_prediction(traces):
        figures["which_k"] = plot_which_k(traces, note)
    break_even_rows = break_even_table(with_synthetic, float(traces["ci_level"].dropna().iloc[0])
                                                  if traces["ci_level"].notna().any() else 0.95)
    if not break_even_rows.empty:
        figures["break_even"] = break_even.plot_break_even(with_synthetic, break_even_rows, note)
    out = {}
    for name, fig in figures.items():
        out[f"{name}.png"], out[f"{name}.pdf"] = save(fig, run_dir / name)
    out["advice.csv"] = run_dir / "advice.csv"
    advice_rows(with_break_even(verdicts, break_even_rows), all_traces[tree_rows],
                thresholds).to_csv(out["advice.csv"], index=False)
    if not break_even_rows.empty:
        out["break_even.csv"] = run_dir / "break_even.csv"
        break_even_rows.to_csv(out["break_even.csv"], index=False)
    levers = write_factorial(traces, run_dir, note, out, figures)
    sections = _sections(traces, cells, verdicts, table, prov, thresholds or Thresholds(), all_traces)
    if has_several_drafters(traces):
        sections.insert(4, ("Which drafter", drafters_md(traces, cells, thresholds or Thresholds())))
    if has_k_prediction(traces):
        sections.insert(3, ("Which k: recommended draft length", which_k_md(traces)))
    if has_p_min(traces):
        sections.insert(4, ("Draft stop rule (p_min) against fixed k", p_min_md(traces, thresholds or Thresholds())))
    if (public := category_table.section_md(traces)) is not None:
        sections.insert(4, ("Public set by category (Spec-Bench's shape)", public))
    sections.insert(3, ("Which alpha would pay: break-even per regime", break_even.section_md(break_even_rows)))
    if (own_time := sweep_time_md((prov or {}).get("sweep_timing") or [])) is not None:
        sections.append(("Where the sweep's time went", own_time))
    out["summary.md"] = run_dir / "summary.md"
    answer = verdict_block(traces, verdicts, k_advice(traces) if has_k_prediction(traces) else None, all_traces)
    if has_trees(all_traces):
        sections.insert(0, ("Trees or chains?", trees_md(all_traces)))
    answer = "\n\n".join([*unfinished_md(prov or {}, traces), answer])  # an unfinished grid: said first
    if not break_even_rows.empty:  # what alpha each regime needs, beside what the drafters reach
        answer += ("\n\nWhich alpha would pay (synthetic acceptance; never lossless, not in the verdicts above):\n\n"
                   + "\n".join(break_even.answer_lines(break_even_rows)))
    if levers is not None:  # right after the answer: the question the run's factors can answer
        sections.insert(0, ("Do the levers add?", levers))
    out["summary.md"].write_text(_render(prov, answer, sections, list(figures)))
    return out


def advice_rows(chains: pd.DataFrame, trees: pd.DataFrame, thresholds: Thresholds | None) -> pd.DataFrame:
    """advice.csv: the chains' regimes, then each draft tree's (decided by the same rules among the
    trees only, named by its draft_shape; empty on chain rows)."""
    if trees.empty:
        return chains
    decided = verdicts_frame(advise(trees.reset_index(drop=True), thresholds))
    shapes = pair_cells(trees.reset_index(drop=True))["draft_shape"].tolist()  # advise's order
    decided.insert(0, "draft_shape", shapes)
    return pd.concat([chains.assign(draft_shape="") if not chains.empty else chains, decided], ignore_index=True)


def write_factorial(traces, run_dir: Path, note: str, out: dict, figures: dict) -> str | None:
    """tidy.csv (one row per cell and repeat), factorial.csv (the log-linear model's terms), the
    interaction figure; returns the "Do the levers add?" section, or None when nothing crosses."""
    tidy, tables, models = factorial.analyse(traces)
    out["tidy.csv"] = run_dir / "tidy.csv"
    tidy.to_csv(out["tidy.csv"], index=False)
    section = levers.section_md(tables, models, tidy)
    if section is None:
        return None
    out["factorial.csv"] = run_dir / "factorial.csv"
    levers.models_frame(models).to_csv(out["factorial.csv"], index=False)
    figure = levers.plot_interactions(tidy, note)
    out["interactions.png"], out["interactions.pdf"] = save(figure, run_dir / "interactions")
    figures["interactions"] = figure
    return section


def _sections(traces, cells, verdicts, table, prov, thresholds, all_traces) -> list:
    return [("Read first: notes from the sweep", notes_md(prov)),
            ("Cells", cells_md(traces, cells, prov)),
            ("Advice per regime",
             verdicts_md(verdicts, thresholds, k_advice(traces) if has_k_prediction(traces) else None)),
            ("How sure: intervals, repeats, outliers", measurement_md(traces)),
            ("By task category", task_md(by_task(traces, thresholds))),
            ("Lossless check", "\n\n".join(filter(None, [failures_md(cells) if not cells.empty else "",
                                                          tree_verdicts_md(all_traces)]))
             or failures_md(cells)),
            ("Speedup against concurrency: slope", slope_md(speedup_slope(cells))),
            ("Theory against measurement", theory_md(table)),
            ("Timing", timing_md(traces))]


FIGURE_TITLES = {"speedup_curve": "Speedup against concurrency and context",
                 "timing_breakdown": "Per-step timing breakdown",
                 "theory_vs_measured": "Closed form against measurement",
                 "acceptance_by_position": "Acceptance by draft position",
                 "by_task": "Acceptance and speedup by task category",
                 "by_drafter": "Which drafter pays, by task",
                 "which_k": "Which k: verify-cost curve and predicted speedup",
                 "break_even": "Which alpha would pay: speedup against alpha per regime",
                 "interactions": "Do the levers add? Speculation's speedup against every other factor"}


def _render(prov: dict, answer: str, sections: list, figures: list) -> str:
    """The answer first, then the sections, the figures, and the reproducibility record last."""
    title = f"# specnative report: run {prov.get('run_id', 'n/a')}"
    parts = [title, "## The answer", answer]
    for heading, body in sections:
        parts += [f"## {heading}", body]
    parts.append("## Figures")
    parts += [f"### {FIGURE_TITLES[f]}\n\n![{f}]({f}.png)\n\n[PDF]({f}.pdf)" for f in figures]
    parts += ["## Reproducibility record", provenance_md(prov)]
    return "\n\n".join(parts) + "\n"
