"""Direct-summation N-body kernel for the CPU with ``numba.njit(parallel=True)``.

Threads take contiguous blocks of targets (``prange``); for each target one
sweep runs over all sources, reading the structure-of-arrays rows ``x``,
``y``, ``z`` and ``m`` with unit stride, so LLVM vectorises it: 8 sources
per AVX2 instruction in float32, 4 in float64, the sums kept in vector
accumulators and reduced once at the end of the sweep.

What makes the sweep fast (interactions/s on this project's 2-core x86 CI
machine at N = 16384: 7.4e9 in float32, 2.2e9 in float64):

- fast-math flags ``contract`` (fused multiply-add), ``arcp`` and ``afn``
  (``1/sqrt`` may become a reciprocal-square-root estimate plus a Newton
  step: ``vrsqrtps`` in float32) and ``reassoc`` (lets the reduction over
  sources run in vector lanes). Not ``nnan`` / ``ninf``: a NaN in the input
  must still come out as a NaN, where the driver's check sees it. The pair
  physics is compiled without ``reassoc``, so only the sums are reordered.
- In float64 x86 has no reciprocal square root instruction below AVX-512.
  Which of two ways is faster depends on the CPU: on the machine the kernel
  was first tuned on, ``sqrt`` plus a division (one unpipelined divider)
  ran at 1.5e9 interactions/s and :func:`fast_inverse_sqrt`, the classic
  bit-trick estimate refined by multiply-adds only (two Newton steps and a
  third-order step; within about 2 ulp), was faster; on a 2-core AVX2 CPU
  without AVX-512 the division was 1.6x faster. So both are compiled
  (:data:`INVERSE_SQRT_VARIANTS`) and :func:`inverse_sqrt_variant` asks
  :func:`hpcgpu.autotune.choose`, which times them once per machine on a
  tiny input (``HPCGPU_AUTOTUNE=0``: the bit trick, everywhere).
- In float32 the compiled sweep does 17 floating-point operations per
  pair (LLVM's Newton step after ``vrsqrtps`` keeps two multiplies by
  constants) and the plain ten-line kernel of :mod:`hpcgpu.bench.plain`
  18: at most 1.06x apart, level in practice. :mod:`.simd` writes the
  sweep as explicit vector code with the Newton step folded into the
  weight (16 operations; :data:`SWEEP_VARIANTS`), 8 lanes with AVX2 and
  16 with AVX-512; :func:`sweep_variant` asks
  :func:`hpcgpu.autotune.choose` which runs (``HPCGPU_AUTOTUNE=0``: the
  compiled one). Per core, side by side with the plain kernel on a
  loaded 2-core Zen 4 (CPU time, medians of 9-15 turns): 1.09-1.10x with
  16 lanes; 1.12-1.13x with 8 lanes in a build for Haswell (AVX2 only),
  where the compiled sweep was level (0.96-1.04x).
- The ``r2 == 0`` test that zeroes coincident pairs costs a compare and a
  blend per pair; with ``eps2`` a normal number every ``r2 >= eps2 > 0``,
  so the sweep is compiled without it. The potential is a second compiled
  variant (one more sum); it leaves the target itself out by sweeping the
  sources before and after it, not by a per-pair index test.

A target's sums do not depend on which other targets are in the call: every
sweep runs the same instructions over the same sources in the same order
(the vector lanes split the sources by index alone; with the potential, the
split at the target's own index depends on that index only), so a partition
that asks for the forces on its own bodies gets bitwise the same values as
one call for all bodies with the same options. (With and without the
potential the compiled loops differ, and the accelerations may differ in the
last bit.) Several targets per sweep (register blocking) was measured: no
faster here (the sweep is bound by arithmetic, not loads). The explicit
float32 sweeps keep this: each lane sums its own sources in index order.

Fresh and cached code: Numba compiles each helper (``_sweep``, the ``prange``
body) as a library of its own, optimises it, then links a ``linkonce_odr``
copy into the kernel's module and optimises that again; its on-disk cache
holds the twice-optimised object. The JIT binds a call to the copy of a
symbol it loaded first, so the process that compiles runs the once-optimised
copies and every process loading the cache the twice-optimised ones. The
sweep must therefore compile to the same arithmetic either way. It did not
with the coincident-pair guard on ``inv_r``: LLVM turned that select into a
branch and, in one pass but not the other, sank ``sqrt`` into it next to the
division; instruction selection fuses ``1/sqrt`` into ``rsqrt`` and a Newton
step only within one block, so the scalar tail of the loop was ``sqrtss`` +
``divss`` fresh and ``rsqrtss`` cached, and 15 of 201 float32 accelerations
differed (up to 1.1e-5 relative) between a fresh and a resumed process. The
guard now zeroes the products, a select of cheap operands that stays a blend
(``tests/kernels/test_nbody_cache_bitwise.py`` compares the two paths).

Subnormals are flushed inside the kernel (:mod:`hpcgpu.kernels.fpenv`).
Inner loops are written ``for j in range(n)`` over contiguous arrays (see
:func:`_sweep` for why).
"""

import functools
import math

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from hpcgpu import autotune
from hpcgpu.kernels.fpenv import flush_subnormals, restore_fp_mode
from hpcgpu.kernels.threads import adaptive_threads
from hpcgpu.kernels.nbody import physics, simd

FASTMATH = frozenset({"contract", "arcp", "afn", "reassoc"})
"""LLVM fast-math flags of the kernel: no ``nnan``/``ninf`` (NaN must propagate)."""

_OPTS = dict(cache=True, nogil=True, fastmath=set(FASTMATH), error_model="numpy")
# The pair physics without reassoc: flags stay on the instructions when LLVM
# inlines, so only the sums over sources are reordered, never the formulas.
_PAIR_OPTS = dict(_OPTS, fastmath=set(FASTMATH - {"reassoc"}))

distance_squared = njit(**_PAIR_OPTS)(physics.distance_squared)
exclude_coincident = njit(**_PAIR_OPTS)(physics.exclude_coincident)
pair_weights = njit(**_PAIR_OPTS)(physics.pair_weights)


@intrinsic
def _float64_bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _float64_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


_RSQRT_MAGIC = np.int64(0x5FE6EB50C7B537A9)
"""The float64 counterpart of the well-known float32 constant 0x5F3759DF:
``bits(y0) = MAGIC - bits(x) / 2`` is within 3.5 % of ``1/sqrt(x)``."""


def _inverse_sqrt_float64(r2, one):
    # 3.5 % -> two Newton steps (the error squares: ~2e-3, ~5e-6) -> one
    # third-order step (it cubes: ~4e-17), all multiply-adds. r2 must be a
    # positive normal number or NaN (which stays NaN); callers mask zeros.
    y = _float64_from_bits(_RSQRT_MAGIC - (_float64_bits(r2) >> 1))
    half_r2 = 0.5 * r2
    y = y * (1.5 - half_r2 * (y * y))
    y = y * (1.5 - half_r2 * (y * y))
    e = one - r2 * (y * y)
    return y + y * (e * (0.5 + 0.375 * e))


def fast_inverse_sqrt(r2, one):
    """``1 / sqrt(r2)`` for a positive normal ``r2``, as fast as the dtype allows.

    float32: ``1 / sqrt`` under the kernel's fast-math flags (``vrsqrtps``
    and one Newton step). float64: a bit-trick estimate refined by
    multiply-adds (within about 2 ulp). NaN gives NaN; zero, subnormal or
    infinite ``r2`` give unspecified values (the kernel masks ``r2 == 0``
    where it can occur). For compiled code only (see :func:`inverse_sqrt_of`
    from Python).
    """
    raise NotImplementedError("fast_inverse_sqrt is called from Numba-compiled code")


def _inverse_sqrt_float32(r2, one):
    # A literal 1 (typed float32): ``one`` is a run-time value, and
    # ``one * rsqrt(r2)`` cost a multiply per pair.
    return np.float32(1.0) / math.sqrt(r2)


@overload(fast_inverse_sqrt, jit_options=dict(fastmath=set(FASTMATH - {"reassoc"}), error_model="numpy"))
def _fast_inverse_sqrt(r2, one):
    if isinstance(r2, types.Float) and r2.bitwidth == 64:
        return _inverse_sqrt_float64
    if isinstance(r2, types.Float) and r2.bitwidth == 32:
        return _inverse_sqrt_float32
    return physics.inverse_sqrt


divide_inverse_sqrt = njit(**_PAIR_OPTS)(physics.inverse_sqrt)


@njit(**_OPTS)
def inverse_sqrt_of(values, out, one, divide=False):
    """:func:`fast_inverse_sqrt` (or, with ``divide``, ``one / sqrt``) of every element of
    ``values`` into ``out`` (for tests; ``one`` is 1 in the values' dtype)."""
    for k in range(values.shape[0]):
        if divide:
            out[k] = divide_inverse_sqrt(values[k], one)
        else:
            out[k] = fast_inverse_sqrt(values[k], one)
    return out


@njit(**_OPTS)
def _sweep(x, y, z, sx, sy, sz, sm, eps2, zero, one, guard, potential, divide):
    """Sums over the sources ``sx, sy, sz, sm`` for the target at (x, y, z):
    ``(ax, ay, az, sum m/r)``.

    ``guard`` masks pairs at zero separation (needed when eps2 == 0);
    ``potential`` also sums ``m/r``; ``divide`` takes ``1/sqrt(r2)`` as
    ``sqrt`` plus a division instead of :func:`fast_inverse_sqrt` (the
    :data:`INVERSE_SQRT_VARIANTS`). All come as literal booleans, so each
    combination compiles to its own loop. The loop index starts at 0 and
    the arrays are contiguous: an offset index that LLVM cannot prove
    non-negative keeps Numba's negative-index wraparound, which turned the
    loads into gathers (2.5x slower).
    """
    ax = zero
    ay = zero
    az = zero
    phi = zero
    for j in range(sx.shape[0]):
        dx = sx[j] - x
        dy = sy[j] - y
        dz = sz[j] - z
        r2 = distance_squared(dx, dy, dz, eps2)
        if divide:
            inv_r = divide_inverse_sqrt(r2, one)
        else:
            inv_r = fast_inverse_sqrt(r2, one)
        weight, m_inv_r = pair_weights(sm[j], inv_r)
        if guard:
            # Zero the products, not inv_r: a select on inv_r itself lets LLVM
            # turn it into a branch and sink the division into it, apart from
            # its sqrt; see "Fresh and cached code" in the module docstring.
            weight = exclude_coincident(weight, r2, zero)
            m_inv_r = exclude_coincident(m_inv_r, r2, zero)
        ax += weight * dx
        ay += weight * dy
        az += weight * dz
        if potential:
            phi += m_inv_r
    return ax, ay, az, phi


@njit(**_OPTS)
def _target_sums(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, guard, potential, divide):
    """All sums of one target; ``me`` is its index among the sources, or -1.

    With the potential, the target itself is left out by sweeping the
    sources before it and after it (a per-pair index test in the loop cost a
    third of the speed). The split depends on the target's own index only.
    """
    if not potential or me < 0:
        return _sweep(x, y, z, sx, sy, sz, sm, eps2, zero, one, guard, potential, divide)
    ax, ay, az, phi = _sweep(x, y, z, sx[:me], sy[:me], sz[:me], sm[:me], eps2, zero, one,
                             guard, potential, divide)
    after = me + 1
    bx, by, bz, psi = _sweep(x, y, z, sx[after:], sy[after:], sz[after:], sm[after:], eps2,
                             zero, one, guard, potential, divide)
    return ax + bx, ay + by, az + bz, phi + psi


@njit(**_OPTS)
def _sums_for_flags(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, guard, potential, divide):
    """:func:`_target_sums` with each flag turned into a literal at its own call site,
    so that every one of the eight combinations is its own loop without a test per pair."""
    if divide:
        if potential:
            if guard:
                return _target_sums(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, True, True, True)
            return _target_sums(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, False, True, True)
        if guard:
            return _target_sums(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, True, False, True)
        return _target_sums(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, False, False, True)
    if potential:
        if guard:
            return _target_sums(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, True, True, False)
        return _target_sums(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, False, True, False)
    if guard:
        return _target_sums(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, True, False, False)
    return _target_sums(x, y, z, sx, sy, sz, sm, eps2, me, zero, one, False, False, False)


@njit(parallel=True, **_OPTS)
def _direct_kernel(tx, ty, tz, sx, sy, sz, sm, eps2, G, self_offset, acc_out, pot_out,
                   guard, potential, divide, n_chunks, zero, one):
    n_targets = tx.shape[0]
    for chunk in prange(n_chunks):
        fp_mode = flush_subnormals()
        i0 = chunk * n_targets // n_chunks
        i1 = (chunk + 1) * n_targets // n_chunks
        for k in range(i1 - i0):
            i = k + i0
            me = i + self_offset if self_offset >= 0 else -1
            ax, ay, az, phi = _sums_for_flags(tx[i], ty[i], tz[i], sx, sy, sz, sm, eps2, me, zero, one,
                                              guard, potential, divide)
            if potential:
                pot_out[i] = -(G * phi)
            acc_out[0, i] = G * ax
            acc_out[1, i] = G * ay
            acc_out[2, i] = G * az
        restore_fp_mode(fp_mode)


@njit(**_OPTS)
def _simd_targets(tx, ty, tz, sx, sy, sz, sm, eps2, G, self_offset, acc_out, pot_out, guard, potential,
                  lanes, i0, i1):
    """Targets ``i0:i1`` with the float32 sweep of :mod:`.simd`, ``lanes`` (a literal) wide."""
    fp_mode = flush_subnormals()
    for k in range(i1 - i0):
        i = k + i0
        me = i + self_offset if self_offset >= 0 else -1
        ax, ay, az, phi = simd.target_sums(tx[i], ty[i], tz[i], sx, sy, sz, sm, eps2, me, lanes, potential, guard)
        if potential:
            pot_out[i] = -(G * phi)
        acc_out[0, i] = G * ax
        acc_out[1, i] = G * ay
        acc_out[2, i] = G * az
    restore_fp_mode(fp_mode)


def _simd_kernel(lanes):
    """The parallel kernel of the ``lanes``-wide float32 sweep (8: AVX2, 16: AVX-512).

    One kernel per width, the width a constant of its closure (Numba types it
    as a literal): a width the CPU lacks is never compiled, and
    ``numba.literally`` on a kernel argument cost 24 ms of dispatch per call.
    """
    @njit(parallel=True, **_OPTS)
    def kernel(tx, ty, tz, sx, sy, sz, sm, eps2, G, self_offset, acc_out, pot_out, guard, potential, n_chunks):
        n_targets = tx.shape[0]
        for chunk in prange(n_chunks):
            _simd_targets(tx, ty, tz, sx, sy, sz, sm, eps2, G, self_offset, acc_out, pot_out, guard, potential,
                          lanes, chunk * n_targets // n_chunks, (chunk + 1) * n_targets // n_chunks)
    return kernel


_SIMD_KERNELS = {"explicit_avx2": _simd_kernel(8), "explicit_avx512": _simd_kernel(16)}


def _chunks(n_targets):
    """Target blocks per call: several per thread, so uneven thread speeds balance."""
    return max(1, min(n_targets, 8 * numba.get_num_threads()))


@adaptive_threads(key=lambda targets, sources, *rest: (targets.shape[1], sources.shape[1]))
def direct(target_positions, source_positions, source_masses, eps2, G, self_offset, acc_out, pot_out):
    """Softened accelerations (and potentials) on the targets; see ``_numpy.direct``."""
    dtype = source_positions.dtype
    t = dtype.type
    sources = np.ascontiguousarray(source_positions)
    masses = np.ascontiguousarray(source_masses)
    # eps2 below the smallest normal number could leave r2 == 0 (or
    # subnormal, which the kernel flushes to 0): keep the guard then.
    guard = not t(eps2) >= np.finfo(dtype).tiny
    potential = pot_out is not None
    pot = pot_out if potential else np.empty(0, dtype)
    sweep = sweep_variant(dtype)
    if sweep in _SIMD_KERNELS:
        _SIMD_KERNELS[sweep](target_positions[0], target_positions[1], target_positions[2],
                             sources[0], sources[1], sources[2], masses, t(eps2), t(G), int(self_offset),
                             acc_out, pot, guard, potential, _chunks(target_positions.shape[1]))
        return acc_out
    divide = inverse_sqrt_variant(dtype) == "divide"
    _direct_kernel(target_positions[0], target_positions[1], target_positions[2],
                   sources[0], sources[1], sources[2], masses, t(eps2), t(G), int(self_offset),
                   acc_out, pot, guard, potential, divide, _chunks(target_positions.shape[1]), t(0), t(1))
    return acc_out


INVERSE_SQRT_VARIANTS = {
    "bit_trick": "bit-trick estimate and multiply-adds (fast_inverse_sqrt): within 2 ulp in float64",
    "divide": "sqrt plus a division, each correctly rounded: within 1.5 ulp",
}
"""The float64 inverse square roots of the sweep and their accuracy (float32 always uses
``1/sqrt`` under fast-math: ``vrsqrtps`` and a Newton step)."""

DEFAULT_INVERSE_SQRT = "bit_trick"
"""The float64 variant run with ``HPCGPU_AUTOTUNE=0``."""

TUNING_BODIES = (256, 1024)
"""(targets, sources) of the input each variant is timed on at first use: 0.26 M
interactions, a fraction of a millisecond."""


SWEEP_TUNING_BODIES = (64, 4096)
"""(targets, sources) the float32 sweeps are timed on: as many interactions as
:data:`TUNING_BODIES`, in sweeps as long as a simulation's (the explicit sweep's fixed
cost per target, adding its lanes, weighs more in short ones)."""


@functools.lru_cache(maxsize=None)
def _tuning_bodies(dtype_name, bodies=TUNING_BODIES):
    dtype = np.dtype(dtype_name)
    rng = np.random.default_rng(0)
    targets, sources = bodies
    positions = rng.standard_normal((3, sources)).astype(dtype)
    masses = np.full(sources, 1.0 / sources, dtype)
    return positions, masses, np.empty((3, targets), dtype), np.empty(0, dtype)


def _tuning_runs(dtype):
    """The variants on the tuning input, built at the first timed call only (``choose`` asks
    for this dict on every call, and times nothing once it has a choice)."""
    targets = TUNING_BODIES[0]
    t = dtype.type

    def run(divide):
        def call():
            positions, masses, acc, pot = _tuning_bodies(dtype.name)
            _direct_kernel(positions[0, :targets], positions[1, :targets], positions[2, :targets],
                           positions[0], positions[1], positions[2], masses, t(1e-4), t(1), 0,
                           acc, pot, False, False, divide, _chunks(targets), t(0), t(1))
        return call

    return {"bit_trick": run(False), "divide": run(True)}


def inverse_sqrt_variant(dtype):
    """The inverse square root the sweep uses for ``dtype`` on this machine (a key of
    :data:`INVERSE_SQRT_VARIANTS`): float64 asks :func:`hpcgpu.autotune.choose`."""
    dtype = np.dtype(dtype)
    if dtype != np.float64:
        return DEFAULT_INVERSE_SQRT
    return autotune.choose("nbody.direct.inverse_sqrt.float64", _tuning_runs(dtype),
                           default=DEFAULT_INVERSE_SQRT)


SWEEP_VARIANTS = {
    "auto_vectorized": "the sweep as LLVM vectorises it (_direct_kernel): 1/sqrt under fast-math, "
                       "vrsqrtps or vrsqrt14ps and LLVM's Newton step; within 4 ulp",
    "explicit_avx2": "the explicit 8-lane sweep of .simd: vrsqrtps, one Newton step folded into the "
                     "weight (16 operations per pair); within 4 ulp",
    "explicit_avx512": "the explicit 16-lane sweep of .simd: vrsqrt14ps, the same Newton step; within 4 ulp",
}
"""The float32 sweeps (float64 always runs ``auto_vectorized``; see :data:`INVERSE_SQRT_VARIANTS`)."""

SWEEP_LANES = {"auto_vectorized": 0, "explicit_avx2": 8, "explicit_avx512": 16}
"""Vector width of each sweep variant (0: the compiler's choice)."""

DEFAULT_SWEEP = "auto_vectorized"
"""The float32 sweep run with ``HPCGPU_AUTOTUNE=0`` (the same on every x86 CPU with the same width)."""


def sweep_variants_available():
    """The keys of :data:`SWEEP_VARIANTS` this CPU can run (the explicit ones need AVX2 + FMA or AVX-512F)."""
    return [name for name, lanes in SWEEP_LANES.items() if not lanes or lanes in simd.lanes_available()]


def _sweep_tuning_runs(dtype):
    """The float32 sweep variants on the tuning input (as :func:`_tuning_runs`)."""
    targets = SWEEP_TUNING_BODIES[0]
    t = dtype.type

    def run(name):
        def call():
            positions, masses, acc, pot = _tuning_bodies(dtype.name, SWEEP_TUNING_BODIES)
            args = (positions[0, :targets], positions[1, :targets], positions[2, :targets],
                    positions[0], positions[1], positions[2], masses, t(1e-4), t(1), 0, acc, pot, False, False)
            if name in _SIMD_KERNELS:
                _SIMD_KERNELS[name](*args, _chunks(targets))
            else:
                _direct_kernel(*args, False, _chunks(targets), t(0), t(1))
        return call

    return {name: run(name) for name in sweep_variants_available()}


def sweep_variant(dtype):
    """The sweep the kernel runs for ``dtype`` on this machine (a key of :data:`SWEEP_VARIANTS`):
    float32 asks :func:`hpcgpu.autotune.choose` when this CPU has an explicit variant."""
    dtype = np.dtype(dtype)
    if dtype != np.float32 or len(sweep_variants_available()) < 2:
        return DEFAULT_SWEEP
    return autotune.choose("nbody.direct.sweep.float32", _sweep_tuning_runs(dtype), default=DEFAULT_SWEEP)
