"""Barnes-Hut octree gravity on the CPU (Numba): N log N softened forces.

``tree(...)`` computes what the ``direct`` kernels compute (see
:mod:`hpcgpu.kernels.nbody`): accelerations on the targets from all sources
and, if asked, the potential without the self term, with Plummer softening;
a pair at zero separation with zero softening contributes nothing.

Algorithm
---------
Build (float64 whatever the input dtype):

1. A cube around the sources; each body's Morton (Z-order) key of 42 levels,
   kept as two 63-bit words (21 levels each), so that a single far-away body
   still leaves 2**42 cells across the cube; sort by key (stable).
2. The octree over the sorted bodies, nodes in depth-first preorder with a
   skip pointer ``next`` (the node after the subtree): the walk descends
   with ``k + 1`` and skips with ``next[k]``, with no stack. A node is the
   smallest octree cell holding its bodies (chains of one-child cells are
   skipped; fewer than 2 N nodes). Leaves hold up to ``leaf_size`` bodies,
   more only where the keys cannot split them: coincident bodies, or bodies
   closer than 2**-42 of the cube, which then share a leaf summed directly.
3. Per node, from its bodies (N x depth work, parallel over nodes): mass,
   centre of mass, the traceless quadrupole ``Q = sum m (3 y y^T - |y|^2 1)``
   and the trace of the second moment ``tr I = sum m |y|^2`` (``y`` the
   offset from the centre of mass). Massless nodes take their cell centre.

Walk (parallel over groups of targets, ``prange``): targets are grouped by
the tree itself (Barnes 1990): a group is a node of at most ``group_size``
bodies, its box the bounding box of those bodies (targets that are not
sources: the node's cell, or the target alone outside the tree). One
interaction list per group serves all its targets:

- opening criterion: a node is accepted when its centre of mass lies farther
  than ``s / theta + delta`` from every point of the group's box, with ``s``
  the node's cell side and ``delta`` the distance of its centre of mass from
  the cell centre (Barnes 1994: lopsided cells open earlier). Every target
  of the group then meets ``(s + theta delta) / d < theta`` at its own
  distance ``d`` to the centre of mass: stricter than the classic
  ``s / d < theta``. Nodes holding the group are always opened, so a target
  never meets a multipole of a node that contains it;
- accepted nodes: the softened monopole + quadrupole expansion, with
  ``d`` from the centre of mass to the target and ``s2 = |d|^2 + eps^2``::

      phi = -G [M / s + (d.Q.d - eps^2 tr I) / (2 s^5)]
      a   =  G [-M d / s^3 + Q d / s^5 - 5/2 (d.Q.d - eps^2 tr I) d / s^7]

  (the exact second-order Taylor expansion of the Plummer potential; the
  ``eps^2 tr I`` terms come from its non-zero Laplacian). Accepted nodes of
  at most 2 bodies, opened leaves and the group's own leaves are summed
  body by body;
- the sums run over the list for 16 targets at a time, one per vector lane.

Deterministic: a target's list depends on its group only, and a source that
is a target always takes the same lane of the same block (spare lanes
compute bodies whose results are dropped), so forces on the sources
``a:b`` are bitwise the rows ``a:b`` of a call for all of them, and repeated
calls agree. Targets that are not sources take lanes in call order; every
lane runs the same vector instructions, so there too the result does not
depend on the other targets (tested, not guaranteed by construction).

float32 inputs are summed in float32 (twice the vector lanes; float32
rounding, ~1e-7, is far below the tree's truncation error), float64 in
float64. Subnormals are flushed inside the parallel loops
(:mod:`hpcgpu.kernels.fpenv`).

Accuracy
--------
Plummer sphere, N = 20000, Henon units (G = M = 1, virial radius 1), eps =
0.01, all 20000 bodies against a float64 direct sum; relative errors
``|a_tree - a_direct| / |a_direct|`` and ``|phi_tree - phi_direct| /
|phi_direct|`` (float32 input gives the same table to two digits):

=====  ============  =========  ========  ==========  =========
theta  force median  force p99  force max  pot median  pot p99
=====  ============  =========  ========  ==========  =========
0.3    2.0e-05       8.9e-05    3.7e-04    1.8e-06     1.1e-05
0.5    1.1e-04       5.2e-04    3.5e-03    1.1e-05     5.4e-05
0.7    3.9e-04       2.3e-03    1.2e-02    2.8e-05     1.6e-04
1.0    9.0e-04       5.7e-03    4.9e-02    1.0e-04     4.2e-04
=====  ============  =========  ========  ==========  =========

Momentum: ``|sum m a| / sum m |a|`` is ~5e-6 at theta = 0.5 (not exactly
zero: the tree breaks the pairwise symmetry of the direct sum).

Cost
----
Build O(N log N): the sort, and moments summed over every node's bodies.
Walk O(N log N): per target ~1100-2600 multipoles and ~1500-2200 bodies at
theta = 0.5 (N = 2e4 to 1e6). Measured on the 2-core development machine
(Xeon, AVX-512 hardware, LLVM using 256-bit vectors), Plummer sphere, eps =
0.01, forces and potentials on all bodies, CPU seconds on one core (two
threads take a little over half of it; the machine was shared, so those
wall times were noisy):

=======  =====  ===================  ===================  =====================
N        build  tree theta=0.5       tree theta=0.7       direct (``_numba``)
                float32 / float64    float32 / float64    float32 / float64
=======  =====  ===================  ===================  =====================
1e4      0.001  0.031 / 0.049        0.020 / 0.033        0.028 / 0.085
1e5      0.018  0.45 / 0.72          0.27 / 0.43          ~2.8 / ~8.5 (N^2)
1e6      0.37   6.1 / 10.7           3.4 / 5.6            ~280 / ~850 (N^2)
=======  =====  ===================  ===================  =====================

(direct: forces only; two threads measured 1e6 at theta = 0.5 in 4.0 s
float32, 8.5 s float64.) The tree overtakes the direct sum near N = 1.2e4 in
float32 and 4e3 in float64 at theta = 0.5 (7e3 in float32 when the direct
sum also computes potentials); at N = 1e5 it is 6x (float32) to 12x
(float64) faster.

Why the CPU
-----------
The walk is branchy and irregular, which Numba-CUDA would run with heavy
divergence; a GPU tree (a Karras radix tree built from the same Morton keys,
warp-wide group walks) is future work. Until then the GPU backends move
positions and masses to the host for this method and the accelerations back
(:func:`hpcgpu.kernels.nbody.accelerations`).

Distributed runs
----------------
Each worker holds all positions after the all-gather that the direct method
needs too, builds the tree of all bodies (cheap: a few % of the walk) and
walks only its own targets, ``tree(pos[:, a:b], pos, m, ..., self_offset=a,
...)``. By the determinism above, the assembled forces equal a single-process
call bit for bit, for any partition.
"""

import numba
import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels.nbody.tree.build import _body_keys, _build_nodes, _gather, _moments, _sort_keys
from hpcgpu.kernels.nbody.tree.options import _LANES, _QMAX
from hpcgpu.kernels.nbody.tree.targets import _groups, _locate, _point_slots, _source_slots
from hpcgpu.kernels.nbody.tree.walk import _walk

__all__ = ["tree", "LEAF_SIZE", "GROUP_SIZE"]

LEAF_SIZE = 16
"""Most bodies in a leaf (more only where the keys cannot split them)."""
GROUP_SIZE = 128
"""Most targets that share one interaction list (a node of the tree)."""


def _check(target_positions, source_positions, source_masses, eps2, G, self_offset,
           theta, acc_out, pot_out, leaf_size, group_size):
    def bad(name, value, valid):
        raise ConfigError(f"tree: {name} must be {valid}; got {value!r}")

    if not (np.isscalar(theta) and np.isfinite(theta) and theta > 0):
        bad("theta", theta, "a finite number > 0 (typical: 0.3 .. 0.8)")
    if not (np.isscalar(eps2) and np.isfinite(eps2) and eps2 >= 0):
        bad("eps2", eps2, "a finite number >= 0 (the softening length squared)")
    if not (np.isscalar(G) and np.isfinite(G)):
        bad("G", G, "a finite number")
    for name, value in (("leaf_size", leaf_size), ("group_size", group_size)):
        if not (isinstance(value, (int, np.integer)) and 1 <= value <= 4096):
            bad(name, value, "an integer in 1..4096")
    tp, sp, sm = target_positions, source_positions, source_masses
    if tp.ndim != 2 or tp.shape[0] != 3:
        bad("target_positions.shape", tp.shape, "(3, n_targets)")
    if sp.ndim != 2 or sp.shape[0] != 3:
        bad("source_positions.shape", sp.shape, "(3, n_sources)")
    if sm.shape != (sp.shape[1],):
        bad("source_masses.shape", sm.shape, f"({sp.shape[1]},), one per source")
    n_t, n_s = tp.shape[1], sp.shape[1]
    if acc_out.shape != (3, n_t):
        bad("acc_out.shape", acc_out.shape, f"(3, {n_t})")
    if pot_out is not None and pot_out.shape != (n_t,):
        bad("pot_out.shape", pot_out.shape, f"({n_t},)")
    if not (isinstance(self_offset, (int, np.integer))
            and (self_offset == -1 or 0 <= self_offset <= n_s - n_t)):
        bad("self_offset", self_offset, f"-1 or in 0..{n_s - n_t} (targets are sources "
            f"self_offset .. self_offset + {n_t})")
    # A NaN would scramble the keys and an infinity the bounding cube.
    if not np.isfinite(sp).all():
        bad("source_positions", "non-finite values", "finite")
    if not np.isfinite(tp).all():
        bad("target_positions", "non-finite values", "finite")
    if not (np.isfinite(sm).all() and (sm >= 0).all()):
        bad("source_masses", "negative or non-finite values",
            "finite and >= 0 (expansions about the centre of mass need them)")


def tree(target_positions, source_positions, source_masses, eps2, G, self_offset,
         theta, acc_out, pot_out, *, leaf_size=LEAF_SIZE, group_size=GROUP_SIZE):
    """Softened gravitational accelerations (and potentials) by Barnes-Hut.

    Same meaning as the ``direct`` kernels (module docstring of
    :mod:`hpcgpu.kernels.nbody`), approximated by an octree with monopole +
    quadrupole moments; the tree is built from all sources on every call.

    Parameters
    ----------
    target_positions : ndarray (3, n)
        Where the accelerations are wanted (length); float32 or float64.
        With ``self_offset >= 0`` these are the sources ``self_offset ..
        self_offset + n`` (the sums then read the sources' sorted copies).
    source_positions : ndarray (3, N)
        Positions of the bodies (length), same dtype.
    source_masses : ndarray (N,)
        Masses (mass), finite and >= 0.
    eps2 : float
        Plummer softening length squared (length**2), >= 0.
    G : float
        Gravitational constant in the units of the inputs.
    self_offset : int
        Index in the sources of target 0 (targets are sources
        ``self_offset .. self_offset + n``, left out of their own potential),
        or -1 when the targets are not sources.
    theta : float
        Opening angle, > 0: smaller is more accurate and slower (0.5: median
        force error ~1e-4 on a Plummer sphere; see the module docstring).
    acc_out : ndarray (3, n)
        Receives the accelerations (length / time**2).
    pot_out : ndarray (n,) or None
        Receives the potentials (energy / mass), if not None.
    leaf_size : int, keyword-only
        Most bodies in a leaf (1..4096; default :data:`LEAF_SIZE`).
    group_size : int, keyword-only
        Most bodies in a group of targets sharing an interaction list
        (1..4096; default :data:`GROUP_SIZE`).

    Returns
    -------
    None
        Results are written into ``acc_out`` and ``pot_out``.

    Raises
    ------
    ConfigError
        (a ``ValueError``) for ``theta`` not finite and > 0, ``eps2`` < 0 or
        not finite, a non-finite ``G``, bad ``leaf_size`` / ``group_size``,
        mismatched shapes, ``self_offset`` out of range, non-finite
        positions, or negative or non-finite masses.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    >>> acc, pot = np.empty((3, 2)), np.empty(2)
    >>> tree(x, x, np.array([1.0, 3.0]), 0.0, 1.0, 0, 0.5, acc, pot)
    >>> acc[0].tolist(), pot.tolist()
    ([0.75, -0.25], [-1.5, -0.5])
    """
    _check(target_positions, source_positions, source_masses, eps2, G, self_offset,
           theta, acc_out, pot_out, leaf_size, group_size)
    n_t, n_s = target_positions.shape[1], source_positions.shape[1]
    if n_t == 0:
        return
    if n_s == 0:
        acc_out[...] = 0
        if pot_out is not None:
            pot_out[...] = 0
        return
    spos = np.ascontiguousarray(source_positions, dtype=np.float64)
    smass = np.ascontiguousarray(source_masses, dtype=np.float64)
    tpos = np.ascontiguousarray(target_positions, dtype=np.float64)
    lower = spos.min(axis=1)
    upper = spos.max(axis=1)
    size = float((upper - lower).max())
    # A cube a little larger than the bodies' extent, so that rounding in
    # the quantisation never puts a body on the far face.
    size = size * (1.0 + 2.0 ** -20) if size > 0 else 1.0
    origin = 0.5 * (lower + upper) - 0.5 * size
    scale = _QMAX / size

    hi, lo = _body_keys(spos, origin, scale)
    order = _sort_keys(hi, lo)
    x, y, z, m, hi, lo = _gather(spos, smass, hi, lo, order)
    first, last, level, leaf, nxt = _build_nodes(hi, lo, int(leaf_size))
    walk, pole, cell, bbox = _moments(x, y, z, m, first, last, level, origin, size, scale,
                                      1.0 / theta)
    # float32 inputs are summed in float32 (twice the vector lanes; the
    # tree's truncation error is far above float32 rounding), float64 in
    # float64. The tree itself is built in float64 either way.
    compute = np.float32 if all(a.dtype == np.float32 for a in (
        target_positions, source_positions, source_masses)) else np.float64
    xc, yc, zc, mc = (a.astype(compute, copy=False) for a in (x, y, z, m))
    if self_offset >= 0:
        groups = _groups(first, last, leaf, nxt, int(group_size))
        work = _source_slots(groups, first, last, xc, yc, zc, order, int(self_offset), n_t,
                             bbox, _LANES)
    else:
        group, holder = _locate(tpos, origin, scale, hi, lo, first, last, level, leaf, nxt,
                                int(group_size))
        work = _point_slots(tpos.astype(compute, copy=False), group, holder, cell,
                            first.shape[0], _LANES)
    n_chunks = max(1, min(work[1].shape[0], 16 * numba.get_num_threads()))
    direct_out = acc_out.dtype == compute and acc_out.flags.c_contiguous
    acc = acc_out if direct_out else np.empty((3, n_t), compute)
    pot = np.empty(n_t, compute)
    _walk(*work, xc, yc, zc, mc, walk, pole.astype(compute, copy=False), first, last, leaf,
          nxt, float(eps2), _LANES, n_chunks, acc, pot)
    if G != 1.0:
        acc *= compute(G)
        pot *= compute(G)
    if not direct_out:
        acc_out[...] = acc
    if pot_out is not None:
        pot_out[...] = pot
