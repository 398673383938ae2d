"""Input checks shared by the public API.

Each check raises :class:`~hpcgpu.errors.ConfigError` with a message that
names the parameter, shows the value and states the valid range, so that bad
input never reaches a kernel.
"""

import math
import numbers
import os

import numpy as np

from hpcgpu.errors import ConfigError

__all__ = [
    "available_memory",
    "check_memory",
    "check_model_memory",
    "check_int",
    "check_count",
    "check_float",
    "check_relative_tolerance",
    "check_choice",
    "check_dtype",
    "check_finite_array",
]

FLOAT_DTYPES = ("float32", "float64")


def check_int(name, value, *, minimum=None, maximum=None):
    """Return ``value`` as an int, or raise ConfigError naming ``name``.

    Examples
    --------
    >>> check_int("nx", 64, minimum=4)
    64
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_count(name, value, *, minimum=1, dtype="int64"):
    """Return ``value`` as an int that fits the kernels' integer ``dtype``, or raise ConfigError naming ``name``.

    For counts that reach compiled code (time steps, list capacities, ghost
    widths): there they are fixed-width integers (Numba's and NumPy's
    ``int64``, the ``int`` of a CUDA C kernel), so a Python int beyond the
    type's range would overflow, be refused deep inside, or, for a loop
    count, run for ever.

    Parameters
    ----------
    name : str
        The parameter, for the message.
    value : int
        An integer (a float with an integral value is accepted, as by :func:`check_int`).
    minimum : int
        Smallest valid value.
    dtype : str or dtype
        The integer type the count must fit (``"int64"``, ``"int32"``).

    Raises
    ------
    ConfigError
        Not an integer, below ``minimum``, or above the largest ``dtype``;
        the message states the valid range ``minimum..max``.

    Examples
    --------
    >>> check_count("steps", 10)
    10
    >>> check_count("steps", 2**70)
    Traceback (most recent call last):
    ...
    hpcgpu.errors.ConfigError: steps=1180591620717411303424 does not fit an int64: steps must be an integer in 1..9223372036854775807
    """
    largest = int(np.iinfo(dtype).max)
    value = check_int(name, value, minimum=minimum)
    if value > largest:
        raise ConfigError(f"{name}={value} does not fit an {np.dtype(dtype).name}: {name} must be an integer in "
                          f"{minimum}..{largest}")
    return value


def check_float(name, value, *, minimum=None, maximum=None, strict_min=False,
                allow_none=False):
    """Return ``value`` as a finite float, or raise ConfigError naming ``name``.

    ``strict_min=True`` makes the lower bound exclusive (``> minimum``).

    Examples
    --------
    >>> check_float("dt", 0.5, minimum=0.0, strict_min=True)
    0.5
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be finite, got {value}")
    if minimum is not None:
        if strict_min and value <= minimum:
            raise ConfigError(f"{name} must be > {minimum}, got {value}")
        if not strict_min and value < minimum:
            raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_choice(name, value, choices):
    """Return ``value`` if it is one of ``choices``, else raise ConfigError.

    Examples
    --------
    >>> check_choice("boundary", "wall", ("periodic", "wall"))
    'wall'
    """
    if value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"{name} must be one of {valid}; got {value!r}")
    return value


def check_dtype(name, value):
    """Return the NumPy float dtype named by ``value`` (float32 or float64).

    Examples
    --------
    >>> check_dtype("dtype", "float32")
    dtype('float32')
    """
    try:
        dtype = None if value is None else np.dtype(value)  # np.dtype(None) is float64: not a choice made
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in FLOAT_DTYPES:
        raise ConfigError(
            f"{name} must be one of {', '.join(FLOAT_DTYPES)}; got {value!r}")
    return dtype


def available_memory(backend):
    """Bytes this process can still allocate on ``backend``'s device (free GPU memory, or free RAM).

    The CUDA simulator keeps the ``cuda`` backend's arrays in RAM (and needs no CuPy): free RAM.
    """
    if getattr(backend, "on_gpu", False) and not getattr(backend, "simulated", False):
        import cupy

        free, _ = cupy.cuda.Device().mem_info
        return int(free) + int(cupy.get_default_memory_pool().free_bytes())
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        # Linux reports reclaimable page cache as used: MemAvailable counts it.
        with open("/proc/meminfo") as stream:
            for line in stream:
                if line.startswith("MemAvailable:"):
                    available = max(available, int(line.split()[1]) * 1024)
        return int(available)
    except (OSError, ValueError, AttributeError):
        return None


def check_memory(what, nbytes, backend, *, available=None):
    """Refuse a problem up front when its estimated memory exceeds what the device has free.

    Parameters
    ----------
    what : str
        The sizes that set the memory, named as the caller's parameters (``"nx=.., ny=.."``).
    nbytes : int
        Estimated bytes (state plus work buffers).
    backend : Backend
    available : int, optional
        Bytes available (default: :func:`available_memory`).

    Raises
    ------
    ConfigError
        With the estimate and what is available.

    Examples
    --------
    >>> from hpcgpu.backends import get_backend
    >>> check_memory("n=10", 1 << 40, get_backend("numpy"), available=1 << 30)
    Traceback (most recent call last):
    ...
    hpcgpu.errors.ConfigError: n=10 needs about 1.1e+12 bytes (1024 GiB) on numpy but about 1.07e+09 bytes (1 GiB) are free; use a smaller problem or more partitions on a cluster
    """
    available = available_memory(backend) if available is None else available
    if available is not None and nbytes > available:
        raise ConfigError(
            f"{what} needs about {nbytes:.3g} bytes ({nbytes / 2**30:.4g} GiB) on {backend.name} but about "
            f"{available:.3g} bytes ({available / 2**30:.4g} GiB) are free; use a smaller problem or more "
            "partitions on a cluster")
    return nbytes


def check_finite_array(name, array):
    """Raise ConfigError if ``array`` (NumPy or CuPy) holds NaN or infinity."""
    xp = _array_module(array)
    if not bool(xp.isfinite(array).all()):
        bad = int((~xp.isfinite(array)).sum())
        raise ConfigError(f"{name} holds {bad} non-finite value(s) (NaN or inf)")


def _array_module(array):
    module = type(array).__module__.split(".")[0]
    if module == "cupy":
        import cupy
        return cupy
    return np


def check_model_memory(model, workers=None, partitions=None, *, client_builds=True):
    """Refuse a model larger than this machine's memory, or a worker's share of it, before its state is built.

    Models without ``memory_estimate()`` pass. On a cluster (``workers``: the
    ``{address: info}`` of :func:`hpcgpu.cluster.worker_info`) each worker
    holds its partitions' share; the client holds nothing unless it builds
    the global state (``client_builds``: a state the ranks cannot build
    themselves), and then the model's whole estimate (an MD state is built
    with its neighbour list and first forces). A gather the client is asked
    for later is checked when it is asked for
    (:mod:`hpcgpu.partition.client_gather`).

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> check_model_memory(ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy"))
    >>> check_model_memory(ShallowWater("gravity_wave", nx=4096, ny=4096, backend="numpy"),
    ...                    {"tcp://a": {"memory_limit": 2**20}}, 2)
    Traceback (most recent call last):
    ...
    hpcgpu.errors.ConfigError: nx=4096, ny=4096 (float64) needs about 1.61e+09 bytes per worker (1.5 GiB) over 2 partitions on 1 workers, but the smallest worker has 0.0009766 GiB; use more workers (or a smaller problem)
    """
    estimate = getattr(model, "memory_estimate", None)
    if estimate is None:
        return
    what, nbytes = estimate()
    if workers is None:
        check_memory(what, nbytes, model.backend)
        return
    if client_builds:  # as the model's estimate says: MD builds the whole list and the first forces there
        check_memory(f"{what} (the state built on the client)", nbytes, model.backend)
    limits = [w.get("memory_limit") or 0 for w in workers.values()]
    if workers and min(limits) > 0:
        count = partitions or len(workers)
        per_worker = nbytes * -(-count // len(workers)) / count
        if per_worker > min(limits):
            raise ConfigError(
                f"{what} needs about {per_worker:.3g} bytes per worker ({per_worker / 2**30:.4g} GiB) over "
                f"{count} partitions on {len(workers)} workers, but the smallest worker has "
                f"{min(limits) / 2**30:.4g} GiB; use more workers (or a smaller problem)")


def check_relative_tolerance(name, value):
    """``value`` as a float in (0, 1), or a ConfigError naming ``name``.

    The tolerance of a relative residual: 1 is met by ``x = 0``, so a
    tolerance of 1 or more would "converge" without an iteration. Both
    conjugate-gradient solvers (one process and distributed) check theirs here.

    Examples
    --------
    >>> check_relative_tolerance("tol", 1e-8)
    1e-08
    """
    from hpcgpu.errors import ConfigError

    value = check_float(name, value, minimum=0.0, strict_min=True, maximum=1.0)
    if value >= 1.0:
        raise ConfigError(f"{name} must be < 1 (a relative residual), got {value}")
    return value
