"""How a rank's message travels on the direct path: protocol-5 pickles with NumPy buffers out of band.

:func:`encode` turns an object into ``(pickle bytes, buffers)`` without
copying its arrays (they go out of band, each sent as its raw bytes), and
:func:`decode` rebuilds it on the receiver. The rank port
(:mod:`hpcgpu.partition.direct_comm`) frames both, and unpickles only what
comes from a peer that proved its session's secret.

Examples
--------
>>> import numpy as np
>>> data, buffers = encode(np.arange(4.0))
>>> decode(data, [bytearray(b) for b in buffers]).tolist()
[0.0, 1.0, 2.0, 3.0]
"""

import io
import pickle

import numpy as np

__all__ = ["decode", "encode"]


class _Pickler(pickle.Pickler):
    """Protocol 5 with non-contiguous NumPy arrays made contiguous first.

    NumPy pickles a non-contiguous array in band, and that path drops a
    non-native byte order (a strided ``>f8`` view arrives as ``<f8``): such
    an array travels as its contiguous copy, out of band like any other.
    Everything else pickles as with :func:`pickle.dumps` (the hook is not
    even called for ints, floats, strings, tuples, lists and dicts).
    """

    def reducer_override(self, obj):
        if type(obj) is np.ndarray and not obj.flags.forc:
            return np.ascontiguousarray(obj).__reduce_ex__(5)
        return NotImplemented


_SCALARS = frozenset({int, float, bool, str, bytes, type(None)})


def _contiguous(obj):
    """True if ``obj`` is a contiguous NumPy array, a scalar, or a tuple or list of them (nothing for _Pickler).

    A quick look at the shapes halo and ghost messages take; anything else
    (dicts, dataclasses, nested containers) goes through :class:`_Pickler`.
    """
    kind = type(obj)
    if kind is np.ndarray:
        return obj.flags.forc
    if kind is tuple or kind is list:
        for item in obj:
            kind = type(item)
            if kind is np.ndarray:
                if not item.flags.forc:
                    return False
            elif kind not in _SCALARS and not isinstance(item, np.generic):  # NumPy scalars: native order
                return False
        return True
    return kind in _SCALARS or isinstance(obj, np.generic)


def encode(obj):
    """``(pickle bytes, out-of-band buffers)`` of ``obj`` (protocol 5: arrays travel without a copy).

    Objects plain pickle refuses but dask would send (lambdas, functions of
    ``__main__``) go with cloudpickle.

    Raises
    ------
    pickle.PicklingError, TypeError, AttributeError
        Neither pickle nor cloudpickle can serialize ``obj`` (the error of cloudpickle).
    """
    buffers = []
    try:
        if _contiguous(obj):  # the messages of a step: pickle.dumps, the cheapest (no Pickler object to make)
            data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        else:
            stream = io.BytesIO()
            _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
            data = stream.getvalue()
    except Exception:  # noqa: BLE001 - whatever pickle refuses, cloudpickle may take
        import cloudpickle

        buffers = []
        data = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return data, [b.raw() for b in buffers]


def decode(data, buffers):
    """The object :func:`encode` gave ``data`` and ``buffers`` for."""
    return pickle.loads(data, buffers=buffers)
