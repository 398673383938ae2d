"""The shallow-water weather model, one folder: what each module holds.

- :mod:`~hpcgpu.workloads.weather.model`: :class:`ShallowWater` (state, step,
  diagnostics, partitioning); its docstring states the equations and links to
  the NumPy reference step that is their statement;
- :mod:`~hpcgpu.workloads.weather.grid_blocks`: what the distributed grid needs of a block (reach, a
  framed block's step, its health);
- :mod:`~hpcgpu.workloads.weather.diagnostics`: mass, energy and potential enstrophy as sums over blocks;
- :mod:`~hpcgpu.workloads.weather.stepper`: the SSP-RK3 time stepper and its buffers;
- :mod:`~hpcgpu.workloads.weather.grid`: the Arakawa C-grid (shared with the vorticity model);
- :mod:`~hpcgpu.workloads.weather.cases`: the named initial conditions;
- :mod:`~hpcgpu.workloads.weather.cli`, :mod:`~hpcgpu.workloads.weather.cost`:
  ``hpcgpu run weather`` and its ``hpcgpu plan`` cost model;
- :mod:`~hpcgpu.workloads.weather.workload`: its declaration to the registry.

Names load on first use (PEP 562): the registry imports
:mod:`~hpcgpu.workloads.weather.workload` to read the declaration, and that
must not import the physics.
"""

from hpcgpu.registry import lazy_exports

__all__ = ["ShallowWater", "ShallowWaterState", "ShallowWaterBudgetState", "ShallowWaterParams", "CASES",
           "RK3_CFL_LIMIT"]

_HOME = {**dict.fromkeys(__all__, "model"), **{"STAGE_REACH": "stepper", "Grid": "grid"}}
"""The module each public name lives in."""


__getattr__, __dir__ = lazy_exports(__name__, _HOME)
