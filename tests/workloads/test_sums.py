"""``exact_total`` adds the exact partial sums of blocks as well as plain terms.

A model whose blocks split rows (2-D process grids) or hold any atoms (3-D
bricks) returns an ``ExactPartial`` per block and quantity; the combined
total is the correctly rounded sum of all terms for any split.
"""

import math
import pickle

import numpy as np
import pytest

from hpcgpu.errors import ConfigError
from hpcgpu.exact_sums import ExactPartial
from hpcgpu.workloads.sums import exact_partial, exact_total


def test_partials_of_2d_blocks_total_the_terms_of_the_whole_grid(rng):
    field = rng.standard_normal((64, 48)) * 10.0 ** rng.integers(-8, 8, (64, 48))
    expected = math.fsum(field.ravel().tolist())
    for px, py in [(1, 1), (2, 2), (3, 2), (2, 4)]:
        blocks = [exact_partial(piece) for rows in np.array_split(field, px, axis=0)
                  for piece in np.array_split(rows, py, axis=1)]
        # as ranks would: each partial pickled and sent, then added in another order
        received = [pickle.loads(pickle.dumps(b)) for b in blocks[::-1]]
        assert exact_total(received) == expected
        assert exact_total(sum(received)) == expected
        assert exact_total(iter(received)) == expected


def test_partials_of_a_blown_up_block_give_nan_or_inf():
    assert math.isnan(exact_total([exact_partial([1.0, np.inf]), exact_partial([-np.inf])]))
    assert exact_total([exact_partial([1e308]), exact_partial([1e308])]) == math.inf


def test_terms_keep_the_behaviour_they_had():
    assert exact_total(np.array([1e16, 1.0, -1e16])) == 1.0
    assert exact_total([]) == 0.0
    assert exact_total(ExactPartial()) == 0.0


def test_partials_mixed_with_numbers_are_refused():
    with pytest.raises(ConfigError, match="values must be all ExactPartial or all numbers; got 1 partials among 2"):
        exact_total([exact_partial([1.0]), 2.0])
