"""A dask preload: ``dask scheduler --preload hpcgpu.dashboard.preload``.

Installs :class:`~hpcgpu.dashboard.plugin.DashboardPlugin` as the scheduler
starts, so the hpcgpu page and panels are in its dashboard before any client
connects (without it, the first :func:`hpcgpu.start_cluster` call for that
scheduler installs them). The scheduler must be able to import hpcgpu.
"""

__all__ = ["dask_setup"]


def dask_setup(scheduler):
    """Called by dask with the scheduler before it starts; its plugins start with it."""
    from hpcgpu.dashboard.plugin import PLUGIN_NAME, DashboardPlugin

    scheduler.add_plugin(DashboardPlugin(), name=PLUGIN_NAME, idempotent=True)
