"""Contiguous blocks in proportion to weights (:func:`hpcgpu.partition.layout.split_rows`)."""

import pytest

from hpcgpu.errors import ConfigError
from hpcgpu.partition.layout import split_rows


def test_weighted_partitions_follow_the_weights():
    assert split_rows(101, [3, 1]) == [(0, 76), (76, 101)]
    # a block too small for the halo is raised to it; the others keep their proportions
    assert split_rows(100, [1, 50, 50], minimum=10) == [(0, 10), (10, 55), (55, 100)]
    for rows in (100, 101, 257):
        (a, b), (c, d) = split_rows(rows, [3.0, 1.0])
        assert abs((b - a) - 3 * (d - c)) <= 4  # within one row of 3:1 each
        assert abs((b - a) - 0.75 * rows) <= 1


def test_blocks_that_cannot_hold_their_halo_never_suggest_zero_partitions():
    with pytest.raises(ConfigError, match=r"needs at least 768 rows \(384 per block for the halo\) but the grid has "
                                          r"128; use fewer steps_per_task \(a narrower halo\) or a bigger grid"):
        split_rows(128, [1, 1], minimum=384)
    with pytest.raises(ConfigError, match="use at most 3 partitions or fewer steps_per_task"):
        split_rows(100, [1] * 4, minimum=30)


def test_finite_weights_whose_sum_overflows_still_place_every_row():
    assert split_rows(40, [1e308, 1e308], minimum=6) == [(0, 20), (20, 40)]
    assert split_rows(40, [1e308, 1e307], minimum=6) == [(0, 34), (34, 40)]
    assert split_rows(40, [1e-300, 3e-300]) == [(0, 10), (10, 40)]
