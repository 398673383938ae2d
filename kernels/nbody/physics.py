"""The softened gravitational pair interaction, written once.

Plain Python functions on scalars. ``_numba.py`` compiles them with
``numba.njit`` and ``_cuda.py`` with ``numba.cuda.jit(device=True)``; only
the loops around them differ (``_cupy.py`` mirrors them in CUDA C++, and
``_numpy.py`` writes the same formulas on whole arrays). Numeric constants
come in as arguments of the positions' dtype (``zero``, ``one``): a float
literal would promote float32 arithmetic to float64 under Numba's typing
rules.

For a target at ``x_i`` and a source of mass ``m`` at ``x_j``, with
``d = x_j - x_i``::

    r2     = eps^2 + |d|^2
    inv_r  = 1 / sqrt(r2)            (0 when r2 == 0: coincident, no softening)
    a_i   += m inv_r^3 d
    phi_i -= m inv_r

``G`` multiplies the sums once, at the end.
"""

import math


def distance_squared(dx, dy, dz, eps2):
    """Softened squared distance ``eps^2 + |d|^2``, summed from ``eps^2`` so
    that it contracts to three fused multiply-adds."""
    return eps2 + dx * dx + dy * dy + dz * dz


def inverse_sqrt(r2, one):
    """``1 / sqrt(r2)``; compiled with fast-math this becomes a reciprocal
    square root instruction (backends may substitute their own)."""
    return one / math.sqrt(r2)


def exclude_coincident(inv_r, r2, zero):
    """``inv_r``, or 0 for a pair at zero separation without softening.

    Such a pair (two bodies at one point, or a body and itself) exerts no
    force; this keeps it from turning the sums into inf or NaN. A NaN ``r2``
    keeps its NaN ``inv_r``, so a bad body still shows in the result.
    """
    if r2 == zero:
        return zero
    return inv_r


def pair_weights(mass, inv_r):
    """``(m / r^3, m / r)``: the acceleration weight of ``d`` and the
    potential term of one source.

    ``m / r`` is formed first, so a massless source gives exact zeros even
    where ``inv_r^3`` alone would overflow.
    """
    m_inv_r = mass * inv_r
    return m_inv_r * inv_r * inv_r, m_inv_r
