"""The head trainer's learning-rate schedule: warm-up, then a cosine that reaches its floor at the
end of the plan, in tokens, or at the deadline of a time budget whatever the speed was."""
from __future__ import annotations

import time

import pytest

from specnative.models.train.trainer import _lr_factor, _progress


def test_warm_up_then_cosine_to_a_tenth():
    assert _lr_factor(0.0, 0, 10) == pytest.approx(0.1)
    assert _lr_factor(0.0, 9, 10) == pytest.approx(1.0)
    assert _lr_factor(0.5, 100, 10) == pytest.approx(0.55)
    assert _lr_factor(1.0, 100, 10) == pytest.approx(0.1)
    assert _lr_factor(3.0, 100, 10) == pytest.approx(0.1)  # past the plan: the floor, not a restart


def test_progress_by_tokens_without_a_deadline():
    assert _progress(250, 1000, time.perf_counter(), None) == pytest.approx(0.25)
    assert _progress(250, float("inf"), time.perf_counter(), None) == 0.0


def test_progress_follows_the_clock_under_a_deadline():
    now = time.perf_counter()
    # three quarters of the time spent, a tenth of the tokens: the clock leads
    assert _progress(100, 1000, now - 30.0, now + 10.0) == pytest.approx(0.75, abs=0.01)
    # a token plan ahead of the clock leads
    assert _progress(900, 1000, now - 1.0, now + 99.0) == pytest.approx(0.9)
    # at the deadline the schedule is at its floor however few tokens were done
    assert _lr_factor(_progress(5, float("inf"), now - 60.0, now), 100, 10) == pytest.approx(0.1, abs=1e-3)
