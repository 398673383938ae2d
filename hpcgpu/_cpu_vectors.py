"""The vector width Numba compiles the CPU kernels for, and how to widen it.

On CPUs with AVX-512, LLVM (and so Numba) tunes most Intel models to
prefer 256-bit vectors. Compiled for 512-bit vectors instead
(``NUMBA_CPU_FEATURES`` set to the host's features plus
``-prefer-256-bit``), hpcgpu's Numba kernels ran, on this project's 2-core
Sapphire Rapids VM (2026-11-30, ``hpcgpu bench ... --backend numba``, side
by side with separate Numba caches): N-body direct summation 1.38x
(float64 2.35e9 -> 3.25e9, float32 7.7e9 -> 1.07e10 interactions/s at
N = 16384), diffusion 1.11x, the fused shallow-water step 1.06x, MD
float32 1.07x, MD float64 and the shallow-water stage calls unchanged.

It is a setting of the whole process and is read when Numba first
compiles, so hpcgpu does not change it on import: set it in the
environment of every process of a run (the client and the workers: local
clusters inherit it) before Python starts. Kernels that sum with
reassociation (N-body, MD pair sums) round differently at another width,
so processes with different settings do not agree bitwise.
"""

import os

__all__ = ["wide_vector_features", "vector_width_note"]


def wide_vector_features():
    """The ``NUMBA_CPU_FEATURES`` value for 512-bit vectors on this CPU, or None without AVX-512.

    Examples
    --------
    >>> value = wide_vector_features()
    >>> value is None or value.endswith(",-prefer-256-bit")
    True
    """
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    if not features.get("avx512f"):
        return None
    return features.flatten() + ",-prefer-256-bit"


def vector_width_note():
    """One line for ``hpcgpu info``: the width the Numba kernels get in this process, and how to widen it."""
    requested = os.environ.get("NUMBA_CPU_FEATURES", "")
    if requested:
        wide = "-prefer-256-bit" in requested and "+avx512f" in requested
        return f"cpu vectors: {'512' if wide else 'as set'}-bit (NUMBA_CPU_FEATURES is set)"
    if wide_vector_features() is None:
        return "cpu vectors: Numba's default for this CPU (no AVX-512)"
    return ("cpu vectors: 256-bit, Numba's default here; AVX-512 is available: export "
            "NUMBA_CPU_FEATURES=\"$(hpcgpu info --wide-vectors)\" in every process of a run for 512-bit "
            "(N-body 1.38x, diffusion 1.11x measured; see hpcgpu._cpu_vectors)")
