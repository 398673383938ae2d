"""Taking a Zarr store back to a checkpoint: snapshots past it are cut off the ``time`` axis.

A run that loses a worker restarts from its last checkpoint
(:meth:`~hpcgpu.simulation.Simulation.run`) and steps again through the
steps after it. A snapshot taken after that checkpoint may be half
written: the ranks write their regions on background threads
(:mod:`hpcgpu.io.rank_zarr`), and the lost worker's regions never
arrived, so that time index holds fill values where the lost ranks'
cells should be. The writer therefore cuts every snapshot after the
checkpoint's step off the store (each array along ``time`` is resized)
and writes them again as the run passes their steps, exactly as the
uninterrupted run did (a resumed run is bitwise the uninterrupted one).

Examples
--------
>>> import tempfile, numpy as np, xarray as xr
>>> path = tempfile.mkdtemp() + "/fields.zarr"
>>> ds = xr.Dataset({"h": (("time", "x"), np.ones((3, 4)))},
...                 coords={"time": [0.0, 1.0, 2.0], "step": ("time", [0, 10, 20])})
>>> ds.to_zarr(path, mode="w", consolidated=False)  # doctest: +ELLIPSIS
<xarray.backends.zarr.ZarrStore object at ...>
>>> keep_snapshots_through(path, 10)
2
>>> xr.open_zarr(path, consolidated=False).step.values.tolist()
[0, 10]
"""

import warnings

import numpy as np

__all__ = ["keep_snapshots_through"]


def _dimensions(array):
    """An array's dimension names: Zarr v3 metadata, or xarray's attribute in a v2 store."""
    names = getattr(array.metadata, "dimension_names", None)
    if names is None:
        names = array.attrs.get("_ARRAY_DIMENSIONS")
    return tuple(names or ())


def keep_snapshots_through(path, step):
    """Cut the snapshots after ``step`` off the store at ``path``; returns how many snapshots it keeps.

    Parameters
    ----------
    path : str
        A Zarr store written by :class:`~hpcgpu.io.zarr_output.ZarrWriter`
        (a ``step`` coordinate along ``time``).
    step : int
        The step of the checkpoint the run went back to: snapshots at or
        before it stay.

    Returns
    -------
    int
        The snapshots left (the time index the next snapshot writes).
    """
    import zarr

    group = zarr.open_group(path, mode="r+")
    steps = np.asarray(group["step"][:])
    keep = int(np.searchsorted(steps, int(step), side="right"))  # snapshots are written in step order
    if keep == steps.size:
        return keep
    for _, array in group.arrays():
        dims = _dimensions(array)
        if "time" in dims:
            axis = dims.index("time")
            array.resize(tuple(keep if i == axis else n for i, n in enumerate(array.shape)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
        if group.metadata.consolidated_metadata is not None or _has_v2_consolidated(path):
            zarr.consolidate_metadata(path)
    return keep


def _has_v2_consolidated(path):
    import os

    return os.path.exists(os.path.join(str(path), ".zmetadata"))
