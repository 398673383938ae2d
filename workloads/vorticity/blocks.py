"""The barotropic vorticity model's physics on a block of whole rows: what one process and every rank compute.

The model runs in one process as one block (the whole grid) and on a
cluster as blocks of whole rows (:mod:`hpcgpu.partition.spectral`); both
run these functions, so their results are bitwise the same:

- :func:`stage_block`: one SSP-RK3 stage of the vorticity on the owned rows,
  from a block whose one-row frames hold the neighbours' rows
  (:func:`tendency_block`: Arakawa's Jacobian, beta and viscosity terms);
- the Poisson solve ``lap_h psi = zeta`` as line transforms:
  :func:`forward_lines` (``rfft`` along x of the owned rows),
  :func:`solve_columns` (along y, per column of the x transform: ``fft``,
  division by the five-point Laplacian's eigenvalues, inverse ``fft``; in a
  channel on the odd reflection of the column, the sine transform of
  :meth:`hpcgpu.kernels.matrix.PoissonOperator.solve_fft`) and
  :func:`inverse_lines` (``irfft`` along x). Their composition is
  :meth:`~hpcgpu.kernels.matrix.PoissonOperator.solve_fft`'s ``rfft2`` and
  ``irfft2`` line by line, except that the mean of ``zeta`` is dropped as
  the mean mode (its eigenvalue's inverse is 0), not subtracted point by
  point, and ``psi`` keeps the rounding-level mean that leaves: removing
  either would need a global sum per solve, and only differences of
  ``psi`` enter the tendency, the velocities and the energy;
- :func:`block_sums` / :func:`combine_sums` (diagnostics as exact partial
  sums, :func:`hpcgpu.exact_sums.exact_partial`, added by
  :func:`hpcgpu.workloads.sums.exact_total`: the same totals for any split) and :func:`block_health` / :func:`combine_health` (the CFL number
  from each block's largest velocities).

A block is described by a :class:`~hpcgpu.partition.block_region.BlockRegion`:
beyond a ``"halo"`` side its frame row holds the neighbour's row, beyond a
``"wall"`` the fields are 0, and a ``"wrap"`` side (a periodic axis held
whole) wraps onto the block's other end.
"""

import math

import numpy as np

from hpcgpu.exact_sums import exact_partial
from hpcgpu.kernels.stencil import SSP_RK3_STAGES
from hpcgpu.kernels.stencil import arakawa_jacobian
from hpcgpu.workloads.sums import exact_total

__all__ = ["block_health", "block_sums", "combine_health", "combine_sums", "forward_lines", "inverse_lines",
           "inverse_symbol", "padded_rows", "solve_columns", "stage_block", "tendency_block"]

RK3_CFL_LIMIT = math.sqrt(3.0)
RK3_REAL_LIMIT = 2.51
"""SSP-RK3 is stable for imaginary eigenvalues up to ``|lambda dt| = sqrt(3)`` (centred advection and Rossby
waves) and for real ones down to about -2.51 (viscosity)."""


def padded_rows(xp, array, where):
    """The owned rows of a framed ``array`` with one row beyond each side: the neighbour's, 0 or wrapped."""
    rows, cols = where.rows, where.cols
    _, _, south, north = where.sides
    if south == "halo" and north == "halo":
        return array[rows.start - 1:rows.stop + 1, cols]
    owned = array[rows, cols]
    below = array[rows.start - 1:rows.start, cols] if south == "halo" else (
        xp.zeros_like(owned[:1]) if south == "wall" else owned[-1:])
    above = array[rows.stop:rows.stop + 1, cols] if north == "halo" else (
        xp.zeros_like(owned[:1]) if north == "wall" else owned[:1])
    return xp.concatenate([below, owned, above])


def tendency_block(model, state, where):
    """``d zeta/dt = -J(psi, zeta) - beta d psi/dx + nu lap zeta`` (1/s**2) on the owned rows of a framed block.

    Arakawa's Jacobian (:func:`hpcgpu.kernels.stencil.arakawa_jacobian`) on
    the rows with one beyond each side, periodic in x; the tendency is zero
    on the south wall of a channel.
    """
    xp, g, p = model.backend.xp, model.grid, model.params
    psi, zeta = padded_rows(xp, state.psi, where), padded_rows(xp, state.zeta, where)
    # the rows beyond the padded ones are never read for the owned rows
    out = arakawa_jacobian(psi, zeta, dx=g.dx, dy=g.dy, boundary=("periodic", "dirichlet"), scale=-1.0,
                           backend=model.backend)[1:-1]
    if p.beta != 0:
        owned = psi[1:-1]
        out -= (xp.roll(owned, -1, axis=1) - xp.roll(owned, 1, axis=1)) * (p.beta / (2.0 * g.dx))
    if p.viscosity != 0:
        z = zeta[1:-1]
        laplacian = ((xp.roll(z, 1, axis=1) + xp.roll(z, -1, axis=1) - 2 * z) * (1.0 / g.dx**2)
                     + (zeta[:-2] + zeta[2:] - 2 * z) * (1.0 / g.dy**2))
        out += p.viscosity * laplacian
    if g.wall_y and where.owned_rows.start == 0:
        out[0, :] = 0
    return out


def stage_block(model, state, start, stage, dt, where):
    """Vorticity on the owned rows after SSP-RK3 stage ``stage`` (0, 1, 2) of a step ``dt`` (s).

    ``state`` is the framed block after the previous stage (frames filled),
    ``start`` the owned rows at the start of the step (Shu-Osher form:
    ``a zeta0 + b zeta + c dt L(zeta)``).
    """
    a, b, c = SSP_RK3_STAGES[stage]
    zeta = where.interior(state.zeta)
    tendency = tendency_block(model, state, where)
    if a == 0:
        return zeta + (c * dt) * tendency
    zeta0 = start.zeta
    return zeta0 + b * (zeta - zeta0) + (c * dt) * tendency


def inverse_symbol(model):
    """``1 / lambda`` of ``lap_h`` per x wavenumber (columns) and y mode (rows of the reflected column in a
    channel); 0 for the mean mode. Host float64, as :class:`~hpcgpu.kernels.matrix.PoissonOperator`'s."""
    g = model.grid
    ny = 2 * g.ny if g.wall_y else g.ny
    sy = np.sin(np.pi * np.arange(ny) / ny)[:, None] ** 2
    sx = np.sin(np.pi * np.arange(g.nx // 2 + 1) / g.nx)[None, :] ** 2
    symbol = -4.0 * ((1.0 / g.dx**2) * sx + (1.0 / g.dy**2) * sy)
    symbol[0, 0] = 1.0
    inverse = 1.0 / symbol
    inverse[0, 0] = 0.0
    return inverse


def forward_lines(model, rows, where):
    """``rfft`` along x of the owned rows of ``zeta`` (the wall row of a channel as 0)."""
    xp = model.backend.xp
    if model.grid.wall_y and where.owned_rows.start == 0:
        rows = rows.copy()
        rows[0] = 0
    return xp.fft.rfft(rows, axis=1)


def solve_columns(model, columns, first, stop, inverse):
    """Whole columns ``first:stop`` of the x transform solved along y (``inverse``: :func:`inverse_symbol` on
    the model's device)."""
    xp = model.backend.xp
    ny = model.grid.ny
    if model.grid.wall_y:  # the odd reflection [0, f_1 .. f_{n-1}, 0, -f_{n-1} .. -f_1]: a sine transform
        zero = xp.zeros_like(columns[:1])
        columns = xp.concatenate([zero, columns[1:], zero, -columns[:0:-1]])
    spectrum = xp.fft.fft(columns, axis=0)
    spectrum *= inverse[:, first:stop]
    return xp.fft.ifft(spectrum, axis=0)[:ny]


def inverse_lines(model, spectra, where):
    """``psi`` on the owned rows from their x transform (0 on the wall row of a channel)."""
    xp = model.backend.xp
    psi = xp.ascontiguousarray(xp.fft.irfft(spectra, n=model.grid.nx, axis=1), dtype=model.dtype)
    if model.grid.wall_y and where.owned_rows.start == 0:
        psi[0] = 0
    return psi


# -- diagnostics and health -----------------------------------------------------------------------------
def block_sums(model, state, where):
    """Exact partial sums over the owned rows: ``|grad psi|**2`` (one-sided, east and north), ``zeta**2``, ``zeta``."""
    xp, g = model.backend.xp, model.grid
    psi = padded_rows(xp, state.psi, where).astype(np.float64)
    zeta = where.interior(state.zeta).astype(np.float64)
    centre = psi[1:-1]
    grad_x = (xp.roll(centre, -1, axis=1) - centre) / g.dx
    grad_y = (psi[2:] - centre) / g.dy
    return {"gradient2": exact_partial(grad_x * grad_x) + exact_partial(grad_y * grad_y),
            "zeta2": exact_partial(zeta * zeta), "zeta": exact_partial(zeta)}


def combine_sums(model, parts):
    """Energy, enstrophy and circulation (dict of floats) from every block's :func:`block_sums`."""
    area = model.grid.cell_area
    total = {key: exact_total([p[key] for p in parts]) for key in parts[0]}
    return {"energy": 0.5 * total["gradient2"] * area, "enstrophy": 0.5 * total["zeta2"] * area,
            "circulation": total["zeta"] * area}


def block_health(model, state, where):
    """A block's non-finite fields and its largest ``|u|`` and ``|v|`` (centred differences of ``psi``)."""
    xp, g = model.backend.xp, model.grid
    psi = padded_rows(xp, state.psi, where)
    centre = psi[1:-1]
    u = (psi[:-2] - psi[2:]) * (0.5 / g.dy)
    v = (xp.roll(centre, -1, axis=1) - xp.roll(centre, 1, axis=1)) * (0.5 / g.dx)
    bad = [name for name in model.field_names if not bool(xp.isfinite(where.interior(getattr(state, name))).all())]
    return {"bad": bad, "max_u": float(xp.abs(u).max()), "max_v": float(xp.abs(v).max())}


def combine_health(model, parts, dt):
    """``(bad_fields, cfl)``: the CFL number of :meth:`BarotropicVorticity.cfl
    <hpcgpu.workloads.vorticity.BarotropicVorticity.cfl>` from every block's :func:`block_health`."""
    bad = [name for name in model.field_names if any(name in p["bad"] for p in parts)]
    g, p = model.grid, model.params
    speed = max(q["max_u"] for q in parts) / g.dx + max(q["max_v"] for q in parts) / g.dy
    if bad or not math.isfinite(speed):
        return bad, math.nan
    diffusion = 4 * p.viscosity * (1 / g.dx**2 + 1 / g.dy**2) * RK3_CFL_LIMIT / RK3_REAL_LIMIT
    return bad, dt * (speed + rossby_rate(model) + diffusion)


def rossby_rate(model):
    """The fastest discrete Rossby-wave frequency (rad/s) of the model's grid."""
    g = model.grid
    theta = 2 * np.pi * np.arange(1, g.nx // 2 + 1) / g.nx
    across = 4 * math.sin(0.5 * math.pi / g.ny) ** 2 / g.dy**2 if g.wall_y else 0.0
    rates = np.sin(theta) / g.dx / (4 * np.sin(0.5 * theta) ** 2 / g.dx**2 + across)
    return abs(model.params.beta) * float(rates.max())
