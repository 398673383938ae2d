"""The astrophysics (N-body) model's declaration to the registry (:mod:`hpcgpu.registry`): all that core knows of it.

Registered in pyproject.toml (``[project.entry-points."hpcgpu.workloads"]``).
Imports nothing of the model (the benchmark case's builder imports it when
called). ``hpcgpu plan`` knows its cost model as ``nbody`` (direct-sum
gravity). Time is in N-body units.
"""

import math

from hpcgpu.registry import BenchmarkCase, PlanOption, Workload

__all__ = ["WORKLOAD", "PLUMMER", "build_plummer"]


def build_plummer(size, *, dtype, backend, scale):
    """A Plummer sphere of ``size`` bodies, ``sqrt(scale)`` times as many: ``scale`` times the N^2 work.

    Examples
    --------
    >>> model = build_plummer(100, dtype="float64", backend="numpy", scale=4)
    >>> model.n, model.method
    (200, 'direct')
    """
    from hpcgpu.workloads.astro.model import NBody

    return NBody("plummer", n=int(size * math.sqrt(scale)), dtype=dtype, backend=backend, seed=4)


PLUMMER = BenchmarkCase(
    name="plummer", build=build_plummer, size_unit="bodies", size=16384, quick_size=2048, min_size=2,
    dtype="float64", time_step=lambda model, state: model.case_dt, size_of=lambda model: model.n)
"""Direct-sum gravity on a Plummer sphere: the N-body benchmark of ``hpcgpu bench nbody`` and cluster acceptance."""

WORKLOAD = Workload(
    name="astro",
    cli="hpcgpu.workloads.astro.cli",
    model="hpcgpu.workloads.astro.model:NBody",
    plan="hpcgpu.workloads.astro.cost:NBodyCost",
    plan_name="nbody",
    plan_kernel="nbody",
    plan_sizes=("bodies",),
    plan_options=(PlanOption("bodies", float, "nbody: number of bodies", count=True),),
    conserved=("energy",),
    diagnostics=("energy", "virial_ratio", "lagrangian_radius_50"),
    benchmarks={"step": PLUMMER, "scaling": PLUMMER},
    plan_parameters=lambda model: {"bodies": model.n},
)
