"""A user's own grid model, written only against :mod:`hpcgpu.partition.protocols` (importable by the workers).

:class:`Heat` is explicit diffusion on a doubly periodic grid whose state
has one field, ``T``, and no ``h``: the row decomposition must step it
through the protocol's methods alone.
"""

from dataclasses import dataclass

import numpy as np

from hpcgpu.backends import get_backend


@dataclass
class HeatState:
    T: object

    def arrays(self):
        return (self.T,)


class Heat:
    """Explicit diffusion on a doubly periodic ``ny x nx`` grid, split along its rows."""

    name = "heat"
    cfl_limit = 0.25
    decomposition = "rows"

    def __init__(self, nx=8, ny=24):
        self.nx, self.ny = nx, ny
        self.backend = get_backend("numpy")

    # SteppedModel
    def initial_state(self):
        y, x = np.mgrid[0:self.ny, 0:self.nx]
        return HeatState(np.sin(2 * np.pi * y / self.ny) + 0.1 * np.cos(2 * np.pi * x / self.nx) + 0.01 * x * y)

    def suggested_dt(self, state, cfl=0.2):
        return cfl

    def stepper(self, dt):
        model = self

        class Stepper:
            def advance(self, state, steps):
                return model.advance_rows(state, dt, steps, 0, False, False)

        return Stepper()

    def warm_up(self):
        pass

    def cfl(self, state, dt):
        return dt if np.isfinite(state.T).all() else float("nan")

    def bad_fields(self, state):
        return [] if np.isfinite(state.T).all() else ["T"]

    def diagnostics(self, state, dt=None):
        return self.combine_sums([self.block_sums(state, 0)])

    def to_dataset(self, state, time=None):
        import xarray as xr

        return xr.Dataset({"T": (("y", "x"), state.T)})

    def attributes(self):
        return {"model": "heat"}

    # Partitionable
    def decomposition_size(self):
        return self.ny

    def take_block(self, state, start, stop):
        return HeatState(state.T[start:stop].copy())

    def concat_blocks(self, states):
        return HeatState(np.concatenate([s.T for s in states]))

    def to_host(self, state):
        return state

    def block_sums(self, state, start, extra=None):
        return {"heat": float(state.T.sum())}

    def combine_sums(self, parts):
        return {"heat": sum(p["heat"] for p in parts)}

    def block_health(self, state):
        return {"bad": self.bad_fields(state)}

    def combine_health(self, parts, dt):
        bad = sorted({b for p in parts for b in p["bad"]})
        return bad, (float("nan") if bad else dt)

    def with_backend(self, backend):
        return self

    # RowModel
    def block_size(self, state):
        return state.T.shape[0]

    def periodic_rows(self):
        return True

    def halo_rows(self, steps):
        return steps, steps

    def assemble_rows(self, south, block, north):
        return self.concat_blocks([p for p in (south, block, north) if p is not None])

    def advance_rows(self, state, dt, steps, first_row, south_open, north_open, cache=None, fresh=False):
        T = state.T
        for _ in range(steps):  # rolled rows at an open edge are wrong, and cut away by the decomposition
            T = T + dt * (np.roll(T, 1, 0) + np.roll(T, -1, 0) + np.roll(T, 1, 1) + np.roll(T, -1, 1) - 4 * T)
        return HeatState(T)

    def row_view(self, state, start, stop):
        return HeatState(state.T[start:stop])

    def write_rows(self, block, start, rows):
        block.T[start:start + rows.T.shape[0]] = rows.T
