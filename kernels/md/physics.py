"""The Lennard-Jones pair interaction and the minimum image, written once.

Plain Python functions on scalars. ``_numba.py`` compiles them with
``numba.njit`` and ``_cuda.py`` with ``numba.cuda.jit(device=True)``;
``_numpy.py`` calls the very same functions on whole arrays of pairs (they
are pure arithmetic, no branches), and ``_cupy.py`` mirrors them in CUDA
C++. Numeric constants come in as arguments of the positions' dtype (``one``,
``two``, and the coefficients ``4 epsilon`` and ``24 epsilon`` formed on the
host): a float literal would promote float32 arithmetic to float64 under
Numba's typing rules.

For atom ``i`` and a neighbour ``j`` at the separation ``d = x_j - x_i``
(minimum image), ``r2 = |d|^2`` and ``s = sigma^2 / r2``::

    energy = 4 eps (s^6 - s^3) - energy_shift
    virial = r . F_ij = 24 eps (2 s^6 - s^3)
    F_i    = -(virial / r2) d

with ``F_ij`` the force of ``i`` on ``j`` along ``r = x_j - x_i`` (a repulsive
pair has a positive virial). The loops apply the cutoff (pairs with
``r2 < cutoff^2`` interact, others contribute exact zeros) by selecting, not
multiplying, so that a far pair never turns into ``0 * inf``.
"""


def lennard_jones(r2, sigma2, four_epsilon, twenty_four_epsilon, energy_shift, one, two):
    """``(weight, energy, virial)`` of one pair at squared distance ``r2``.

    ``weight = virial / r2`` is the force on atom ``i`` per unit of
    ``-(x_j - x_i)``: ``F_i = -weight * d``. ``energy`` is the whole pair's
    (shifted) potential energy, ``virial`` the pair's ``r . F``. One division
    per pair (``1 / r2``); ``r2 == 0`` gives infinities and NaN, which the
    public API reports as overlapping atoms.
    """
    inv_r2 = one / r2
    s = sigma2 * inv_r2
    s3 = s * s * s
    s6 = s3 * s3
    energy = four_epsilon * (s6 - s3) - energy_shift
    virial = twenty_four_epsilon * (two * s6 - s3)
    return virial * inv_r2, energy, virial


def minimum_image(d, length, inverse_length, nearest):
    """The periodic image of the separation ``d`` nearest to zero along one side.

    ``nearest`` is ``d * inverse_length`` rounded to the nearest integer, as a
    float (``rint``: the backends compute it with their own instruction).
    Valid for any ``d``, so positions need not be wrapped into the box.
    """
    return d - length * nearest


def within(r2, limit2):
    """Whether a pair at squared distance ``r2`` is inside the squared radius ``limit2``."""
    return r2 < limit2
