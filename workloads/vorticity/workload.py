"""The vorticity model's declaration to the registry (:mod:`hpcgpu.registry`): all that core knows of it.

Registered in pyproject.toml (``[project.entry-points."hpcgpu.workloads"]``).
Imports nothing of the model. It has no ``hpcgpu plan`` cost model yet.
"""

from hpcgpu.registry import Workload

__all__ = ["WORKLOAD"]


def grid_points(model):
    """Points one step updates: the ``nx x ny`` points of its grid."""
    return model.grid.nx * model.grid.ny


WORKLOAD = Workload(
    name="vorticity",
    cli="hpcgpu.workloads.vorticity.cli",
    model="hpcgpu.workloads.vorticity.model:BarotropicVorticity",
    time_unit="s",
    conserved=("energy", "enstrophy"),
    grid_points=grid_points,
    diagnostics=("energy", "enstrophy", "circulation"),
)
