"""Exact partial sums: any split of an array, combined in any order, rounds to the one correctly rounded total.

The reference is independent of the code under test: the exact sum as a
:class:`fractions.Fraction`, rounded to float64 by integer arithmetic
here (round half to even, subnormals, overflow), and :func:`math.fsum`
wherever it returns.
"""

import math
import os
import pickle
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcgpu import exact_sums
from hpcgpu.errors import ConfigError
from hpcgpu.exact_sums import ExactPartial, exact_partial, exponent_bins, exponent_bins_numba

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=os.environ.get("HPCGPU_HYPOTHESIS_EXPLORE", "0") in ("", "0"))
METHODS = ["numba", "array"]
LARGEST = np.finfo(np.float64).max


def correctly_rounded(values):
    """The float64 nearest the exact sum of the finite ``values`` (ties to even), by integer arithmetic."""
    exact = sum((Fraction(v) for v in values), Fraction(0))
    if exact == 0:
        return 0.0
    size = abs(exact)
    exponent = size.numerator.bit_length() - size.denominator.bit_length()  # 2**exponent <= size < 2**(exponent+2)
    if Fraction(2) ** exponent > size:
        exponent -= 1
    quantum = max(exponent - 52, -1074)  # the spacing of float64 near the sum (subnormals: 2**-1074)
    scaled = size / Fraction(2) ** quantum
    whole, rest = divmod(scaled.numerator, scaled.denominator)
    if 2 * rest > scaled.denominator or (2 * rest == scaled.denominator and whole % 2):
        whole += 1
    sign = 1.0 if exact > 0 else -1.0
    try:
        return sign * math.ldexp(whole, quantum)
    except OverflowError:
        return sign * math.inf


def same(a, b):
    """Bitwise equal floats (NaN equals NaN; 0.0 and -0.0 differ)."""
    return np.float64(a).tobytes() == np.float64(b).tobytes() or (math.isnan(a) and math.isnan(b))


# Floats of every magnitude: subnormals, around 1, near the float64 maximum, both signs.
wide_floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.builds(lambda m, e: math.ldexp(m, e), st.floats(-1.0, 1.0), st.integers(-1080, 1024)).filter(math.isfinite),
    st.builds(lambda m, e: math.ldexp(m, e), st.integers(-(1 << 53), 1 << 53), st.integers(-1074, -1000)),
    st.sampled_from([0.0, -0.0, 5e-324, -5e-324, LARGEST, -LARGEST, 1e16, -1e16, 1.0, 0.1]),
)


@st.composite
def splits(draw, elements=wide_floats, max_size=60):
    """An array, the cut points of its pieces, and a random order and grouping to combine them in."""
    values = draw(st.lists(elements, max_size=max_size))
    cuts = sorted(draw(st.lists(st.integers(0, len(values)), max_size=6)))
    bounds = list(zip([0] + cuts, cuts + [len(values)]))
    order = draw(st.permutations(range(len(bounds))))
    pairs = draw(st.lists(st.integers(0, 1000), min_size=len(bounds), max_size=len(bounds)))
    return np.array(values, dtype=np.float64), bounds, order, pairs


def combine(parts, order, pairs):
    """Add the partials in ``order``, joining random neighbours (a random tree, as a reduction would)."""
    pool = [parts[i] for i in order]
    for pick in pairs:
        if len(pool) == 1:
            break
        i = pick % (len(pool) - 1)
        pool[i:i + 2] = [pool[i] + pool[i + 1]]
    return pool[0] if pool else ExactPartial()


@SETTINGS
@given(case=splits(), method=st.sampled_from(METHODS))
def test_any_split_combined_in_any_order_is_the_correctly_rounded_sum(case, method):
    values, bounds, order, pairs = case
    parts = [exact_partial(values[a:b], method=method) for a, b in bounds]
    total = float(combine(parts, order, pairs))
    assert same(total, correctly_rounded(values.tolist()))
    assert same(float(sum(parts)), total)
    assert (sum(parts)).count == values.size
    try:
        reference = math.fsum(values.tolist())
    except OverflowError:  # fsum's intermediate overflow: it depends on the order, the exact sum does not
        return
    assert same(total, reference)


@SETTINGS
@given(case=splits(st.floats(-1e-300, 1e-300).map(lambda x: x * 2.0 ** -30), max_size=40))
def test_subnormal_and_tiny_terms_are_exact(case):
    values, bounds, order, pairs = case
    total = float(combine([exact_partial(values[a:b]) for a, b in bounds], order, pairs))
    assert same(total, math.fsum(values.tolist()))


@SETTINGS
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=40))
def test_the_numba_kernel_and_the_array_path_agree_bin_for_bin(values):
    values = np.array(values, dtype=np.float64)
    for by_numba, by_array in zip(exponent_bins_numba(values), exponent_bins(np, values)):
        np.testing.assert_array_equal(by_numba, by_array)
    assert exact_partial(values, method="numba") == exact_partial(values, method="array")


def test_the_bins_hold_the_halves_of_the_significand_by_biased_exponent():
    high, low, specials = exponent_bins(np, np.array([1.0 + 2.0 ** -52, -3.0, 5e-324, np.nan, -np.inf]))
    assert high[1023] == 1 << 26 and low[1023] == 1  # 2**52 + 1 = 2**26 * 2**26 + 1
    assert high[1024] == -(3 << 25) and low[1024] == 0
    assert high[0] == 0 and low[0] == 1  # the smallest subnormal: significand 1, exponent 0
    assert specials.tolist() == [1, 0, 1]
    assert np.count_nonzero(high) + np.count_nonzero(low) == 4


@pytest.mark.parametrize("method", METHODS)
def test_large_random_arrays_split_like_a_process_grid(method, rng):
    values = rng.standard_normal((96, 80)) * 10.0 ** rng.integers(-20, 20, (96, 80))
    whole = float(exact_partial(values, method=method))
    assert same(whole, math.fsum(values.ravel().tolist()))
    for px, py in [(1, 1), (2, 1), (3, 2), (2, 4), (7, 5)]:
        blocks = [exact_partial(rows[:, cols], method=method)
                  for rows in np.array_split(values, px, axis=0)
                  for cols in [slice(a[0], a[-1] + 1) for a in np.array_split(np.arange(80), py)]]
        assert same(float(sum(blocks[::-1])), whole)
    bricks = values.reshape(12, 8, 80)
    pieces = [exact_partial(bricks[i:i + 5, j:j + 3, k:k + 17], method=method)
              for i in range(0, 12, 5) for j in range(0, 8, 3) for k in range(0, 80, 17)]
    assert same(float(sum(pieces)), whole)


@pytest.mark.parametrize("method", METHODS)
def test_inputs_longer_than_a_chunk_go_in_chunks(method, rng, monkeypatch):
    # one value repeated: every element in one bin, which a single pass over 2**26 of them would overflow
    values = np.concatenate([np.full(1000, 1.0 - 2.0 ** -53), rng.standard_normal(37)])
    expected = exact_partial(values, method=method)
    monkeypatch.setattr(exact_sums, "CHUNK_ELEMENTS", 7)
    assert exact_partial(values, method=method) == expected
    assert same(float(expected), math.fsum(values.tolist()))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("values, expected", [
    ([1.0, np.nan, 2.0], math.nan),
    ([np.inf, 1.0, 1e308, 1e308], math.inf),
    ([-np.inf, -1.0], -math.inf),
    ([np.inf, -np.inf], math.nan),
    ([np.nan, np.inf], math.nan),
])
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_nan_and_infinities_give_what_numpy_sum_gives(method, values, expected):
    total = float(exact_partial(np.array(values), method=method))
    assert same(total, expected)
    assert same(total, float(np.sum(values)))


def test_infinities_of_both_signs_in_different_pieces_give_nan():
    assert math.isnan(float(exact_partial([np.inf, 2.0]) + exact_partial([1.0, -np.inf])))
    assert float(exact_partial([np.inf]) + exact_partial([np.finfo(float).max] * 3)) == math.inf
    assert math.isnan(float(exact_partial([3.0]) + exact_partial([np.nan])))


def test_a_finite_sum_past_the_float64_range_rounds_to_infinity_and_may_come_back():
    big = exact_partial([LARGEST, LARGEST])
    assert float(big) == math.inf and float(exact_partial([-LARGEST] * 2)) == -math.inf
    assert float(big + exact_partial([-LARGEST])) == LARGEST  # fsum([max, max, -max]) raises OverflowError
    ulp = LARGEST - np.nextafter(LARGEST, 0)
    assert float(exact_partial([LARGEST, ulp / 2])) == math.inf  # the halfway point rounds to even: 2**1024
    assert float(exact_partial([LARGEST, ulp / 2, -5e-324])) == LARGEST


def test_zeros_and_empty_inputs_sum_to_positive_zero():
    for values in ([], [0.0], [-0.0, -0.0], [1.0, -1.0], np.zeros((0, 3))):
        partial = exact_partial(values)
        assert same(float(partial), 0.0) and same(float(partial), math.fsum(np.ravel(values).tolist()))
    assert exact_partial([]).count == 0 and float(sum([exact_partial([]), exact_partial([])])) == 0.0
    assert 0 + exact_partial([2.5]) == exact_partial([2.5])


@pytest.mark.parametrize("dtype", ["float16", "float32", "int8", "int32", "uint16", "bool"])
def test_narrow_dtypes_are_converted_exactly(dtype, rng):
    values = (rng.standard_normal(500) * 1000).astype(dtype)
    assert same(float(exact_partial(values)), math.fsum(values.astype(np.float64).tolist()))


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_64_bit_integers_beyond_2_53_are_summed_exactly(dtype):
    info = np.iinfo(dtype)
    values = np.array([info.max, info.max - 1, 12345, info.min + 7, 3], dtype=dtype)
    exact = sum(int(v) for v in values)
    assert exact_partial(values).units == exact << 1074
    assert float(exact_partial(values)) == float(exact)
    assert float(exact_partial(values[:2]) + exact_partial(values[2:])) == float(exact)
    assert exact_partial(values).count == 5


def test_any_shape_and_memory_layout_sums_all_elements(rng):
    values = rng.standard_normal((6, 7, 8))
    expected = exact_partial(values.ravel())
    assert exact_partial(values) == expected
    assert exact_partial(np.asfortranarray(values)) == expected
    assert exact_partial(values[:, ::2]) == exact_partial(values[:, ::2].copy().ravel())
    assert exact_partial(values.tolist()) == expected


def test_a_partial_pickles_small_and_round_trips(rng):
    partial = exact_partial(rng.standard_normal(10000) * 10.0 ** rng.integers(-300, 300, 10000))
    partial = partial + exact_partial([np.inf, np.nan])
    data = pickle.dumps(partial)
    assert pickle.loads(data) == partial and len(data) < 1000
    assert math.isnan(float(pickle.loads(data)))


@pytest.mark.parametrize("bad, match", [
    (np.array([1 + 2j]), "dtype complex128"),
    (np.array([1.0], dtype=np.longdouble), "dtype float128"),
    (np.array(["1.0"]), "dtype <U3"),
])
def test_values_float64_cannot_hold_are_refused(bad, match):
    if bad.dtype == np.longdouble and np.finfo(np.longdouble).nmant == 52:
        pytest.skip("longdouble is float64 here")
    with pytest.raises(ConfigError, match=match):
        exact_partial(bad)


def test_a_bad_method_or_operand_is_refused():
    with pytest.raises(ConfigError, match="method must be one of auto, numba, array; got 'fast'"):
        exact_partial([1.0], method="fast")
    with pytest.raises(TypeError):
        exact_partial([1.0]) + 1.0
    with pytest.raises(TypeError):
        1 + exact_partial([1.0])


def test_the_module_imports_no_workload_no_cupy_and_no_numba():
    code = ("import sys; import hpcgpu.exact_sums; "
            "bad = [m for m in sys.modules if m.startswith(('hpcgpu.workloads', 'cupy', 'numba'))]; "
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_narrow_floats_are_widened_from_their_bits_with_subnormals_signs_and_specials(rng, dtype):
    from hpcgpu.exact_sums import _widened_on_device

    with np.errstate(over="ignore"):
        narrow = (rng.standard_normal(20000) * 10.0 ** rng.integers(-50, 40, 20000)).astype(dtype)
    narrow[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.finfo(dtype).smallest_subnormal]
    assert ((narrow != 0) & (np.abs(narrow) < np.finfo(dtype).tiny)).sum() > 100  # subnormals are there
    wide = _widened_on_device(np, narrow)
    assert wide.dtype == np.float64
    np.testing.assert_array_equal(wide, narrow.astype(np.float64))
    assert np.signbit(wide).tolist() == np.signbit(narrow).tolist()


@pytest.mark.gpu
def test_cupy_arrays_are_binned_on_the_device_and_agree_with_the_host(rng):
    from _support import usable_backend

    cupy = usable_backend("cupy").xp
    values = rng.standard_normal(100003) * 10.0 ** rng.integers(-300, 300, 100003)
    values[[5, 17]] = [np.inf, -3e-320]
    device = cupy.asarray(values)
    for by_device, by_host in zip(exponent_bins(cupy, device), exponent_bins_numba(values)):
        np.testing.assert_array_equal(by_device, by_host)
    assert exact_partial(device) == exact_partial(values)
    # float32 (subnormals included) binned on the device: cast on the host, where the cast is IEEE's
    singles = values[:500].astype(np.float32)
    assert exact_partial(cupy.asarray(singles)) == exact_partial(singles)
    with pytest.raises(ConfigError, match="method='numba' cannot sum these values"):
        exact_partial(device, method="numba")


@SETTINGS
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=40),
       pieces=st.integers(1, 5))
def test_integer_bins_filled_piece_by_piece_fold_to_the_partial_of_all_the_values(values, pieces):
    # a fused kernel bins row after row into the same integer bins and folds them once
    from hpcgpu.exact_bins_numba import COPIES, add_to_int_bins
    from hpcgpu.exact_sums import exact_partial_from_bins

    values = np.array(values, dtype=np.float64)
    highs, lows = np.zeros((2048, COPIES), np.int64), np.zeros((2048, COPIES), np.int64)
    specials = np.zeros(3, np.int64)
    for piece in np.array_split(values, pieces):
        add_to_int_bins(np.ascontiguousarray(piece).view(np.int64), highs, lows, specials)
    high, low, array_specials = exponent_bins(np, values)
    np.testing.assert_array_equal(highs.sum(axis=1), high)
    np.testing.assert_array_equal(lows.sum(axis=1), low)
    np.testing.assert_array_equal(specials, array_specials)
    assert exact_partial_from_bins(highs, lows, specials, values.size) == exact_partial(values, method="array")


def test_folding_integer_bin_copies_does_not_overflow_int64():
    from hpcgpu.exact_sums import exact_partial_from_bins

    big = np.iinfo(np.int64).max
    highs = np.zeros((2048, 4), np.int64)
    highs[1023] = big  # four copies whose int64 sum would wrap around
    lows = np.zeros_like(highs)
    lows[0, :2] = -big
    partial = exact_partial_from_bins(highs, lows, [0, 0, 0], 7)
    assert partial.units == (4 * big << 26 << 1022) - 2 * big and partial.count == 7
    # float bins of one copy, as exponent_bins gives them, fold as they did
    high, low, specials = exponent_bins(np, np.array([0.1, -2.5, 3e-310]))
    assert exact_partial_from_bins(high, low, specials, 3) == exact_partial([0.1, -2.5, 3e-310])
