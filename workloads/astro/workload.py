"""The astrophysics (N-body) model's declaration to the registry (:mod:`hpcgpu.registry`): all that core knows of it.

Registered in pyproject.toml (``[project.entry-points."hpcgpu.workloads"]``).
Imports nothing of the model. ``hpcgpu plan`` knows its cost model as
``nbody`` (direct-sum gravity). Time is in N-body units.
"""

from hpcgpu.registry import PlanOption, Workload

__all__ = ["WORKLOAD"]

WORKLOAD = Workload(
    name="astro",
    cli="hpcgpu.workloads.astro.cli",
    model="hpcgpu.workloads.astro.model:NBody",
    plan="hpcgpu.workloads.astro.cost:NBodyCost",
    plan_name="nbody",
    plan_sizes=("bodies",),
    plan_options=(PlanOption("bodies", float, "nbody: number of bodies", count=True),),
    conserved=("energy",),
    diagnostics=("energy", "virial_ratio", "lagrangian_radius_50"),
)
