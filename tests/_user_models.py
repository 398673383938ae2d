"""A user's own grid model, written only against :mod:`hpcgpu.partition.protocols` (importable by the workers).

:class:`Heat` is explicit diffusion on a doubly periodic grid whose state
has one field, ``T``: it describes its local physics alone (the README's
example), and the distributed grid steps it on any process grid.
"""

from dataclasses import dataclass

import numpy as np

from hpcgpu.exact_sums import exact_partial
from hpcgpu.partition.grid_model import GridModelBase


@dataclass
class HeatState:
    T: object


class Heat(GridModelBase):
    """Explicit diffusion of one field ``T`` on a doubly periodic ``ny x nx`` grid."""

    name, cfl_limit = "heat", 0.25

    def __init__(self, nx=8, ny=24, kappa=1.0):
        self.shape, self.kappa = (ny, nx), kappa

    def reach(self, steps):
        return steps  # the five-point stencil reads one cell each way per step

    def initial_block(self, where):
        y, x = np.meshgrid(where.owned_rows, where.owned_cols, indexing="ij")
        ny, nx = self.shape
        return HeatState(np.sin(2 * np.pi * y / ny) + 0.1 * np.cos(2 * np.pi * x / nx) + 0.01 * x * y)

    def step_block(self, state, dt, steps, where):
        T = state.T
        for _ in range(steps):  # rolled cells at a frame's edge are wrong, and never reach the owned ones
            T = T + self.kappa * dt * (np.roll(T, 1, 0) + np.roll(T, -1, 0) + np.roll(T, 1, 1)
                                       + np.roll(T, -1, 1) - 4 * T)
        return HeatState(T)

    def block_sums(self, state, where):
        return {"heat": exact_partial(where.interior(state.T))}

    def combine_sums(self, parts):
        return {"heat": float(sum(p["heat"] for p in parts))}

    def cfl(self, state, dt):
        return 4 * self.kappa * dt if np.isfinite(state.T).all() else float("nan")
