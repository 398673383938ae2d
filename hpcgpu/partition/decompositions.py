"""The decompositions by kind: what ``model.decomposition`` names, and the class that splits such a model.

- ``"grid"``: :class:`~hpcgpu.partition.grid.GridDecomposition` (2-D grids on a
  px x py process grid; :class:`~hpcgpu.partition.protocols.GridModel`);
- ``"rows"``: :class:`~hpcgpu.partition.rows.RowDecomposition` (grids split into
  blocks of rows; :class:`~hpcgpu.partition.protocols.RowModel`);
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
from hpcgpu.partition.rows import RowDecomposition
from hpcgpu.partition.spectral import SpectralDecomposition

__all__ = ["DECOMPOSITIONS", "decomposition_for"]

DECOMPOSITIONS = {"rows": RowDecomposition, "grid": GridDecomposition, "bodies": AllPairsDecomposition,
                  "domains": BrickDecomposition, "spectral": SpectralDecomposition}
"""The class of each kind of decomposition (``model.decomposition``; a model without one is ``"rows"``)."""


def decomposition_for(model):
    """The decomposition class for ``model.decomposition`` (``rows``, ``grid``, ``bodies``, ``domains``, ``spectral``)."""
    kind = getattr(model, "decomposition", "rows")
    if kind not in DECOMPOSITIONS:
        raise ConfigError(f"model decomposition must be one of {sorted(DECOMPOSITIONS)}; got {kind!r}")
    return DECOMPOSITIONS[kind]
