"""Stencil kernels for the GPU as CuPy ``RawModule`` CUDA C++ kernels.

Every kernel gives each thread ``vec`` adjacent columns and a strip of
``rows`` rows, and runs blocks of ``threads`` threads along x (so a warp
reads 32 * ``vec`` neighbouring points of a row, coalesced, in one vector load
of 16 bytes per thread when ``vec`` is 4 in float or 2 in double). A thread
walks its strip northwards and keeps the rows it still needs in registers:

- ``laplacian`` and ``diffuse`` load the whole strip first (``rows + 2``
  vector loads and two scalar neighbour loads per row), so many bytes are in
  flight per thread, then compute and store it: one DRAM read and one write
  per point, plus the two halo rows per strip.
- ``shallow_water_stage`` is one fused pass per Runge-Kutta stage that
  pipelines rows as ``_numba._stage_kernel`` does: per row it computes the
  potential vorticity of one new corner row, the mass fluxes, the Bernoulli
  potential and the Arakawa-Lamb coefficients of one new cell row, for its
  columns and the one or two neighbours the stencil reaches, and carries the
  rows behind it in registers.

Vector kernels need every array aligned to the vector and ``nx`` a multiple
of ``vec``; other arrays run the ``vec = 1`` instance of the same template.
The launch shapes are :data:`LAUNCH` (per kernel family and dtype), with
alternatives in :data:`VARIANTS` that ``scripts/gpu_kernel_variants.py``
times against them.

The per-point physics mirrors ``physics`` as ``__device__`` functions and
the ghost rules mirror ``_numba``: periodic edges wrap, wall and open edges
clamp, the normal velocity beyond a wall is zero, and beyond a Dirichlet
edge (scalar kernels only) the five-point kernels use the boundary value.

The stage kernel's registers are capped per instance (``sw_stage_tuning``
in the source, ``__maxnreg__``: CUDA >= 12.4) at the fewest that compile
without spilling at the next occupancy step: 64 / 96 / 168 for float with
vec 1 / 2 / 4, 128 for double with vec 1 (50, 31, 19 and 25 % occupancy,
from 31, 25, 12.5 and 19 %), at the cost of loading ``u0, v0, h0`` just
before the row's store and not unrolling the row loop by two. ptxas then
fuses one more multiply-add per row into an FMA than the unrolled loop did
(which alternated between even and odd rows), so these instances differ
from the previous ones by rounding (within the float32 / float64 tolerances
against NumPy), not bit for bit.

The CUDA source is the string :data:`KERNEL_SOURCE` (written in
:mod:`.device_source_cupy` and :mod:`.kernel_source_cupy`; templates on the float
type, vector width and strip height; no headers, no shared memory, no
``__syncthreads``, no warp shuffles), compiled by NVRTC on first use through
a cached :class:`cupy.RawModule`. Importing this module does not import CuPy
or touch the GPU. The tests compile the same text on the CPU with g++ and run
it thread by thread (``tests/kernels/test_stencil_cupy_source.py``).
"""

from typing import NamedTuple

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import launch_limits
from hpcgpu.kernels.cupy_templates import TemplateKernels, array_module
from hpcgpu.kernels.stencil.kernel_source_cupy import KERNEL_SOURCE


class StencilCupyLaunch(NamedTuple):
    """How a kernel family is launched for one dtype."""

    vec: int
    """Adjacent columns per thread (values per vector load)."""
    rows: int
    """Rows per thread: the height of the strip a thread walks."""
    threads: int
    """Threads per block, all along x."""


OPTIONS = ("--std=c++17",)
"""NVRTC options of the module."""

CTYPES = {"float32": "float", "float64": "double"}
"""C++ type of each supported NumPy dtype (the template argument)."""

FAMILIES = {"five_point": ("laplacian_kernel", "diffuse_kernel"), "stage": ("sw_stage_kernel",)}
"""The ``__global__`` templates of :data:`KERNEL_SOURCE`, by launch family."""

KERNELS = tuple(name for names in FAMILIES.values() for name in names)

LAUNCH = {
    ("five_point", "float32"): StencilCupyLaunch(vec=4, rows=8, threads=128),
    ("five_point", "float64"): StencilCupyLaunch(vec=2, rows=8, threads=128),
    ("stage", "float32"): StencilCupyLaunch(vec=2, rows=16, threads=128),
    ("stage", "float64"): StencilCupyLaunch(vec=1, rows=16, threads=128),
}
"""The launch of each kernel family per dtype (vec falls back to 1 when unaligned)."""

VARIANTS = {
    ("five_point", "float32"): (StencilCupyLaunch(1, 8, 128), StencilCupyLaunch(2, 8, 128),
                                StencilCupyLaunch(4, 4, 128), StencilCupyLaunch(4, 16, 128),
                                StencilCupyLaunch(4, 8, 256), StencilCupyLaunch(4, 8, 64)),
    ("five_point", "float64"): (StencilCupyLaunch(1, 8, 128), StencilCupyLaunch(2, 4, 128),
                                StencilCupyLaunch(2, 16, 128), StencilCupyLaunch(2, 8, 256),
                                StencilCupyLaunch(2, 8, 64)),
    ("stage", "float32"): (StencilCupyLaunch(1, 16, 128), StencilCupyLaunch(4, 16, 128), StencilCupyLaunch(2, 8, 128),
                           StencilCupyLaunch(2, 32, 128), StencilCupyLaunch(2, 16, 64),
                           StencilCupyLaunch(2, 16, 256)),
    ("stage", "float64"): (StencilCupyLaunch(2, 16, 128), StencilCupyLaunch(1, 8, 128), StencilCupyLaunch(1, 32, 128),
                           StencilCupyLaunch(1, 16, 64), StencilCupyLaunch(1, 16, 256)),
}
"""Alternative launches, timed by ``scripts/gpu_kernel_variants.py``."""


def _expression(name, dtype_name, vec, rows):
    """The template instance of kernel ``name``: ``rows`` is a template argument
    of the five-point kernels only (the stage kernel takes it at run time)."""
    ctype = CTYPES[dtype_name]
    if name in FAMILIES["stage"]:
        return f"{name}<{ctype}, {vec}>"
    return f"{name}<{ctype}, {vec}, {rows}>"


def _instances(launches):
    """Template instances that ``launches`` (a {(family, dtype): [StencilCupyLaunch]} map) run,
    the ``vec = 1`` fallback of each included."""
    out = []
    for (family, dtype_name), options in launches.items():
        for launch in options:
            for vec in sorted({1, launch.vec}):
                for name in FAMILIES[family]:
                    expression = _expression(name, dtype_name, vec, launch.rows)
                    if expression not in out:
                        out.append(expression)
    return tuple(out)


NAME_EXPRESSIONS = _instances({key: (launch,) for key, launch in LAUNCH.items()})
"""Template instances of the default launches, as passed to ``get_function``."""

VARIANT_EXPRESSIONS = tuple(e for e in _instances(VARIANTS) if e not in NAME_EXPRESSIONS)
"""Further instances that only :data:`VARIANTS` use (a second module, compiled on demand)."""


_xp = array_module


_TEMPLATES = TemplateKernels(KERNEL_SOURCE, OPTIONS, NAME_EXPRESSIONS, VARIANT_EXPRESSIONS,
                             hint="add its launch to LAUNCH or VARIANTS")
_kernel = _TEMPLATES.kernel
"""The compiled template instance of an expression (the emulation tests replace it)."""


MAX_GRID_Y = 65535
"""CUDA's limit on blocks along y: caps ny at 65535 * rows."""


def _grid(ny, nx, launch):
    """Blocks (x, y, z) covering an (ny, nx) grid with ``launch``."""
    # No shared memory (the source declares none): the strips live in registers.
    launch_limits.check("the cupy stencil kernels", launch, launch.threads)
    grid = (-(-nx // (launch.threads * launch.vec)), -(-ny // launch.rows), 1)
    if grid[1] > MAX_GRID_Y:
        raise ConfigError(f"the cupy stencil kernels take at most {MAX_GRID_Y * launch.rows} rows "
                          f"per array; got ny={ny}. Split the grid into partitions along y")
    return grid


def _address(array):
    if isinstance(array, np.ndarray):
        return array.ctypes.data
    return array.data.ptr


def _fitting(launch, nx, arrays):
    """``launch``, or its ``vec = 1`` form unless every array is aligned to the
    vector and rows hold whole vectors."""
    if launch.vec == 1:
        return launch
    width = launch.vec * arrays[0].dtype.itemsize
    if nx % launch.vec or any(_address(a) % width for a in arrays):
        return launch._replace(vec=1)
    return launch


def _launch(name, family, arrays, shape, args, launch=None):
    """Run kernel ``name`` of ``family`` over an (ny, nx) grid; ``arrays`` are
    the pointers it reads or writes with vector accesses."""
    dtype_name = arrays[0].dtype.name
    ny, nx = shape
    launch = _fitting(launch or LAUNCH[(family, dtype_name)], nx, arrays)
    kernel = _kernel(_expression(name, dtype_name, launch.vec, launch.rows))
    kernel(_grid(ny, nx, launch), (launch.threads, 1, 1), args)


def _float_type(array):
    """The NumPy scalar type that kernel scalars are passed with."""
    if array.dtype.name not in CTYPES:
        raise ConfigError(f"stencil kernels take float32 or float64 arrays; got dtype {array.dtype}")
    return array.dtype.type


def _input(array, like):
    """``array`` as a C-contiguous array on ``like``'s device with its dtype.

    Copies only when needed (host arrays, other dtypes, strided views): the
    kernels index raw row-major memory.
    """
    xp = _xp(like)
    return xp.ascontiguousarray(xp.asarray(array, dtype=like.dtype))


def _target(out, dtype):
    """Where a kernel writes ``out``: itself, or a scratch array to copy back."""
    if out.dtype == dtype and out.flags.c_contiguous:
        return out
    return _xp(out).empty(out.shape, dtype)


def _five_point(name, src, dst, c_x, c_y, bc_x, bc_s, launch=None, *, bc_n=None, value=0.0):
    """One five-point kernel from ``src`` into ``dst`` (contiguous, same dtype).

    ``bc_n`` is the north edge's kind (default ``bc_s``'s: for a scalar field
    only a Dirichlet edge tells the two apart); ``value`` is the field beyond
    Dirichlet edges.
    """
    t = src.dtype.type
    ny, nx = src.shape
    bc_n = bc_s if bc_n is None else bc_n
    _launch(name, "five_point", (src, dst), src.shape,
            (src, dst, np.int32(ny), np.int32(nx), t(c_x), t(c_y), np.int32(bc_x), np.int32(bc_s),
             np.int32(bc_n), t(value)),
            launch)


def laplacian(field, out, rdx2, rdy2, bc_x, bc_s, bc_n, value=0.0):
    """Five-point Laplacian into ``out``; see ``_numpy.laplacian``."""
    _float_type(field)
    field = _input(field, field)
    target = _target(out, field.dtype)
    _five_point("laplacian_kernel", field, target, rdx2, rdy2, bc_x, bc_s, bc_n=bc_n, value=value)
    if target is not out:
        out[...] = target
    return out


def diffuse(field, work, cx, cy, steps, bc_x, bc_s, bc_n, value=0.0):
    """``steps`` explicit diffusion steps; returns the buffer holding the result.

    Beyond a Dirichlet edge the field is ``value``.
    """
    _float_type(field)
    dtype = field.dtype
    src, dst = _target(field, dtype), _target(work, dtype)
    if src is not field:
        src[...] = field
    for _ in range(int(steps)):
        _five_point("diffuse_kernel", src, dst, cx, cy, bc_x, bc_s, bc_n=bc_n, value=value)
        src, dst = dst, src
    if src is field or src is work:
        return src
    field[...] = src
    return field


def _stage(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner, g, rdx, rdy, nu, a, b, c,
           bc_x, bc_s, bc_n, launch=None, cols=None):
    """The stage kernel on contiguous arrays of one dtype (``*0`` unread when ``a == 0``), columns ``cols``.

    The kernel steps the window ``cols`` as if it were the whole grid,
    indexing it from its first column with the arrays' own row stride.
    """
    t = h.dtype.type
    ny, pitch = h.shape
    c0, c1 = (0, pitch) if cols is None else cols
    vectors = (u, v, h, u_out, v_out, h_out) + ((u0, v0, h0) if a != 0 else ())
    launch = _fitting(launch or LAUNCH[("stage", h.dtype.name)], c1 - c0, vectors)
    if pitch % launch.vec or c0 % launch.vec:  # the window's rows must start on whole vectors too
        launch = launch._replace(vec=1)
    _launch("sw_stage_kernel", "stage", vectors, (ny, c1 - c0),
            (u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner,
             np.int32(ny), np.int32(c1 - c0), np.int32(pitch), np.int32(c0), np.int32(launch.rows),
             t(g), t(rdx), t(rdy), t(nu),
             t(a), t(b), t(c), t(rdx / (24.0 * rdy)), t(rdy / (24.0 * rdx)),
             np.int32(bc_x), np.int32(bc_s), np.int32(bc_n)),
            launch)


def shallow_water_stage(u0, v0, h0, u, v, h, u_out, v_out, h_out,
                        f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n, cols=None):
    """Fused RK stage ``out = a*state0 + b*state + c*tendency(state)``; see ``_numpy``.

    ``cols = (lo, hi)`` steps only those columns, as if they were the whole grid.
    """
    _float_type(h)
    dtype = h.dtype
    u, v, h = (_input(x, h) for x in (u, v, h))
    if a == 0:
        u0, v0, h0 = u, v, h  # valid pointers; the kernel does not read them
    else:
        u0, v0, h0 = (_input(x, h) for x in (u0, v0, h0))
    f_corner = _input(f_corner, h)
    outs = (u_out, v_out, h_out)
    targets = tuple(_target(o, dtype) for o in outs)
    _stage(u0, v0, h0, u, v, h, *targets, f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n, cols=cols)
    window = (slice(None), slice(None) if cols is None else slice(*cols))
    for out, target in zip(outs, targets):
        if target is not out:
            out[window] = target[window]


def shallow_water_tendency(u, v, h, f_corner, g, rdx, rdy, nu, bc_x, bc_s, bc_n):
    """Tendencies ``(du, dv, dh)``; see ``_numpy.shallow_water_tendency``."""
    xp = _xp(h)
    du, dv, dh = (xp.empty(h.shape, h.dtype) for _ in range(3))
    shallow_water_stage(u, v, h, u, v, h, du, dv, dh, f_corner, g, rdx, rdy, nu,
                        0.0, 0.0, 1.0, bc_x, bc_s, bc_n)
    return du, dv, dh
