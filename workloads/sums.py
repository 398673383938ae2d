"""Order-independent sums shared by the models' diagnostics.

The weather and N-body diagnostics reduce per-block partial sums with one
correctly rounded sum (:func:`exact_total`), so that a partitioned run
reports bitwise the numbers of an unpartitioned one. This module imports
nothing of the models: each model's ``diagnostics`` imports it, never the
other way round.

A block that holds whole rows may return one float per row and have them
added by :func:`exact_total`; a block that holds any piece of an array (a
2-D block splits rows, a 3-D brick holds any atoms) returns the exact sum
of its own terms instead, an :class:`~hpcgpu.exact_sums.ExactPartial`
from the core's :func:`~hpcgpu.exact_sums.exact_partial` (re-exported
here), and the partials of all blocks add exactly. A model's diagnostics
then read::

    def block_sums(self, block):
        terms = 0.5 * block.h * (block.u ** 2 + block.v ** 2)   # the block's own cells
        return {"energy": exact_partial(terms), "cells": int(block.h.size)}

    def combine_sums(self, parts):
        return {"energy": exact_total([p["energy"] for p in parts])}   # or float(sum(...))

and equal, bitwise, on any process grid: ``float(sum(partials))`` is the
correctly rounded sum of every term, whatever the split.

Examples
--------
>>> from hpcgpu.workloads.sums import exact_partial, exact_total
>>> exact_total([1e16, 1.0, -1e16])  # a plain sum in this order gives 0.0
1.0
>>> exact_total([exact_partial([1e16, 1.0]), exact_partial([-1e16])])
1.0
"""

import math

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.exact_sums import ExactPartial, exact_partial

__all__ = ["exact_total", "exact_partial", "ExactPartial"]


def exact_total(values):
    """The correctly rounded sum of ``values``, whatever their order; NaN or inf as NumPy's sum.

    Parameters
    ----------
    values : ExactPartial, iterable of ExactPartial, iterable of float, or a host float64 array
        Exact partial sums of blocks (:func:`exact_partial`), or the terms
        themselves (host memory: :func:`math.fsum` reads Python floats).

    Returns
    -------
    float
        For partials, the correctly rounded sum of every element that went
        into them (:meth:`ExactPartial.total`: NaN or inf as
        ``numpy.sum``). For terms, ``math.fsum(values)``; where that raises
        (``inf - inf`` gives ``ValueError``, an intermediate overflow
        ``OverflowError``), the plain ``numpy.sum`` (NaN or inf), so that a
        diagnostic of a blown-up state stays a number the instability check
        reports instead of an exception.

    Raises
    ------
    ConfigError
        Partials mixed with numbers (turn the numbers into a partial).

    Examples
    --------
    >>> import numpy as np
    >>> exact_total(np.array([0.1] * 10))
    1.0
    >>> exact_total(np.array([np.inf, -np.inf]))
    nan
    >>> exact_total([exact_partial(np.full((2, 3), 0.1)), exact_partial(np.full(4, 0.1))])
    1.0
    """
    if isinstance(values, ExactPartial):
        return values.total()
    if not isinstance(values, np.ndarray):
        values = list(values)
        partials = sum(isinstance(v, ExactPartial) for v in values)
        if partials and partials == len(values):
            return sum(values).total()
        if partials:
            # math.fsum would round each partial to a float first: no longer exact
            raise ConfigError(f"values must be all ExactPartial or all numbers; got {partials} partials "
                              f"among {len(values)} items")
    try:
        return math.fsum(values)
    except (ValueError, OverflowError):
        return float(np.sum(values))
