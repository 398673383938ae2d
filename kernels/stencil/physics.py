"""Per-point physics of the stencil family, written once.

These are plain Python functions on scalars. ``_numba.py`` compiles them
with ``numba.njit`` and ``_cuda.py`` with ``numba.cuda.jit(device=True)``;
only the loops around them differ. Numeric constants come in as arguments of
the field's dtype (``quarter``, ``half``, ...) because a float literal would
promote float32 arithmetic to float64 under Numba's typing rules.

Grid conventions are in ``boundary``; the scheme is documented in
``_numpy.shallow_water_tendency``.
"""


def potential_vorticity(f, h_sw, h_se, h_nw, h_ne, u_s, u_n, v_w, v_e, rdx, rdy, quarter):
    """(f + dv/dx - du/dy) / h at a cell corner; h is the mean of the 4 cells."""
    return (f + (v_e - v_w) * rdx - (u_n - u_s) * rdy) / ((h_sw + h_se + h_nw + h_ne) * quarter)


def al_alpha(q_sw, q_se, q_nw, q_ne, c24):
    """Arakawa-Lamb alpha (= gamma) of a cell: weight 2 on NE and SW corners."""
    s_diag = q_ne + q_sw
    return (s_diag + s_diag + q_nw + q_se) * c24


def al_beta(q_sw, q_se, q_nw, q_ne, c24):
    """Arakawa-Lamb beta (= delta) of a cell: weight 2 on NW and SE corners."""
    s_anti = q_nw + q_se
    return (q_ne + q_sw + s_anti + s_anti) * c24


def al_epsilon(q_sw, q_se, q_nw, q_ne, c_eps):
    """Arakawa-Lamb epsilon (u-u coupling); ``c_eps = dy / (24 dx)``."""
    return (q_ne + q_nw - q_sw - q_se) * c_eps


def al_phi(q_sw, q_se, q_nw, q_ne, c_phi):
    """Arakawa-Lamb phi (v-v coupling); ``c_phi = dx / (24 dy)``."""
    return (q_nw + q_sw - q_ne - q_se) * c_phi


def mass_flux(h_a, h_b, velocity, half):
    """Face mass flux: the mean of the two neighbouring depths times velocity."""
    return (h_a + h_b) * half * velocity


def bernoulli(g, h, u_w, u_e, v_s, v_n, quarter):
    """g h + K at a cell centre, K = (mean of u**2 in x + mean of v**2 in y) / 2."""
    return g * h + (u_w * u_w + u_e * u_e + v_s * v_s + v_n * v_n) * quarter


def u_vortex_force(alpha_e, beta_w, alpha_w, beta_e, eps_e, eps_w,
                   vf_ne, vf_nw, vf_sw, vf_se, uf_e, uf_w):
    """Potential-vorticity flux term of du/dt at a west face (Arakawa-Lamb)."""
    return (alpha_e * vf_ne + beta_w * vf_nw + alpha_w * vf_sw + beta_e * vf_se
            - eps_e * uf_e + eps_w * uf_w)


def v_vortex_force(alpha_s, beta_s, alpha_n, beta_n, phi_n, phi_s,
                   uf_sw, uf_se, uf_ne, uf_nw, vf_n, vf_s):
    """Potential-vorticity flux term of dv/dt at a south face (Arakawa-Lamb)."""
    return -(alpha_s * uf_sw + beta_s * uf_se + alpha_n * uf_ne + beta_n * uf_nw
             + phi_n * vf_n - phi_s * vf_s)


def laplacian_5pt(centre, west, east, south, north, rdx2, rdy2):
    """Five-point Laplacian from a point and its four neighbours."""
    return (west + east - centre - centre) * rdx2 + (south + north - centre - centre) * rdy2


def diffusion_update(centre, west, east, south, north, cx, cy):
    """One explicit diffusion step of a point; ``cx = nu dt / dx**2``."""
    return centre + cx * (west + east - centre - centre) + cy * (south + north - centre - centre)
