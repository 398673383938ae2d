"""The device functions the Numba-CUDA stencil kernels are built from.

Shared by the backend file :mod:`._cuda` and the multi-step diffusion pass
(:mod:`.diffusion_cuda`), which therefore build on this module, not on the
backend file: the per-point physics of :mod:`.physics` compiled as device
functions, and the index arithmetic of ghost cells (wrap or clamp, as in
:mod:`.boundary`).
"""

from hpcgpu._compat import numpy_aliases_for_numba_cuda

numpy_aliases_for_numba_cuda()

from numba import cuda  # noqa: E402

from hpcgpu.kernels.stencil import physics  # noqa: E402

_device_function = cuda.jit(device=True)
potential_vorticity = _device_function(physics.potential_vorticity)
al_alpha = _device_function(physics.al_alpha)
al_beta = _device_function(physics.al_beta)
al_epsilon = _device_function(physics.al_epsilon)
al_phi = _device_function(physics.al_phi)
mass_flux = _device_function(physics.mass_flux)
bernoulli = _device_function(physics.bernoulli)
u_vortex_force = _device_function(physics.u_vortex_force)
v_vortex_force = _device_function(physics.v_vortex_force)
laplacian_5pt = _device_function(physics.laplacian_5pt)
diffusion_update = _device_function(physics.diffusion_update)


@cuda.jit(device=True)
def _clamp(k, last):
    # Not min/max: with Numba 0.68's built-in CUDA target their generic
    # overloads fail to compile (signature mismatch).
    if k < 0:
        return 0
    if k > last:
        return last
    return k


@cuda.jit(device=True)
def _wrap_or_clamp(k, n, periodic):
    """Stored index for logical index ``k`` on an axis of ``n`` points.

    One period of wrap covers every index a valid output reads (at most two
    beyond an edge, and ``n >= 4``); the final clamp keeps the rows that the
    last strip reads past the grid's end (results it does not store) inside
    the array.
    """
    if periodic:
        if k < 0:
            k += n
        elif k >= n:
            k -= n
    return _clamp(k, n - 1)


@cuda.jit(device=True)
def _coriolis_index(r, ny, periodic):
    """Entry of ``f_corner`` (corner rows 0..ny) for logical corner row ``r``."""
    if periodic:
        if r < 0:
            r += ny
        elif r >= ny:
            r -= ny
    return _clamp(r, ny)

