"""Flush subnormal floats to zero inside the Numba CPU kernels.

x86 CPUs take microcode assists on subnormal operands and results, up to
~100 times slower per operation. A shallow-water jet in float32 has them:
the far field of a sech^2 profile and of a Gaussian perturbation makes
products below 1e-38, and the whole stage ran 3x slower there than on the
same grid full of eddies. Setting MXCSR's flush-to-zero and
denormals-are-zero bits inside a parallel region removes that; changing
values below 1e-38 (float32) or 1e-308 (float64) to zero is far below every
tolerance. Each kernel sets the bits at the start of its parallel loop body
and restores the thread's previous mode at the end, so other code running on
Numba's worker threads is unaffected. GPUs handle subnormals at full speed
(and CuPy compiles float32 with flush-to-zero already).

On CPUs other than x86-64 both functions do nothing.
"""

import platform

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["flush_subnormals", "restore_fp_mode", "FLUSH_BITS"]

FLUSH_BITS = 0x8040  # MXCSR bit 15: flush to zero; bit 6: denormals are zero
_X86_64 = platform.machine().lower() in ("x86_64", "amd64")

if _X86_64:
    from llvmlite import ir

    def _mxcsr_intrinsic(builder, name, slot):
        i8_pointer = ir.IntType(8).as_pointer()
        function = builder.module.declare_intrinsic(
            name, fnty=ir.FunctionType(ir.VoidType(), [i8_pointer]))
        builder.call(function, [builder.bitcast(slot, i8_pointer)])

    @intrinsic
    def _read_mxcsr(typingctx):
        def codegen(context, builder, signature, args):
            slot = builder.alloca(ir.IntType(32))
            _mxcsr_intrinsic(builder, "llvm.x86.sse.stmxcsr", slot)
            return builder.load(slot)
        return types.uint32(), codegen

    @intrinsic
    def _write_mxcsr(typingctx, value):
        def codegen(context, builder, signature, args):
            slot = builder.alloca(ir.IntType(32))
            builder.store(args[0], slot)
            _mxcsr_intrinsic(builder, "llvm.x86.sse.ldmxcsr", slot)
            return context.get_dummy_value()
        return types.void(types.uint32), codegen

    @njit(cache=True)
    def flush_subnormals():
        """Turn on flush-to-zero in this thread; returns the previous mode."""
        previous = _read_mxcsr()
        _write_mxcsr(previous | np.uint32(FLUSH_BITS))
        return previous

    @njit(cache=True)
    def restore_fp_mode(previous):
        """Restore the mode returned by :func:`flush_subnormals`."""
        _write_mxcsr(previous)
else:  # pragma: no cover - not x86-64
    @njit(cache=True)
    def flush_subnormals():
        return np.uint32(0)

    @njit(cache=True)
    def restore_fp_mode(previous):
        return None
