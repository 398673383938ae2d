"""The periodic box of the MD kernels, checked in one place for every entry point and backend.

Every public MD function that takes a ``box`` (the per-step ones included:
:func:`~hpcgpu.kernels.md.verlet_drift`, :func:`~hpcgpu.kernels.md.wrap_into_box`,
:func:`~hpcgpu.kernels.md.largest_displacement_squared`) passes it through
:func:`check_box` before any backend sees it, so the ``numpy``, ``numba``,
``cuda`` and ``cupy`` kernels only ever get three positive finite floats.

Examples
--------
>>> from hpcgpu.kernels.md.box import check_box
>>> check_box([10, 10.5, 12])
(10.0, 10.5, 12.0)
>>> check_box((10.0, -1.0, 12.0))
Traceback (most recent call last):
...
hpcgpu.errors.ConfigError: box side Ly must be a finite number > 0; got -1.0
"""

import math
import numbers

from hpcgpu.errors import ConfigError

__all__ = ["check_box"]

_INF = math.inf

_SHAPE = "box must be three side lengths (Lx, Ly, Lz), each a finite number > 0"


def check_box(box):
    """The box as a tuple of three positive finite floats.

    A tuple of three such Python floats (what this function returns, and so
    what a model holds and passes back every step) is returned as it is
    after three type tests and six scalar comparisons (about 0.2 us), with
    no conversion and no array touched: this check runs in the per-step
    kernels, thousands of times a run.

    Parameters
    ----------
    box : sequence of 3 real numbers, or an array of 3
        Orthorhombic periodic box ``(Lx, Ly, Lz)`` (length).

    Returns
    -------
    tuple of 3 float

    Raises
    ------
    ConfigError
        Not three real numbers (a string, two or four sides, a nested
        sequence), or a side that is not finite and > 0 (named:
        ``box side Ly ...``). It is a :class:`ValueError`.

    Notes
    -----
    No limit involving the cutoff or the Verlet skin is checked here: the
    entry points that take a cutoff require ``cutoff <= min(box) / 2``
    (minimum image). A list radius ``cutoff + skin`` beyond half a side
    needs nothing more: the list holds every pair whose minimum image is
    within the radius, which still includes every pair that can come within
    the cutoff before a rebuild.
    """
    # Fast path: the checked tuple itself (NaN fails the comparisons and falls through).
    if type(box) is tuple and len(box) == 3:
        lx, ly, lz = box
        if (type(lx) is float and type(ly) is float and type(lz) is float
                and 0.0 < lx < _INF and 0.0 < ly < _INF and 0.0 < lz < _INF):
            return box
    sides = box.tolist() if hasattr(box, "tolist") else box
    # A string is a sequence of characters: "123" would pass as (1.0, 2.0, 3.0).
    if isinstance(sides, (str, bytes)):
        raise ConfigError(_SHAPE + f"; got {box!r}")
    try:
        sides = list(sides)
    except TypeError:
        raise ConfigError(_SHAPE + f"; got {box!r}") from None
    if len(sides) != 3 or not all(type(v) is float or (isinstance(v, numbers.Real) and not isinstance(v, bool))
                                  for v in sides):
        raise ConfigError(_SHAPE + f"; got {box!r}")
    values = tuple(float(v) for v in sides)
    for axis, length in zip("xyz", values):
        if not (math.isfinite(length) and length > 0):
            raise ConfigError(f"box side L{axis} must be a finite number > 0; got {length}")
    return values
