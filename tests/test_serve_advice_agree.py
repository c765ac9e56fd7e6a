"""advice.json's batch-size settings are what docs/serving.md says: disable_by_batch_size is the
first off band's mean occupancy rounded down (at least 1); k_by_batch_size gives k only where
speculation was measured to pay. And `serve -np N` is the slot count, as llama-server's -np."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from specnative.analysis import crossover
from specnative.serving.cli import build_parser

DOCS = Path(__file__).resolve().parents[1] / "docs"


def rows(benefits: dict, occupancy: dict, traces: int = 3) -> pd.DataFrame:
    """Serve rows whose on/off throughput ratio at each rate is benefits[rate] (a little spread over the
    traces), at the given mean occupancy per rate; latencies inverse to throughput."""
    out = []
    for rate, b in benefits.items():
        for t in range(traces):
            wobble = 1 + 0.01 * (t - 1)
            for spec, tps in (("off", 100.0), ("on", 100.0 * b * wobble)):
                out.append({"request_rate": rate, "trace_sha256": f"{rate}-{t}", "spec_decode": spec,
                            "output_throughput": tps, "goodput": tps / 10, "tpot_p50_ms": 1000 / tps,
                            "tpot_p99_ms": 2000 / tps, "ttft_p50_ms": 500 / tps, "mean_occupancy": occupancy[rate],
                            "concurrency": 6, "k": 4 if spec == "on" else None, "drafter": "model"})
    return pd.DataFrame(out)


def advice(benefits, occupancy):
    frame = rows(benefits, occupancy)
    return crossover.advice(frame, crossover.benefit_table(frame))


def test_disable_by_batch_size_is_the_first_off_bands_occupancy_rounded_down():
    found = advice({1.0: 1.5, 2.0: 0.7}, {1.0: 1.2, 2.0: 3.8})
    assert [b["speculation"] for b in found["load_bands"]] == ["on", "off"]
    assert found["disable_by_batch_size"] == 3  # 3.8 rounded down: off no later than where it lost
    assert found["k_by_batch_size"] == {"1": 4, "2": 4, "3": 0, "4": 0, "5": 0, "6": 0}
    assert advice({1.0: 0.7}, {1.0: 0.4})["disable_by_batch_size"] == 1  # at least 1


def test_k_is_given_only_where_speculation_was_measured_to_pay():
    within_noise = advice({1.0: 1.0, 4.0: 1.0}, {1.0: 1.0, 4.0: 4.0})
    assert {b["speculation"] for b in within_noise["load_bands"]} == {"either (within noise)"}
    assert within_noise["disable_by_batch_size"] is None
    assert set(within_noise["k_by_batch_size"].values()) == {0}  # nothing pays: no size gets k
    mixed = advice({1.0: 1.5, 3.0: 1.0, 5.0: 1.4}, {1.0: 1.0, 3.0: 3.0, 5.0: 5.0})
    assert [b["speculation"] for b in mixed["load_bands"]] == ["on", "either (within noise)", "on"]
    assert mixed["k_by_batch_size"] == {"1": 4, "2": 4, "3": 0, "4": 0, "5": 4, "6": 4}
    text = " ".join((DOCS / "serving.md").read_text(encoding="utf-8").split())
    assert "rounded down and at least 1" in text and "A run with no band \"on\" gives 0 everywhere" in text


def test_serve_takes_np_as_its_slot_count_and_refuses_a_list_clearly(capsys):
    assert build_parser().parse_args(["-np", "4"]).max_concurrency == 4
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["-np", "1,4"])
    assert refused.value.code == 2
    assert "argument -np/--max-concurrency: expected one number of slots, e.g. 8, not '1,4'" in capsys.readouterr().err
