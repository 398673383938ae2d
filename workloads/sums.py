"""Order-independent sums shared by the models' diagnostics.

The weather and N-body diagnostics reduce per-block partial sums with one
correctly rounded sum (:func:`exact_total`), so that a partitioned run
reports bitwise the numbers of an unpartitioned one. This module imports
nothing of the models: each model's ``diagnostics`` imports it, never the
other way round.

Examples
--------
>>> from hpcgpu.workloads.sums import exact_total
>>> exact_total([1e16, 1.0, -1e16])  # a plain sum in this order gives 0.0
1.0
"""

import math

import numpy as np

__all__ = ["exact_total"]


def exact_total(values):
    """The correctly rounded sum of ``values``, whatever their order; NaN or inf as NumPy's sum.

    Parameters
    ----------
    values : iterable of float, or a host float64 array
        The terms (host memory: :func:`math.fsum` reads Python floats).

    Returns
    -------
    float
        ``math.fsum(values)``; where that raises (``inf - inf`` gives
        ``ValueError``, an intermediate overflow ``OverflowError``), the
        plain ``numpy.sum`` (NaN or inf), so that a diagnostic of a blown-up
        state stays a number the instability check reports instead of an
        exception.

    Examples
    --------
    >>> import numpy as np
    >>> exact_total(np.array([0.1] * 10))
    1.0
    >>> exact_total(np.array([np.inf, -np.inf]))
    nan
    """
    try:
        return math.fsum(values)
    except (ValueError, OverflowError):
        return float(np.sum(values))
