"""The science models, one folder each: :mod:`~hpcgpu.workloads.weather`, :mod:`~hpcgpu.workloads.vorticity`,
:mod:`~hpcgpu.workloads.md` and :mod:`~hpcgpu.workloads.astro`.

In each, ``model.py`` holds the model class (its docstring states the
equations and names the reference step), beside its cases, command line,
``hpcgpu plan`` cost model and ``workload.py``, the declaration that
registers it (entry-point group ``hpcgpu.workloads``, read by
:mod:`hpcgpu.registry`). Core reaches the models only through that registry.

:mod:`~hpcgpu.workloads.sums` holds what several models' diagnostics share
(the order-independent :func:`~hpcgpu.workloads.sums.exact_total`, which
also adds the blocks' exact partial sums from the core's
:func:`~hpcgpu.exact_sums.exact_partial`); it imports no model.
"""
