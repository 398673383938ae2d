"""The one-pass Numba kernel of :mod:`hpcgpu.exact_sums`: float64 bits into exponent bins.

Each float64 ``x`` with biased exponent ``e`` (bits 52-62) and fraction
``f`` is exactly ``sign * m * 2**(max(e, 1) - 1075)`` with the integer
significand ``m = f + 2**52`` (``m = f`` for subnormals, ``e == 0``).
The kernel adds ``sign * (m >> 26)`` into ``high[e]`` and
``sign * (m & (2**26 - 1))`` into ``low[e]``: both halves are integers
below ``2**27``, so a bin stays an exact float64 integer while it receives
fewer than ``2**26`` elements (the caller chunks longer inputs). NaN and
infinities (``e == 2047``) are counted apart, in ``specials``.

The bins equal, bin for bin, those of the array-module path
(:func:`hpcgpu.exact_sums.exponent_bins`), which the tests check. This
module imports Numba; :mod:`hpcgpu.exact_sums` imports it only when Numba
is installed.
"""

import numpy as np
from numba import njit

from hpcgpu import _jit_cache

_jit_cache.install()  # before the cached function below is defined

__all__ = ["add_exponent_bins", "add_to_int_bins", "COPIES"]

_FRACTION = np.int64((1 << 52) - 1)
_LOW = np.int64((1 << 26) - 1)
COPIES = 4
"""Independent bin sets per exponent: runs of equal exponents would otherwise chain every add on one bin."""


@njit(cache=True, nogil=True)
def _add_groups(bits, groups, highs, lows, specials):
    """Bins the first ``groups * COPIES`` values, value ``i`` into copy ``i % COPIES``."""
    for i in range(0, groups * COPIES, COPIES):
        for copy in range(COPIES):
            b = bits[i + copy]
            exponent = (b >> 52) & 0x7FF
            if exponent == 0x7FF:
                if b & _FRACTION:
                    specials[0] += 1
                elif b < 0:
                    specials[2] += 1
                else:
                    specials[1] += 1
                continue
            significand = (b & _FRACTION) | (np.int64(exponent != 0) << 52)
            sign = b >> 63  # 0 or -1: (x ^ sign) - sign negates x where the value is negative
            highs[exponent, copy] += ((significand >> 26) ^ sign) - sign
            lows[exponent, copy] += ((significand & _LOW) ^ sign) - sign


@njit(cache=True, nogil=True)
def add_exponent_bins(bits, high, low, specials):
    """Add the float64 values whose bits are ``bits`` into the exponent bins, in one pass.

    Parameters
    ----------
    bits : numpy.ndarray of int64, 1-D
        The values' bit patterns (``values.view(np.int64)``), fewer than
        ``2**26`` of them (so that every bin stays exact).
    high, low : numpy.ndarray of float64, shape (2048,)
        Bins indexed by the biased exponent, added into (start from zeros).
    specials : numpy.ndarray of int64, shape (3,)
        Counts of NaN, +inf and -inf, added into.

    Examples
    --------
    >>> import numpy as np
    >>> high, low, specials = np.zeros(2048), np.zeros(2048), np.zeros(3, np.int64)
    >>> add_exponent_bins(np.array([1.5, -1.0, np.inf]).view(np.int64), high, low, specials)
    >>> float(high[1023]), float(low[1023]), specials.tolist()
    (33554432.0, 0.0, [0, 1, 0])
    """
    # int64 copies, one per element of a group of COPIES: a run of equal exponents
    # (data of one magnitude) would otherwise chain every add through one bin
    highs = np.zeros((2048, COPIES), np.int64)
    lows = np.zeros((2048, COPIES), np.int64)
    add_to_int_bins(bits, highs, lows, specials)
    for e in range(2048):
        for copy in range(COPIES):
            high[e] += highs[e, copy]
            low[e] += lows[e, copy]


@njit(cache=True, nogil=True)
def add_to_int_bins(bits, highs, lows, specials):
    """Add float64 values, given by their bits, into integer exponent bins (for kernels that sum as they go).

    The bins of :func:`add_exponent_bins` before they are folded to
    float64: ``highs[e, c]`` and ``lows[e, c]`` (int64) receive the halves
    of the values ``c, c + COPIES, ...``. Every half is below ``2**27``, so
    int64 bins stay exact for fewer than ``2**36`` values in all, over any
    number of calls: a fused kernel bins one row at a time into the same
    bins and folds them once (:func:`hpcgpu.exact_sums.exact_partial_from_bins`).

    Parameters
    ----------
    bits : numpy.ndarray of int64, 1-D
        The values' bit patterns (``values.view(np.int64)``).
    highs, lows : numpy.ndarray of int64, shape (2048, COPIES)
        Added into (start from zeros).
    specials : numpy.ndarray of int64, shape (3,)
        Counts of NaN, +inf and -inf, added into.

    Examples
    --------
    >>> import numpy as np
    >>> highs, lows = np.zeros((2048, COPIES), np.int64), np.zeros((2048, COPIES), np.int64)
    >>> specials = np.zeros(3, np.int64)
    >>> add_to_int_bins(np.array([1.5, -1.0, np.nan]).view(np.int64), highs, lows, specials)
    >>> int(highs[1023].sum()), int(lows[1023].sum()), specials.tolist()
    (33554432, 0, [1, 0, 0])
    """
    n = bits.shape[0]
    whole = n // COPIES
    _add_groups(bits, whole, highs, lows, specials)
    # the last values padded with +0.0 (bits 0: exponent 0, significand 0) to one whole group
    tail = np.zeros(COPIES, np.int64)
    tail[:n - whole * COPIES] = bits[whole * COPIES:]
    _add_groups(tail, 1, highs, lows, specials)
