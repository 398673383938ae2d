"""The cupy N-body backend's CUDA C++ source and launch code, run on the CPU.

CuPy needs a GPU, so ``test_nbody.py`` checks the cupy backend only on a GPU
machine. Here the same source text, ``_cupy.KERNEL_SOURCE``, is compiled with
g++ behind the emulation header of ``_cuda_emulator``, which runs each
block's threads one at a time between barriers (so the tiled kernel's shared
memory and ``__syncthreads`` are exercised, and a missing barrier shows up
as a wrong result). The launches go through ``_cupy``'s own Python code:
only ``_cupy._kernel`` (which would compile with NVRTC) is replaced, so
argument order, scalar types, grids and the slice bookkeeping are tested too.
"""

import shutil
import subprocess
import sys

import numpy as np
import pytest
from _cuda_emulator import CpuKernel, compile_library
from _support import tolerance

from hpcgpu.kernels.nbody import _cupy, _numpy, tiling

ALL_EXPRESSIONS = _cupy.NAME_EXPRESSIONS + _cupy.VARIANT_EXPRESSIONS
DTYPES = [np.dtype("float32"), np.dtype("float64")]


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """The kernels compiled for the CPU as a shared library."""
    return compile_library(_cupy.KERNEL_SOURCE, ALL_EXPRESSIONS,
                           tmp_path_factory.mktemp("nbody_cupy"), "nbody_cupy_emulated")


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
    monkeypatch.setattr(_cupy, "emulated_kernels", kernels, raising=False)
    return _cupy


def _launch_cases():
    return [pytest.param(launch, id=f"threads{launch.threads}-tiles{launch.min_tiles}-"
                                    f"slices{launch.max_slices}")
            for launch in dict.fromkeys((tiling.LAUNCH["float64"], *tiling.VARIANTS["float64"]))]


def _size(launch):
    """Bodies for ``launch``: over two blocks, a partial last tile, and at least two slices."""
    length, _ = tiling.slices(1, launch)
    return max(2 * launch.threads, length) + launch.threads // 2 + 3


def _bodies(rng, n, dtype):
    positions = rng.standard_normal((3, n)).astype(dtype)
    masses = rng.uniform(0.5, 1.5, n).astype(dtype)
    return positions, masses


def _reference(targets, positions, masses, eps2, G, self_offset, potential):
    m = targets.shape[1]
    acc = np.empty((3, m), positions.dtype)
    pot = np.empty(m, positions.dtype) if potential else None
    _numpy.direct(targets, positions, masses, eps2, G, self_offset, acc, pot)
    return acc, pot


def _relative_error(got, ref):
    assert np.isfinite(got).all(), "non-finite values (a read outside an array, or a target missed)"
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("launch", _launch_cases())
@pytest.mark.parametrize("potential", [False, True], ids=["acc", "acc+pot"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_direct_matches_numpy(emulated, dtype, potential, launch, rng):
    n = _size(launch)
    positions, masses = _bodies(rng, n, dtype)
    outside = rng.standard_normal((3, 5)).astype(dtype) * 3
    cases = [(positions, 0), (positions[:, 7:n - 9], 7), (outside, -1)]
    for targets, self_offset in cases:
        ref_acc, ref_pot = _reference(targets, positions, masses, 1e-2, 0.7, self_offset, potential)
        m = targets.shape[1]
        acc = np.full((3, m), np.nan, dtype)
        pot = np.full(m, np.nan, dtype) if potential else None
        assert emulated._direct(targets, positions, masses, 1e-2, 0.7, self_offset, acc, pot,
                                launch) is acc
        assert _relative_error(acc, ref_acc) <= tolerance("cupy", dtype)
        if potential:
            assert _relative_error(pot, ref_pot) <= tolerance("cupy", dtype)


def test_the_sources_are_cut_into_slices(emulated, rng):
    """The size of _size() makes every launch run several target blocks and slices."""
    for param in _launch_cases():
        launch = param.values[0]
        n = _size(launch)
        positions, masses = _bodies(rng, n, np.dtype("float64"))
        acc = np.empty((3, n))
        emulated._direct(positions, positions, masses, 1e-2, 1.0, 0, acc, None, launch)
        kernel = emulated.emulated_kernels[_cupy._direct_expression("float64", launch.threads, False)]
        grid, block = kernel.launches[-1]
        assert grid[0] >= 2 and grid[1] >= 2 and block == (launch.threads, 1, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_default_entry_point(emulated, dtype, rng):
    positions, masses = _bodies(rng, 300, dtype)
    ref_acc, ref_pot = _reference(positions, positions, masses, 0.0, 1.0, 0, True)
    acc, pot = np.empty((3, 300), dtype), np.empty(300, dtype)
    emulated.direct(positions, positions, masses, 0.0, 1.0, 0, acc, pot)
    assert _relative_error(acc, ref_acc) <= tolerance("cupy", dtype)
    assert _relative_error(pot, ref_pot) <= tolerance("cupy", dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sub_range_targets_are_bitwise_equal(emulated, dtype, rng):
    """A target's sums do not depend on the other targets of the call."""
    launch = tiling.VARIANTS[dtype.name][-1]
    n = _size(launch)
    positions, masses = _bodies(rng, n, dtype)
    acc, pot = np.empty((3, n), dtype), np.empty(n, dtype)
    emulated._direct(positions, positions, masses, 1e-3, 1.0, 0, acc, pot, launch)
    for start, stop in [(0, 1), (5, 40), (33, n)]:
        part_acc, part_pot = np.empty((3, stop - start), dtype), np.empty(stop - start, dtype)
        emulated._direct(positions[:, start:stop], positions, masses, 1e-3, 1.0, start,
                         part_acc, part_pot, launch)
        np.testing.assert_array_equal(part_acc, acc[:, start:stop])
        np.testing.assert_array_equal(part_pot, pot[start:stop])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_coincident_bodies_without_softening_contribute_nothing(emulated, dtype):
    positions = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype)
    masses = np.array([1.0, 2.0, 4.0], dtype)
    acc, pot = np.empty((3, 3), dtype), np.empty(3, dtype)
    emulated._direct(positions, positions, masses, 0.0, 1.0, 0, acc, pot, tiling.VARIANTS[dtype.name][-1])
    np.testing.assert_allclose(acc[0], [4.0, 4.0, -3.0], rtol=1e-6)
    np.testing.assert_allclose(pot, [-4.0, -4.0, -3.0], rtol=1e-6)
    assert (acc[1:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_outputs_are_written_through_copies(emulated, dtype, rng):
    positions, masses = _bodies(rng, 50, dtype)
    ref_acc, ref_pot = _reference(positions, positions, masses, 1e-2, 1.0, 0, True)
    holder = np.full((4, 100), np.nan, dtype)
    acc, pot = holder[:3, ::2], holder[3, 1::2]
    emulated.direct(np.asfortranarray(positions), positions, masses, 1e-2, 1.0, 0, acc, pot)
    assert _relative_error(acc, ref_acc) <= tolerance("cupy", dtype)
    assert _relative_error(pot, ref_pot) <= tolerance("cupy", dtype)
    assert np.isnan(holder[:3, 1::2]).all() and np.isnan(holder[3, ::2]).all()


_BROKEN_SOURCE = r"""
// Each thread stores its value in a shared tile and sums the whole tile.
template<typename T, bool BARRIER, bool EARLY_EXIT>
__global__ void tile_sum(const T* __restrict__ x, T* __restrict__ out)
{
    __shared__ T tile[32];
    const int t = (int)threadIdx.x;
    if (EARLY_EXIT && t == 31) return;
    tile[t] = x[blockIdx.x * 32 + t];
    if (BARRIER) __syncthreads();
    T total = T(0);
    for (int k = 0; k < 32; ++k) total += tile[k];
    out[blockIdx.x * 32 + t] = total;
}
"""


def test_the_emulator_catches_missing_and_divergent_barriers(tmp_path, rng):
    """The emulation has teeth: without the barrier thread 0 sums a tile the
    others have not stored yet; a thread that returns before the barrier is
    reported as divergence."""
    expressions = ("tile_sum<double, true, false>", "tile_sum<double, false, false>",
                   "tile_sum<double, true, true>")
    library = compile_library(_BROKEN_SOURCE, expressions, tmp_path, "broken")
    x = rng.random(64)
    expected = np.repeat(x.reshape(2, 32).sum(axis=1), 32)
    out = np.empty(64)
    CpuKernel(library, expressions[0])((2, 1, 1), (32, 1, 1), (x, out))
    np.testing.assert_allclose(out, expected)
    CpuKernel(library, expressions[1])((2, 1, 1), (32, 1, 1), (x, out))
    assert not np.allclose(out, expected)
    with pytest.raises(AssertionError, match="different barriers"):
        CpuKernel(library, expressions[2])((2, 1, 1), (32, 1, 1), (x, out))


def test_every_kernel_is_instantiated_for_both_dtypes():
    for name in _cupy.KERNELS:
        assert f"__global__ void {name}(" in _cupy.KERNEL_SOURCE
    for dtype_name, launch in tiling.LAUNCH.items():
        for potential in (False, True):
            assert _cupy._direct_expression(dtype_name, launch.threads, potential) in _cupy.NAME_EXPRESSIONS
            assert _cupy._finalize_expression(dtype_name, potential) in _cupy.NAME_EXPRESSIONS
    assert not set(_cupy.NAME_EXPRESSIONS) & set(_cupy.VARIANT_EXPRESSIONS)


def test_launches_fit_the_gpu():
    for launch in {*tiling.LAUNCH.values(), *(v for vs in tiling.VARIANTS.values() for v in vs)}:
        assert launch.threads % 32 == 0 and launch.threads <= 1024
        assert 1 <= launch.max_slices <= 65535 and launch.min_tiles >= 1
        for n in (2, 31, 1000, 16384, 10**6, 2**31 - 1):
            length, count = tiling.slices(n, launch)
            assert length % launch.threads == 0 and length >= launch.min_tiles * launch.threads
            assert (count - 1) * length < n <= count * length
            assert count <= launch.max_slices


def test_import_does_not_load_cupy():
    """Importing the backend must not import CuPy or touch a GPU (DESIGN.md)."""
    code = ("import sys, hpcgpu.kernels.nbody._cupy as m; "
            "assert 'cupy' not in sys.modules, 'cupy imported'; print(len(m.KERNEL_SOURCE))")
    result = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_source_compiles_for_the_gpu_with_nvcc(tmp_path):
    """Where nvcc is installed, the source also compiles as real CUDA (sm_90, no warnings),
    with no register spills."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: the CUDA compile check needs the CUDA toolkit")
    instances = ", ".join(f"(void*)&{e}" for e in ALL_EXPRESSIONS)
    source = tmp_path / "nbody_cupy.cu"
    source.write_text(_cupy.KERNEL_SOURCE + f"\nvoid* hpcgpu_instances[] = {{{instances}}};\n")
    command = [nvcc, "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v",
               "-Werror", "all-warnings", "-o", str(tmp_path / "nbody_cupy.cubin"), str(source)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"nvcc failed:\n{' '.join(command)}\n{result.stderr}"
    usage = [line.strip() for line in result.stderr.splitlines() if "spill stores" in line]
    assert len(usage) == len(ALL_EXPRESSIONS), result.stderr
    for line in usage:
        assert line.startswith("0 bytes stack frame, 0 bytes spill stores"), line
