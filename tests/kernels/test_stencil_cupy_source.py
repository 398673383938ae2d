"""The cupy stencil backend's CUDA C++ source and launch code, run on the CPU.

CuPy needs a GPU, so ``tests/kernels/test_stencil.py`` can check the cupy
backend only on a GPU machine. Here the same source text,
``_cupy.KERNEL_SOURCE``, is compiled with g++ behind a small emulation
header (``__global__`` and ``__device__`` become plain functions;
``blockIdx``, ``blockDim``, ``threadIdx`` and ``gridDim`` become globals) and
each kernel runs as a host loop over every block and thread of its grid.
That is exact for these kernels, which use no shared memory, no
``__syncthreads`` and no warp shuffles.

The launches go through ``_cupy``'s own Python code: only ``_cupy._kernel``
(which would compile with NVRTC) is replaced by a CPU launcher. That launcher
packs arguments the way CuPy does (arrays as pointers, NumPy scalars by
their dtype, Python ints as 64-bit ints, Python floats as doubles) and checks
them against the kernel's C++ parameter types, so argument order, dtype
dispatch and scalar types are tested too. Arrays are handed to the kernels
inside NaN-filled guard zones, so a read outside an array shows up as a NaN
in the result and a write outside it as a changed guard. The guarded copy
keeps the array's address modulo 256, so vector kernels see the alignment the
launch code saw; the launcher asserts that a vector instance only ever gets
pointers aligned to its vector.
"""

import ctypes
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from _support import BOUNDARIES, SCALAR_BOUNDARIES, tolerance

from hpcgpu.kernels.stencil import _cupy, _numpy, normalize_boundary

# Even and odd sizes; strips that do not divide ny, several warps along x,
# and the 4x4 minimum (where periodic ghosts wrap across the whole grid).
SHAPES = [(16, 24), (17, 13), (9, 70), (4, 4)]
# Every instance the module holds: the defaults and the variants.
ALL_EXPRESSIONS = _cupy.NAME_EXPRESSIONS + _cupy.VARIANT_EXPRESSIONS
DTYPES = [np.dtype("float32"), np.dtype("float64")]

EMULATION_HEADER = r"""
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __forceinline__ inline

struct hg_dim3 { unsigned x, y, z; };
static thread_local hg_dim3 threadIdx, blockIdx;
static thread_local hg_dim3 blockDim, gridDim;
"""

LAUNCHER = r"""
template<typename P> struct hg_type_name;
template<> struct hg_type_name<int> { static constexpr const char* value = "int"; };
template<> struct hg_type_name<float> { static constexpr const char* value = "float"; };
template<> struct hg_type_name<double> { static constexpr const char* value = "double"; };
template<> struct hg_type_name<float*> { static constexpr const char* value = "float*"; };
template<> struct hg_type_name<double*> { static constexpr const char* value = "double*"; };
template<> struct hg_type_name<const float*> { static constexpr const char* value = "const float*"; };
template<> struct hg_type_name<const double*> { static constexpr const char* value = "const double*"; };

// Comma-separated C++ types of a kernel's parameters.
template<typename... P>
static std::string hg_signature(void (*)(P...))
{
    std::string s;
    ((s += (s.empty() ? "" : ","), s += hg_type_name<std::remove_cv_t<P>>::value), ...);
    return s;
}

// Call a kernel with arguments packed like cuLaunchKernel's kernelParams:
// args[k] points at the value of parameter k.
template<typename... P, std::size_t... I>
static void hg_invoke(void (*kernel)(P...), void** args, std::index_sequence<I...>)
{
    kernel(*static_cast<std::remove_cv_t<P>*>(args[I])...);
}

template<typename... P>
static void hg_launch(void (*kernel)(P...), hg_dim3 grid, hg_dim3 block, void** args)
{
    gridDim = grid;
    blockDim = block;
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx)
    for (unsigned tz = 0; tz < block.z; ++tz)
    for (unsigned ty = 0; ty < block.y; ++ty)
    for (unsigned tx = 0; tx < block.x; ++tx) {
        blockIdx = hg_dim3{bx, by, bz};
        threadIdx = hg_dim3{tx, ty, tz};
        hg_invoke(kernel, args, std::index_sequence_for<P...>{});
    }
}
"""

WRAPPER = r"""
extern "C" const char* signature_{c_name}()
{{
    static const std::string s = hg_signature(&{expression});
    return s.c_str();
}}

extern "C" void launch_{c_name}(unsigned gx, unsigned gy, unsigned gz,
                                unsigned bx, unsigned by, unsigned bz, void** args)
{{
    hg_launch(&{expression}, hg_dim3{{gx, gy, gz}}, hg_dim3{{bx, by, bz}}, args);
}}
"""

# How CuPy packs a kernel argument, as the C++ type it arrives as.
_SCALAR_TYPES = {
    np.int32: ("int", ctypes.c_int32),
    np.int64: ("long long", ctypes.c_int64),
    np.float32: ("float", ctypes.c_float),
    np.float64: ("double", ctypes.c_double),
    int: ("long long", ctypes.c_int64),
    float: ("double", ctypes.c_double),
}


def _c_name(expression):
    return re.sub(r"\W+", "_", expression).strip("_")


def _template_arguments(expression):
    """``"k<float, 4, 8>"`` -> ``["float", "4", "8"]``."""
    return [a.strip() for a in expression[expression.index("<") + 1:-1].split(",")]


def _source():
    wrappers = "".join(WRAPPER.format(c_name=_c_name(e), expression=e) for e in ALL_EXPRESSIONS)
    return EMULATION_HEADER + _cupy.KERNEL_SOURCE + LAUNCHER + wrappers


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """The kernels compiled for the CPU as a shared library."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found: the CUDA C++ source of the cupy backend is compiled on the "
                    "CPU with g++ for this test; install g++ (e.g. apt-get install g++)")
    folder = tmp_path_factory.mktemp("stencil_cupy")
    source = folder / "stencil_cupy_emulated.cpp"
    target = folder / "libstencil_cupy_emulated.so"
    source.write_text(_source())
    # -ffp-contract=off: the operations as written, no fused multiply-add where
    # the host has one (as NumPy evaluates the reference).
    command = [compiler, "-O1", "-shared", "-fPIC", "-std=c++17", "-Wall", "-Werror", "-ffp-contract=off",
               "-Wno-unknown-pragmas", "-o", str(target), str(source)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"g++ failed:\n{' '.join(command)}\n{result.stderr}"
    return ctypes.CDLL(str(target))


def _guarded(arg):
    """A NaN buffer three times ``arg``'s size with ``arg`` in the middle third,
    at the same address modulo 256 as ``arg``; returns (buffer, middle)."""
    n, item = arg.size, arg.itemsize
    raw = np.empty((3 * n + 512 // item,), arg.dtype)
    shift = (arg.ctypes.data % 256 - (raw.ctypes.data + arg.nbytes) % 256) % 256
    assert shift % item == 0
    buffer = raw[shift // item:shift // item + 3 * n]
    buffer[...] = np.nan
    buffer[n:2 * n] = arg.ravel()
    return buffer


class CpuKernel:
    """Stands in for a ``cupy.RawKernel``: ``kernel(grid, block, args)`` on the CPU."""

    def __init__(self, library, expression):
        self.expression = expression
        arguments = _template_arguments(expression)
        self.dtype = np.dtype({"float": "float32", "double": "float64"}[arguments[0]])
        self.vec = int(arguments[1])
        name = _c_name(expression)
        signature = getattr(library, f"signature_{name}")
        signature.restype = ctypes.c_char_p
        self.parameters = signature().decode().split(",")
        self.launch = getattr(library, f"launch_{name}")
        self.launch.restype = None
        self.launch.argtypes = [ctypes.c_uint] * 6 + [ctypes.POINTER(ctypes.c_void_p)]

    def __call__(self, grid, block, args):
        assert len(grid) == 3 and len(block) == 3
        assert all(isinstance(n, int) and n >= 1 for n in (*grid, *block))
        assert block[0] * block[1] * block[2] <= 1024, f"block {block} has over 1024 threads"
        assert grid[0] < 2**31 and grid[1] <= 65535 and grid[2] <= 65535, f"grid {grid} too large"
        assert len(args) == len(self.parameters), (
            f"{self.expression} takes {len(self.parameters)} arguments, got {len(args)}")
        values, guarded = [], []
        for k, (arg, parameter) in enumerate(zip(args, self.parameters)):
            if isinstance(arg, np.ndarray):
                assert parameter.endswith("*"), f"argument {k}: array passed for {parameter}"
                assert arg.dtype == self.dtype, (
                    f"argument {k}: {arg.dtype} array for {parameter} in {self.expression}")
                assert arg.flags.c_contiguous, f"argument {k}: array is not C-contiguous"
                if self.vec > 1 and arg.ndim == 2:
                    # Fields (not f_corner) are read and written in vectors.
                    width = self.vec * arg.itemsize
                    assert arg.ctypes.data % width == 0, (
                        f"argument {k}: {self.expression} got a pointer not aligned to {width} bytes")
                    assert arg.shape[1] % self.vec == 0, (
                        f"argument {k}: {self.expression} got rows of {arg.shape[1]} points")
                # Guard zones as long as the array itself, before and after.
                buffer = _guarded(arg)
                address = buffer.ctypes.data + arg.nbytes
                guarded.append((arg, buffer, parameter.startswith("const")))
                values.append(ctypes.c_void_p(address))
            else:
                assert type(arg) in _SCALAR_TYPES, f"argument {k}: CuPy cannot pass {type(arg)}"
                c_type, ctype = _SCALAR_TYPES[type(arg)]
                assert c_type == parameter, (
                    f"argument {k} of {self.expression}: CuPy would pass {arg!r} as {c_type}, "
                    f"the kernel expects {parameter}")
                values.append(ctype(arg))
        pointers = (ctypes.c_void_p * len(values))(
            *(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values))
        self.launch(*grid, *block, pointers)
        for arg, buffer, read_only in guarded:
            n = arg.size
            assert np.isnan(buffer[:n]).all() and np.isnan(buffer[2 * n:]).all(), (
                f"{self.expression} wrote outside an array")
            if read_only:
                assert np.array_equal(buffer[n:2 * n], arg.ravel(), equal_nan=True), (
                    f"{self.expression} wrote to a const array")
            else:
                arg.ravel()[...] = buffer[n:2 * n]


@pytest.fixture
def emulated(library, monkeypatch):
    """``_cupy`` with its kernels compiled by g++ instead of NVRTC."""
    kernels = {}

    def kernel(expression):
        assert expression in ALL_EXPRESSIONS, f"{expression} is not instantiated"
        if expression not in kernels:
            kernels[expression] = CpuKernel(library, expression)
        return kernels[expression]

    monkeypatch.setattr(_cupy, "_kernel", kernel)
    return _cupy


def relative_error(result, reference):
    assert np.isfinite(result).all(), "non-finite values (a read outside an array, or a point missed)"
    scale = np.abs(reference).max()
    return float(np.abs(result.astype(np.float64) - reference).max() / scale)


def random_state(rng, shape, dtype):
    """Random u, v, h; wall-normal edge velocities are left non-zero on purpose:
    both backends must treat them alike."""
    h = (1.0 + 0.2 * rng.random(shape)).astype(dtype)
    u = rng.standard_normal(shape).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    return u, v, h


def nan_like(array):
    return np.full(array.shape, np.nan, array.dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("boundary", SCALAR_BOUNDARIES, ids=str)
def test_laplacian_matches_numpy(emulated, boundary, dtype, shape, rng):
    bc = normalize_boundary(boundary, allow_dirichlet=True)
    field = rng.standard_normal(shape).astype(dtype)
    value = float(rng.standard_normal())
    ref = _numpy.laplacian(field, np.empty_like(field), 4.0, 16.0, *bc, value)
    out = nan_like(field)
    got = emulated.laplacian(field, out, 4.0, 16.0, *bc, value)
    assert got is out and got.dtype == dtype
    assert relative_error(got, ref) <= max(tolerance("cupy", dtype), 1e-15) * 8


@pytest.mark.parametrize("steps", [1, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("boundary", SCALAR_BOUNDARIES, ids=str)
def test_diffuse_matches_numpy(emulated, boundary, dtype, shape, steps, rng):
    bc = normalize_boundary(boundary, allow_dirichlet=True)
    field = rng.standard_normal(shape).astype(dtype)
    value = float(rng.standard_normal())
    ref = _numpy.diffuse(field.copy(), np.empty_like(field), 0.3, 0.15, steps, *bc, value)
    work_field, work = field.copy(), nan_like(field)
    got = emulated.diffuse(work_field, work, 0.3, 0.15, steps, *bc, value)
    assert got is (work if steps % 2 else work_field)
    assert relative_error(got, ref) <= max(tolerance("cupy", dtype), 1e-15) * 8


def test_diffusion_conserves_the_total_over_thousands_of_float32_steps(emulated, rng):
    """As ``test_stencil.py`` checks every backend: 2000 periodic float32 steps keep the
    total to 4e-9 per step. The source evaluates ``physics.diffusion_update``'s
    operations in its order, so (without contraction) it is bitwise the reference."""
    field = (1.0 + rng.random((64, 64))).astype(np.float32)
    steps = 2000
    got = emulated.diffuse(field.copy(), np.empty_like(field), 0.2, 0.2, steps, 0, 0, 0)
    total = field.sum(dtype=np.float64)
    drift = abs(got.sum(dtype=np.float64) - total) / total
    assert drift <= 4e-9 * steps, f"relative change of the total after {steps} steps: {drift:.3g}"
    np.testing.assert_array_equal(got, _numpy.diffuse(field.copy(), np.empty_like(field), 0.2, 0.2, steps, 0, 0, 0))


@pytest.mark.parametrize("nu", [0.05, 0.0], ids=["viscous", "inviscid"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_shallow_water_tendency_matches_numpy(emulated, boundary, dtype, shape, nu, rng):
    bc = normalize_boundary(boundary)
    u, v, h = random_state(rng, shape, dtype)
    f_corner = rng.uniform(0.5, 2.0, shape[0] + 1).astype(dtype)
    args = (f_corner, 9.81, 1 / 0.7, 1 / 1.3, nu, *bc)
    reference = _numpy.shallow_water_tendency(u, v, h, *args)
    result = emulated.shallow_water_tendency(u, v, h, *args)
    for name, got, ref in zip("uvh", result, reference):
        assert got.dtype == dtype
        err = relative_error(got, ref)
        assert err <= tolerance("cupy", dtype) * 50 + 1e-15, f"d{name}: {err}"
    if bc[0] == 1:
        assert (result[0][:, 0] == 0).all()
    if bc[1] == 1:
        assert (result[1][0, :] == 0).all()


@pytest.mark.parametrize("coefficients", [(0.0, 1.0, 0.3), (0.75, 0.25, 0.075)], ids=["first", "later"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_shallow_water_stage_matches_numpy(emulated, boundary, dtype, shape, coefficients, rng):
    bc = normalize_boundary(boundary)
    a, b, c = coefficients
    state0 = random_state(rng, shape, dtype)
    state = random_state(rng, shape, dtype)
    f_corner = rng.uniform(-1.0, 1.0, shape[0] + 1).astype(dtype)
    params = (f_corner, 2.0, 1.0 / 0.9, 1.0 / 1.1, 0.01, a, b, c, *bc)
    out_ref = tuple(np.empty(shape, dtype) for _ in range(3))
    _numpy.shallow_water_stage(*state0, *state, *out_ref, *params)
    out = tuple(nan_like(x) for x in state)
    emulated.shallow_water_stage(*state0, *state, *out, *params)
    for name, got, ref in zip("uvh", out, out_ref):
        err = relative_error(got, ref)
        assert err <= tolerance("cupy", dtype) * 50 + 1e-15, f"{name}: {err}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_first_stage_does_not_read_state0(emulated, dtype, rng):
    shape = (12, 10)
    state = random_state(rng, shape, dtype)
    state0 = tuple(nan_like(x) for x in state)
    out = tuple(nan_like(x) for x in state)
    emulated.shallow_water_stage(*state0, *state, *out, np.ones(13, dtype), 1.0, 1.0, 1.0, 0.0,
                                 0.0, 1.0, 0.5, 0, 1, 1)
    assert all(np.isfinite(x).all() for x in out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_arrays_are_read_and_written_correctly(emulated, dtype, rng):
    """Views that are not C-contiguous go through contiguous copies, both ways."""
    bc = normalize_boundary(("periodic", "wall"))
    big = rng.standard_normal((3, 20, 30)).astype(dtype)
    u, v = big[0, ::2, ::2], big[1, ::2, :15]
    h = np.asfortranarray(1.5 + 0.2 * big[2, :10, :15])
    f_corner = np.linspace(-1.0, 1.0, 11).astype(dtype)
    params = (f_corner, 2.0, 1.0, 1.0, 0.01, 0.5, 0.5, 0.1, *bc)
    out_ref = tuple(np.empty((10, 15), dtype) for _ in range(3))
    _numpy.shallow_water_stage(u, v, h, u, v, h, *out_ref, *params)
    holder = np.full((3, 10, 30), np.nan, dtype)
    out = tuple(holder[k, :, ::2] for k in range(3))
    emulated.shallow_water_stage(u, v, h, u, v, h, *out, *params)
    for got, ref in zip(out, out_ref):
        assert relative_error(got, ref) <= tolerance("cupy", dtype) * 50 + 1e-15
    assert np.isnan(holder[:, :, 1::2]).all()

    field = np.asfortranarray(big[0, :10, :15])
    ref = _numpy.laplacian(field, np.empty((10, 15), dtype), 1.0, 1.0, *bc)
    lap = holder[0, :, 1::2]
    assert emulated.laplacian(field, lap, 1.0, 1.0, *bc) is lap
    assert relative_error(lap, ref) <= max(tolerance("cupy", dtype), 1e-15) * 8

    for steps in (1, 2):
        ref = _numpy.diffuse(field.copy(), np.empty((10, 15), dtype), 0.2, 0.2, steps, *bc)
        src, work = field.copy(order="F"), holder[2, :, 1::2]
        got = emulated.diffuse(src, work, 0.2, 0.2, steps, *bc)
        assert got is src or got is work
        assert relative_error(got, ref) <= max(tolerance("cupy", dtype), 1e-15) * 8


# Shapes around the launch shapes: ny a multiple of no strip height (and one
# row over 32), a row wider than the widest block (256 threads x 4 columns),
# a grid narrower and shorter than a block and a strip (nx not a multiple of
# 4, so vec-4 launches fall back to their scalar instance), a single vector.
LAUNCH_SHAPES = [(37, 20), (5, 1032), (6, 6), (33, 4)]
LAUNCH_BOUNDARIES = ["periodic", ("wall", "open", "wall"), ("periodic", "wall", "open")]
FIVE_POINT_LAUNCH_BOUNDARIES = LAUNCH_BOUNDARIES + [("dirichlet", "wall", "dirichlet"),
                                                    ("periodic", "dirichlet", "open")]


def _launch_cases(family):
    return [pytest.param(dtype_name, launch, id=f"{dtype_name}-vec{launch.vec}-rows{launch.rows}-"
                                                f"threads{launch.threads}")
            for (fam, dtype_name), default in _cupy.LAUNCH.items() if fam == family
            for launch in (default, *_cupy.VARIANTS[(fam, dtype_name)])]


@pytest.mark.parametrize("boundary", FIVE_POINT_LAUNCH_BOUNDARIES, ids=str)
@pytest.mark.parametrize("shape", LAUNCH_SHAPES, ids=str)
@pytest.mark.parametrize("dtype_name, launch", _launch_cases("five_point"))
def test_every_five_point_launch_matches_numpy(emulated, dtype_name, launch, shape, boundary, rng):
    bc = normalize_boundary(boundary, allow_dirichlet=True)
    dtype = np.dtype(dtype_name)
    field = rng.standard_normal(shape).astype(dtype)
    value = float(rng.standard_normal())
    for name, reference in (
            ("laplacian_kernel", _numpy.laplacian(field, np.empty_like(field), 4.0, 16.0, *bc, value)),
            ("diffuse_kernel", _numpy.diffuse(field.copy(), np.empty_like(field), 0.3, 0.15, 1, *bc, value))):
        c_x, c_y = (4.0, 16.0) if name == "laplacian_kernel" else (0.3, 0.15)
        out = nan_like(field)
        emulated._five_point(name, field, out, c_x, c_y, bc[0], bc[1], launch, bc_n=bc[2], value=value)
        assert relative_error(out, reference) <= max(tolerance("cupy", dtype), 1e-15) * 8, name


@pytest.mark.parametrize("boundary", LAUNCH_BOUNDARIES, ids=str)
@pytest.mark.parametrize("shape", LAUNCH_SHAPES, ids=str)
@pytest.mark.parametrize("dtype_name, launch", _launch_cases("stage"))
def test_every_stage_launch_matches_numpy(emulated, dtype_name, launch, shape, boundary, rng):
    bc = normalize_boundary(boundary)
    dtype = np.dtype(dtype_name)
    state0 = random_state(rng, shape, dtype)
    state = random_state(rng, shape, dtype)
    f_corner = rng.uniform(-1.0, 1.0, shape[0] + 1).astype(dtype)
    params = (f_corner, 2.0, 1.0 / 0.9, 1.0 / 1.1, 0.01, 0.75, 0.25, 0.075, *bc)
    out_ref = tuple(np.empty(shape, dtype) for _ in range(3))
    _numpy.shallow_water_stage(*state0, *state, *out_ref, *params)
    out = tuple(nan_like(x) for x in state)
    emulated._stage(*state0, *state, *out, *params, launch=launch)
    for name, got, ref in zip("uvh", out, out_ref):
        err = relative_error(got, ref)
        assert err <= tolerance("cupy", dtype) * 50 + 1e-15, f"{name}: {err}"


@pytest.mark.parametrize("cols", [(4, 20), (3, 17), (0, 24), (8, 24)], ids=str)
@pytest.mark.parametrize("dtype_name, launch", _launch_cases("stage"))
def test_every_stage_launch_steps_a_column_window_alone(emulated, dtype_name, launch, cols, rng):
    """A window of columns (whole vectors or not) is stepped as if it were the whole grid, through the
    arrays' own row stride; the columns outside it are not written (the launcher's guards see any read
    beyond the arrays)."""
    lo, hi = cols
    bc = normalize_boundary(("open", "wall", "open"))
    dtype = np.dtype(dtype_name)
    shape = (21, 24)
    state0 = random_state(rng, shape, dtype)
    state = random_state(rng, shape, dtype)
    f_corner = rng.uniform(-1.0, 1.0, shape[0] + 1).astype(dtype)
    params = (f_corner, 2.0, 1.0 / 0.9, 1.0 / 1.1, 0.01, 0.75, 0.25, 0.075, *bc)
    out_ref = tuple(np.empty((shape[0], hi - lo), dtype) for _ in range(3))
    _numpy.shallow_water_stage(*(np.ascontiguousarray(x[:, lo:hi]) for x in (*state0, *state)), *out_ref, *params)
    out = tuple(nan_like(x) for x in state)
    emulated._stage(*state0, *state, *out, *params, launch=launch, cols=cols)
    for name, got, ref in zip("uvh", out, out_ref):
        err = relative_error(got[:, lo:hi], ref)
        assert err <= tolerance("cupy", dtype) * 50 + 1e-15, f"{name}: {err}"
        assert np.isnan(got[:, :lo]).all() and np.isnan(got[:, hi:]).all(), name


def _unaligned(array):
    """A C-contiguous copy of ``array`` one element past a 256-byte boundary."""
    raw = np.empty(array.size + 512 // array.itemsize, array.dtype)
    start = (-raw.ctypes.data % 256) // array.itemsize + 1
    out = raw[start:start + array.size].reshape(array.shape)
    out[...] = array
    assert out.flags.c_contiguous and out.ctypes.data % 16
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unaligned_arrays_run_the_scalar_instances(emulated, dtype, rng):
    """Contiguous views off the vector alignment are computed right, by the vec = 1
    instances (the emulated launcher rejects unaligned pointers for vector ones)."""
    shape = (19, 64)
    bc = normalize_boundary(("periodic", "wall"))
    for family in ("five_point", "stage"):
        launch = _cupy.LAUNCH[(family, dtype.name)]
        aligned = np.empty(shape, dtype)
        assert _cupy._fitting(launch, shape[1], (aligned,)).vec == launch.vec
        assert _cupy._fitting(launch, shape[1], (aligned, _unaligned(aligned))).vec == 1
        assert _cupy._fitting(launch, shape[1] + 1, (aligned,)).vec == 1
    field = _unaligned(rng.standard_normal(shape).astype(dtype))
    ref = _numpy.laplacian(field, np.empty_like(field), 1.0, 1.0, *bc)
    out = _unaligned(np.full(shape, np.nan, dtype))
    assert emulated.laplacian(field, out, 1.0, 1.0, *bc) is out
    assert relative_error(out, ref) <= max(tolerance("cupy", dtype), 1e-15) * 8
    state = tuple(_unaligned(x) for x in random_state(rng, shape, dtype))
    params = (np.linspace(-1.0, 1.0, shape[0] + 1).astype(dtype), 2.0, 1.0, 1.0, 0.01,
              0.5, 0.5, 0.1, *bc)
    out_ref = tuple(np.empty(shape, dtype) for _ in range(3))
    _numpy.shallow_water_stage(*state, *state, *out_ref, *params)
    out = tuple(_unaligned(np.full(shape, np.nan, dtype)) for _ in range(3))
    emulated.shallow_water_stage(*state, *state, *out, *params)
    for got, ref in zip(out, out_ref):
        assert relative_error(got, ref) <= tolerance("cupy", dtype) * 50 + 1e-15


def test_grid_covers_the_array_with_whole_blocks():
    for launch in {*_cupy.LAUNCH.values(), *(v for vs in _cupy.VARIANTS.values() for v in vs)}:
        columns = launch.threads * launch.vec
        for ny, nx in [(4, 4), (8, 32), (9, 33), (1000, 777), (17, 4096)]:
            gx, gy, gz = _cupy._grid(ny, nx, launch)
            assert gz == 1
            assert (gx - 1) * columns < nx <= gx * columns
            assert (gy - 1) * launch.rows < ny <= gy * launch.rows
        assert _cupy._grid(_cupy.MAX_GRID_Y * launch.rows, 4, launch)[1] == _cupy.MAX_GRID_Y
        with pytest.raises(ValueError, match="ny="):
            _cupy._grid(_cupy.MAX_GRID_Y * launch.rows + 1, 4, launch)


def test_every_kernel_is_instantiated_for_both_dtypes():
    for name in _cupy.KERNELS:
        assert f"__global__ void {name}(" in _cupy.KERNEL_SOURCE
        for ctype in ("float", "double"):
            assert any(e.startswith(f"{name}<{ctype},") for e in _cupy.NAME_EXPRESSIONS)
    # Each default launch has its instance and the vec = 1 fallback for unaligned arrays.
    for (family, dtype_name), launch in _cupy.LAUNCH.items():
        for name in _cupy.FAMILIES[family]:
            for vec in (1, launch.vec):
                assert _cupy._expression(name, dtype_name, vec, launch.rows) in _cupy.NAME_EXPRESSIONS
    assert not set(_cupy.NAME_EXPRESSIONS) & set(_cupy.VARIANT_EXPRESSIONS)


def test_vector_width_is_sixteen_bytes_at_most():
    """sm_90 loads at most 16 bytes per thread per instruction."""
    for launches in ([*_cupy.LAUNCH.items()], [(k, v) for k, vs in _cupy.VARIANTS.items() for v in vs]):
        for (family, dtype_name), launch in launches:
            assert launch.vec * np.dtype(dtype_name).itemsize <= 16, (family, dtype_name, launch)
            assert launch.threads % 32 == 0 and launch.threads <= 1024


def test_import_does_not_load_cupy():
    """Importing the backend must not import CuPy or touch a GPU (DESIGN.md)."""
    code = ("import sys, hpcgpu.kernels.stencil._cupy as m; "
            "assert 'cupy' not in sys.modules, 'cupy imported'; print(len(m.KERNEL_SOURCE))")
    result = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_source_compiles_for_the_gpu_with_nvcc(tmp_path):
    """Where nvcc is installed, the source also compiles as real CUDA (sm_90, no warnings).

    NVRTC (what CuPy uses) and nvcc share the front end; this catches device
    code that g++ accepts but CUDA does not, without needing a GPU.
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: the CUDA compile check needs the CUDA toolkit")
    instances = ", ".join(f"(void*)&{e}" for e in ALL_EXPRESSIONS)
    source = tmp_path / "stencil_cupy.cu"
    source.write_text(_cupy.KERNEL_SOURCE + f"\nvoid* hpcgpu_instances[] = {{{instances}}};\n")
    command = [nvcc, "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v",
               "-Werror", "all-warnings", "-o", str(tmp_path / "stencil_cupy.cubin"), str(source)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"nvcc failed:\n{' '.join(command)}\n{result.stderr}"
    # Every kernel keeps its neighbourhood in registers: no stack, no spills.
    usage = [line.strip() for line in result.stderr.splitlines() if "spill stores" in line]
    assert len(usage) == len(ALL_EXPRESSIONS), result.stderr
    for line in usage:
        assert line.startswith("0 bytes stack frame, 0 bytes spill stores"), line
