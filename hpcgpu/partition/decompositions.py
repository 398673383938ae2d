"""The decompositions by kind: what ``model.decomposition`` names, and the class that splits such a model.

- ``"grid"``: :class:`~hpcgpu.partition.grid.GridDecomposition` (2-D grids on a
  px x py process grid; :class:`~hpcgpu.partition.protocols.GridModel`);
- ``"bodies"``: :class:`~hpcgpu.partition.all_pairs.AllPairsDecomposition`
  (all-pairs forces; :class:`~hpcgpu.partition.protocols.AllPairsModel`);
- ``"domains"``: :class:`~hpcgpu.partition.bricks.BrickDecomposition` (short-range
  particles on px x py x pz bricks; :class:`~hpcgpu.partition.protocols.SlabModel`);
- ``"spectral"``: :class:`~hpcgpu.partition.spectral.SpectralDecomposition` (row
  blocks with a global FFT solve per stage; :class:`~hpcgpu.partition.protocols.SpectralModel`).
"""

from hpcgpu.errors import ConfigError
from hpcgpu.partition.all_pairs import AllPairsDecomposition
from hpcgpu.partition.bricks import BrickDecomposition
from hpcgpu.partition.grid import GridDecomposition
from hpcgpu.partition.spectral import SpectralDecomposition

__all__ = ["DECOMPOSITIONS", "decomposition_for", "decomposition_kind"]

DECOMPOSITIONS = {"grid": GridDecomposition, "bodies": AllPairsDecomposition, "domains": BrickDecomposition,
                  "spectral": SpectralDecomposition}
"""The class of each kind of decomposition (``model.decomposition``)."""


def decomposition_kind(model):
    """``model.decomposition``, checked: one of :data:`DECOMPOSITIONS`.

    Raises
    ------
    ConfigError
        The model has no ``decomposition`` attribute, or names no known kind.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> decomposition_kind(ShallowWater("rest", nx=8, ny=8, backend="numpy"))
    'grid'
    """
    kind = getattr(model, "decomposition", None)
    if kind not in DECOMPOSITIONS:
        got = f"got {kind!r}" if hasattr(model, "decomposition") else "it has none"
        raise ConfigError(f"{type(model).__name__}.decomposition must be one of {sorted(DECOMPOSITIONS)} "
                          f"(see hpcgpu.partition.protocols); {got}")
    return kind


def decomposition_for(model):
    """The decomposition class for ``model.decomposition`` (``grid``, ``bodies``, ``domains``, ``spectral``)."""
    return DECOMPOSITIONS[decomposition_kind(model)]
