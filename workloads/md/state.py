"""The state of the Lennard-Jones model: the atoms of one (partition of a) box, a frozen dataclass.

Pickles cleanly to dask workers; :class:`hpcgpu.workloads.md.LennardJones`
makes and advances it.
"""

from dataclasses import dataclass

__all__ = ["MDState"]


@dataclass(frozen=True)
class MDState:
    """Atoms of one (partition of a) Lennard-Jones model.

    Attributes
    ----------
    positions : array (3, N)
        Wrapped into the box, ``0 <= x < L`` (sigma).
    velocities, forces : arrays (3, N)
        Velocities and the forces at ``positions`` (reduced units, mass 1).
    images : int64 array (3, N)
        Periodic images crossed: the unwrapped position is ``positions + images * box``.
    origins : array (3, N)
        Unwrapped positions at step 0 (for the mean-squared displacement).
    ids : int64 array (N,)
        Global atom ids: they key each atom's random numbers.
    energies, virials : arrays (N,)
        Half of the potential energy and of ``r . f`` of each of the atom's pairs.
    pair_counts : int32 array (N,)
        The atom's neighbours inside the cutoff: their sum is twice the
        interacting pairs (what the shifted potential's energy lacks, times
        ``u(cutoff)``, from the full potential's).
    step, rebuilds : int
        Time steps taken (keys the thermostat's noise) and neighbour lists built so far.
    neighbors : NeighborList or None
        The current list (derived data; ``None`` makes the next step build one).
    """

    positions: object
    velocities: object
    forces: object
    images: object
    origins: object
    ids: object
    energies: object
    virials: object
    pair_counts: object
    step: int = 0
    rebuilds: int = 0
    neighbors: object = None

    def arrays(self):
        return (self.positions, self.velocities, self.forces, self.images, self.origins, self.ids,
                self.energies, self.virials, self.pair_counts)

    def __setstate__(self, fields):
        # a checkpoint written before the state carried its pair counts: the model restores them
        fields.setdefault("pair_counts", None)
        self.__dict__.update(fields)

    @property
    def size(self):
        return self.ids.shape[0]

    def _repr_html_(self):
        """HTML summary for Jupyter: atoms, step, list builds and each array's shape, dtype, device and range."""
        from hpcgpu.io import html_views

        return html_views.state_html(self, facts=[("atoms", self.size)])
