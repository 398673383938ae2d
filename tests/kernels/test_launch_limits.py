"""Every launch chooser refuses a thread block the GPU cannot run, before anything is launched.

A block over 1024 threads, over 48 KiB of static shared memory or (with a
known register count) over the register file fails only on the GPU, at
compile or launch time, and loses the run: the ``cuda`` and ``cupy``
choosers check first and raise :class:`~hpcgpu.errors.ConfigError`. Nothing
here needs a GPU or runs a kernel; ``test_compile_sm90.py`` checks the
compiled kernels' real registers and shared bytes.
"""

import numpy as np
import pytest

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import launch_limits


def test_limits_name_what_a_block_exceeds():
    assert launch_limits.problems(1024, 48 * 1024) == []
    assert launch_limits.problems(1025) == ["1025 threads per block (1 to 1024)"]
    assert launch_limits.problems(256, 48 * 1024 + 1) == ["49153 B of static shared memory (at most 49152)"]
    # Registers go to a warp in 256s: 128 each x 512 threads is the whole register file, 129 is over.
    assert launch_limits.problems(512, registers=128) == []
    assert "69632 registers per block" in launch_limits.problems(512, registers=129)[0]
    assert launch_limits.problems(256, registers=255) == []  # 256 threads always fit
    with pytest.raises(ConfigError, match="launch=.*does not fit a thread block"):
        launch_limits.check("a kernel", "launch", 2048)


def test_diffusion_pass_counts_its_shared_ring_per_dtype():
    """The crash of issue 19: T = 8 steps with 256 threads is 9 x 3 x 256 values of shared ring,
    55,296 B in float64 (over 48 KiB), 27,648 B in float32."""
    from hpcgpu.kernels.stencil import diffusion_cuda as diffusion

    launch = diffusion.PassLaunch(8, 128, 256)
    assert diffusion.shared_bytes(launch, "float64") == 55296
    assert diffusion.fits((1024, 1024), launch, "float32")
    assert not diffusion.fits((1024, 1024), launch, "float64")
    assert not diffusion.fits((1024, 1024), launch)  # dtype unknown: float64, the larger
    assert diffusion.launch_problems(launch, "float64") == ["55296 B of static shared memory (at most 49152)"]
    assert diffusion.launch_problems(diffusion.PassLaunch(8, 8, 40), "float64") == [
        "threads - 2 steps = 24 output columns (at least 32)"]
    # Every pass it may be asked for fits a thread block, but for that one in float64.
    for dtype in ("float32", "float64"):
        for option in (*diffusion.VARIANTS, *(p for p in diffusion.PASS.values() if p)):
            assert diffusion.fits((1024, 1024), option, dtype) == (
                (dtype, option) != ("float64", diffusion.PassLaunch(8, 128, 256)))


def test_diffuse_refuses_a_pass_that_fits_no_grid():
    """An impossible pass is an error, not a silent fall back to one step per launch (the variants
    script would time the one-step kernel under the pass's name); only a grid too small for a pass
    falls back."""
    from hpcgpu.kernels.stencil import _cuda, diffusion_cuda

    field = np.zeros((40, 40))
    with pytest.raises(ConfigError, match=r"multi_step=.*float64.*55296 B of static shared memory"):
        _cuda.diffuse(field, np.empty_like(field), 0.1, 0.1, 8, 0, 0, 0,
                      multi_step=diffusion_cuda.PassLaunch(8, 128, 256))


@pytest.mark.parametrize("threads", [2048, 0])
def test_stencil_cuda_grid_refuses_a_block_beyond_the_limits(threads):
    from hpcgpu.kernels.stencil import _cuda

    with pytest.raises(ConfigError, match="the cuda stencil kernels"):
        _cuda._grid((64, 64), _cuda.StencilCudaLaunch(rows=8, threads=threads))


def test_stencil_cupy_grid_refuses_a_block_beyond_the_limits():
    from hpcgpu.kernels.stencil import _cupy

    with pytest.raises(ConfigError, match="the cupy stencil kernels.*2048 threads"):
        _cupy._grid(64, 64, _cupy.StencilCupyLaunch(vec=1, rows=8, threads=2048))


def test_stencil_tables_hold_only_launches_their_choosers_accept():
    from hpcgpu.kernels.stencil import _cuda, _cupy

    for module, grid in ((_cuda, lambda launch: _cuda._grid((4096, 4096), launch)),
                         (_cupy, lambda launch: _cupy._grid(4096, 4096, launch))):
        for key, launch in module.LAUNCH.items():
            for option in (launch, *module.VARIANTS[key]):
                grid(option)


def test_nbody_tile_counts_its_shared_bodies_and_both_backends_check_it(monkeypatch):
    from hpcgpu.kernels.nbody import _cuda, _cupy, tiling

    assert tiling.shared_bytes(tiling.DirectSumLaunch(256, 2, 32), "float64") == 256 * 4 * 8
    for dtype, launch in tiling.LAUNCH.items():
        for option in (launch, *tiling.VARIANTS[dtype]):
            tiling.check(option, dtype)
    too_big = tiling.DirectSumLaunch(2048, 1, 4)
    with pytest.raises(ConfigError, match="nbody direct_kernel.*2048 threads.*65536 B of static shared"):
        tiling.check(too_big, "float64")
    positions, masses = np.zeros((3, 8)), np.ones(8)
    acc = np.empty((3, 8))
    # The cupy backend checks before it compiles anything (no CuPy needed to refuse).
    with pytest.raises(ConfigError, match="nbody direct_kernel"):
        _cupy._direct(positions, positions, masses, 0.0, 1.0, 0, acc, None, too_big)

    # The cuda backend asks the same check before it launches.
    def refuse(launch, dtype):
        raise ConfigError(f"checked {launch} {dtype}")

    monkeypatch.setattr(_cuda, "check", refuse)
    with pytest.raises(ConfigError, match="checked"):
        _cuda._direct(positions, positions, masses, 0.0, 1.0, 0, acc, None, too_big)


def test_md_blocks_refuse_a_block_beyond_the_limits(monkeypatch):
    from hpcgpu.kernels.md import _cuda, _cupy

    assert _cuda._blocks(1000) == -(-1000 // _cuda.THREADS)
    monkeypatch.setattr(_cuda, "THREADS", 2048)
    with pytest.raises(ConfigError, match="md cuda kernels"):
        _cuda._blocks(1000)
    with pytest.raises(ConfigError, match="md cupy kernels"):
        _cupy._blocks(1000, 2048)


def test_gemm_counts_its_shared_tiles(monkeypatch):
    from hpcgpu.kernels.matrix import _cuda

    for dtype in ("float32", "float64"):
        for launch in (_cuda.LAUNCH[dtype], *_cuda.VARIANTS):
            _cuda.check_gemm(launch, dtype)
    # 1024 threads, but A and B tiles of 64 deep: 64 x (129 + 128) doubles = 131,584 B.
    deep = _cuda.GemmLaunch(128, 128, 64, 4, 4)
    assert _cuda.gemm_shared_bytes(deep, "float64") == 131584
    with pytest.raises(ConfigError, match="matrix gemm kernel.*131584 B of static shared memory"):
        _cuda.check_gemm(deep, "float64")
    with pytest.raises(ConfigError, match="must divide"):
        _cuda.check_gemm(_cuda.GemmLaunch(64, 64, 8, 3, 4), "float32")
    a = np.zeros((4, 4))
    with pytest.raises(ConfigError, match="matrix gemm kernel"):
        _cuda.gemm(a, a, np.empty_like(a), deep)


def test_matrix_vector_kernels_check_their_block(monkeypatch):
    from hpcgpu.kernels.matrix import _cuda

    assert _cuda._vector_blocks("dot", 1000, _cuda.THREADS * 8) == 4
    monkeypatch.setattr(_cuda, "THREADS", 2048)
    x = np.ones(5)
    with pytest.raises(ConfigError, match="matrix axpy kernel"):
        _cuda.axpy(1.0, x, x, np.empty_like(x))
    with pytest.raises(ConfigError, match="matrix dot kernel.*2048 threads"):
        _cuda.dot(x, x)
    with pytest.raises(ConfigError, match="matrix spmv kernel"):
        _cuda.spmv(x, np.zeros(5, np.int32), np.arange(6, dtype=np.int32), x, np.empty_like(x))


def test_cupy_spmv_checks_lanes_and_its_shared_partial_sums(monkeypatch):
    from hpcgpu.kernels.matrix import _cupy

    for dtype in ("float32", "float64"):
        for lanes in _cupy.LANES:
            _cupy.check_spmv(dtype, lanes)
    with pytest.raises(ConfigError, match="lanes=3"):
        _cupy.check_spmv("float64", 3)
    monkeypatch.setattr(_cupy, "THREADS", 8192)
    x = np.ones(5)
    # Refused before CuPy is needed: 8192 threads and 64 KiB of partial sums.
    with pytest.raises(ConfigError, match="matrix spmv_kernel.*65536 B of static shared memory"):
        _cupy.spmv(x, np.zeros(5, np.int32), np.arange(6, dtype=np.int32), x, np.empty_like(x))
