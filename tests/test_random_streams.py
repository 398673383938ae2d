"""Counter-based random numbers: pure functions of (key, id, slot), uniform, and MD's stream family."""

import numpy as np
import pytest
from scipy import stats

from hpcgpu.errors import ConfigError
from hpcgpu.random_streams import stream_key, uniforms
from hpcgpu.workloads.md import setup as md_setup


def test_a_deviate_depends_on_its_key_id_and_slot_only():
    key = stream_key(3, 1, 0)
    every = uniforms(np, key, np.arange(1000), 3)
    ids = np.array([999, 0, 17, 17])
    np.testing.assert_array_equal(uniforms(np, key, ids, 3), every[:, ids])
    assert not np.any(uniforms(np, stream_key(3, 1, 1), np.arange(1000), 3) == every)
    assert not np.any(uniforms(np, stream_key(4, 1, 0), np.arange(1000), 3) == every)


def test_uniforms_are_uniform_and_independent_between_slots():
    u = uniforms(np, stream_key(1, 2, 3), np.arange(100000), 2)
    assert 0.0 <= u.min() and u.max() < 1.0
    for row in u:
        assert stats.kstest(row, "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(u)[0, 1]) < 0.02
    closed = uniforms(np, stream_key(1, 2, 3), np.arange(100000), 2, open_below=True)
    assert 0.0 < closed.min() and closed.max() <= 1.0
    np.testing.assert_allclose(closed - u, 2.0**-53, rtol=1e-6, atol=0)


def test_the_keys_are_those_of_the_md_streams():
    for seed, stream, step in ((0, 1, 0), (7, 2, 12345), (2**40, 3, 1)):
        assert stream_key(seed, stream, step) == md_setup.stream_key(seed, stream, step)


def test_a_count_below_one_is_refused():
    with pytest.raises(ConfigError, match="count must be >= 1; got 0"):
        uniforms(np, 1, np.arange(3), 0)
