"""The molecular-dynamics model's declaration to the registry (:mod:`hpcgpu.registry`): all that core knows of it.

Registered in pyproject.toml (``[project.entry-points."hpcgpu.workloads"]``).
Imports nothing of the model (the benchmark case's builder imports it when
called). Time is in reduced Lennard-Jones units (tau).
"""

from dataclasses import replace

from hpcgpu.registry import BenchmarkCase, PlanOption, Workload

__all__ = ["WORKLOAD", "LJ_LIQUID", "LJ_LIQUID_SETUP", "build_lj_liquid", "n_cells_for"]

LJ_LIQUID_SETUP = {"density": 0.8442, "temperature": 1.44, "cutoff": 2.5, "skin": 0.3, "dt": 0.005}
"""The classic LJ benchmark's state point and run parameters (reduced LJ units)."""

MIN_CELLS = 3
"""Fewest fcc cells per side (108 atoms): the box must be at least twice the cutoff."""


def n_cells_for(atoms):
    """fcc unit cells per side for about ``atoms`` atoms: ``round((atoms / 4) ** (1/3))``.

    Examples
    --------
    >>> n_cells_for(32000), n_cells_for(256), n_cells_for(1_000_000)
    (20, 4, 63)
    """
    return int(round((atoms / 4.0) ** (1.0 / 3.0)))


def build_lj_liquid(size, *, dtype, backend, scale):
    """The classic LJ liquid benchmark of MD codes: about ``size`` atoms, ``scale`` times as many cells along z.

    Atoms on an fcc lattice (``N = 4 n^3``, ``n`` from :func:`n_cells_for`)
    at density 0.8442, velocities at T = 1.44, cutoff 2.5 (energy shifted to
    zero there), a Verlet list with skin 0.3, velocity-Verlet NVE.

    Examples
    --------
    >>> model = build_lj_liquid(520, dtype="float64", backend="numpy", scale=2)
    >>> model.cells, model.n
    ((5, 5, 10), 1000)
    """
    from hpcgpu.workloads.md.model import LennardJones

    cells = n_cells_for(size)
    return LennardJones((cells, cells, cells * scale), density=LJ_LIQUID_SETUP["density"],
                        temperature=LJ_LIQUID_SETUP["temperature"], cutoff=LJ_LIQUID_SETUP["cutoff"],
                        skin=LJ_LIQUID_SETUP["skin"], shift=True, thermostat="none", dtype=dtype, backend=backend)


def _facts(model):
    cells = model.cells
    return {"n_cells": cells[0] if len(set(cells)) == 1 else list(cells), "density": model.density,
            "temperature": model.temperature, "cutoff": model.cutoff, "skin": model.skin, "shift": bool(model.shift),
            "ensemble": "nve" if model.thermostat == "none" else "nvt"}


LJ_LIQUID = BenchmarkCase(
    name="lj_liquid", build=build_lj_liquid, size_unit="atoms", size=32000, quick_size=6912,
    min_size=4 * MIN_CELLS ** 3, dtype="float64", time_step=lambda model, state: LJ_LIQUID_SETUP["dt"],
    size_of=lambda model: model.n, facts=_facts)
"""The Lennard-Jones liquid of ``hpcgpu bench md`` and of cluster acceptance."""

WORKLOAD = Workload(
    name="md",
    cli="hpcgpu.workloads.md.cli",
    model="hpcgpu.workloads.md.model:LennardJones",
    plan="hpcgpu.workloads.md.cost:MolecularDynamicsCost",
    plan_kernel="md",
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
    # weak scaling from 16 cells a side (16,384 atoms a worker; 12 cells quick): a step's forces well
    # above the few messages it sends
    benchmarks={"step": LJ_LIQUID, "scaling": replace(LJ_LIQUID, size=16384)},
    plan_parameters=lambda model: {"atoms": model.n, "density": model.density, "cutoff": model.cutoff,
                                   "skin": model.skin},
)
