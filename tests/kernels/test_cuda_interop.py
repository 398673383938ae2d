"""The cached CuPy-to-Numba wrappers of ``kernels/cuda_interop.py``.

Without a GPU, Numba's wrapping calls are replaced by recorders and CuPy
arrays by stand-ins that carry what the cache reads (address, device, shape,
strides, dtype): the tests check what is cached under which key, what the
wrappers describe, that a wrapper's Numba type is computed once (also on
the installed Numba's own device array class), and that the table stays
bounded. Simulator arrays (NumPy) pass through untouched. On a GPU the last
test runs a kernel twice on CuPy arrays and checks that the second launch
makes no wrapper.
"""

import os
import subprocess
import sys
import types

import numpy as np
import pytest
from _support import simulated, usable_backend

from hpcgpu.kernels import cuda_interop as interop


class _Memory:
    def __init__(self, ptr, device_id):
        self.ptr = ptr
        self.device_id = device_id


class _Flags:
    def __init__(self, c_contiguous):
        self.c_contiguous = c_contiguous


class FakeCupyArray:
    """What the wrappers read from a CuPy array, for memory that does not exist."""

    def __init__(self, ptr, shape, dtype=np.float32, device_id=0, strides=None):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.itemsize = self.dtype.itemsize
        self.size = int(np.prod(shape))
        contiguous = np.empty(self.shape, self.dtype).strides
        self.strides = contiguous if strides is None else tuple(strides)
        self.flags = _Flags(self.strides == contiguous)
        self.data = _Memory(ptr, device_id)


@pytest.fixture
def recorded(monkeypatch):
    """Numba's wrapping calls replaced by recorders; fresh caches before and after."""
    calls = {"views": [], "streams": []}

    def from_cuda_array_interface(description, owner=None, sync=True):
        calls["views"].append((description, owner, sync))
        return object()

    def external_stream(ptr):
        calls["streams"].append(ptr)
        return object()

    fake_cuda = types.SimpleNamespace(from_cuda_array_interface=from_cuda_array_interface,
                                      external_stream=external_stream)
    monkeypatch.setattr(interop, "cuda", fake_cuda)
    interop.clear_caches()
    yield calls
    interop.clear_caches()


def _fake_cupy(monkeypatch, stream_ptr):
    current = types.SimpleNamespace(ptr=stream_ptr)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: current))
    monkeypatch.setattr(interop, "_cupy", lambda: fake)
    return current


def test_simulator_arrays_pass_through():
    a = np.arange(12.0).reshape(3, 4)
    assert interop.on_device(a) is a
    flat = interop.flat_on_device(a)
    assert flat.shape == (12,) and np.shares_memory(flat, a)
    assert interop.stream_of(a) == 0
    assert interop.array_module(a) is np


def test_one_wrapper_per_address_shape_strides_dtype_and_device(recorded):
    a = FakeCupyArray(0x7F0000001000, (4, 6))
    first = interop.on_device(a)
    assert interop.on_device(a) is first
    assert interop.on_device(FakeCupyArray(0x7F0000001000, (4, 6))) is first  # another view, same memory
    (description, owner, sync), = recorded["views"]
    assert description == {"shape": (4, 6), "strides": (24, 4), "typestr": "<f4",
                           "data": (0x7F0000001000, False), "version": 3}
    assert owner is None and sync is False  # no reference kept, no host synchronisation
    others = [FakeCupyArray(0x7F0000002000, (4, 6)), FakeCupyArray(0x7F0000001000, (6, 4)),
              FakeCupyArray(0x7F0000001000, (4, 6), strides=(4, 16)),
              FakeCupyArray(0x7F0000001000, (4, 6), np.int32), FakeCupyArray(0x7F0000001000, (4, 6), device_id=1)]
    wrappers = [interop.on_device(x) for x in others]
    assert len({id(w) for w in wrappers + [first]}) == 6
    assert len(recorded["views"]) == 6


def test_flat_view_without_a_reshape(recorded):
    a = FakeCupyArray(0x7F0000001000, (5, 7), np.float64)
    flat = interop.flat_on_device(a)
    assert interop.flat_on_device(a) is flat
    (description, _, _), = recorded["views"]
    assert description["shape"] == (35,) and description["strides"] == (8,)
    assert description["typestr"] == "<f8" and description["data"] == (0x7F0000001000, False)
    with pytest.raises(ValueError, match="C-contiguous"):
        interop.flat_on_device(FakeCupyArray(0x7F0000001000, (5, 7), strides=(4, 20)))


def test_the_table_is_bounded(recorded):
    base = 0x7F0000000000
    first = interop.on_device(FakeCupyArray(base, (8,)))
    for k in range(1, interop.VIEWS + 1):
        interop.on_device(FakeCupyArray(base + 256 * k, (8,)))
    assert interop._view.cache_info().currsize == interop.VIEWS
    assert interop.on_device(FakeCupyArray(base, (8,))) is not first  # the oldest was dropped
    assert len(recorded["views"]) == interop.VIEWS + 2


class FakeDeviceArray:
    """Stands in for Numba's DeviceNDArray: a ``_numba_type_`` property that counts its uses."""

    typings = 0

    def __init__(self, description):
        self.description = description

    @property
    def _numba_type_(self):
        FakeDeviceArray.typings += 1
        return ("array", self.description["typestr"], len(self.description["shape"]))


def test_a_wrapper_is_typed_once(recorded, monkeypatch):
    """Numba reads ``_numba_type_`` on every launch; a cached wrapper computes it once."""
    monkeypatch.setattr(interop.cuda, "from_cuda_array_interface",
                        lambda description, owner=None, sync=True: FakeDeviceArray(description))
    FakeDeviceArray.typings = 0
    wrapper = interop.on_device(FakeCupyArray(0x7F0000001000, (3, 5), np.float64))
    assert isinstance(wrapper, FakeDeviceArray) and type(wrapper) is not FakeDeviceArray
    for _ in range(3):
        assert wrapper._numba_type_ == ("array", "<f8", 2)
    assert FakeDeviceArray.typings == 1
    assert interop.on_device(FakeCupyArray(0x7F0000001000, (3, 5), np.float64)) is wrapper
    assert FakeDeviceArray.typings == 1


_OWN_DEVICE_ARRAY = """
import ctypes
import numpy as np
from numba.core.typing.typeof import Purpose, typeof
from numba.cuda.cudadrv import devicearray, driver
from hpcgpu.kernels import cuda_interop as interop
memory = driver.MemoryPointer(None, ctypes.c_uint64(0x7F0000001000), size=4 * 24, owner=None)
array = devicearray.DeviceNDArray(shape=(4, 6), strides=(4, 16), dtype=np.dtype(np.float32),
                                  gpu_data=memory, stream=0)
expected = typeof(array, Purpose.argument)
typed = interop._typed_once(array)
assert typed is array and isinstance(typed, devicearray.DeviceNDArray)
assert type(typed) is not devicearray.DeviceNDArray
assert typed.__dict__["_numba_type_"] == expected == typeof(typed, Purpose.argument)
assert expected.layout == "F"
print("ok")
"""


def test_numbas_own_device_arrays_take_the_cached_type():
    """The installed Numba's DeviceNDArray (over memory never touched) changes class and keeps
    its Numba type. In a fresh process outside the simulator, which replaces these modules."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, "-c", _OWN_DEVICE_ARRAY], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_one_numba_stream_per_cupy_stream(recorded, monkeypatch):
    current = _fake_cupy(monkeypatch, 0)
    a = FakeCupyArray(0x7F0000001000, (4,))
    assert interop.stream_of(a) == 0  # CuPy's default stream: Numba's default too
    current.ptr = 0x5500
    stream = interop.stream_of(a)
    assert interop.stream_of(a) is stream
    current.ptr = 0x5600
    assert interop.stream_of(a) is not stream
    assert recorded["streams"] == [0x5500, 0x5600]
    interop.clear_caches()
    current.ptr = 0x5500
    assert interop.stream_of(a) is not stream
    assert recorded["streams"] == [0x5500, 0x5600, 0x5500]


@pytest.mark.skipif(simulated(), reason="needs CuPy arrays on a GPU")
@pytest.mark.gpu
def test_a_time_loop_wraps_its_buffers_once():
    """On a GPU: the second stage on the same buffers makes no new wrapper, and gives the same result."""
    backend = usable_backend("cuda")
    from hpcgpu.kernels.stencil import _cuda

    cp = backend.xp
    rng = np.random.default_rng(7)
    shape = (64, 256)
    u, v = (cp.asarray(rng.standard_normal(shape), dtype=cp.float32) for _ in range(2))
    h = cp.asarray(1.0 + 0.1 * rng.random(shape), dtype=cp.float32)
    f = cp.zeros(shape[0] + 1, cp.float32)
    outs = [cp.empty(shape, cp.float32) for _ in range(3)]
    args = (u, v, h, u, v, h, *outs, f, 9.81, 1.0, 1.0, 0.0, 0.0, 1.0, 0.1, 0, 0, 0)
    _cuda.shallow_water_stage(*args)
    first = [o.copy() for o in outs]
    misses = interop._view.cache_info().misses
    _cuda.shallow_water_stage(*args)
    assert interop._view.cache_info().misses == misses
    for o, expected in zip(outs, first):
        assert bool((o == expected).all())
