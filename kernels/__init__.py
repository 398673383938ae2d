"""Compute kernels of hpcgpu, one family per subpackage.

Each family (``stencil``, ...) has one file per backend (``_numpy.py``,
``_numba.py``, ``_cuda.py``, ``_cupy.py``) exporting the same functions with
the same signatures on raw arrays, and a public ``__init__.py`` that checks
input once and dispatches on ``backend=``. Kernels know nothing of dask or of
the models that use them.
"""

from hpcgpu import _jit_cache

# Before any kernel module defines its cached functions: their compiled code
# goes to the user's cache directory, never into the installed package.
_jit_cache.install()
