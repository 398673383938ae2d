"""Counter-based random numbers: pure functions of (key, id, slot), uniform, and MD's stream family."""

import numpy as np
import pytest
from scipy import stats

from hpcgpu.errors import ConfigError
from hpcgpu.random_streams import counter_bits, stream_key, uniforms
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


def test_the_keys_and_bits_are_pinned():
    # Every MD and astro start is made from these numbers: a change here changes every run's results.
    keys = {(0, 1, 0): 0x44E5B98100C67FB0, (7, 2, 12345): 0xD24A09DB20DAFC45, (2**40, 3, 1): 0xDFA035932C8F6E97}
    for (seed, stream, step), key in keys.items():
        assert stream_key(seed, stream, step) == key
    bits = counter_bits(keys[7, 2, 12345], np.arange(1, 4, dtype=np.uint64))
    assert [int(b) for b in bits] == [0xD1AEE17F4CA29769, 0x2A4007D85D075E8F, 0xC0F0BEDCFDEF9E62]


def test_md_draws_its_gaussians_from_these_streams():
    assert md_setup.stream_key is stream_key
    key, ids = stream_key(5, md_setup.STREAM_LANGEVIN, 3), np.array([4, 0, 11])
    u1 = (counter_bits(key, ids.astype(np.uint64) * np.uint64(4) + np.uint64(1)) >> np.uint64(11)) + 1.0
    angle = (counter_bits(key, ids.astype(np.uint64) * np.uint64(4) + np.uint64(2)) >> np.uint64(11)) * 2.0**-53
    first = np.sqrt(-2.0 * np.log(u1 * 2.0**-53)) * np.cos(2.0 * np.pi * angle)
    np.testing.assert_allclose(md_setup.gaussians(np, key, ids, 1)[0], first, rtol=1e-14)


def test_a_count_below_one_is_refused():
    with pytest.raises(ConfigError, match="count must be >= 1; got 0"):
        uniforms(np, 1, np.arange(3), 0)
