"""The docs say what the code does: the generated column tables match the code that defines the
columns, and statements the docs make about cell ids, the serve levers and the reports hold.

`python tests/test_docs_agree.py --write` regenerates docs/traces.md's column table from the
schema (`specnative schema`): run it after changing a column's text."""
from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def traces_doc_table(text: str) -> tuple[str, str, str]:
    """(before, the column table, after) of docs/traces.md's "## Columns" section."""
    head, rest = text.split("## Columns\n", 1)
    lines = rest.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| column | type |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return (head + "## Columns\n" + "\n".join(lines[:start]) + "\n", "\n".join(lines[start:end]),
            "\n" + "\n".join(lines[end:]))


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_traces_column_table_is_the_schemas():
    from specnative.record.schema import markdown_doc

    _, table, _ = traces_doc_table((DOCS / "traces.md").read_text(encoding="utf-8"))
    assert table == markdown_doc(), "docs/traces.md's column table is not `specnative schema`'s output: " \
                                    "run python tests/test_docs_agree.py --write"


def test_the_schema_says_rates_are_pooled_and_names_every_lossless_method():
    from specnative.record.schema import COLUMNS

    docs = {c.name: c.doc for c in COLUMNS}
    assert "median" not in docs["repeats"] and "pooled" in docs["repeats"] and "pooled" in docs["tps"]
    for method in ("exact-greedy", "exact-seed", "distribution", "reference", "alone-greedy", "alone-seed"):
        assert method in docs["lossless_method"], method


def test_the_tidy_column_table_is_tidys():
    from specnative.analysis.tidy import COLUMNS

    text = (DOCS / "traces.md").read_text(encoding="utf-8").split("## tidy.csv", 1)[1]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(COLUMNS)


def test_a_p_min_cell_id_is_as_drafters_md_says():
    from specnative.sweep.config import Cell

    example = "…|task=mixed|pmin=0.5|prefix=off|k4"
    cell = Cell(Path("t.gguf"), ctx_len=0, concurrency=1, temperature=0.0, prefix_cache=False,
                factors=(("draft_p_min", 0.5),))
    assert cell.key("ab" * 32, "greedy", 4).endswith(example[1:])
    text = one_line((DOCS / "drafters.md").read_text(encoding="utf-8"))
    assert f"`{example}`" in text and "`cell_id` ends in `|pmin=P`" not in text


def test_the_warm_up_statement_names_when_the_check_runs_count():
    text = one_line((DOCS / "measurement.md").read_text(encoding="utf-8"))
    assert ("The lossless check's own pair of runs counts as the first where it ran what is timed: at T = 0, "
            "or under `match`, at the timed seed.") in text
    assert "Under the default rule at T > 0" in text


def test_which_drafter_appears_only_when_several_drafters_ran():
    import pandas as pd

    from specnative.report.drafter_sections import has_several_drafters

    assert not has_several_drafters(pd.DataFrame({"drafter": ["ngram-simple", "ngram-simple", None]}))
    assert not has_several_drafters(pd.DataFrame({"drafter": ["model", "model"]}))
    assert has_several_drafters(pd.DataFrame({"drafter": ["model", "ngram-simple"]}))
    text = one_line((DOCS / "advice.md").read_text(encoding="utf-8"))
    assert "When several drafters were measured, the \"Which drafter\" section" in text


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    from specnative.record.schema import markdown_doc

    page = DOCS / "traces.md"
    before, _, after = traces_doc_table(page.read_text(encoding="utf-8"))
    page.write_text(before + markdown_doc() + after, encoding="utf-8")
    print(f"wrote the column table of {page.name}")
