"""CSR products of banded matrices without reading the column indices: runs of rows that share their diagonals.

A 5-point Poisson matrix stores, per row, 5 values (4 bytes each in
float32) and 5 column indices (4 bytes each) and reads one ``indptr``
entry: the indices are nearly half the bytes a CSR product moves, and the
row loop of variable length (5 here, 3 or 4 at an edge) keeps LLVM from
vectorising it. Most rows of a banded matrix, though, hold exactly the
same diagonals: row ``i`` stores columns ``i + offsets[0], i + offsets[1],
...`` in that order (any order, the same in every row of a run). For a run of such rows the values are the CSR
``data`` itself, ``len(offsets)`` per row back to back, and the columns are
known without reading ``indices``, so

    y[i] = sum over d of data[p + n_d (i - s) + d] * x[i + offsets[d]]

runs as a vector loop over rows that reads ``data``, ``x`` and writes
``y``: 28 of the 52 bytes per row of the CSR product at 2048^2 in float32.

:func:`band_structure` finds the diagonals (the pattern most frequent among :data:`SAMPLED_ROWS` rows) and
the runs of rows that store exactly them, in increasing column order, once
per matrix (one pass over ``indices``; remembered for the same index
arrays); :func:`spmv_banded` runs those runs by the loop above and every
other row (edges, rows with other entries) by the CSR loop. Each row's sum
is formed in the same order with the same fused multiply-adds as the CSR
loop's, so the result is bitwise the same (tested). Five diagonals (the
2-D 5-point stencil) have their own unrolled loop; other counts, up to
:data:`MAX_BANDS`, a loop over the diagonals per row, which still reads no
indices but does not vectorise.

Values may change between products (the loop reads ``data``); the
structure (``indices``, ``indptr``) must not, as for the checks
:class:`~hpcgpu.kernels.matrix.CSRMatrix` makes once on construction.
"""

import threading
import weakref
from typing import NamedTuple

import numpy as np
from numba import njit, prange

__all__ = ["MAX_BANDS", "MIN_COVERED", "BandStructure", "band_structure", "spmv_banded"]

MAX_BANDS = 16
"""Most diagonals a banded run may have (a wider row is left to the CSR loop)."""

MIN_COVERED = 0.5
"""Fraction of the rows that runs must cover for :func:`band_structure` to return one."""


class BandStructure(NamedTuple):
    """The diagonals of a banded CSR matrix and the runs of rows that store exactly them."""

    offsets: np.ndarray
    """Column minus row of each diagonal, in the order the rows store them (int64, distinct)."""
    run_starts: np.ndarray
    """First row of each run (int64, increasing)."""
    run_stops: np.ndarray
    """One past the last row of each run (int64)."""
    covered_rows: int
    """Rows in runs."""


@njit(cache=True, nogil=True)
def _runs_of_rows(indices, indptr, offsets):
    """Runs of consecutive rows whose entries are exactly ``i + offsets``, in that order."""
    n_rows = indptr.shape[0] - 1
    bands = offsets.shape[0]
    starts = np.empty(n_rows // 2 + 1, np.int64)
    stops = np.empty(n_rows // 2 + 1, np.int64)
    runs = 0
    inside = False
    for i in range(n_rows):
        p = indptr[i]
        full = indptr[i + 1] - p == bands
        if full:
            for d in range(bands):
                if indices[p + d] - i != offsets[d]:
                    full = False
                    break
        if full and not inside:
            if runs == starts.shape[0]:  # many short runs: grow
                starts = np.concatenate((starts, np.empty_like(starts)))
                stops = np.concatenate((stops, np.empty_like(stops)))
            starts[runs] = i
            inside = True
        elif not full and inside:
            stops[runs] = i
            runs += 1
            inside = False
    if inside:
        stops[runs] = n_rows
        runs += 1
    return starts[:runs].copy(), stops[:runs].copy()


_lock = threading.Lock()
_known = {}  # (id(indices), id(indptr)) -> (weakref, weakref, structure or None)


def band_structure(indices, indptr):
    """The :class:`BandStructure` of the CSR arrays, or None when runs cover under :data:`MIN_COVERED`.

    Found once per pair of index arrays (remembered while they live).

    Examples
    --------
    >>> import numpy as np
    >>> indices = np.array([0, 1, 0, 1, 2, 1, 2, 3, 2, 3], np.int32)   # tridiagonal 4 x 4
    >>> indptr = np.array([0, 2, 5, 8, 10], np.int32)
    >>> s = band_structure(indices, indptr)
    >>> s.offsets.tolist(), s.run_starts.tolist(), s.run_stops.tolist()
    ([-1, 0, 1], [1], [3])
    """
    key = (id(indices), id(indptr))
    with _lock:
        known = _known.get(key)
        if known is not None and known[0]() is indices and known[1]() is indptr:
            return known[2]
    structure = _find_structure(indices, indptr)
    try:
        entry = (weakref.ref(indices), weakref.ref(indptr), structure)
    except TypeError:  # views of foreign buffers may not take weak references: do not remember
        return structure
    with _lock:
        for stale in [k for k, (a, b, _) in _known.items() if a() is None or b() is None]:
            del _known[stale]
        _known[key] = entry
    return structure


SAMPLED_ROWS = 63
"""Rows, spread evenly, whose diagonals are the candidates: the most frequent pattern is tried
(one row alone may be an edge row: the middle row of an even grid is on its left edge)."""


def _find_structure(indices, indptr):
    n_rows = indptr.shape[0] - 1
    if n_rows < 1:
        return None
    patterns = {}
    for k in range(SAMPLED_ROWS):
        row = (2 * k + 1) * n_rows // (2 * SAMPLED_ROWS)
        offsets = np.asarray(indices[indptr[row]:indptr[row + 1]], np.int64) - row
        if 0 < offsets.shape[0] <= MAX_BANDS and np.unique(offsets).shape[0] == offsets.shape[0]:
            patterns[tuple(offsets.tolist())] = patterns.get(tuple(offsets.tolist()), 0) + 1
    if not patterns:
        return None
    offsets = np.array(max(patterns, key=patterns.get), np.int64)
    starts, stops = _runs_of_rows(indices, indptr, offsets)
    covered = int((stops - starts).sum())
    if covered < MIN_COVERED * n_rows:
        return None
    return BandStructure(offsets, starts, stops, covered)


@njit(cache=True, nogil=True, fastmath={"contract"})
def _csr_rows(data, indices, indptr, x, out, first, stop, zero):
    for i in range(first, stop):
        total = zero
        for e in range(indptr[i], indptr[i + 1]):
            total += data[e] * x[indices[e]]
        out[i] = total


@njit(cache=True, nogil=True, fastmath={"contract"})
def _five_band_rows(data, p, x, out, first, stop, offsets, zero):
    # Slices from index 0 and a loop index from 0: vector loads, no wraparound checks.
    rows = stop - first
    values = data[p:p + 5 * rows]
    x0 = x[first + offsets[0]:stop + offsets[0]]
    x1 = x[first + offsets[1]:stop + offsets[1]]
    x2 = x[first + offsets[2]:stop + offsets[2]]
    x3 = x[first + offsets[3]:stop + offsets[3]]
    x4 = x[first + offsets[4]:stop + offsets[4]]
    y = out[first:stop]
    for k in range(rows):
        total = zero
        total += values[5 * k] * x0[k]
        total += values[5 * k + 1] * x1[k]
        total += values[5 * k + 2] * x2[k]
        total += values[5 * k + 3] * x3[k]
        total += values[5 * k + 4] * x4[k]
        y[k] = total


@njit(cache=True, nogil=True, fastmath={"contract"})
def _any_band_rows(data, p, x, out, first, stop, offsets, zero):
    bands = offsets.shape[0]
    for k in range(stop - first):
        i = first + k
        total = zero
        for d in range(bands):
            total += data[p + bands * k + d] * x[i + offsets[d]]
        out[i] = total


@njit(parallel=True, nogil=True, cache=True, fastmath={"contract"})
def _banded_kernel(data, indices, indptr, x, out, bounds, run_starts, run_stops, offsets, zero):
    n_runs = run_starts.shape[0]
    five = offsets.shape[0] == 5
    for chunk in prange(bounds.shape[0] - 1):
        first = bounds[chunk]
        last = bounds[chunk + 1]
        k = np.searchsorted(run_stops, first, side="right")  # the first run ending after `first`
        i = first
        while i < last:
            run_first = last
            if k < n_runs:
                run_first = min(max(run_starts[k], i), last)
            _csr_rows(data, indices, indptr, x, out, i, run_first, zero)
            if run_first >= last:
                break
            run_stop = min(run_stops[k], last)
            if five:
                _five_band_rows(data, indptr[run_first], x, out, run_first, run_stop, offsets, zero)
            else:
                _any_band_rows(data, indptr[run_first], x, out, run_first, run_stop, offsets, zero)
            i = run_stop
            k += 1
    return out


_banded_serial = njit(cache=True, nogil=True, fastmath={"contract"})(_banded_kernel.py_func)


def spmv_banded(data, indices, indptr, x, out, structure, bounds, *, parallel=True):
    """``out = A x`` with the runs of ``structure`` read as bands, the other rows as CSR.

    ``bounds``: the row chunks (int64, first 0, last the number of rows);
    with ``parallel`` the chunks go to Numba's threads.
    """
    kernel = _banded_kernel if parallel else _banded_serial
    return kernel(data, indices, indptr, x, out, bounds, structure.run_starts, structure.run_stops,
                  structure.offsets, data.dtype.type(0))
