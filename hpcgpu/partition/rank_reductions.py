"""Reductions on the ranks: a function of each rank's block, summed, so that only the sum reaches the client.

A diagnostic that is a sum over items (a histogram of pair distances, an
energy by species, a count) need not gather the state: each rank computes
its part from its own block (and, through the communicator, what its
neighbours hold), the parts are summed up a tree to rank 0 and the client
receives that one sum. :meth:`PartitionedExecutor.reduce_on_ranks
<hpcgpu.partition.engine.PartitionedExecutor.reduce_on_ranks>` queues such
a reduction into the run's program (it runs inside an epoch, after the
queued steps, where the ranks can exchange messages), and
:meth:`LocalExecutor.reduce_on_ranks
<hpcgpu.partition.local.LocalExecutor.reduce_on_ranks>` calls the same
function once on the whole state, so a diagnostic written once runs on
both.

The function is called on every rank as ``function(rank, block, *args)``:

- ``rank`` is a :class:`RankView`: ``model`` (the rank's copy of the
  model), ``comm`` (its communicator: point-to-point and collectives),
  ``rank``, ``size`` and ``decomposition`` (None on a local run);
- ``block`` is what the decomposition keeps for the rank between epochs
  (``decomposition.model_state(block)`` is the model state of its own
  items; on a local run, the whole state itself);

and returns its part: a number, a NumPy array or a dict of them, summed
key by key (:func:`combine_parts`). The function travels to the workers
with the epoch's program (a module-level function by name; a closure is
pickled with what it captures: keep that small), and every rank must make
the same collective calls in the same order. A function that raises on a
rank ends the run, as a failing step does: check what it is given on the
client first.
"""

import uuid
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ClusterError, ConfigError

__all__ = ["RankView", "combine_parts", "reduction_operation", "run_reduction", "take_reduction"]

KIND = "reduced"
"""The kind of the record a reduction leaves among an executor's collected records."""


@dataclass(frozen=True)
class RankView:
    """What a reduction's function sees of its rank: model, communicator, rank, size, decomposition."""

    model: object
    comm: object
    rank: int = 0
    size: int = 1
    decomposition: object = None


def combine_parts(parts):
    """The sum of the ranks' parts, in rank order: numbers, arrays, or dicts of them (key by key).

    Integer counts held in float64 sum exactly below 2**53, so a histogram
    of counts is the same however the items were split.

    Examples
    --------
    >>> combine_parts([{"counts": np.array([1.0, 2.0]), "atoms": 3}, {"counts": np.array([0.0, 5.0]), "atoms": 4}])
    {'counts': array([1., 7.]), 'atoms': 7}
    >>> combine_parts([1.5, 2.5])
    4.0
    """
    if not parts:
        raise ConfigError("combine_parts needs at least one part; got none")
    first = parts[0]
    if isinstance(first, dict):
        if any(not isinstance(p, dict) or p.keys() != first.keys() for p in parts):
            raise ConfigError(f"every rank's part must be a dict with the keys {sorted(first)}; got "
                              f"{[sorted(p) if isinstance(p, dict) else type(p).__name__ for p in parts]}")
        return {key: combine_parts([p[key] for p in parts]) for key in first}
    total = np.array(first, copy=True) if isinstance(first, np.ndarray) else first
    for part in parts[1:]:
        total = total + part
    return total


def reduction_operation(step, function, args):
    """``(op, value)`` of a reduction in an epoch's program; ``value`` holds a token that names its record."""
    if not callable(function):
        raise ConfigError(f"function must be callable as function(rank, block, *args); got {function!r}")
    return "reduce", (step, uuid.uuid4().hex, function, tuple(args))


def run_reduction(context, carried, value):
    """Run a reduction on one rank inside an epoch; rank 0's record ``(KIND, step, (token, sum))``, others None."""
    step, token, function, args = value
    view = RankView(context.model, context.comm, context.rank, context.size, context.decomposition)
    parts = context.comm.gather(function(view, carried, *args))
    return (KIND, step, (token, combine_parts(parts))) if context.rank == 0 else None


def take_reduction(ready, operation):
    """``(sum, the other records)``: the reduction ``operation``'s record taken out of the executor's ``ready``.

    Raises
    ------
    ClusterError
        The record is missing: the ranks stopped before it (a failed
        health check earlier in the same epoch; collect() returns it).
    """
    _, (step, token, function, _) = operation
    mine = [r for r in ready if r[0] == KIND and r[2][0] == token]
    if not mine:
        name = getattr(function, "__name__", repr(function))
        raise ClusterError(f"the reduction {name} at step {step} did not run: the ranks stopped before it (a failed "
                           "health check; the driver's collect() returns it)")
    return mine[0][2][1], [r for r in ready if r is not mine[0]]
