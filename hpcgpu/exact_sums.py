"""Exact partial sums: pieces of an array that add up to the correctly rounded total, whatever the split.

This first version keeps every value of a partial and sums them with
:func:`math.fsum` (correctly rounded, so independent of order and split);
it is exact but holds a copy of its values. A binned version that keeps a
few thousand numbers per partial replaces it.

Examples
--------
>>> import numpy as np
>>> values = np.array([1e16, 1.0, -1e16, 0.5])
>>> float(exact_partial(values[:2]) + exact_partial(values[2:])) == float(exact_partial(values))
True
"""

import math

import numpy as np

__all__ = ["ExactPartial", "exact_partial"]


class ExactPartial:
    """Values whose correctly rounded sum is ``float(partial)``; partials add (``p + q``, ``sum(parts)``)."""

    def __init__(self, values):
        self.values = values

    def __add__(self, other):
        if isinstance(other, (int, float)) and other == 0:
            return self
        return ExactPartial(np.concatenate([self.values, other.values]))

    __radd__ = __add__

    def __float__(self):
        try:
            return math.fsum(self.values)
        except (ValueError, OverflowError):  # inf - inf, or an overflow: NaN or inf as numpy's sum
            return float(np.sum(self.values))


def exact_partial(values):
    """An :class:`ExactPartial` of every element of ``values`` (any shape; NumPy or CuPy)."""
    host = values.get() if hasattr(values, "get") else values
    return ExactPartial(np.asarray(host, dtype=np.float64).ravel().copy())
