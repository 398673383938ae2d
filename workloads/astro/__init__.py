"""The astrophysics (N-body) model, one folder: what each module holds.

- :mod:`~hpcgpu.workloads.astro.model`: :class:`NBody` (state, leapfrog step,
  partitioning); its docstring states the equations and links to the NumPy
  reference that is their statement;
- :mod:`~hpcgpu.workloads.astro.diagnostics`: energy, virial ratio, Lagrangian radii;
- :mod:`~hpcgpu.workloads.astro.kepler`: the analytic two-body orbit to check against;
- :mod:`~hpcgpu.workloads.astro.cases`: the named initial conditions;
- :mod:`~hpcgpu.workloads.astro.cli`, :mod:`~hpcgpu.workloads.astro.cost`:
  ``hpcgpu run astro`` and its ``hpcgpu plan nbody`` cost model;
- :mod:`~hpcgpu.workloads.astro.workload`: its declaration to the registry.

Names load on first use (PEP 562): the registry imports
:mod:`~hpcgpu.workloads.astro.workload` to read the declaration, and that
must not import the physics.
"""

from hpcgpu.registry import lazy_exports

__all__ = ["NBody", "NBodyState", "CASES", "INTEGRATORS", "kepler_period", "kepler_orbit"]

_HOME = {**dict.fromkeys(__all__, "model"), "kepler_period": "kepler", "kepler_orbit": "kepler", "METHODS": "model"}
"""The module each public name lives in."""


__getattr__, __dir__ = lazy_exports(__name__, _HOME)
