"""Compute kernels of hpcgpu, one family per subpackage.

Each family (``stencil``, ...) has one file per backend (``_numpy.py``,
``_numba.py``, ``_cuda.py``, ``_cupy.py``) exporting the same functions with
the same signatures on raw arrays, and a public ``__init__.py`` that checks
input once and dispatches on ``backend=``. Kernels know nothing of dask or of
the models that use them.

Names of the files in a family
------------------------------
- ``_<backend>.py``: the backend files, and only they, start with ``_``
  (``_numpy.py``, ``_numba.py``, ``_cuda.py``, ``_cupy.py``).
- ``<what>.py``: a helper module is named for what it holds (``boundary.py``,
  ``physics.py``, ``tiling.py``, ``cells.py``, ``poisson.py``,
  ``solvers.py``); ``<what>_<backend>.py`` when it serves one backend
  (``fused_rk3_numba.py``, ``diffusion_cuda.py``, ``atoms_numba.py``); a
  subpackage when it outgrows one file (``nbody/tree/``: ``keys``,
  ``build``, ``targets``, ``walk``). Helpers shared by all families sit here
  (``threads.py``, ``fpenv.py``, ``cuda_interop.py``, ``launch_limits.py``).

The family's public API is the only door
----------------------------------------
Code outside ``kernels/`` (workloads, core) imports ``hpcgpu.kernels.<family>``
and uses the names in its ``__all__``: public functions that check their
input, and for hot loops ``prepare_*`` objects that check once (per call only
what is cheap). Optional fast paths (a fused RK3 step, a fused MD drift) are
declared by name in the family's ``FAST_PATHS``, never found by ``getattr``
probes on a backend file. Helper modules, even without a leading ``_``, are
the family's own; ``tests/test_layout.py`` fails on any module outside
``kernels/`` that imports one or calls ``backend.kernels(...)`` (the
benchmark harness, which times the backend kernels themselves, is listed
there).
"""

from hpcgpu import _jit_cache

# Before any kernel module defines its cached functions: their compiled code
# goes to the user's cache directory, never into the installed package.
_jit_cache.install()
