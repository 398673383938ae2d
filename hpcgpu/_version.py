"""The version of hpcgpu, in a module of its own so that the modules that record it (checkpoints) import it
from here, below the package's ``__init__`` (which imports them)."""

__version__ = "0.1.0"
