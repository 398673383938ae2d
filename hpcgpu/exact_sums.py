"""Exact partial sums: pieces of an array that add up to the correctly rounded sum of all of it.

A partitioned run must report the diagnostics of a one-process run
bitwise, whatever its process grid. A rounded sum per block cannot: the
rounding depends on where the blocks split (a 2-D block holds parts of
rows, a 3-D brick any set of atoms). :func:`exact_partial` turns any
piece of an array into an :class:`ExactPartial`, which holds the piece's
sum *exactly*. Partials add exactly, in any order and grouping, and
``float(partial)`` rounds once: the result is the correctly rounded sum of
every element that went in (``math.fsum`` of them all), the same for any
split into pieces.

How it works: every finite float64 is ``sign * m * 2**(max(e, 1) - 1075)``
with ``e`` its biased exponent and ``m`` an integer below ``2**53``. One
pass adds the high and low 26-bit halves of ``m`` into 2048 bins per
exponent (:func:`exponent_bins`; float64 bins, exact while a bin receives
fewer than ``2**26`` elements, so longer inputs go in chunks). The bins are
then folded into one Python integer, the sum in units of ``2**-1074`` (a
long accumulator, as Kulisch's): partials add as integers, exactly for any
number of pieces and any magnitude, pickle in a few hundred bytes, and
``float()`` is CPython's correctly rounded integer division. NaN and
infinities are counted apart and give what :func:`numpy.sum` gives.

Paths: a Numba kernel reads the bits of host arrays in one pass
(:mod:`hpcgpu.exact_bins_numba`, used when Numba is installed); otherwise,
and for CuPy arrays, the same bins come from array operations and
``bincount`` of the array's own module (only the bins travel to the host).

How a model uses it: ``block_sums`` returns ``{"energy":
exact_partial(terms), ...}`` for the block's own terms (any shape, on
host or GPU); ``combine_sums`` adds the blocks' partials, ``sum(p["energy"]
for p in parts)``, and takes ``float()`` of the total (or passes the
partials to :func:`hpcgpu.workloads.sums.exact_total`).

Examples
--------
>>> import numpy as np
>>> values = np.array([1e16, 1.0, -1e16, 0.1, 0.2])
>>> pieces = [exact_partial(values[:2]), exact_partial(values[2:4]), exact_partial(values[4:])]
>>> float(sum(pieces)), math.fsum(values), sum(values.tolist())
(1.3, 1.3, 0.30000000000000004)
"""

import math
import sys
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigError

__all__ = ["ExactPartial", "exact_partial", "exact_partial_from_bins", "exponent_bins", "exponent_bins_numba",
           "numba_available", "CHUNK_ELEMENTS", "METHODS"]

CHUNK_ELEMENTS = 1 << 26
"""Elements binned per pass: a 27-bit half times ``2**26`` terms stays below ``2**53``, exact in float64."""
METHODS = ("auto", "numba", "array")
"""``exact_partial(method=...)``: Numba's kernel, the array-module path, or the first that applies."""

_BINS = 2048
_FRACTION = (1 << 52) - 1
_LOW = (1 << 26) - 1
_UNIT = 1 << 1074  # the integer sums are in units of the smallest subnormal, 2**-1074


@dataclass(frozen=True)
class ExactPartial:
    """The exact sum of some elements: add partials with ``+`` or :func:`sum`, round once with :func:`float`.

    Build one with :func:`exact_partial`. The fields are plain integers, so
    a partial pickles small and compares with ``==``.

    Attributes
    ----------
    units : int
        The exact sum of the finite elements, in units of ``2**-1074``.
    count : int
        How many elements went in, finite or not (for means).
    nans, positive_infinities, negative_infinities : int
        How many elements were NaN, +inf and -inf.

    Examples
    --------
    >>> import numpy as np
    >>> p, q = exact_partial(np.array([0.1, 0.2])), exact_partial([0.3])
    >>> float(p + q), float(sum([p, q])), (p + q).count
    (0.6, 0.6, 3)
    >>> float(exact_partial([np.inf, 1.0]) + exact_partial([-np.inf]))
    nan
    """

    units: int = 0
    count: int = 0
    nans: int = 0
    positive_infinities: int = 0
    negative_infinities: int = 0

    def __add__(self, other):
        if not isinstance(other, ExactPartial):
            return NotImplemented
        return ExactPartial(self.units + other.units, self.count + other.count, self.nans + other.nans,
                            self.positive_infinities + other.positive_infinities,
                            self.negative_infinities + other.negative_infinities)

    def __radd__(self, other):
        # sum() starts from the integer 0
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented

    def total(self):
        """The correctly rounded sum (float) of every element that went in.

        Equal to ``math.fsum`` of all elements where that returns; an exact
        zero is ``0.0`` (as ``math.fsum`` and :func:`numpy.sum` give on
        Python 3.11). With NaN, or both infinities, NaN; with one kind of
        infinity, that infinity; a finite sum beyond the float64 range
        rounds to an infinity (where ``math.fsum`` raises
        ``OverflowError``).
        """
        if self.nans or (self.positive_infinities and self.negative_infinities):
            return math.nan
        if self.positive_infinities:
            return math.inf
        if self.negative_infinities:
            return -math.inf
        try:
            return self.units / _UNIT  # CPython divides integers with one correct rounding
        except OverflowError:
            return math.inf if self.units > 0 else -math.inf

    def __float__(self):
        return self.total()

    def __repr__(self):
        return f"ExactPartial(total={self.total()!r}, count={self.count})"


def exact_partial(values, *, method="auto"):
    """The exact sum of all elements of ``values`` as an :class:`ExactPartial`.

    Parameters
    ----------
    values : array_like or cupy.ndarray
        Any shape (all elements count). Floating (float16/32/64), integer or
        bool; converted to float64 exactly (integers beyond ``2**53`` are
        summed exactly too). CuPy arrays are binned on their device.
    method : {"auto", "numba", "array"}
        ``"numba"``: the one-pass kernel (host arrays, Numba installed);
        ``"array"``: array operations and ``bincount`` of the array's module;
        ``"auto"``: Numba for host arrays when installed, else the array path.

    Returns
    -------
    ExactPartial

    Raises
    ------
    ConfigError
        An unknown ``method``; ``"numba"`` without Numba or for a CuPy
        array; a dtype that float64 cannot hold exactly (complex,
        longdouble, object, ...).

    Examples
    --------
    >>> import numpy as np
    >>> grid = np.array([[1e16, 1.0], [-1e16, 1.0]])
    >>> float(exact_partial(grid[:, 0]) + exact_partial(grid[:, 1])), float(np.sum(grid))
    (2.0, 1.0)
    """
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    xp = _array_module(values)
    values = xp.asarray(values)
    if method == "numba" and (xp is not np or not numba_available()):
        reason = "a CuPy array" if xp is not np else "Numba is not installed"
        raise ConfigError(f"method='numba' cannot sum these values ({reason}); use method='array' or 'auto'")
    kind = values.dtype.kind
    if kind in "iu" and values.dtype.itemsize == 8 and values.size:
        return _exact_partial_of_64_bit_integers(xp, values, method)
    if kind == "f" and values.dtype.itemsize < 8 and xp is not np:
        values = _widened_on_device(xp, values.ravel())
    elif kind in "biu" or (kind == "f" and values.dtype.itemsize <= 8):
        values = xp.ascontiguousarray(values.astype(np.float64, copy=False).ravel())
    else:
        raise ConfigError(f"values must be float16/32/64, integer or bool; got dtype {values.dtype} "
                          "(float64 cannot hold it exactly)")
    use_numba = xp is np and method != "array" and numba_available()
    units, specials = 0, np.zeros(3, np.int64)
    for start in range(0, values.size, CHUNK_ELEMENTS):
        chunk = values[start:start + CHUNK_ELEMENTS]
        high, low, chunk_specials = exponent_bins_numba(chunk) if use_numba else exponent_bins(xp, chunk)
        units += _bins_to_units(high, low)
        specials += chunk_specials
    nans, positive, negative = (int(c) for c in specials)
    return ExactPartial(units, int(values.size), nans, positive, negative)


def exact_partial_from_bins(high, low, specials, count):
    """The :class:`ExactPartial` that exponent bins hold: for kernels that bin values as they compute them.

    Parameters
    ----------
    high, low : array_like of integers or integral floats, shape (2048,) or (2048, copies)
        Per biased exponent ``e`` (first axis), the exact sums of ``sign *
        (m >> 26)`` and ``sign * (m & (2**26 - 1))`` (``m`` the integer
        significand), as :func:`exponent_bins` and
        :func:`hpcgpu.exact_bins_numba.add_to_int_bins` make them; copies
        along a second axis are added.
    specials : array_like of int, shape (3,)
        The counts of NaN, +inf and -inf.
    count : int
        How many elements went in, finite or not.

    Returns
    -------
    ExactPartial

    Examples
    --------
    >>> import numpy as np
    >>> high, low, specials = exponent_bins(np, np.array([0.1, 0.2, -np.inf]))
    >>> p = exact_partial_from_bins(high, low, specials, 3)
    >>> p == exact_partial([0.1, 0.2, -np.inf]), float(exact_partial_from_bins(high, low, [0, 0, 0], 2))
    (True, 0.30000000000000004)
    """
    nans, positive, negative = (int(c) for c in specials)
    return ExactPartial(_bins_to_units(np.asarray(high), np.asarray(low)), int(count), nans, positive, negative)


# (integer view, fraction bits, exponent bits, smallest subnormal) of the narrow floats
_NARROW = {2: (np.int16, 10, 5, 2.0 ** -24), 4: (np.int32, 23, 8, 2.0 ** -149)}


def _widened_on_device(xp, values):
    """float16/32 ``values`` (a device array) as float64, subnormals kept exactly.

    CuPy's casts flush float32 subnormals to zero (measured on an H100: a
    float32 subnormal widened by ``astype`` came out 0.0), so they are
    rebuilt from their bits: ``fraction * 2**-149`` is exact in float64.

    Examples
    --------
    >>> import numpy as np
    >>> tiny = np.array([1e-45, -3e-39, 1.5], dtype=np.float32)
    >>> bool((_widened_on_device(np, tiny) == tiny.astype(np.float64)).all())
    True
    """
    integer, fraction_bits, exponent_bits, smallest = _NARROW[values.dtype.itemsize]
    bits = xp.ascontiguousarray(values).view(integer).astype(xp.int64)
    wide = values.astype(np.float64)
    subnormal = ((bits >> fraction_bits) & ((1 << exponent_bits) - 1)) == 0
    fraction = (bits & ((1 << fraction_bits) - 1)).astype(np.float64) * smallest
    rebuilt = xp.where(bits < 0, -fraction, fraction)
    return xp.ascontiguousarray(xp.where(subnormal, rebuilt, wide))


def exponent_bins(xp, values):
    """The exponent bins of float64 ``values`` by array operations of the module ``xp`` (NumPy or CuPy).

    Parameters
    ----------
    xp : module
        The array module of ``values`` (``numpy`` or ``cupy``).
    values : array of float64, 1-D, contiguous
        Fewer than :data:`CHUNK_ELEMENTS` of them.

    Returns
    -------
    high, low : numpy.ndarray of float64, shape (2048,)
        Per biased exponent ``e``, the exact sums of ``sign * (m >> 26)`` and
        ``sign * (m & (2**26 - 1))`` over the finite values (``m`` the
        integer significand); host arrays.
    specials : numpy.ndarray of int64, shape (3,)
        The counts of NaN, +inf and -inf.

    Examples
    --------
    >>> import numpy as np
    >>> high, low, specials = exponent_bins(np, np.array([1.5, -1.0, np.nan]))
    >>> float(high[1023]), float(low[1023]), specials.tolist()
    (33554432.0, 0.0, [1, 0, 0])
    """
    bits = values.view(xp.int64)
    exponent = (bits >> 52) & 0x7FF
    significand = bits & _FRACTION
    significand |= (exponent != 0).astype(xp.int64) << 52  # the implicit bit of normal numbers
    # the sign of each value on its halves (copysign: one pass, where a compare and a select take two)
    high = xp.copysign((significand >> 26).astype(xp.float64), values)
    significand &= _LOW
    low = xp.copysign(significand.astype(xp.float64), values)
    special = exponent == 0x7FF
    specials = np.zeros(3, np.int64)
    if bool(special.any()):  # NaN and infinities are rare: count them apart, out of the bins
        odd = values[special]
        counts = xp.stack([xp.isnan(odd).sum(), (odd == xp.inf).sum(), (odd == -xp.inf).sum()])
        specials[:] = _to_host(counts)
        high[special] = 0.0
        low[special] = 0.0
    bins = xp.stack([xp.bincount(exponent, weights=high, minlength=_BINS),
                     xp.bincount(exponent, weights=low, minlength=_BINS)])
    bins = np.asarray(_to_host(bins), dtype=np.float64)
    return bins[0], bins[1], specials


def exponent_bins_numba(values):
    """The bins of :func:`exponent_bins` for a host float64 array, by the one-pass Numba kernel.

    Parameters
    ----------
    values : numpy.ndarray of float64, 1-D, contiguous
        Fewer than :data:`CHUNK_ELEMENTS` of them.

    Returns
    -------
    high, low, specials : numpy.ndarray
        As :func:`exponent_bins`.

    Examples
    --------
    >>> import numpy as np
    >>> high, low, specials = exponent_bins_numba(np.array([1.5, -1.0, -np.inf]))
    >>> float(high[1023]), specials.tolist()
    (33554432.0, [0, 0, 1])
    """
    from hpcgpu.exact_bins_numba import add_exponent_bins

    high, low, specials = np.zeros(_BINS), np.zeros(_BINS), np.zeros(3, np.int64)
    add_exponent_bins(np.ascontiguousarray(values, dtype=np.float64).view(np.int64), high, low, specials)
    return high, low, specials


def numba_available():
    """Whether Numba is installed (the fast host path of :func:`exact_partial`).

    Examples
    --------
    >>> isinstance(numba_available(), bool)
    True
    """
    from hpcgpu import _gpu_probe

    return _gpu_probe.module_installed("numba")


def _bins_to_units(high, low):
    """The exact sum the bins hold, in units of ``2**-1074`` (a Python integer); copies along axis 1 add."""
    if high.ndim == 1:
        high, low = high[:, None], low[:, None]
    used = np.flatnonzero(((high != 0) | (low != 0)).any(axis=1))
    units = 0
    # bin e weighs 2**(max(e, 1) - 1075), i.e. 2**(max(e, 1) - 1) units; its high half 2**26 times more
    # (Python integers: int64 copies could overflow when added in int64)
    for exponent, uppers, lowers in zip(used.tolist(), high[used].tolist(), low[used].tolist()):
        upper, lower = sum(int(x) for x in uppers), sum(int(x) for x in lowers)
        units += ((upper << 26) + lower) << (max(exponent, 1) - 1)
    return units


def _exact_partial_of_64_bit_integers(xp, values, method):
    """64-bit integers, exactly: each is ``high * 2**32 + low`` with both halves exact in float64."""
    values = values.ravel()
    high = _exact_partial_units(xp, values >> 32, method)
    low = _exact_partial_units(xp, values & 0xFFFFFFFF, method)
    return ExactPartial((high << 32) + low, int(values.size))


def _exact_partial_units(xp, values, method):
    return exact_partial(values.astype(np.float64), method=method).units


def _array_module(values):
    """``cupy`` for a CuPy array (imported only then), else ``numpy``."""
    if type(values).__module__.split(".")[0] == "cupy":
        return sys.modules["cupy"]
    return np


def _to_host(array):
    """A CuPy array's values on the host; NumPy arrays as they are."""
    return array.get() if hasattr(array, "get") else array
