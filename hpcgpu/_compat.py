"""Compatibility shims for third-party version skew, each with its reason."""

import numpy as np

__all__ = ["numpy_aliases_for_numba_cuda"]

# NumPy 2.5 removed aliases that numba-cuda (0.30.x) still registers overloads
# for while building its typing context, so every first kernel compile fails
# with "module 'numpy' has no attribute 'row_stack'". Restoring the alias (to
# the function it always pointed at) is harmless for every other user.
_REMOVED_ALIASES = {"row_stack": "vstack"}


def numpy_aliases_for_numba_cuda():
    """Restore NumPy aliases numba-cuda needs; call before compiling CUDA kernels."""
    for alias, target in _REMOVED_ALIASES.items():
        if alias not in np.__dict__:
            try:
                getattr(np, alias)
            except AttributeError:
                setattr(np, alias, getattr(np, target))
