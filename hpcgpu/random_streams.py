"""Counter-based random numbers: a deviate is a pure function of ``(seed, stream, step, id, slot)``.

A rank that builds its own items (bodies, atoms) draws their random
numbers without the others': splitmix64 (Steele, Lea and Flood 2014)
hashes a counter to 64 random bits, and the counter of an item's
``slot``-th number is ``count * id + slot + 1`` in the sequence whose
key is :func:`stream_key` of ``(seed, stream, step)``. So the numbers an
item gets never depend on how many items there are, on their order or on
how they are split between ranks: one process over every id and P ranks
over theirs draw the same floats.

Any model draws from it (:mod:`hpcgpu.workloads.md.setup` makes its
Gaussians from :func:`counter_bits`); ``step`` may number the attempts of
a rejection sampler (each attempt a fresh stream of the same item).

Examples
--------
>>> import numpy as np
>>> key = stream_key(7, 1, 0)
>>> every = uniforms(np, key, np.arange(10), 2)
>>> some = uniforms(np, key, np.array([9, 3]), 2)
>>> bool((some == every[:, [9, 3]]).all()), every.shape
(True, (2, 10))
"""

import numpy as np

from hpcgpu.errors import ConfigError

__all__ = ["counter_bits", "stream_key", "uniforms"]

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment: 2**64 / golden ratio, odd
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _mix_int(z):
    """splitmix64's output function on a Python int (64-bit wrap-around)."""
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def stream_key(seed, stream, step=0):
    """The 64-bit key of one random stream at one step (a Python int); seed, stream and step are ints >= 0."""
    key = seed & _MASK
    for word in (stream, step):
        key = _mix_int((key + _GAMMA) & _MASK) ^ (word & _MASK)
    return _mix_int((key + _GAMMA) & _MASK)


def _mix(z):
    """splitmix64's output function on uint64 arrays (NumPy or CuPy wrap around silently)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def counter_bits(key, counters):
    """The splitmix64 outputs (uint64) at ``counters`` of the sequence keyed ``key``.

    Output ``c`` of the sequence is the mix of ``key + c * gamma`` (64-bit
    wrap-around), so any counter is drawn without the ones before it.

    Parameters
    ----------
    key : int
        A :func:`stream_key`.
    counters : numpy.ndarray or cupy.ndarray
        uint64 counters; the result is an array of the same kind and shape.

    Examples
    --------
    >>> bits = counter_bits(stream_key(7, 2, 12345), np.arange(1, 4, dtype=np.uint64))
    >>> hex(int(bits[0])), bits.dtype
    ('0xd1aee17f4ca29769', dtype('uint64'))
    """
    return _mix(np.uint64(key) + counters * np.uint64(_GAMMA))


def uniforms(xp, key, ids, count, open_below=False):
    """Uniform deviates ``(count, len(ids))`` in float64, a function of ``(key, id, slot)`` only.

    Row ``slot`` of item ``id`` is the splitmix64 output at counter
    ``count * id + slot + 1`` of the sequence keyed ``key``; its 53 high
    bits make the float. In ``[0, 1)``, or in ``(0, 1]`` with
    ``open_below`` (for logarithms and negative powers).

    Raises
    ------
    ConfigError
        ``count`` below 1.
    """
    if count < 1:
        raise ConfigError(f"count must be >= 1; got {count}")
    with np.errstate(over="ignore"):
        base = xp.asarray(ids).astype(np.uint64) * np.uint64(count)
        out = xp.empty((count, base.shape[0]), dtype=np.float64)
        shift = 1.0 if open_below else 0.0
        for slot in range(count):
            bits = counter_bits(key, base + np.uint64(slot + 1)) >> np.uint64(11)
            out[slot] = (bits.astype(np.float64) + shift) * 2.0**-53
    return out
