"""Distributed linear algebra on a dask cluster: blocked matrix multiply and conjugate gradient.

:func:`matmul` multiplies matrices held as blocks on the workers, larger
than any one worker's memory: every task multiplies one pair of square
tiles with the backend's GEMM (BLAS, cuBLAS or the hand-written kernels of
:mod:`hpcgpu.kernels.matrix`), and a tree of additions sums the tiles along
the inner dimension (``dask.array.blockwise`` then ``sum(split_every=...)``,
the formulation ``dask.array.matmul`` uses). The tile size comes from the
workers' count and memory (:func:`choose_tile`): as large as a task's three
tiles fit in a quarter of a worker thread's share of memory, and small
enough that there are at least two output tiles per worker.

:func:`conjugate_gradient` solves a sparse symmetric positive-definite
system whose rows are split over the workers. It runs SPMD: one pinned
task per worker runs the whole iteration loop for its rows, and the
partitions message each other directly through a communicator
(:mod:`hpcgpu.partition.dask_communicator`), not through the scheduler. Each
iteration sends two small messages to each peer: a partial dot product,
then partial dot products together with the entries of the preconditioned
residual that the peer's rows reference. Every rank reduces the same
values in the same order, so all take the same decisions; the client only
sees the residual history and the solution, at the end.

The modules: :mod:`~hpcgpu.linalg.blocked_matmul` (the tiled product),
:mod:`~hpcgpu.linalg.cg` (the solver's client side: input checks, rounds,
watching the workers) and :mod:`~hpcgpu.linalg.cg_ranks` (what each rank
runs on its worker).

Examples
--------
>>> import numpy as np  # doctest: +SKIP
>>> c = matmul(np.ones((4000, 3000)), np.ones((3000, 5000)), client=client)  # doctest: +SKIP
>>> float(c[0, 0].compute())  # doctest: +SKIP
3000.0
"""

from hpcgpu.linalg.blocked_matmul import MEMORY_FRACTION, MIN_TILE, choose_tile, matmul, worker_memory
from hpcgpu.linalg.cg import conjugate_gradient

__all__ = ["matmul", "choose_tile", "conjugate_gradient", "worker_memory"]
