"""The radial distribution function g(r) of a run, reduced on its ranks: no atom reaches the client.

:func:`run_rdf` asks the run's executor for a reduction
(:mod:`hpcgpu.partition.rank_reductions`): each rank of a brick run
counts, per shell, the pairs of each of its own atoms with every atom
within ``r_max`` of it, its own and its ghosts (fetched fresh by a staged
exchange of the current positions, :meth:`BrickDecomposition.current_ghosts
<hpcgpu.partition.bricks.BrickDecomposition.current_ghosts>`); the counts
are summed up a tree to rank 0 and the client normalises them. Every atom
is owned by one rank and counts each of its pairs once, as a row of the
one-process full list does, so the summed counts are the one-process
counts exactly (the same positions give the same float64 distances, and
the counts are integers held in float64). A local run computes the same
function on its whole state.

``r_max`` at most the cutoff on a brick run: ghosts reach ``cutoff + skin``
from a brick, and an atom strays up to ``skin / 2`` from it between list
builds.
"""

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import md as md_kernels
from hpcgpu.workloads.md import pairs

__all__ = ["rdf_part", "run_rdf"]


def run_rdf(simulation, bins=100, r_max=None):
    """g(r) of ``simulation``'s current state, reduced on its ranks (a partitioned run gathers no atom).

    Parameters
    ----------
    simulation : hpcgpu.Simulation
        A run of a :class:`~hpcgpu.workloads.md.LennardJones` model, local or partitioned.
    bins : int
        Shells of equal width (>= 1).
    r_max : float, optional
        Largest distance (sigma), default the cutoff; at most half the
        shortest box side, and at most the cutoff on a partitioned run.

    Returns
    -------
    r, g : numpy arrays (bins,)
        Shell centres (sigma) and g(r), as :meth:`LennardJones.rdf
        <hpcgpu.workloads.md.LennardJones.rdf>` gives for the gathered state.

    Raises
    ------
    ConfigError
        ``bins`` or ``r_max`` out of range.

    Examples
    --------
    >>> from hpcgpu import Simulation
    >>> from hpcgpu.workloads.md import LennardJones
    >>> sim = Simulation(LennardJones(4, backend="numpy"), dt=0.005, stop_steps=2, progress=False)
    >>> r, g = run_rdf(sim, bins=50)
    >>> bool((g == sim.model.rdf(sim.state, bins=50)[1]).all())
    True
    """
    model = simulation.model
    bins, r_max = model.rdf_range(bins, r_max)
    # checked here: an error on a rank would end the run
    decomposition = getattr(simulation.executor, "decomposition", None)
    if decomposition is not None and not hasattr(decomposition, "current_ghosts"):
        raise ConfigError(f"g(r) on the ranks needs a decomposition with ghost atoms (bricks); this run's is "
                          f"{type(decomposition).__name__}")
    if decomposition is not None and r_max > model.cutoff:
        raise ConfigError(f"r_max must be <= the cutoff ({model.cutoff}) on a partitioned run (its ghost atoms "
                          f"reach no farther); got {r_max}")
    total = simulation.executor.reduce_on_ranks(rdf_part, bins, r_max)
    return pairs.rdf_from_counts(total["counts"], total["atoms"], model.box, r_max)


def rdf_part(rank, block, bins, r_max):
    """A rank's share of g(r): ``{"counts": pairs per shell of its own atoms, "atoms": how many it owns}``.

    Called on every rank by a reduction (:mod:`hpcgpu.partition.rank_reductions`);
    on a local run ``block`` is the whole state.
    """
    model, decomposition = rank.model, rank.decomposition
    if decomposition is None:
        return {"counts": model.rdf_counts(block, bins, r_max), "atoms": block.size}
    state = decomposition.model_state(block)
    ghosts = decomposition.current_ghosts(rank, block)  # every rank exchanges, even one without atoms
    own = state.size
    if own == 0:
        return {"counts": np.zeros(bins), "atoms": 0}
    xp = model.backend.xp
    joined = xp.concatenate([state.positions, ghosts], axis=1) if ghosts.shape[1] else state.positions
    capacity = getattr(state.neighbors, "capacity", None)
    # rows for the rank's own atoms only: a ghost's pairs are counted by the rank that owns it
    neighbors = md_kernels.build_neighbor_list(joined, model.box, cutoff=r_max, skin=model.skin, capacity=capacity,
                                               rows=own, backend=model.backend)
    return {"counts": pairs.pair_distance_counts(model.backend, model.box, joined, neighbors, bins, r_max),
            "atoms": own}
