"""Messages of the NCCL transport: the device arrays of an object split from the rest, and put back.

A message of :class:`~hpcgpu.partition.nccl_communicator.NcclCommunicator` is
an object that may hold CuPy arrays anywhere inside it.
:func:`split_device_arrays` pickles it with a placeholder for each device
array (which then travel through NCCL), :func:`join_device_arrays` puts the
received arrays back. The small records that travel over the base
communicator describe them: a :class:`Header` on the direction's control
key, an :class:`Envelope` under the caller's tag, a
:class:`DeviceArrayShape` in a collective's descriptor exchange. See
:mod:`hpcgpu.partition.nccl_communicator` for the protocol.
"""

import io
import pickle
from dataclasses import dataclass

import numpy as np

__all__ = ["DeviceArrayShape", "Envelope", "Header", "join_device_arrays", "split_device_arrays"]


@dataclass(frozen=True)
class Header:
    """On the control key: the buffers of one message, ``((seq, shape, dtype), ...)`` in send order."""

    items: tuple


@dataclass(frozen=True)
class Envelope:
    """Under the caller's tag: the object (None: a bare array) and ``(seq or None, shape, dtype)`` per buffer."""

    skeleton: bytes
    items: tuple


@dataclass(frozen=True)
class DeviceArrayShape:
    """A bare device array in a collective's descriptor exchange."""

    shape: tuple
    dtype: str
    nbytes: int


_PLAIN = (str, bytes, int, float, complex, bool, np.ndarray, np.generic)
_TAG = "hpcgpu-device-array"


class _Splitter(pickle.Pickler):
    def __init__(self, file, array_type, buffer_callback=None):
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self.array_type = array_type
        self.arrays = []

    def persistent_id(self, obj):
        if isinstance(obj, self.array_type):
            self.arrays.append(obj)
            return (_TAG, len(self.arrays) - 1)
        return None


class _Joiner(pickle.Unpickler):
    def __init__(self, file, arrays):
        super().__init__(file)
        self.arrays = arrays

    def persistent_load(self, pid):
        return self.arrays[pid[1]]


def split_device_arrays(obj, array_type):
    """``(skeleton, arrays)``: the device arrays in ``obj`` and the rest of it (pickled with placeholders).

    A bare array gives ``(None, [obj])``; an object without device arrays
    (or one that cannot be pickled: the base decides) gives ``(None, None)``.

    Examples
    --------
    >>> skeleton, arrays = split_device_arrays({"h": np.zeros(2), "n": 3}, np.ndarray)
    >>> len(arrays), join_device_arrays(skeleton, [np.ones(2)])["h"].tolist()
    (1, [1.0, 1.0])
    """
    if isinstance(obj, array_type):
        return None, [obj]
    if obj is None or isinstance(obj, _PLAIN):
        return None, None
    try:
        # a look first, host buffers out of band (not copied); most messages hold no device array
        probe = _Splitter(io.BytesIO(), array_type, buffer_callback=lambda buffer: False)
        probe.dump(obj)
    except Exception:  # noqa: BLE001 - not picklable here: the base's serialisation decides
        return None, None
    if not probe.arrays:
        return None, None
    out = io.BytesIO()
    splitter = _Splitter(out, array_type)
    splitter.dump(obj)
    return out.getvalue(), splitter.arrays


def join_device_arrays(skeleton, arrays):
    """The object :func:`split_device_arrays` gave ``skeleton`` for, with ``arrays`` in place of its device arrays."""
    if skeleton is None:
        return arrays[0]
    return _Joiner(io.BytesIO(skeleton), arrays).load()
