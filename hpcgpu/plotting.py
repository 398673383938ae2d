"""PNG pictures: moved to :mod:`hpcgpu.io.png_panels`; ``hpcgpu.plotting`` stays as an alias for existing code."""

from hpcgpu.io.png_panels import *  # noqa: F403 - the same objects under the old name
from hpcgpu.io.png_panels import __all__
