"""HTML views: moved to :mod:`hpcgpu.io.html_views`; ``hpcgpu.display`` stays as an alias for existing code."""

from hpcgpu.io.html_views import *  # noqa: F403 - the same objects under the old name
from hpcgpu.io.html_views import __all__
