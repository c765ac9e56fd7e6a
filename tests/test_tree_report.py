"""summary.md counts every verdict the run has: a draft tree's verdict enters the answer's counts and
the lossless check, and a tree-only run says where its answer is instead of "nothing was measured"."""
from __future__ import annotations

import pytest

from specnative.sweep import SweepConfig

TREE = "tree:topk=2,depth=2,budget=3"


@pytest.fixture(scope="module")
def tree_only_run(noisy_pair, tmp_path_factory):
    from specnative.sweep import run_sweep
    target, draft = noisy_pair
    out = tmp_path_factory.mktemp("tree-only") / "run"
    cfg = SweepConfig(targets=[target], draft=draft, ctx_lens=[0], concurrencies=[1], ks=[3], n_predict=12,
                      warmup=0, repeats=2, max_repeats=2, threads=1, out_dir=out, report=False, draft_shapes=[TREE])
    run_sweep(cfg)
    return out


def _answer(summary: str) -> str:
    return summary.split("## The answer", 1)[1].split("\n## ", 1)[0]


def test_a_tree_only_run_counts_its_tree_verdict(tree_only_run):
    from specnative.report import write_report
    summary = write_report(tree_only_run).read_text()
    answer = _answer(summary)
    assert "No speculative cell was measured" not in answer
    assert "No chain was measured" in answer and "Trees or chains?" in answer
    assert "Lossless verdicts of the 1 speculative cells (1 of them draft trees): 1 exact" in answer
    check = summary.split("## Lossless check", 1)[1].split("\n## ", 1)[0]
    assert "Draft trees: 1 verdicts: 1 exact" in check


def test_a_failing_tree_is_counted_where_verdicts_are_counted(tree_only_run, tmp_path):
    import shutil

    from specnative.record.schema import read_traces
    from specnative.report import write_report
    run = tmp_path / "run"
    shutil.copytree(tree_only_run, run)
    rows = read_traces(run / "traces.csv")
    tree = rows["draft_shape"] == TREE
    rows.loc[tree, "lossless_ok"], rows.loc[tree, "verdict"], rows.loc[tree, "verdict_reason"] = False, "fail", "planted"
    rows.to_csv(run / "traces.csv", index=False)
    summary = write_report(run).read_text()
    assert "1 fail — **a `fail` is a bug" in _answer(summary)
    check = summary.split("## Lossless check", 1)[1].split("\n## ", 1)[0]
    assert "1 fail" in check and "planted" in check


def test_the_lossless_check_counts_exact_dist_verdicts():
    import pandas as pd

    from specnative.analysis.advisor import REGIME_KEYS
    from specnative.report.tables import verdicts_of_cells_md
    cells = pd.DataFrame({"verdict": ["exact", "exact-dist", "exact-dist", "numeric"]})
    text = verdicts_of_cells_md(cells.assign(**{c: 0 for c in ("first_divergence", "mismatches", "max_mismatch_gap",
                                                                "noise_tolerance", "noise_max_abs_delta",
                                                                "noise_flips", "verdict_reason")},
                                             **{c: 1 for c in REGIME_KEYS}))
    assert text.startswith("Lossless verdicts: 1 exact, 1 numeric, 2 exact-dist, 0 fail.")


def test_advice_csv_holds_the_trees_regimes_named_by_their_shape(tree_only_run, tmp_path):
    import shutil

    import pandas as pd

    from specnative.report import write_report
    run = tmp_path / "run"
    shutil.copytree(tree_only_run, run)
    write_report(run)
    advice = pd.read_csv(run / "advice.csv")
    assert advice["draft_shape"].tolist() == [TREE]
    assert advice["decision"].iloc[0] in ("on", "off", "measure-more") and int(advice["k"].iloc[0]) == 3


@pytest.mark.parametrize("width", [6, 13])
def test_a_figure_caption_stays_inside_the_figure(width):
    """The speedup figure's footer (the interval caption and the host note) was wider than the
    figure: its first and last characters were cut off."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from specnative.report.figures import BAND_CAPTION, caption, new_figure
    fig, _ = new_figure(width, 4.6, 2)
    note = ("Self-measured on CPU AMD EPYC 7B13 64-Core Processor (2 cores, 23.4 GB), CPU; "
            "every rate is this host's own and does not carry to other hardware.")
    caption(fig, f"{BAND_CAPTION}; lossless cells only (hollow markers: `numeric` lossless verdict).", note)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box = fig._supxlabel.get_window_extent(canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box.x0, box.x1, fig.bbox.width)
    assert "error bars" in fig._supxlabel.get_text() and "other hardware." in fig._supxlabel.get_text()
