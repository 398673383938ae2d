"""The float32 N-body sweep written as explicit x86 vector code, with its own Newton step.

Why: compiled from Python, ``1 / sqrt(r2)`` under fast-math becomes
``vrsqrtps`` plus LLVM's Newton step, four more operations (two multiplies by
constants among them), and ``m inv_r^3`` three more: 17 floating-point
operations per pair (counted in the assembly), where the plain ten-line
kernel does 18 (its ``one / sqrt`` keeps a multiply by a run-time 1). Port
bound, that is at most 1.06x. Here the estimate ``y0`` of the reciprocal
square root is taken as it comes from the instruction and one Newton step is
folded into the weight with the constants moved out of the loop::

    y  = y0 (3 - r2 y0^2)        = 2 / sqrt(r2)  (one Newton step, unscaled)
    w  = (m y) y y               = 8 m / r^3
    a += w d,   phi += m y       (sums scaled by 8 and by 2)

three operations for the step and three for the weight: 16 per pair with
the differences, ``r2`` and the sums (1.125x the plain kernel's count). The
caller multiplies the sums by 1/8 and 1/2 (exact: powers of two).

:func:`lanes_available` says which widths the features Numba compiles for
allow: 8 lanes (AVX2 and FMA: ``vrsqrtps``, 12-bit estimate) and 16
(AVX-512F: ``vrsqrt14ps``, 14-bit). After the Newton step they are within
1.7 and 1.1 ulp of ``1 / sqrt(r2)`` (tested: within 4), like the compiled
sweep. Where neither is available (another architecture, or
``NUMBA_CPU_NAME`` naming a CPU without ``NUMBA_CPU_FEATURES``) there is no
variant to choose. Multiply-adds are explicit ``llvm.fma`` calls; each lane
of each of the :data:`STREAMS` sums its own sources in index order, and the
sums are added in a fixed order at the end: a target's sums depend on the
sources alone (not on the other targets of the call), as in
:mod:`hpcgpu.kernels.nbody._numba`. The last ``n % (lanes * STREAMS)``
sources go through a scalar loop with a correctly rounded ``2 / sqrt``.

Measured per core beside the plain kernel (CPU time, medians of 15 turns,
N = 16384, a loaded 2-core Zen 4): 16 lanes 1.09-1.13x, 8 lanes in a
Haswell build 1.12-1.20x; one stream was 1.08x and four (8 lanes, 16
registers) lost to spills.
"""

import functools
import math

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["LANE_WIDTHS", "STREAMS", "inverse_sqrt_of", "lanes_available", "target_sums"]

LANE_WIDTHS = (8, 16)
"""Vector widths (float32 lanes) the sweep is written for: AVX2 + FMA, and AVX-512F."""

STREAMS = 2
"""Independent vectors of sources per loop step, each with its own sums (added at the end)."""

_OPTS = dict(cache=True, nogil=True, error_model="numpy")
# No fast-math: the vector code's operations are exactly those written (explicit
# fma calls), and the scalar tail is correctly rounded.


def _compiled_features():
    """The x86 features Numba compiles for: ``NUMBA_CPU_FEATURES`` when set (``hpcgpu info
    --wide-vectors`` sets it), else the host's; None when a named CPU hides them."""
    requested = numba.config.CPU_FEATURES
    if requested:
        return {entry[1:] for entry in requested.split(",") if entry.startswith("+")}
    if numba.config.CPU_NAME not in (None, "host"):
        return None
    import llvmlite.binding as llvm

    try:
        return {name for name, on in llvm.get_host_cpu_features().items() if on}
    except RuntimeError:  # not a CPU LLVM can describe
        return None


@functools.lru_cache(maxsize=None)
def lanes_available():
    """The widths of :data:`LANE_WIDTHS` the kernels of this process can be compiled for.

    8 with AVX2 and FMA, 16 too with AVX-512F, in the features Numba compiles
    for; () on other CPUs or when ``NUMBA_CPU_NAME`` names a CPU without
    ``NUMBA_CPU_FEATURES``.

    Examples
    --------
    >>> set(lanes_available()) <= {8, 16}
    True
    """
    features = _compiled_features()
    if not features or not {"avx2", "fma"} <= features:
        return ()
    return (8, 16) if "avx512f" in features else (8,)


def _rsqrt_estimate(builder, values, lanes):
    """The hardware reciprocal-square-root estimate of a float32 vector."""
    vector = values.type
    if lanes == 8:
        function = builder.module.declare_intrinsic("llvm.x86.avx.rsqrt.ps.256", fnty=ir.FunctionType(vector, [vector]))
        return builder.call(function, [values])
    mask_type = ir.IntType(16)
    function = builder.module.declare_intrinsic(
        "llvm.x86.avx512.rsqrt14.ps.512", fnty=ir.FunctionType(vector, [vector, vector, mask_type]))
    return builder.call(function, [values, ir.Constant(vector, None), ir.Constant(mask_type, -1)])


def _fma(builder, a, b, c):
    vector = a.type
    function = builder.module.declare_intrinsic(f"llvm.fma.v{vector.count}f32",
                                                fnty=ir.FunctionType(vector, [vector, vector, vector]))
    return builder.call(function, [a, b, c])


def _splat(builder, scalar, vector):
    single = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(single, ir.Constant(vector, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), vector.count), None))


def _lane_sum(builder, values):
    """The lanes' sum, halves added pairwise (lane k + lane k + n/2, ...): a fixed order, and
    a dependency chain of log2(lanes) additions rather than lanes."""
    width = values.type.count
    while width > 1:
        width //= 2
        low = builder.shuffle_vector(values, values, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                                  list(range(width))))
        high = builder.shuffle_vector(values, values, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                                   list(range(width, 2 * width))))
        values = builder.fadd(low, high)
    return builder.extract_element(values, ir.Constant(ir.IntType(32), 0))


@intrinsic
def _vector_sums(typingctx, sx, sy, sz, sm, x, y, z, eps2, count, lanes, potential, guard):
    """The scaled sums ``(8 ax, 8 ay, 8 az, 2 phi)`` over the first ``count`` sources (a
    multiple of ``lanes``), ``lanes`` at a time; ``lanes``, ``potential`` and ``guard`` are
    literals, so only the host's own width is ever compiled."""
    float32_row = types.Array(types.float32, 1, "C")
    if not all(row == float32_row for row in (sx, sy, sz, sm)):
        return None
    if not (isinstance(lanes, types.IntegerLiteral) and lanes.literal_value in LANE_WIDTHS
            and isinstance(potential, types.BooleanLiteral) and isinstance(guard, types.BooleanLiteral)):
        return None
    width, with_potential, with_guard = lanes.literal_value, potential.literal_value, guard.literal_value
    signature = types.UniTuple(types.float32, 4)(sx, sy, sz, sm, types.float32, types.float32, types.float32,
                                                 types.float32, types.intp, lanes, potential, guard)

    def codegen(context, builder, sig, args):
        rows = [context.make_array(sig.args[k])(context, builder, args[k]).data for k in range(4)]
        vector = ir.VectorType(ir.FloatType(), width)
        target = [_splat(builder, args[k], vector) for k in (4, 5, 6)]
        eps2v = _splat(builder, args[7], vector)
        three = ir.Constant(vector, [3.0] * width)
        zero = ir.Constant(vector, None)
        streams = [[cgutils.alloca_once_value(builder, zero) for _ in range(4)] for _ in range(STREAMS)]
        step = width * STREAMS
        blocks = builder.udiv(args[8], ir.Constant(args[8].type, step))
        with cgutils.for_range(builder, blocks) as loop:
            for stream, sums in enumerate(streams):
                first = builder.add(builder.mul(loop.index, ir.Constant(loop.index.type, step)),
                                    ir.Constant(loop.index.type, stream * width))

                def load(row):
                    pointer = builder.bitcast(builder.gep(row, [first]), vector.as_pointer())
                    return builder.load(pointer, align=4)

                d = [builder.fsub(load(rows[k]), target[k]) for k in range(3)]
                r2 = _fma(builder, d[2], d[2], _fma(builder, d[1], d[1], _fma(builder, d[0], d[0], eps2v)))
                y0 = _rsqrt_estimate(builder, r2, width)
                correction = _fma(builder, builder.fneg(builder.fmul(r2, y0)), y0, three)
                twice_inv_r = builder.fmul(y0, correction)
                if with_guard:  # r2 == 0 gave inf * 0 = NaN: such a pair contributes nothing
                    twice_inv_r = builder.select(builder.fcmp_ordered("==", r2, zero), zero, twice_inv_r)
                m_y = builder.fmul(load(rows[3]), twice_inv_r)
                weight = builder.fmul(builder.fmul(m_y, twice_inv_r), twice_inv_r)
                for k in range(3):
                    builder.store(_fma(builder, weight, d[k], builder.load(sums[k])), sums[k])
                if with_potential:
                    builder.store(builder.fadd(builder.load(sums[3]), m_y), sums[3])
        totals = []
        for k in range(4):
            total = builder.load(streams[0][k])
            for sums in streams[1:]:
                total = builder.fadd(total, builder.load(sums[k]))
            totals.append(_lane_sum(builder, total))
        return context.make_tuple(builder, sig.return_type, totals)

    return signature, codegen


@njit(**_OPTS)
def _sweep(x, y, z, sx, sy, sz, sm, eps2, lanes, potential, guard):
    """Scaled sums over all of ``sx, sy, sz, sm``: vectors, then a scalar tail of fewer than ``lanes``."""
    n = sx.shape[0]
    head = n - n % (lanes * STREAMS)
    ax, ay, az, phi = _vector_sums(sx, sy, sz, sm, x, y, z, eps2, head, lanes, potential, guard)
    two = np.float32(2.0)
    tx, ty, tz, tm = sx[head:], sy[head:], sz[head:], sm[head:]
    for j in range(tx.shape[0]):
        dx = tx[j] - x
        dy = ty[j] - y
        dz = tz[j] - z
        r2 = eps2 + dx * dx + dy * dy + dz * dz
        if guard and r2 == 0:
            continue
        twice_inv_r = two / math.sqrt(r2)
        m_y = tm[j] * twice_inv_r
        weight = m_y * twice_inv_r * twice_inv_r
        ax += weight * dx
        ay += weight * dy
        az += weight * dz
        if potential:
            phi += m_y
    return ax, ay, az, phi


@njit(**_OPTS)
def _split_sums(x, y, z, sx, sy, sz, sm, eps2, me, lanes, potential, guard):
    """As ``_numba._target_sums``: with the potential, the target (source ``me``) is left out by
    sweeping the sources before and after it."""
    if not potential or me < 0:
        return _sweep(x, y, z, sx, sy, sz, sm, eps2, lanes, potential, guard)
    ax, ay, az, phi = _sweep(x, y, z, sx[:me], sy[:me], sz[:me], sm[:me], eps2, lanes, potential, guard)
    after = me + 1
    bx, by, bz, psi = _sweep(x, y, z, sx[after:], sy[after:], sz[after:], sm[after:], eps2, lanes, potential,
                             guard)
    return ax + bx, ay + by, az + bz, phi + psi


@njit(**_OPTS)
def target_sums(x, y, z, sx, sy, sz, sm, eps2, me, lanes, potential, guard):
    """``(ax, ay, az, phi)`` of one float32 target (``me``: its index among the sources, or -1),
    ``lanes`` a literal of :data:`LANE_WIDTHS`; unscaled (the vector sums' 8 and 2 divided out)."""
    if potential:
        if guard:
            ax, ay, az, phi = _split_sums(x, y, z, sx, sy, sz, sm, eps2, me, lanes, True, True)
        else:
            ax, ay, az, phi = _split_sums(x, y, z, sx, sy, sz, sm, eps2, me, lanes, True, False)
    elif guard:
        ax, ay, az, phi = _split_sums(x, y, z, sx, sy, sz, sm, eps2, me, lanes, False, True)
    else:
        ax, ay, az, phi = _split_sums(x, y, z, sx, sy, sz, sm, eps2, me, lanes, False, False)
    eighth = np.float32(0.125)
    return ax * eighth, ay * eighth, az * eighth, phi * np.float32(0.5)


@njit(**_OPTS)
def inverse_sqrt_of(values, out, lanes):
    """``1 / sqrt`` of each of the float32 ``values`` into ``out``, as the ``lanes``-wide sweep
    computes it (the estimate and its Newton step; for tests).

    Each value is the ``r2`` of ``lanes * STREAMS`` sources at the target's place (``eps2`` the
    value, zero separations), one of mass 1 and the others massless: the potential sum is then
    exactly the one pair's ``2 / sqrt(r2)``, which :func:`target_sums` halves.
    """
    numba.literally(lanes)
    count = lanes * STREAMS
    zeros = np.zeros(count, np.float32)
    masses = np.zeros(count, np.float32)
    masses[0] = 1
    origin = np.float32(0)
    for k in range(values.shape[0]):
        out[k] = target_sums(origin, origin, origin, zeros, zeros, zeros, masses, values[k], -1, lanes, True,
                             False)[3]
    return out
