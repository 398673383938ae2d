"""The barotropic vorticity model, one folder: what each module holds.

- :mod:`~hpcgpu.workloads.vorticity.model`: :class:`BarotropicVorticity` (state,
  step, diagnostics); its docstring states the equation and links to the
  reference that is its statement;
- :mod:`~hpcgpu.workloads.vorticity.cases`: the named initial conditions;
- :mod:`~hpcgpu.workloads.vorticity.cli`: ``hpcgpu run vorticity``;
- :mod:`~hpcgpu.workloads.vorticity.workload`: its declaration to the registry.

Names load on first use (PEP 562): the registry imports
:mod:`~hpcgpu.workloads.vorticity.workload` to read the declaration, and that
must not import the physics.
"""

from hpcgpu.registry import lazy_exports

__all__ = ["BarotropicVorticity", "VorticityState", "VorticityParams", "CASES", "SOLVERS", "RK3_CFL_LIMIT",
           "rossby_wave_frequency"]

_HOME = dict.fromkeys(__all__, "model")
"""The module each public name lives in."""


__getattr__, __dir__ = lazy_exports(__name__, _HOME)
