"""The Lennard-Jones molecular-dynamics model, one folder: what each module holds.

- :mod:`~hpcgpu.workloads.md.model`: :class:`LennardJones` (state, velocity-Verlet
  step, thermostat); its docstring states the equations and links to the NumPy
  reference that is their statement;
- :mod:`~hpcgpu.workloads.md.state`: :class:`MDState`, the atoms (a frozen dataclass);
- :mod:`~hpcgpu.workloads.md.local_steps`: the step in two halves on a block of
  atoms, forces with ghosts, picking and joining atoms (a mixin of the model);
- :mod:`~hpcgpu.workloads.md.diagnostics`: energies, temperature, pressure, MSD,
  an object the model holds;
- :mod:`~hpcgpu.workloads.md.setup`: lattice, counter-based random numbers,
  velocities, tail corrections;
- :mod:`~hpcgpu.workloads.md.pairs`: pair distances (closest pair, overlaps, g(r));
- :mod:`~hpcgpu.workloads.md.structure`: g(r) of a run, reduced on its ranks (``run_rdf``);
- :mod:`~hpcgpu.workloads.md.output`: extended-XYZ trajectories and datasets;
- :mod:`~hpcgpu.workloads.md.cli`, :mod:`~hpcgpu.workloads.md.cost`:
  ``hpcgpu run md`` and its ``hpcgpu plan`` cost model;
- :mod:`~hpcgpu.workloads.md.workload`: its declaration to the registry.

Names load on first use (PEP 562): the registry imports
:mod:`~hpcgpu.workloads.md.workload` to read the declaration, and that
must not import the physics.
"""

from hpcgpu.registry import lazy_exports

__all__ = ["LennardJones", "MDState", "Integrator", "XYZWriter", "THERMOSTATS", "MIN_DISTANCE", "tail_corrections",
           "run_rdf"]

_HOME = {**dict.fromkeys(__all__, "model"), "MDState": "state", "DEFAULT_DENSITY": "model",
         "run_rdf": "structure"}
"""The module each public name lives in."""


__getattr__, __dir__ = lazy_exports(__name__, _HOME)
