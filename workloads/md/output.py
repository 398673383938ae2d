"""Output of the Lennard-Jones model: xarray datasets (for Zarr) and extended XYZ.

:func:`dataset` is the model's ``to_dataset``. Extended XYZ trajectories are
read by ASE, OVITO and VMD; one frame per write: the atom count, a comment line of ``key=value`` pairs
(extended XYZ: ``Lattice`` holds the three cell vectors row by row,
``Properties`` names the columns, ``pbc`` the periodic axes) and one line per
atom::

    500
    Lattice="8.39 0 0 0 8.39 0 0 0 8.39" Properties=species:S:1:pos:R:3:vel:R:3 Time=0.5 Step=100 pbc="T T T"
    Ar 0.52 0.52 0.52 -1.3 0.2 0.9
    ...

Lengths in sigma, velocities in sigma/tau, time in tau (reduced units).
"""

import os
import warnings

import numpy as np

from hpcgpu.errors import ConfigError, GatherWarning
from hpcgpu.schedules import as_schedule

__all__ = ["XYZWriter", "atom_lines", "xyz_frame", "dataset"]


def dataset(model, state, time=None):
    """The atoms of ``state`` as an ``xarray.Dataset`` (dimensions ``axis``, ``atom``).

    Variables ``positions`` (wrapped), ``velocities``, ``images``, ``ids`` and
    ``potential_energies`` (per atom, half of each pair), the model's
    attributes, and a ``time`` dimension of length 1 when ``time`` is given.
    Atoms in the order of their ids, whatever their order in the state (the
    model re-sorts them into cell order, bricks exchange them), so that
    ``atom`` means the same atom in every output.
    """
    import xarray as xr

    host = _in_id_order(model.to_host(state))
    coords = {"axis": ("axis", np.arange(3), {"long_name": "0: x, 1: y, 2: z"}),
              "atom": ("atom", np.arange(host.size))}
    data = {
        "positions": (("axis", "atom"), host.positions, {"units": "sigma", "long_name": "wrapped into the box"}),
        "velocities": (("axis", "atom"), host.velocities, {"units": "sigma / tau"}),
        "images": (("axis", "atom"), host.images, {"long_name": "unwrapped = positions + images * box"}),
        "ids": (("atom",), host.ids, {"long_name": "global atom id"}),
        "potential_energies": (("atom",), host.energies, {"units": "epsilon", "long_name": "half of each pair"}),
    }
    ds = xr.Dataset(data, coords=coords, attrs=model.attributes())
    if time is not None:
        ds = ds.expand_dims(time=[float(time)])
        ds["time"].attrs.update(units="tau = sigma sqrt(m / epsilon)", long_name="model time")
    return ds


def xyz_frame(model, state, *, time=0.0, step=0, species="Ar", unwrapped=False, precision=8):
    """One extended-XYZ frame of ``state`` as text (atoms in the order of their ids, as in every frame).

    Parameters
    ----------
    model : LennardJones
    state : MDState
    time : float
        Model time of the frame (tau).
    step : int
    species : str
        Chemical symbol written for every atom (``"Ar"``: ASE needs a real
        element; argon is the textbook Lennard-Jones atom).
    unwrapped : bool
        Write unwrapped positions (``positions + images * box``) instead of
        positions wrapped into the box.
    precision : int
        Significant digits of every number.
    """
    host = _in_id_order(model.to_host(state))
    positions = host.positions.astype(np.float64)
    if unwrapped:
        positions = positions + host.images * np.asarray(model.box)[:, None]
    lx, ly, lz = model.box
    header = (f'{host.size}\nLattice="{lx!r} 0.0 0.0 0.0 {ly!r} 0.0 0.0 0.0 {lz!r}" '
              f"Properties=species:S:1:pos:R:3:vel:R:3 Time={float(time)!r} Step={int(step)} "
              f'pbc="T T T"\n')
    columns = np.concatenate([positions, host.velocities.astype(np.float64)]).T
    return header + (atom_lines(species, columns, precision) if len(columns) else "\n")


ROWS_PER_BLOCK = 2**14
"""Atom lines formatted by one ``%`` (their numbers as one tuple: about 1 MB of Python floats)."""


def atom_lines(species, columns, precision=8):
    """The atom lines of a frame: ``species`` and each row of ``columns`` in ``%.{precision}g``, one per line.

    One ``%`` formats a whole block of rows (the C loop of string
    formatting, not a Python loop per number): the same bytes as
    formatting each number with ``" %.{precision}g" % value``.

    Examples
    --------
    >>> print(atom_lines("Ar", np.array([[0.5, 1.0, 1e-9], [2.0, -3.25, 12345678.9]]), precision=4), end="")
    Ar 0.5 1 1e-09
    Ar 2 -3.25 1.235e+07
    """
    columns = np.asarray(columns, dtype=np.float64)
    line = species.replace("%", "%%") + f" %.{int(precision)}g" * columns.shape[1] + "\n"
    return "".join((line * len(block)) % tuple(block.ravel().tolist())
                   for block in (columns[start:start + ROWS_PER_BLOCK]
                                 for start in range(0, len(columns), ROWS_PER_BLOCK)))


def _in_id_order(host):
    """A host state with its atoms sorted by id (itself when they are already).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> _in_id_order(SimpleNamespace(ids=np.arange(3))).ids.tolist()
    [0, 1, 2]
    """
    order = np.argsort(host.ids, kind="stable")
    if (order == np.arange(order.size)).all():
        return host
    arrays = (a[..., order] for a in host.arrays())
    return type(host)(*arrays, step=host.step, rebuilds=host.rebuilds)


class XYZWriter:
    """Append extended-XYZ frames of an MD simulation to a file on a schedule.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.xyz`` file; replaced by the first frame (unless ``overwrite``
        is false, when an existing file raises ConfigError, or ``append``).
    schedule : int or Schedule
        When to write (an int means every N steps); step 0 is included.
    species, unwrapped, precision
        As for :func:`xyz_frame`.
    overwrite : bool
    append : bool
        Continue an existing file (a run resumed from a checkpoint): frames
        are appended, and those of steps the file already holds (written
        after the checkpoint, before the run stopped) are not written twice.
        A last frame cut short (the job killed while writing it) is dropped.

    Notes
    -----
    On a partitioned run each frame gathers every atom to the client
    (:attr:`Simulation.state <hpcgpu.simulation.Simulation.state>`, which
    refuses a gather that would not fit the client's memory with
    :class:`~hpcgpu.errors.GatherTooLarge`), and the first frame warns so
    (a :class:`~hpcgpu.errors.GatherWarning`). Extended XYZ is one text stream with the
    atoms in id order, about 100 bytes per atom, read whole by the viewers
    it is for: the ranks would have to exchange their atoms by id and
    agree on byte offsets to write it in parallel, for a file no viewer
    opens at 10^8 atoms. Large runs write :class:`hpcgpu.io.ZarrWriter`
    output (binary, chunked, read by parts) and convert the frames to view.

    Examples
    --------
    >>> import tempfile
    >>> from hpcgpu import Simulation
    >>> from hpcgpu.workloads.md import LennardJones
    >>> sim = Simulation(LennardJones(4, backend="numpy"), dt=0.005, stop_steps=4, progress=False)
    >>> writer = XYZWriter(tempfile.mkdtemp() + "/run.xyz", 2)
    >>> _ = sim.add_writer(writer).run()
    >>> writer.frames
    3
    """

    def __init__(self, path, schedule, *, species="Ar", unwrapped=False, precision=8, overwrite=True,
                 append=False):
        self.path = os.fspath(path)
        self.schedule = as_schedule(schedule)
        if not isinstance(species, str) or not species.isalpha():
            raise ConfigError(f"species must be a chemical symbol such as 'Ar'; got {species!r}")
        self.species = species
        self.unwrapped = bool(unwrapped)
        self.precision = int(precision)
        self.frames = 0
        self._last_step = None
        self._warned = False
        if append and os.path.exists(self.path):
            self.frames, self._last_step = _complete_frames(self.path)
        elif os.path.exists(self.path) and not overwrite:
            raise ConfigError(f"path {self.path!r} exists; pass overwrite=True or another path")

    def write(self, simulation):
        """Append the current state of ``simulation`` as one frame (on a partitioned run: gathered, see Notes)."""
        if self._last_step is not None and simulation.step <= self._last_step:
            return  # already in the file (written before the run was resumed)
        if not self._warned and simulation.executor.describe().get("executor") == "distributed":
            self._warned = True
            warnings.warn(f"{self!r} gathers every atom of the partitioned run to the client for each frame "
                          f"({simulation.model.n} atoms): for large runs write hpcgpu.io.ZarrWriter output instead "
                          "(g(r) and the diagnostics are reduced on the ranks)", GatherWarning, stacklevel=2)
        text = xyz_frame(simulation.model, simulation.state, time=simulation.time, step=simulation.step,
                         species=self.species, unwrapped=self.unwrapped, precision=self.precision)
        with open(self.path, "w" if self.frames == 0 else "a") as stream:
            stream.write(text)
        self.frames += 1

    def close(self, simulation):
        """Nothing to flush: every frame is written when it is taken."""

    def __repr__(self):
        return f"XYZWriter({self.path!r}, {self.schedule!r})"


def _complete_frames(path):
    """``(frames, last step)`` of the extended-XYZ file ``path``; truncates a last frame cut short.

    Only the count and comment lines are parsed; the atom lines are skipped.
    """
    frames, last_step, end = 0, None, 0
    with open(path, "rb") as stream:
        while True:
            count = stream.readline()
            if not count.endswith(b"\n"):
                break  # the end of the file (or a count line cut short)
            try:
                atoms = int(count)
            except ValueError:
                # not ours to cut: refuse rather than append to (or truncate) another file
                raise ConfigError(f"cannot append to {path!r}: frame {frames + 1} does not start with an atom "
                                  f"count ({count[:40]!r}); give another output directory") from None
            comment = stream.readline()
            lines = [stream.readline() for _ in range(atoms)]
            if not comment.endswith(b"\n") or not all(line.endswith(b"\n") for line in lines):
                break  # cut short
            step = [field for field in comment.split() if field.startswith(b"Step=")]
            frames, end = frames + 1, stream.tell()
            last_step = int(step[0][5:]) if step else last_step
    if end < os.path.getsize(path):
        with open(path, "r+b") as stream:
            stream.truncate(end)
    return frames, last_step
