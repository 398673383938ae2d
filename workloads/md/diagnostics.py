"""Diagnostics of the Lennard-Jones model: energies, temperature, pressure, MSD, stability.

:class:`Thermodynamics` is an object a :class:`hpcgpu.workloads.md.LennardJones`
holds (``model.thermo``) and delegates its diagnostics to. Every quantity is
a sum over atoms (``block_sums``) combined afterwards (``combine_sums``), so
a partitioned run reduces on its workers and only scalars travel.
"""

import math

import numpy as np

from hpcgpu.workloads.md.setup import tail_corrections

__all__ = ["Thermodynamics", "OMEGA_PER_ROOT_FORCE"]

# omega_max per sqrt(max |f|): on the repulsive wall u'' = 13 |u'| / r, and a
# pair (reduced mass 1/2) vibrates at sqrt(2 u''). Verlet is stable for omega dt < 2.
OMEGA_PER_ROOT_FORCE = math.sqrt(26.0)


class Thermodynamics:
    """Energies, temperature, pressure, momentum, MSD and the stability number of a model's states.

    Parameters
    ----------
    model : LennardJones
        The model whose backend, box, volume, cutoff and field names it uses.

    Examples
    --------
    >>> from hpcgpu.workloads.md import LennardJones
    >>> model = LennardJones(4, temperature=1.0, backend="numpy")
    >>> round(model.thermo.diagnostics(model.initial_state())["temperature"], 12)
    1.0
    """

    def __init__(self, model):
        self.model = model

    def cfl(self, state, dt):
        """Time-step number ``dt * omega_max / 2``: 1 is velocity Verlet's stability limit.

        ``omega_max = sqrt(26 max|f|)`` estimates the highest pair frequency
        from the largest force (see ``OMEGA_PER_ROOT_FORCE``); the liquid at
        ``dt = 0.005`` sits near 0.15 and blows up near 1. NaN for non-finite values.
        """
        return self.combine_health([self.block_health(state)], dt)[1]

    def bad_fields(self, state):
        """Names of the fields holding NaN/inf."""
        isfinite = self.model.backend.xp.isfinite
        return [name for name in self.model.field_names if not bool(isfinite(getattr(state, name)).all())]

    def block_health(self, state):
        f2 = (state.forces.astype(np.float64) ** 2).sum(axis=0)
        return {"f_max": math.sqrt(float(f2.max())) if f2.size else 0.0, "bad": self.bad_fields(state)}

    def combine_health(self, parts, dt):
        bad = sorted({name for p in parts for name in p["bad"]}, key=self.model.field_names.index)
        f_max = max(p["f_max"] for p in parts)
        if bad or not math.isfinite(f_max):
            return bad or ["positions"], math.nan
        return [], 0.5 * dt * OMEGA_PER_ROOT_FORCE * math.sqrt(f_max)

    def diagnostics(self, state, dt=None):
        """Energies, temperature, pressure, momentum, MSD and tail corrections (dict of floats).

        ``kinetic_energy``, ``potential_energy`` (of the simulated, shifted or
        truncated, potential) and ``energy`` (their sum, conserved in NVE);
        ``potential_energy_per_atom``; ``potential_energy_full`` and
        ``potential_energy_full_per_atom``, the estimate of the full
        (untruncated, unshifted) Lennard-Jones potential energy, the one
        tables of the fluid (NIST, Johnson et al.) give, whatever ``shift``::

            U_full = U + n_pairs u(cutoff) [shift] + N u_tail

        with ``U`` the simulated energy, ``n_pairs`` the pairs inside the
        cutoff (``interacting_pairs``: the shift took ``u(cutoff)`` from
        each of them) and ``N u_tail`` the tail beyond the cutoff
        (``energy_tail``, assuming ``g(r) = 1`` there); ``temperature`` ``2 K' / (3N - 3)``
        with ``K'`` the kinetic energy in the centre-of-mass frame;
        ``pressure`` ``(2 K + W) / (3 V)``, the virial pressure with ``K``
        the kinetic energy and ``W`` the sum over pairs of ``r_ij . F_ij``:
        its kinetic part is ``2 K / (3 V)`` whatever the temperature's
        degrees of freedom (what LAMMPS, HOOMD and OpenMM report), so it is
        not ``N T / V`` with the ``3N - 3`` temperature; ``energy_tail`` (N u_tail,
        already in ``potential_energy_full``; added to ``potential_energy``
        alone it is the full estimate only for ``shift=False``) and
        ``pressure_tail`` (add it to ``pressure`` for the full potential's,
        either ``shift``: see :func:`tail_corrections`); ``momentum_x/y/z``; ``msd``, the mean
        squared displacement since step 0 (sigma^2); ``density``;
        ``neighbor_rebuilds``, the neighbour lists built so far.
        """
        out = self.combine_sums([self.block_sums(state, 0)])
        if dt is not None:
            out["max_cfl"] = self.cfl(state, dt)
        return out

    def block_sums(self, state, start, extra=None):
        """Sums over a block of atoms that add up to the global diagnostics."""
        backend = self.model.backend
        xp = backend.xp
        v = state.velocities.astype(np.float64)
        squared = 0.0
        for axis, length in enumerate(self.model.box):
            d = state.positions[axis].astype(np.float64) + state.images[axis] * length - state.origins[axis]
            squared = squared + d * d
        # the pair counts ride in float64: exact below 2**53
        values = xp.stack([(v * v).sum(), *v.sum(axis=1), state.energies.sum(dtype=np.float64),
                           state.virials.sum(dtype=np.float64), xp.asarray(squared).sum(),
                           state.pair_counts.sum(dtype=np.float64)])
        names = ("kinetic2", "momentum_x", "momentum_y", "momentum_z", "potential", "virial", "squared_displacement",
                 "listed_pairs")
        out = dict(zip(names, (float(x) for x in backend.to_host(values))))
        out.update(atoms=state.size, rebuilds=state.rebuilds)
        return out

    def combine_sums(self, parts):
        total = {key: sum(p[key] for p in parts) for key in parts[0] if key != "rebuilds"}
        n = total["atoms"]
        kinetic = 0.5 * total["kinetic2"]
        momentum2 = sum(total[f"momentum_{a}"] ** 2 for a in "xyz")
        temperature = 2.0 * (kinetic - 0.5 * momentum2 / n) / (3 * n - 3)
        volume = self.model.volume
        density = n / volume
        energy_tail, pressure_tail = tail_corrections(density, self.model.cutoff)
        # every pair inside the cutoff sits in both of its atoms' counts, whichever blocks hold them
        pairs = 0.5 * total["listed_pairs"]
        # energy_shift is u(cutoff) with shift=True, 0 without: the shift taken from each pair goes back
        full = total["potential"] + pairs * self.model.energy_shift + n * energy_tail
        out = {"energy": kinetic + total["potential"], "kinetic_energy": kinetic,
               "potential_energy": total["potential"], "potential_energy_per_atom": total["potential"] / n,
               "potential_energy_full": full, "potential_energy_full_per_atom": full / n,
               "interacting_pairs": pairs,
               "temperature": temperature, "pressure": (2.0 * kinetic + total["virial"]) / (3.0 * volume),
               "energy_tail": n * energy_tail, "pressure_tail": pressure_tail,
               "msd": total["squared_displacement"] / n, "density": density,
               "neighbor_rebuilds": max(p["rebuilds"] for p in parts)}
        for axis in "xyz":
            out[f"momentum_{axis}"] = total[f"momentum_{axis}"]
        return out
