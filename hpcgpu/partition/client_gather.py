"""Whether the whole state of a partitioned run fits the client, asked before it is gathered.

The ranks hold the state; the client gathers it only when asked
(``Simulation.state``, a writer that needs the whole state). Before the
gather each rank reports the bytes of its block's host copy (a few numbers
travel), and :func:`check_gather` compares what the gather would take on
the client with the memory the client has: the blocks as they arrive plus
the joined state (:data:`JOIN_COPIES`; the bricks of particle models sort
the joined atoms by id, one copy more). A gather that would not fit raises
:class:`~hpcgpu.errors.GatherTooLarge` instead of running the client out of
memory half-way.

The check counts the arrays a state's host copy holds (``state.arrays()``,
what ``model.to_host`` copies: not an MD state's neighbour list, which
stays on the ranks), measured on the ranks, not estimated.
"""

import sys

from hpcgpu.errors import GatherTooLarge
from hpcgpu.partition.collectives import payload_nbytes
from hpcgpu.partition.decomposition import on_worker
from hpcgpu.validation import available_memory

__all__ = ["JOIN_COPIES", "check_gather", "gather_nbytes", "gathered_or_none", "rank_state_nbytes", "state_nbytes"]

JOIN_COPIES = 2
"""Copies of the state the client holds at the peak of a gather: the blocks and the joined state.
A decomposition may say otherwise with a ``join_copies`` attribute (bricks: 3, the joined atoms
sorted by id)."""


def state_nbytes(state):
    """Bytes of the arrays of ``state``'s host copy: ``state.arrays()`` when it has them, else every array field.

    Examples
    --------
    >>> import numpy as np
    >>> from types import SimpleNamespace
    >>> state_nbytes(SimpleNamespace(arrays=lambda: (np.zeros(4), np.zeros((2, 2), np.float32))))
    48
    """
    arrays = getattr(state, "arrays", None)
    return payload_nbytes(tuple(arrays()) if callable(arrays) else state)


def rank_state_nbytes(spec, ranks, results):
    """On a worker: the host bytes of each of its ranks' model states (what a gather would bring)."""
    decomposition = spec.decomposition
    on_worker(spec.model)  # the worker's copy of the model, as the gather's
    return [state_nbytes(decomposition.model_state(r.carried)) for r in results]


def gather_nbytes(block_nbytes, decomposition=None):
    """Bytes a gather takes on the client: the blocks' bytes times the decomposition's copies at the peak."""
    return int(sum(block_nbytes)) * getattr(decomposition, "join_copies", JOIN_COPIES)


def check_gather(model, block_nbytes, decomposition=None, *, available=None):
    """Raise :class:`~hpcgpu.errors.GatherTooLarge` if gathering blocks of ``block_nbytes`` bytes would not fit.

    Parameters
    ----------
    model
        The run's model (its ``memory_estimate()`` names the sizes, when it has one).
    block_nbytes : sequence of int
        Each rank's block, host bytes.
    decomposition : optional
        Its ``join_copies`` (default :data:`JOIN_COPIES`).
    available : int, optional
        The client's available bytes (default: :func:`hpcgpu.validation.available_memory`
        of this process's host memory).

    Returns
    -------
    int
        The bytes the gather takes on the client.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> model = SimpleNamespace(name="weather")
    >>> check_gather(model, [2**30, 2**30], available=2**31)
    Traceback (most recent call last):
    ...
    hpcgpu.errors.GatherTooLarge: gathering the state of weather to the client takes about 4294967296 bytes (4 GiB: 2 GiB of state in 2 blocks, 2 copies at the peak), but the client has 2147483648 bytes (2 GiB) available. The ranks hold the state: read the run without gathering it through sim.diagnostics (reduced on the ranks), writers such as hpcgpu.io.ZarrWriter, or executor.reduce_on_ranks(function) for a sum of your own; or run the client on a node with more memory
    """
    nbytes = int(sum(block_nbytes))
    copies = getattr(decomposition, "join_copies", JOIN_COPIES)
    needed = gather_nbytes(block_nbytes, decomposition)
    available = available_memory(None) if available is None else available
    if available is None or needed <= available:
        return needed
    estimate = getattr(model, "memory_estimate", None)
    what = estimate()[0] if callable(estimate) else getattr(model, "name", type(model).__name__)
    raise GatherTooLarge(
        f"gathering the state of {what} to the client takes about {needed} bytes ({needed / 2**30:.4g} GiB: "
        f"{nbytes / 2**30:.4g} GiB of state in {len(block_nbytes)} blocks, {copies} copies at "
        f"the peak), but the client has {available} bytes ({available / 2**30:.4g} GiB) available. The ranks "
        "hold the state: read the run without gathering it through sim.diagnostics (reduced on the ranks), "
        "writers such as hpcgpu.io.ZarrWriter, or executor.reduce_on_ranks(function) for a sum of "
        "your own; or run the client on a node with more memory", needed=needed, available=available)


def gathered_or_none(simulation, purpose):
    """``simulation.state``, or None and a line on stderr saying why when the gather would not fit the client.

    For what a command draws at the end of a run (a picture): a run too
    large for its client still ends with its outputs and summary.
    """
    try:
        return simulation.state
    except GatherTooLarge as error:
        print(f"hpcgpu: no {purpose}: {error}", file=sys.stderr)
        return None
