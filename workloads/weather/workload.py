"""The weather model's declaration to the registry (:mod:`hpcgpu.registry`): all that core knows of it.

Registered in pyproject.toml (``[project.entry-points."hpcgpu.workloads"]``).
Imports nothing of the model: the registry imports the modules named here
when they are needed.
"""

from hpcgpu.registry import PlanOption, Workload

__all__ = ["WORKLOAD"]


def grid_points(model):
    """Points one step updates: the ``nx x ny`` cells of the C-grid."""
    return model.grid.nx * model.grid.ny


WORKLOAD = Workload(
    name="weather",
    cli="hpcgpu.workloads.weather.cli",
    model="hpcgpu.workloads.weather.model:ShallowWater",
    plan="hpcgpu.workloads.weather.cost:WeatherCost",
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
)
