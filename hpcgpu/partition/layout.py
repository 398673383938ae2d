"""How many items each partition holds: contiguous blocks in proportion to weights."""

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.validation import check_float

__all__ = ["alignment", "check_weights", "split_rows"]


def split_rows(rows, weights, minimum=1, align=1):
    """Split ``rows`` into contiguous blocks proportional to ``weights``.

    Largest-remainder rounding, so each block is within one row of its exact
    share. A block whose share is below ``minimum`` (the halo a block must
    be able to give its neighbour) gets ``minimum`` and the others share the
    rest in proportion. With ``align`` > 1 every cut between two blocks is
    then moved to the nearest multiple of ``align`` (unless a block would
    fall below ``minimum``), so that chunks of ``align`` rows never straddle
    two blocks. Raises ConfigError when the blocks cannot all hold
    ``minimum`` rows.

    Examples
    --------
    >>> split_rows(10, [3, 1])
    [(0, 8), (8, 10)]
    >>> split_rows(100, [1, 100], minimum=12)
    [(0, 12), (12, 100)]
    >>> split_rows(8192, [1.003, 0.997], align=64)
    [(0, 4096), (4096, 8192)]
    """
    weights = np.asarray(weights, dtype=float)
    if weights.ndim != 1 or len(weights) == 0 or not np.all(weights > 0) or not np.all(np.isfinite(weights)):
        raise ConfigError(f"weights must be positive finite numbers, one per partition; got {weights.tolist()}")
    weights = weights / weights.max()  # finite weights whose sum overflows would all share 0 rows
    count = len(weights)
    if count * minimum > rows:
        most = rows // minimum
        advice = (f"use at most {most} partitions or fewer steps_per_task" if most > 1 else
                  "use fewer steps_per_task (a narrower halo) or a bigger grid")
        raise ConfigError(f"partitions={count} needs at least {count * minimum} rows ({minimum} per block for the "
                          f"halo) but the grid has {rows}; {advice}")
    sizes = np.zeros(count, dtype=int)
    fixed = np.zeros(count, dtype=bool)
    while True:
        free = rows - sizes[fixed].sum()
        exact = np.where(fixed, 0.0, free * weights / weights[~fixed].sum())
        share = np.floor(exact).astype(int)
        order = [i for i in np.argsort(-(exact - share), kind="stable") if not fixed[i]]
        for index in order[: free - share[~fixed].sum()]:
            share[index] += 1
        small = ~fixed & (share < minimum)
        if not small.any():
            sizes[~fixed] = share[~fixed]
            break
        sizes[small] = minimum
        fixed |= small
    if sizes.sum() != rows:  # pragma: no cover - the rounding above always places every row
        raise AssertionError(f"split_rows placed {sizes.sum()} of {rows} rows (weights {weights.tolist()})")
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    if align > 1:
        aligned = bounds.copy()
        aligned[1:-1] = np.round(bounds[1:-1] / align).astype(int) * align
        if np.all(np.diff(aligned) >= max(minimum, 1)):
            bounds = aligned
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def alignment(rows, count, most=64, slack=64):
    """The cut alignment for ``rows`` split ``count`` ways: a power of two at most ``most``, and at most
    ``1 / slack`` of an even block (so aligning costs a block at most ``1 / (2 * slack)`` of its share).

    Examples
    --------
    >>> alignment(8192, 2), alignment(512, 4), alignment(16, 2)
    (64, 2, 1)
    """
    share = rows // max(count, 1)
    unit = 1
    while unit * 2 <= most and unit * 2 * slack <= share:
        unit *= 2
    return unit


def check_weights(weights, partitions):
    """``weights`` as a list of floats, or ConfigError: one positive finite number per partition.

    Examples
    --------
    >>> check_weights((1, 2.5), 2)
    [1.0, 2.5]
    """
    valid = f"None, 'calibrate' or a sequence of {partitions} positive finite numbers (one per partition)"
    try:
        values = list(weights)
    except TypeError:
        raise ConfigError(f"weights must be {valid}; got {weights!r}") from None
    if len(values) != partitions:
        raise ConfigError(f"weights must be {valid}; got {len(values)} entries: {weights!r}")
    try:
        return [check_float("weights", w, minimum=0.0, strict_min=True) for w in values]
    except ConfigError as error:
        raise ConfigError(f"weights must be {valid}; got {weights!r} ({error})") from None
