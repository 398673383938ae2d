"""The decompositions by kind: what ``model.decomposition`` names, and the class that splits such a model.

- ``"rows"``: :class:`~hpcgpu.partition.rows.RowDecomposition` (grids; the model
  follows :class:`~hpcgpu.partition.protocols.RowModel`);
- ``"bodies"``: :class:`~hpcgpu.partition.all_pairs.AllPairsDecomposition`
  (all-pairs forces; :class:`~hpcgpu.partition.protocols.AllPairsModel`);
- ``"domains"``: :class:`~hpcgpu.partition.bricks.BrickDecomposition` (short-range
  particles; :class:`~hpcgpu.partition.protocols.SlabModel`).
"""

from hpcgpu.errors import ConfigError
from hpcgpu.partition.all_pairs import AllPairsDecomposition
from hpcgpu.partition.bricks import BrickDecomposition
from hpcgpu.partition.rows import RowDecomposition

__all__ = ["DECOMPOSITIONS", "decomposition_for"]

DECOMPOSITIONS = {"rows": RowDecomposition, "bodies": AllPairsDecomposition, "domains": BrickDecomposition}
"""The class of each kind of decomposition (``model.decomposition``; a model without one is ``"rows"``)."""


def decomposition_for(model):
    """The decomposition class for ``model.decomposition`` (``rows``, ``bodies``, ``domains``)."""
    kind = getattr(model, "decomposition", "rows")
    if kind not in DECOMPOSITIONS:
        raise ConfigError(f"model decomposition must be 'rows', 'bodies' or 'domains'; got {kind!r}")
    return DECOMPOSITIONS[kind]
