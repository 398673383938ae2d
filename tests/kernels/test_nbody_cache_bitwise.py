"""Numba's N-body kernel gives bitwise the same forces freshly compiled and loaded from Numba's cache.

The project promises that a run resumed in a new process equals an uninterrupted one, and that 1 and N
workers agree; both need this. One child process compiles the kernels (and writes the cache), a second one
with the same ``NUMBA_CACHE_DIR`` loads them. The compiling process runs the once-optimised copies of the
kernel's helpers and the loading one the twice-optimised copies linked into the kernel (see "Fresh and cached
code" in :mod:`hpcgpu.kernels.nbody._numba`): with the coincident-pair guard on ``inv_r``, float32 with
``softening=0`` differed in 15 of 201 accelerations. The inputs cover the guarded sweep (two coincident
bodies, no softening), the potential, a softened run, and float64.

Example, by hand::

    NUMBA_CACHE_DIR=$(mktemp -d) python -c "$CHILD" fresh.npz   # compiles
    NUMBA_CACHE_DIR=<same> python -c "$CHILD" cached.npz       # loads the cache
"""

import os
import subprocess
import sys
import textwrap

import numpy as np

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from hpcgpu.kernels import nbody
    results = {}
    for dtype in (np.float32, np.float64):
        rng = np.random.default_rng(1)
        positions = rng.standard_normal((3, 301)).astype(dtype)
        positions[:, 7] = positions[:, 3]
        masses = rng.random(301).astype(dtype)
        for softening in (0.0, 0.01):
            name = f"{np.dtype(dtype).name}_eps{softening}"
            results[name] = nbody.accelerations(positions, masses, softening=softening, G=1.5,
                                                targets=(50, 117), backend="numba")
            acc, pot = nbody.accelerations(positions, masses, softening=softening, G=1.5,
                                           potential=True, backend="numba")
            results[name + "_with_potential"] = acc
            results[name + "_potential"] = pot
    np.savez(sys.argv[1], **{name: np.asarray(value) for name, value in results.items()})
""")


def run_child(tmp_path, name):
    out = tmp_path / f"{name}.npz"
    # Autotune off: the float32 sweep is the auto-vectorised one on every CPU.
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba_cache"), HPCGPU_AUTOTUNE="0",
               HPCGPU_ADAPTIVE_THREADS="0")
    subprocess.run([sys.executable, "-c", CHILD, str(out)], env=env, check=True, timeout=300)
    with np.load(out) as data:
        return {key: data[key] for key in data.files}


def test_fresh_and_cached_kernels_give_bitwise_equal_forces(tmp_path):
    fresh = run_child(tmp_path, "fresh")
    assert any((tmp_path / "numba_cache").rglob("*.nbc")), "the first run wrote no Numba cache"
    cached = run_child(tmp_path, "cached")
    assert fresh.keys() == cached.keys()
    differing = {name: int((fresh[name] != cached[name]).sum()) for name in fresh
                 if fresh[name].tobytes() != cached[name].tobytes()}
    assert not differing, f"values differing between the fresh and the cached kernel: {differing}"
