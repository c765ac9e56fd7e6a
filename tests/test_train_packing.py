"""Packing sequences into the trainer's batch rows: every sequence exactly once, no row over its
length, and rows filled best-fit (a sequence goes where it leaves the least room)."""
from __future__ import annotations

import numpy as np

from specnative.models.train.batches import pack


def _check(rows, lengths, row_len):
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= row_len for row in rows)


def test_a_sequence_goes_where_it_fits_best():
    lengths = [300, 400, 200, 100]
    rows = pack(lengths, 500, order=range(4))
    _check(rows, lengths, 500)
    # 300 opens a row, 400 another; 200 fits only beside 300; 100 fills 400's row exactly
    assert rows == [[0, 2], [1, 3]]


def test_best_fit_wastes_less_than_placing_in_turn():
    rng = np.random.RandomState(0)
    lengths = rng.randint(100, 500, size=400).tolist()
    row_len = 576
    rows = pack(lengths, row_len, order=rng.permutation(400))
    _check(rows, lengths, row_len)
    # placing in turn closes a row as soon as the next sequence does not fit
    in_turn, used = 1, 0
    for n in lengths:
        if used + n > row_len:
            in_turn, used = in_turn + 1, 0
        used += n
    assert len(rows) < 0.9 * in_turn
    assert sum(lengths) / (len(rows) * row_len) > 0.9


def test_a_sequence_as_long_as_the_row_has_a_row_of_its_own():
    rows = pack([576, 10, 576], 576, order=[0, 1, 2])
    assert rows == [[0], [1], [2]]
