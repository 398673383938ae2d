"""Preconditioned conjugate gradient with the rows of a sparse matrix spread over dask workers.

Partition ``p`` holds rows ``[a_p, b_p)`` of the matrix and the same
entries of every vector (x, r, z, p, q), resident on its worker. Its rows
reference columns of other partitions; those entries of the search
direction are its *ghosts*, and the partitions that own them send exactly
those entries each iteration (the matrix's sparsity fixes the lists once,
as PETSc's scatter contexts do). One iteration is::

    ghosts q->p   entries of direction_q that p's rows reference
    matvec p      q_p = A_p [direction_p, ghosts]   and the local  p.q
    alpha         rz / sum(p.q)                        (one scalar task)
    update p      x += alpha p, r -= alpha q, z = D^-1 r, and the local r.z, r.r
    sums          sum of (r.z, r.r)                    (one scalar task)
    direction p   p = z + (rz_new / rz_old) p

Only scalars reach the client, in batches of ``check_every`` iterations
(the next batch is already running while the client reads one). When the
recursive residual meets the tolerance the solution is gathered and the true
residual ``b - A x`` is checked on the client; if rounding made them part,
CG restarts from there.
"""

import math
from dataclasses import dataclass, replace

import numpy as np

from hpcgpu.cluster import worker_info
from hpcgpu.distributed import split_rows
from hpcgpu.errors import ClusterError, ConfigError, ConvergenceError
from hpcgpu.validation import check_float, check_int

STALL_WINDOW = 100
"""Iterations without a 1 % drop of the best residual that count as a stall."""


@dataclass(frozen=True)
class _Part:
    """The static piece of one partition: its rows (local column numbering) and its send lists."""

    matrix: object        # CSRMatrix (rows, own + ghosts): own columns first, then ghosts in owner order
    inverse_diagonal: object
    sends: tuple          # ((partition, indices of own entries it needs), ...)
    receives: tuple       # partitions whose entries are this part's ghosts, in ghost order


@dataclass(frozen=True)
class _Vectors:
    x: object
    r: object
    z: object
    p: object
    q: object = None


def _split(matrix, bounds):
    """The :class:`_Part` of each row block ``bounds`` of a host CSR matrix."""
    from hpcgpu.kernels.matrix import CSRMatrix

    data, indices, indptr = (np.asarray(a) for a in (matrix.data, matrix.indices, matrix.indptr))
    starts = np.array([a for a, _ in bounds])
    diagonal = np.asarray(matrix.diagonal())
    needs = {}
    pieces = []
    for p, (a, b) in enumerate(bounds):
        lo, hi = int(indptr[a]), int(indptr[b])
        columns = indices[lo:hi].astype(np.int64)
        own = (columns >= a) & (columns < b)
        external = np.unique(columns[~own])
        owners = np.searchsorted(starts, external, side="right") - 1
        local = np.where(own, columns - a, (b - a) + np.searchsorted(external, columns))
        receives = tuple(int(q) for q in np.unique(owners))
        for q in receives:
            needs.setdefault(q, []).append((p, external[owners == q] - starts[q]))
        local_matrix = CSRMatrix(data[lo:hi], local, indptr[a:b + 1] - lo, shape=(b - a, (b - a) + len(external)))
        pieces.append((local_matrix, 1.0 / diagonal[a:b], receives))
    return [_Part(m, d, tuple((p, idx.astype(np.int64)) for p, idx in needs.get(q, [])), r)
            for q, (m, d, r) in enumerate(pieces)]


# -- tasks ------------------------------------------------------------------------------------
def _backend(name):
    from hpcgpu.backends import get_backend

    return get_backend(name)


def _prepare(part, backend):
    b = _backend(backend)
    return replace(part, matrix=part.matrix.to_backend(b), inverse_diagonal=b.asarray(part.inverse_diagonal),
                   sends=tuple((p, b.asarray(i)) for p, i in part.sends))


def _start(part, x, r, backend):
    b = _backend(backend)
    x, r = b.asarray(x), b.asarray(r)
    z = part.inverse_diagonal * r
    return _Vectors(x, r, z, z.copy())


def _local_sums(vectors, backend):
    from hpcgpu.kernels import matrix

    return (matrix.dot(vectors.r, vectors.z, backend=backend), matrix.dot(vectors.r, vectors.r, backend=backend))


def _ghosts(part, vectors, destination):
    for p, index in part.sends:
        if p == destination:
            return vectors.p[index]
    raise AssertionError(f"no send list for partition {destination}")


def _matvec(part, vectors, backend, *ghosts):
    from hpcgpu.kernels import matrix

    xp = _backend(backend).xp
    full = xp.concatenate([vectors.p, *ghosts]) if ghosts else vectors.p
    q = matrix.spmv(part.matrix, full, backend=backend)
    return replace(vectors, q=q)


def _pq(vectors, backend):
    from hpcgpu.kernels import matrix

    return matrix.dot(vectors.p, vectors.q, backend=backend)


def _alpha(sums, *pq_parts):
    pq = math.fsum(pq_parts)
    return (sums[0] / pq if pq > 0 else 0.0), pq


def _update(part, vectors, alpha):
    a = vectors.x.dtype.type(alpha[0])
    r = vectors.r - a * vectors.q
    return _Vectors(vectors.x + a * vectors.p, r, part.inverse_diagonal * r, vectors.p)


def _add_pairs(*pairs):
    return math.fsum(p[0] for p in pairs), math.fsum(p[1] for p in pairs)


def _direction(vectors, new, old):
    beta = vectors.z.dtype.type(new[0] / old[0] if old[0] > 0 else 0.0)
    return replace(vectors, p=vectors.z + beta * vectors.p, q=None)


def _x(vectors):
    x = vectors.x
    return x.get() if hasattr(x, "get") else np.asarray(x)


# -- the solver ---------------------------------------------------------------------------------
def _host_csr(matrix):
    from hpcgpu.kernels.matrix import CSRMatrix

    if isinstance(matrix, CSRMatrix):
        return matrix if not matrix.on_gpu else matrix.to_backend("numpy")
    if hasattr(matrix, "tocsr"):
        return CSRMatrix.from_scipy(matrix.tocsr())
    raise ConfigError(f"matrix must be a CSRMatrix or a scipy.sparse matrix; got {type(matrix).__name__}")


def solve(matrix, b, *, client, partitions, x0, tol, max_iter, preconditioner, backend, check_every):
    from hpcgpu.kernels import matrix as kernels
    from hpcgpu.kernels.matrix._solvers import CGResult

    A = _host_csr(matrix)
    n = A.shape[0]
    if A.shape[0] != A.shape[1]:
        raise ConfigError(f"matrix must be square; got shape {A.shape}")
    b = np.asarray(b)
    if b.shape != (n,):
        raise ConfigError(f"b must have shape ({n},) to match the matrix; got {b.shape}")
    if b.dtype != A.dtype:
        raise ConfigError(f"b must have the matrix's dtype {A.dtype}; got {b.dtype}")
    tol = check_float("tol", tol, minimum=0.0, strict_min=True)
    max_iter = 10 * n if max_iter is None else check_int("max_iter", max_iter, minimum=1)
    check_every = check_int("check_every", check_every, minimum=1)
    if preconditioner not in ("jacobi", None):
        raise ConfigError(f"preconditioner must be 'jacobi' or None; got {preconditioner!r}")
    workers = sorted(worker_info(client))
    if not workers:
        raise ClusterError("the dask cluster has no workers")
    partitions = len(workers) if partitions is None else check_int("partitions", partitions, minimum=1,
                                                                   maximum=n)
    diagonal = np.asarray(A.diagonal())
    if preconditioner == "jacobi" and not np.all(diagonal > 0):
        raise ConfigError("preconditioner='jacobi' needs a positive diagonal (an SPD matrix has one); "
                          f"the smallest diagonal entry is {diagonal.min():.3g}")
    bounds = split_rows(n, [1.0] * partitions)
    parts = _split(A, bounds)
    if preconditioner is None:
        parts = [replace(part, inverse_diagonal=np.ones(stop - start, dtype=A.dtype))
                 for part, (start, stop) in zip(parts, bounds)]
    receives = [part.receives for part in parts]
    name = backend if isinstance(backend, str) else backend.name
    owner = [workers[p % len(workers)] for p in range(partitions)]
    b_norm = math.sqrt(kernels.dot(b, b, backend="numpy"))
    if b_norm == 0:
        return CGResult(np.zeros_like(b), 0, (0.0,), True)
    x = np.zeros_like(b) if x0 is None else np.asarray(x0, dtype=b.dtype).copy()
    if x.shape != (n,):
        raise ConfigError(f"x0 must have shape ({n},); got {x.shape}")
    token = f"{np.random.default_rng().integers(1 << 48):012x}"
    static = [client.submit(_prepare, client.scatter(part, workers=[w], hash=False), name,
                            key=f"cg-prepare-{token}-{p}", workers=[w], pure=False)
              for p, (part, w) in enumerate(zip(parts, owner))]
    history, iterations = [], 0
    while True:
        r = b - kernels.spmv(A, x, backend="numpy")
        history.append(math.sqrt(kernels.dot(r, r, backend="numpy")) / b_norm)
        if history[-1] <= tol:
            return CGResult(x, iterations, tuple(history), True)
        x, iterations = _iterate(client, static, receives, owner, bounds, x, r, name, b_norm, tol, max_iter,
                                 check_every, history, iterations, token)


def _iterate(client, static, receives, owner, bounds, x, r, backend, b_norm, tol, max_iter, check_every,
             history, iterations, token):
    """CG from ``x`` (residual ``r``) until the recursive residual meets ``tol``; returns (x, iterations)."""
    count = len(bounds)
    restart = len(history)

    def submit(function, *args, key, p=0):
        return client.submit(function, *args, key=f"cg-{key}-{token}-{restart}", workers=[owner[p]],
                             allow_other_workers=True, pure=False)

    vectors = [submit(_start, static[p], x[a:b], r[a:b], backend, key=f"start-{p}", p=p)
               for p, (a, b) in enumerate(bounds)]
    sums = submit(_add_pairs, *[submit(_local_sums, v, backend, key=f"start-sums-{p}", p=p)
                                for p, v in enumerate(vectors)], key="start-sum")
    best, best_at = history[-1], iterations

    def batch(start, vectors, sums):
        records = []
        for k in range(start, start + check_every):
            matvec = []
            for p in range(count):
                pieces = [submit(_ghosts, static[q], vectors[q], p, key=f"ghosts-{k}-{q}-{p}", p=q)
                          for q in receives[p]]
                matvec.append(submit(_matvec, static[p], vectors[p], backend, *pieces, key=f"matvec-{k}-{p}", p=p))
            alpha = submit(_alpha, sums, *[submit(_pq, v, backend, key=f"pq-{k}-{p}", p=p)
                                           for p, v in enumerate(matvec)], key=f"alpha-{k}")
            updated = [submit(_update, static[p], v, alpha, key=f"update-{k}-{p}", p=p) for p, v in enumerate(matvec)]
            new = submit(_add_pairs, *[submit(_local_sums, v, backend, key=f"sums-{k}-{p}", p=p)
                                       for p, v in enumerate(updated)], key=f"sum-{k}")
            vectors = [submit(_direction, v, new, sums, key=f"direction-{k}-{p}", p=p) for p, v in enumerate(updated)]
            records.append((alpha, new, updated))
            sums = new
        return records, vectors, sums

    k = iterations
    pending, vectors, sums = batch(k, vectors, sums)
    while True:
        ahead = None
        if k + check_every < max_iter:  # the next batch runs while the client reads this one
            ahead, vectors, sums = batch(k + check_every, vectors, sums)
        scalars = client.gather([(alpha, new) for alpha, new, _ in pending])
        for (alpha, new), (_, _, updated) in zip(scalars, pending):
            pq = alpha[1]
            if not pq > 0:
                _fail(f"p.A p = {pq:.3e} <= 0: the matrix is not symmetric positive definite", history, k, tol)
            k += 1
            history.append(math.sqrt(max(new[1], 0.0)) / b_norm)
            if not math.isfinite(history[-1]):
                _fail("the residual is not finite", history, k, tol)
            if history[-1] <= tol:
                x = np.concatenate(client.gather([submit(_x, v, key=f"x-{k}-{p}", p=p)
                                                  for p, v in enumerate(updated)]))
                return x, k
            if history[-1] < 0.99 * best:
                best, best_at = history[-1], k
            elif k - best_at >= STALL_WINDOW:
                _fail(f"stalled: no 1 % progress in the last {STALL_WINDOW} iterations", history, k, tol)
            if k >= max_iter:
                _fail(f"max_iter={max_iter} reached without convergence", history, k, tol)
        if ahead is None:
            _fail(f"max_iter={max_iter} reached without convergence", history, k, tol)
        pending = ahead


def _fail(reason, history, k, tol):
    raise ConvergenceError(f"distributed conjugate gradient stopped after {k} iteration(s): {reason}; relative "
                           f"residual {history[-1]:.3e} (best {min(history):.3e}), tol {tol:.3e}",
                           residuals=history, iterations=k)
