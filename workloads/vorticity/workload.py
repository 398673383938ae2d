"""The vorticity model's declaration to the registry (:mod:`hpcgpu.registry`): all that core knows of it.

Registered in pyproject.toml (``[project.entry-points."hpcgpu.workloads"]``).
Imports nothing of the model (the benchmark case's builder imports it when
called). It has no ``hpcgpu plan`` cost model yet, and no scaling case: it
cannot be split over workers yet.
"""

from hpcgpu.registry import BenchmarkCase, Workload

__all__ = ["WORKLOAD", "TURBULENCE", "build_turbulence", "grid_points"]


def grid_points(model):
    """Points one step updates: the ``nx x ny`` points of its grid."""
    return model.grid.nx * model.grid.ny


def build_turbulence(size, *, dtype, backend, scale):
    """Decaying turbulence on the periodic beta plane, ``size`` points per side (or ``(nx, ny)``), ``ny`` x ``scale``.

    Points are 31.25 km apart whatever the grid (the case's 4,000 km over
    128 points), so a larger grid is a larger basin.

    Examples
    --------
    >>> model = build_turbulence(32, dtype="float64", backend="numpy", scale=1)
    >>> model.grid.nx, model.grid.ny, model.grid.Lx
    (32, 32, 1000000.0)
    """
    from hpcgpu.workloads.vorticity.model import BarotropicVorticity

    nx, ny = size if isinstance(size, (tuple, list)) else (size, size)
    ny *= scale
    spacing = 4.0e6 / 128
    return BarotropicVorticity("turbulence", nx=nx, ny=ny, dtype=dtype, backend=backend, Lx=spacing * nx,
                               Ly=spacing * ny)


TURBULENCE = BenchmarkCase(
    name="turbulence", build=build_turbulence, size_unit="points per side", size=512, quick_size=128, min_size=8,
    dtype="float64", size_of=lambda model: (model.grid.nx, model.grid.ny))
"""One process stepping decaying turbulence (the FFT Poisson solve included)."""

WORKLOAD = Workload(
    name="vorticity",
    cli="hpcgpu.workloads.vorticity.cli",
    model="hpcgpu.workloads.vorticity.model:BarotropicVorticity",
    time_unit="s",
    conserved=("energy", "enstrophy"),
    grid_points=grid_points,
    diagnostics=("energy", "enstrophy", "circulation"),
    benchmarks={"step": TURBULENCE},
)
