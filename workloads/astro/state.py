"""The state of an N-body model (or of one partition of it): bodies as arrays on the model's backend.

Examples
--------
>>> import numpy as np
>>> state = NBodyState(np.zeros((3, 2)), np.zeros((3, 2)), np.ones(2), np.zeros((3, 2)), np.zeros(2))
>>> state.size, len(state.arrays())
(2, 5)
"""

from dataclasses import dataclass

__all__ = ["NBodyState"]


@dataclass(frozen=True)
class NBodyState:
    """Bodies of one (partition of an) N-body model.

    Attributes
    ----------
    positions, velocities : arrays (3, N)
        Rows x, y, z (length, length/time), both at the state's time.
    masses : array (N,)
    accelerations : array (3, N)
        From the last force evaluation (length/time**2): at ``positions``
        with the ``"kdk"`` integrator, at the last step's mid-step (drifted)
        positions with ``"dkd"`` (and at ``positions`` in a fresh state).
    potentials : array (N,)
        Gravitational potential at each body from all others (energy/mass),
        from the same force evaluation as ``accelerations``. With ``"dkd"``
        use :meth:`NBody.diagnostics` for the energy: it evaluates the
        potential at ``positions``.
    """

    positions: object
    velocities: object
    masses: object
    accelerations: object
    potentials: object

    def arrays(self):
        return (self.positions, self.velocities, self.masses, self.accelerations, self.potentials)

    @property
    def size(self):
        return self.masses.shape[0]

    def _repr_html_(self):
        """HTML summary for Jupyter: the number of bodies and each array's shape, dtype, device and range."""
        from hpcgpu.io import html_views

        return html_views.state_html(self, facts=[("bodies", self.size)])
