"""When the ranks of a brick grid rebuild their neighbour lists: stamped flags carried by the ghost exchange.

A rank raises a flag when one of its atoms may, ``D`` steps on, have moved
more than ``skin / 2`` since the lists were built (``D`` =
:func:`rebuild_delay`); the flag is the step it was raised at. Each ghost
message carries the earliest flag its sender has heard, and a staged x,
y, z exchange moves it one layer of ranks along every axis at once: after
the step of the raise and ``D`` more, every rank has heard it, ``D + 1``
being the most layers between two ranks along any axis (``n // 2`` on a
periodic axis of ``n`` layers). Every rank then rebuilds at the same step,
``raised + D``, with no collective: the decision is a function of the
flags alone, and no rank can hear an earlier one (there is none).

Why it is safe: the rank tests its atoms against a bound on their
displacement ``D`` steps ahead (:meth:`LocalSteps.rebuild_reach
<hpcgpu.workloads.md.local_steps.LocalSteps.rebuild_reach>`: the distance
so far, plus :data:`LATE_REBUILD_MARGIN` times what their speed and force
carry them in ``D`` steps). The first flag at step ``s`` means no bound
passed ``skin / 2`` at step ``s - 1``: the list holds until ``s - 1 + D``,
the last step that uses it. With ``D = 0`` (no axis of more than 3
layers) the test is the one of a single process: the same builds at the
same steps. The bound is an estimate (forces change); every step that
keeps the list checks its atoms' true displacement and raises
:class:`~hpcgpu.errors.UnstableSimulation` past ``skin / 2``: a
*dangerous build* (LAMMPS counts them) fails loudly instead of giving
wrong forces. Right after a build a flag covers nothing before it: atoms
fast enough to raise one at once rebuild every ``D + 1`` steps, checked
the same way.

Examples
--------
>>> rebuild_delay((2, 2, 2)), rebuild_delay((3, 2, 1)), rebuild_delay((1, 1, 4)), rebuild_delay((8, 8, 4))
(0, 0, 1, 3)
>>> earliest(None, 12, 9), earliest(None, None), rebuild_due(9, 12, 3), rebuild_due(9, 11, 3)
(9, None, True, False)
"""

import math

from hpcgpu.errors import UnstableSimulation

__all__ = ["LATE_REBUILD_MARGIN", "rebuild_delay", "earliest", "rebuild_due", "check_list_holds"]

LATE_REBUILD_MARGIN = 1.5
"""Factor on the motion an atom's speed and force predict for the steps a rebuild comes late: room for
forces that grow on the way (collisions slow atoms down; attraction in Lennard-Jones is weak)."""


def rebuild_delay(grid):
    """Steps between a rank's rebuild flag and the rebuild of every rank: the most layers between two ranks
    along an axis of ``grid`` (periodic: ``n // 2`` of ``n``), less the one the raising step covers.

    0 while no axis has more than 3 layers: the flags of a step reach every rank in that step's exchange.
    """
    return max([0] + [parts // 2 - 1 for parts in grid if parts > 1])


def earliest(*stamps):
    """The earliest of some flags (steps; None: none raised)."""
    raised = [s for s in stamps if s is not None]
    return min(raised) if raised else None


def rebuild_due(heard, step, delay):
    """Whether the ranks rebuild at ``step``, having heard the flag ``heard`` (None: none) ``delay`` steps late."""
    return heard is not None and step >= heard + delay


def check_list_holds(progress, rank, step, delay):
    """Raise UnstableSimulation when a rank keeps a list some atom of it has moved more than ``skin / 2`` from.

    ``progress`` is the largest squared displacement over ``(skin / 2)^2``.
    """
    if progress > 1.0:
        raise UnstableSimulation(
            f"partition {rank}: an atom moved {math.sqrt(progress):.4g} x skin / 2 since the neighbour lists were "
            f"built, and the rebuild decided {delay} step(s) late has not come (a dangerous build: the forces "
            f"would miss pairs); the atoms moved faster than their speed predicted: reduce dt, raise the skin, "
            f"or use a process grid of at most 3 layers an axis", step=int(step), field="positions", cfl=math.nan)
