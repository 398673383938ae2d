"""What every Numba-CUDA backend file needs to work on CuPy arrays.

The ``cuda`` backend keeps its data in CuPy arrays (so that CuPy, cuBLAS
and the RMM pool share them) and launches Numba-CUDA kernels on them. These
helpers wrap a CuPy array for Numba without a host synchronisation, launch
on CuPy's current stream so the two queue in order, and let the CUDA
simulator (NumPy arrays, ``NUMBA_ENABLE_CUDASIM=1``) pass through unchanged.
Imported only by the ``_cuda`` backend files: it imports ``numba.cuda``.

Wrapping is cached. ``cuda.as_cuda_array`` builds, on every call, CuPy's
``__cuda_array_interface__`` dictionary, a Numba stream object for the
stream named in it, a memory pointer and a ``DeviceNDArray``: tens of
microseconds of Python per array, several hundred per launch of a kernel of
ten arrays, which a time loop of kernels of a few tens of microseconds each
feels directly. A wrapper depends only on where the array's memory starts,
its shape, strides and dtype, and its device, so one is made per such key
and reused (a least-recently-used table of :data:`VIEWS` entries): a time
loop that cycles through the same buffers, or gets the same addresses back
from CuPy's memory pool, makes none after its first step. A wrapper holds no
reference to the CuPy array: it is a description of memory, valid for a
launch while the caller holds the array, as the uncached wrapper was (the
launch queues on the array's stream before the caller can free it). The
same holds for the Numba stream object of each CuPy stream handle. A cached
wrapper also carries its Numba type, which Numba would otherwise work out
again on every launch (:func:`_typed_once`).
"""

import functools

import numpy as np
from numba import cuda

from hpcgpu import _gpu_probe

if _gpu_probe.simulator_enabled():
    from hpcgpu.kernels.cuda_simulator import yield_while_polling

    yield_while_polling()  # or launches can fall into a GIL convoy (kernels/cuda_simulator.py)

__all__ = ["on_device", "flat_on_device", "stream_of", "array_module", "clear_caches", "VIEWS"]

VIEWS = 1024
"""Most cached array wrappers (a few kilobytes each; a stage launch uses ten)."""

STREAMS = 64
"""Most cached stream wrappers."""


def on_device(array):
    """A Numba view of a CuPy array without a host sync; NumPy arrays (simulator) pass through."""
    if isinstance(array, np.ndarray):
        return array
    memory = array.data
    return _view(memory.ptr, array.shape, array.strides, array.dtype, memory.device_id)


def flat_on_device(array, start=0):
    """A 1-D Numba view of a C-contiguous array (of any shape), as flat kernels index it.

    The same as ``on_device(array.reshape(array.size)[start:])`` without
    making the CuPy view on every call. ``start`` (an element, ``0 <= start
    < array.size``) lets a kernel index a window of columns from its first
    element with the array's own row stride.
    """
    if isinstance(array, np.ndarray):
        return array.reshape(array.size)[start:]
    if not array.flags.c_contiguous:
        raise ValueError("flat_on_device needs a C-contiguous array")
    memory = array.data
    return _view(memory.ptr + start * array.itemsize, (array.size - start,), (array.itemsize,), array.dtype,
                 memory.device_id)


@functools.lru_cache(maxsize=VIEWS)
def _view(ptr, shape, strides, dtype, device_id):
    """The Numba wrapper of ``shape`` / ``strides`` / ``dtype`` memory at ``ptr`` on ``device_id``.

    No stream in the description (Numba would make a stream object for it
    and, unless told not to, synchronise it) and no owner (the caller holds
    the array for the launch).
    """
    description = {"shape": tuple(shape), "strides": tuple(strides), "typestr": dtype.str,
                   "data": (ptr, False), "version": 3}
    return _typed_once(cuda.from_cuda_array_interface(description, owner=None, sync=False))


def _typed_once(array):
    """``array`` with its Numba type computed now rather than at every launch.

    Numba types each array argument on every launch through the
    ``_numba_type_`` property of ``DeviceNDArray``, which inspects the
    array's flags and interns a new type object: 7-10 microseconds per
    array on the host, more than a small kernel runs. A cached wrapper never
    changes, so its type is stored as a plain attribute of a subclass, which
    Numba reads in its C fast path. Anything else passes through unchanged.
    """
    typed = _typed_class(type(array))
    if typed is None:
        return array
    numba_type = array._numba_type_
    try:
        array.__class__ = typed
    except TypeError:  # a Numba whose device arrays cannot change class: keep the property
        return array
    array._numba_type_ = numba_type
    return array


@functools.cache
def _typed_class(base):
    """A subclass of ``base`` whose ``_numba_type_`` is an instance attribute, or None
    when ``base`` has no ``_numba_type_`` property."""
    if not isinstance(getattr(base, "_numba_type_", None), property):
        return None
    return type(f"Typed{base.__name__}", (base,), {
        "_numba_type_": None,
        "__doc__": f"A ``{base.__name__}`` whose Numba type was computed once (cuda_interop).",
        "__module__": __name__})


def stream_of(array):
    """CuPy's current stream as a Numba stream, so kernels queue behind CuPy's work."""
    if isinstance(array, np.ndarray):
        return 0
    ptr = _cupy().cuda.get_current_stream().ptr
    return _external_stream(ptr, array.data.device_id) if ptr else 0


@functools.lru_cache(maxsize=STREAMS)
def _external_stream(ptr, device_id):
    """The Numba stream object of the CUDA stream handle ``ptr`` on ``device_id``."""
    return cuda.external_stream(ptr)


@functools.cache
def _cupy():
    import cupy
    return cupy


def array_module(array):
    """``numpy`` for simulator arrays, ``cupy`` for device arrays."""
    if isinstance(array, np.ndarray):
        return np
    return _cupy()


def clear_caches():
    """Forget every cached wrapper: needed only after Numba's CUDA contexts are reset
    (``cuda.close()``), whose objects the wrappers point to."""
    _view.cache_clear()
    _external_stream.cache_clear()
