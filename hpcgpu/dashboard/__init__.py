"""hpcgpu in the dask dashboard: live status of the simulations on a cluster.

Two views of the same data, both served by the scheduler's dashboard port:

- **panels in dask's own dashboard**, Bokeh documents beside Task Stream:
  runs with steps/s, diagnostics over time, partitions per worker, and GPU
  utilisation, memory and power. They are listed in dask's "More..." menu
  and in ``/individual-plots.json``, so JupyterLab's dask extension offers
  them as panels (``/individual-hpcgpu-runs``, ``-diagnostics``,
  ``-partitions``, ``-gpus``);
- **the hpcgpu page** at ``/hpcgpu`` (in dask's top bar): everything on one
  page, plain HTML and JavaScript that needs no Bokeh, polling
  ``/hpcgpu/data.json`` (the same data as JSON) every second.

GPU readings come from NVML (``pynvml``, from ``nvidia-ml-py``, in the
``cuda`` extras) on the workers; without it the views say "no GPU" and why.

:func:`hpcgpu.start_cluster` installs the scheduler plugin that serves them and
prints the page's link; a scheduler started from the command line gets them
from its first hpcgpu client, or at start with ``dask scheduler --preload
hpcgpu.dashboard.preload``. A :class:`~hpcgpu.Simulation` running on a dask
client publishes its status after a batch of steps, at most once a second,
without waiting: publishing never slows a run, and a scheduler without the
plugin only means no views.

Modules: :mod:`~hpcgpu.dashboard.publishing` (the client's side),
:mod:`~hpcgpu.dashboard.plugin` (the scheduler's side),
:mod:`~hpcgpu.dashboard.gpu` (the workers' side), :mod:`~hpcgpu.dashboard.page`
(the page; its files in ``static/``), :mod:`~hpcgpu.dashboard.panels` (the
Bokeh panels) and :mod:`~hpcgpu.dashboard.dask_dashboard` (adding them to
dask's dashboard), :mod:`~hpcgpu.dashboard.preload` (``dask scheduler
--preload``).

Examples
--------
>>> import hpcgpu
>>> client = hpcgpu.start_cluster(workers=2)           # doctest: +SKIP
hpcgpu: dask dashboard at http://127.0.0.1:8787/status, hpcgpu page at http://127.0.0.1:8787/hpcgpu
>>> hpcgpu.dashboard.page_link(client)                 # doctest: +SKIP
'http://127.0.0.1:8787/hpcgpu'
"""

from hpcgpu.dashboard.publishing import page_link, publish, register, status_record

__all__ = ["register", "page_link", "publish", "status_record"]
