"""The periodic box of the MD kernels, checked once for every entry point.

Examples
--------
>>> from hpcgpu.kernels.md.box import check_box
>>> check_box([10, 10.5, 12])
(10.0, 10.5, 12.0)
"""

import math

from hpcgpu.errors import ConfigError

__all__ = ["check_box"]


def check_box(box):
    """The box as a tuple of three positive finite floats.

    Parameters
    ----------
    box : sequence of 3 numbers, or an array of 3
        Orthorhombic periodic box ``(Lx, Ly, Lz)``.

    Raises
    ------
    ConfigError
        Not three numbers, or a side that is not finite and > 0 (named: ``box side Ly ...``).
    """
    try:
        values = [float(v) for v in (box.tolist() if hasattr(box, "tolist") else box)]
    except (TypeError, ValueError):
        raise ConfigError(f"box must be three side lengths (Lx, Ly, Lz); got {box!r}") from None
    if len(values) != 3:
        raise ConfigError(f"box must be three side lengths (Lx, Ly, Lz); got {box!r}")
    for axis, length in zip("xyz", values):
        if not (math.isfinite(length) and length > 0):
            raise ConfigError(f"box side L{axis} must be a finite number > 0; got {length}")
    return tuple(values)
