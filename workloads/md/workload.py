"""The molecular-dynamics model's declaration to the registry (:mod:`hpcgpu.registry`): all that core knows of it.

Registered in pyproject.toml (``[project.entry-points."hpcgpu.workloads"]``).
Imports nothing of the model. Time is in reduced Lennard-Jones units (tau).
"""

from hpcgpu.registry import PlanOption, Workload

__all__ = ["WORKLOAD"]

WORKLOAD = Workload(
    name="md",
    cli="hpcgpu.workloads.md.cli",
    model="hpcgpu.workloads.md.model:LennardJones",
    plan="hpcgpu.workloads.md.cost:MolecularDynamicsCost",
    plan_sizes=("atoms",),
    plan_options=(
        PlanOption("atoms", float, "md: number of atoms (1e7 is accepted)", count=True),
        PlanOption("density", float, "md: density (default 0.8442)"),
        PlanOption("cutoff", float, "md: cutoff (default 2.5)"),
        PlanOption("skin", float, "md: skin (default 0.3)"),
        PlanOption("rebuild_every", int, "md: steps between neighbour-list builds (default 15)"),
    ),
    conserved=("energy",),
    diagnostics=("energy", "kinetic_energy", "potential_energy", "temperature", "pressure"),
)
