"""Arakawa's (1966) Jacobian of two cell-centred fields, array-module generic (NumPy or CuPy).

The barotropic vorticity model advects vorticity with it: the average of
three second-order forms conserves the domain integrals of the vorticity, its
square (enstrophy) and the energy, so the scheme has no nonlinear
instability. The same expressions run on every backend's arrays (NumPy for
``numpy`` and ``numba``, CuPy for ``cuda`` and ``cupy``), so the roundings
are the same everywhere.
"""

from hpcgpu.kernels.stencil.boundary import DIRICHLET

__all__ = ["jacobian"]


def _pad(xp, field, bc_x, bc_y):
    """One ghost point each side: wrapped, or zero beyond a Dirichlet edge."""
    padded = xp.pad(field, ((0, 0), (1, 1)), mode="constant" if bc_x == DIRICHLET else "wrap")
    return xp.pad(padded, ((1, 1), (0, 0)), mode="constant" if bc_y == DIRICHLET else "wrap")


def jacobian(xp, psi, zeta, scale, bc_x, bc_y):
    """``scale * (J++ + J+x + Jx+)`` on the interior points (see :func:`hpcgpu.kernels.stencil.arakawa_jacobian`).

    With ``scale = 1 / (12 dx dy)`` that is ``J(psi, zeta)``; the caller
    chooses the sign and factor so that a model's tendency takes one pass.
    Also returns ``psi`` east minus west (``pe - pw``), which a beta term needs.
    """
    P, Z = _pad(xp, psi, bc_x, bc_y), _pad(xp, zeta, bc_x, bc_y)
    pe, pw, pn, ps = P[1:-1, 2:], P[1:-1, :-2], P[2:, 1:-1], P[:-2, 1:-1]
    ze, zw, zn, zs = Z[1:-1, 2:], Z[1:-1, :-2], Z[2:, 1:-1], Z[:-2, 1:-1]
    pne, pnw, pse, psw = P[2:, 2:], P[2:, :-2], P[:-2, 2:], P[:-2, :-2]
    zne, znw, zse, zsw = Z[2:, 2:], Z[2:, :-2], Z[:-2, 2:], Z[:-2, :-2]
    j_pp = (pe - pw) * (zn - zs) - (pn - ps) * (ze - zw)
    j_px = pe * (zne - zse) - pw * (znw - zsw) - pn * (zne - znw) + ps * (zse - zsw)
    j_xp = zn * (pne - pnw) - zs * (pse - psw) - ze * (pne - pse) + zw * (pnw - psw)
    return (j_pp + j_px + j_xp) * scale, pe - pw
