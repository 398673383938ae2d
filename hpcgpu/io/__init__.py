"""What hpcgpu writes and shows: fields to Zarr, pictures to PNG, objects as HTML in notebooks.

:mod:`~hpcgpu.io.zarr_output`
    :class:`ZarrWriter`, a writer for :meth:`hpcgpu.Simulation.add_writer`
    that appends snapshots of the fields on a schedule, and
    :func:`open_output` to read a run back (xarray); on a partitioned run
    the ranks write them (:mod:`~hpcgpu.io.rank_zarr` for grids,
    :mod:`~hpcgpu.io.particle_zarr` for particles, by id, both on the
    workers' :mod:`~hpcgpu.io.writer_threads`);
:mod:`~hpcgpu.io.png_panels`
    :func:`save_panels`, colour maps of 2D fields for the command line;
:mod:`~hpcgpu.io.html_views`
    the ``_repr_html_`` summaries of simulations, models and states.

MD trajectories in extended XYZ belong to the MD model
(:class:`hpcgpu.workloads.md.XYZWriter`): the format is about atoms.
"""

from hpcgpu.io.png_panels import save_panels
from hpcgpu.io.zarr_output import ZarrWriter, open_output

__all__ = ["ZarrWriter", "open_output", "save_panels"]
