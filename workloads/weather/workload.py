"""The weather model's declaration to the registry (:mod:`hpcgpu.registry`): all that core knows of it.

Registered in pyproject.toml (``[project.entry-points."hpcgpu.workloads"]``).
Imports nothing of the model: the registry imports the modules named here
when they are needed, and the benchmark case's builder imports the model
class when it is called.
"""

from dataclasses import replace

from hpcgpu.registry import BenchmarkCase, PlanOption, Workload

__all__ = ["WORKLOAD", "TURBULENCE", "build_turbulence", "grid_points", "plan_parameters"]


def grid_points(model):
    """Points one step updates: the ``nx x ny`` cells of the C-grid."""
    return model.grid.nx * model.grid.ny


def plan_parameters(model):
    """The ``hpcgpu plan weather`` options that describe ``model``: its grid and whether it wraps along y."""
    return {"nx": model.grid.nx, "ny": model.grid.ny, "periodic": bool(model.periodic[1])}


def build_turbulence(size, *, dtype, backend, scale):
    """Balanced eddies everywhere, ``size`` cells per side (or ``(nx, ny)``), ``ny`` grown ``scale`` times.

    Every block of a split grid then does the same work. (A jet in a wide
    channel leaves far-field blocks with tiny values whose float32 products
    go subnormal, which slows CPUs many times over and would make equal
    blocks unequal.) Cells are 20 km wide whatever the grid, and the eddies'
    peak wavenumber grows with ``ny``, so a larger grid is more of the same
    flow, not the same flow finer.

    Examples
    --------
    >>> model = build_turbulence((64, 32), dtype="float32", backend="numpy", scale=2)
    >>> model.grid.nx, model.grid.ny, model.grid.Lx
    (64, 64, 1280000.0)
    """
    from hpcgpu.workloads.weather.model import ShallowWater

    nx, ny = size if isinstance(size, (tuple, list)) else (size, size)
    ny *= scale
    return ShallowWater("turbulence", nx=nx, ny=ny, dtype=dtype, backend=backend, Lx=2.0e4 * nx, Ly=2.0e4 * ny,
                        peak_wavenumber=max(6.0, ny / 64))


def build_gravity_wave(size, *, dtype, backend, scale):
    """A gravity wave on a doubly periodic grid of ``size`` cells per side (``ny`` grown ``scale`` times).

    Doubly periodic, so every block of a split grid is the same size and
    the output's chunks are whole blocks (what ``hpcgpu bench io`` writes).

    Examples
    --------
    >>> model = build_gravity_wave(32, dtype="float32", backend="numpy", scale=1)
    >>> model.grid.nx, model.periodic
    (32, (True, True))
    """
    from hpcgpu.workloads.weather.model import ShallowWater

    nx, ny = size if isinstance(size, (tuple, list)) else (size, size)
    return ShallowWater("gravity_wave", nx=nx, ny=ny * scale, dtype=dtype, backend=backend)


def _cfl_04(model, state):
    return model.suggested_dt(state, 0.4)


TURBULENCE = BenchmarkCase(
    name="turbulence", build=build_turbulence, size_unit="cells per side", size=1024, quick_size=512, min_size=16,
    dtype="float32", time_step=_cfl_04, size_of=lambda model: (model.grid.nx, model.grid.ny))
"""The benchmark case of every weather benchmark (sizes differ by purpose, the flow does not)."""

WORKLOAD = Workload(
    name="weather",
    cli="hpcgpu.workloads.weather.cli",
    model="hpcgpu.workloads.weather.model:ShallowWater",
    plan="hpcgpu.workloads.weather.cost:WeatherCost",
    plan_kernel="stencil",
    plan_sizes=("nx", "ny"),
    plan_options=(
        PlanOption("nx", int, "weather: grid cells along x"),
        PlanOption("ny", int, "weather: grid cells along y"),
        PlanOption("steps_per_task", int, "weather: steps per halo exchange K (default: the engine's, up to 16)"),
        PlanOption("periodic", bool, "weather: periodic in y (default: walls)"),
    ),
    time_unit="s",
    conserved=("mass", "energy", "enstrophy"),
    grid_points=grid_points,
    diagnostics=("mass", "energy", "enstrophy", "max_cfl"),
    benchmarks={
        "step": TURBULENCE,
        "scaling": TURBULENCE,
        # long runs with kills: a small grid keeps each restart short
        "soak": replace(TURBULENCE, size=256, quick_size=128),
        "energy": replace(TURBULENCE, size=(1024, 512), quick_size=(512, 256)),
        # strong scaling over 1 and 2 local workers: halos of ~0.9 MB, blocks of 256 rows
        "plan_check": replace(TURBULENCE, size=(1024, 512), quick_size=(512, 256)),
        "io": BenchmarkCase(name="gravity_wave", build=build_gravity_wave, size_unit="cells per side", size=1024,
                            quick_size=256, min_size=16, dtype="float32",
                            size_of=lambda model: (model.grid.nx, model.grid.ny)),
    },
    plan_parameters=plan_parameters,
)
