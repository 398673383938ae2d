"""Zarr output: moved to :mod:`hpcgpu.io.zarr_output`; ``hpcgpu.output`` stays as an alias for existing code."""

from hpcgpu.io.zarr_output import *  # noqa: F403 - the same objects under the old name
from hpcgpu.io.zarr_output import __all__
