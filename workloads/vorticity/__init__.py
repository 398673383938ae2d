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

import importlib

__all__ = ["BarotropicVorticity", "VorticityState", "VorticityParams", "CASES", "SOLVERS", "RK3_CFL_LIMIT",
           "rossby_wave_frequency"]

_HOME = dict.fromkeys(__all__, "model")
"""The module each public name lives in."""


def __getattr__(name):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))
