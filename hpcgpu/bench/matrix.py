"""``hpcgpu bench matrix``: dense GEMM and CSR SpMV per backend.

Case ``gemm``: ``C = A B`` for ``n x n`` matrices of standard normals through
the public :func:`hpcgpu.kernels.matrix.matmul` (checks included, as users
call it), ``n`` = ``size``. ``value`` is ``flops_per_s`` = ``2 n**3`` over the
median time. Each line also carries ``relative_error``: max |C - C64| /
max |C64| over the first :data:`CHECKED_ROWS` rows, against a float64
product of the same (rounded) operands on the host. On GPU backends the
line carries ``cublas_flops_per_s``, plain ``cupy.dot`` on the same
operands with CuPy's float32 compute type set to full precision (no TF32),
timed in the same run, and ``fraction_of_cublas``. Case ``gemm_tf32``: the
``cupy`` backend with ``allow_tf32=True`` (float32 only). Case ``gemm_tiles``
(``cuda`` on a GPU only): the other tile sizes of the hand-written kernel.

Case ``spmv``: ``y = A x`` for the 5-point Laplacian (Dirichlet) on a
``size x size`` grid (``size**2`` rows, about 5 values per row, int32
indices), built on the backend's device; ``steps`` products per timed call.
``value`` is ``bytes_per_s``, the effective bytes one product must move
(``data``, ``indices``, ``indptr``, ``x`` and ``y`` once each) over the time
per product; ``fraction_of_copy`` compares it with a copy measured in the
same run on the same number of bytes, and on CPU backends
``fraction_of_triad`` with a STREAM triad on every core
(:func:`hpcgpu.bench.plain.triad_bandwidth`: the memory roof). The bytes
are those a CSR product must move even where the ``numba`` backend reads
a banded matrix without its indices (``spmv_variant``), so the fraction
may pass 1. The ``numba`` line carries ``ratio_to_plain``: its rate over a
plain ``prange`` CSR row loop's on the same matrix, timed in turns.

Case ``cg_partitions`` (with ``--workers N``, N >= 2): Jacobi-preconditioned
CG on the Poisson matrix of a ``size/4 x size/4`` grid (``--size 2048``
solves 512^2) with the rows spread over N local workers
(:func:`hpcgpu.linalg.conjugate_gradient`: halo entries and dot products go
rank to rank through the communicator), beside the same solve in this
process; ``value`` is iterations per second and the line carries
``overhead_s_per_iteration``, the distributed solve's time per iteration
minus the local one's (what partitioning costs: messages, reductions, the
epoch's task).

``ratio_to_numpy`` is the ratio to the ``numpy`` backend (BLAS on the CPU)
in the same run. Cases are the functions in :data:`CASES`, so that more
(solvers) can be added by name.
"""

import numpy as np

from hpcgpu.bench.harness import copy_bandwidth, measure

__all__ = ["run", "CASES", "poisson_matrix", "spmv_bytes_moved", "CHECKED_ROWS"]

CHECKED_ROWS = 32
"""Rows of C compared with a float64 product for ``relative_error``."""

SEED = 11


def _gemm_operands(backend, n, dtype):
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
    b = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
    return a, b


def _relative_error(backend, c, a, b):
    rows = min(CHECKED_ROWS, a.shape[0])
    reference = a[:rows].astype(np.float64) @ b.astype(np.float64)
    got = backend.to_host(c[:rows]).astype(np.float64)
    return float(np.abs(got - reference).max() / np.abs(reference).max())


def _cublas_rate(backend, a, b, c, budget_s):
    """flops/s of plain ``cupy.dot`` (cuBLAS) with full-precision float32: the ``cupy`` backend's
    raw ``matmul`` without TF32."""
    from hpcgpu.kernels.matrix import raw_kernels

    cublas = raw_kernels("cupy").matmul
    durations = measure(lambda: cublas(a, b, c, False), synchronize=backend.synchronize,
                        budget_s=budget_s, min_repeats=3)
    return 2.0 * a.shape[0] ** 3 / float(np.median(durations))


def gemm(recorder, backend, dtype, n, steps, budget_s, *, allow_tf32=False, cache=None):
    """One ``gemm`` (or ``gemm_tf32``) line for ``backend``."""
    from hpcgpu.kernels.matrix import matmul, raw_kernels

    dtype = np.dtype(dtype)
    host_a, host_b = _gemm_operands(backend, n, dtype)
    a, b = backend.asarray(host_a), backend.asarray(host_b)
    c = backend.empty((n, n), dtype)
    durations = measure(lambda: matmul(a, b, c, backend=backend, allow_tf32=allow_tf32),
                        synchronize=backend.synchronize, budget_s=budget_s, min_repeats=2)
    rate = 2.0 * n**3 / float(np.median(durations))
    extra = {"gflops": rate / 1e9, "relative_error": _relative_error(backend, c, host_a, host_b),
             "allow_tf32": allow_tf32}
    if backend.name == "numba":
        extra["blas"] = raw_kernels(backend).BLAS
    if backend.name == "cuda":
        extra["tiles"] = raw_kernels(backend).LAUNCH[dtype.name]._asdict()
    if backend.on_gpu and not backend.simulated:
        key = (n, dtype.name)
        if cache is not None and key not in cache:
            cache[key] = _cublas_rate(backend, a, b, c, budget_s)
        if cache is not None:
            extra["cublas_flops_per_s"] = cache[key]
            extra["fraction_of_cublas"] = rate / cache[key]
    case = "gemm_tf32" if allow_tf32 else "gemm"
    return recorder.add(case=case, backend=backend.name, dtype=dtype.name, size=n, metric="flops_per_s",
                        value=rate, unit="flop/s", durations=durations, **extra)


def poisson_matrix(xp, side, dtype):
    """The 5-point Laplacian (4 on the diagonal, -1 to each neighbour, Dirichlet) on a
    ``side x side`` grid, as a CSRMatrix on the device of ``xp`` (columns sorted).

    Examples
    --------
    >>> import numpy as np
    >>> poisson_matrix(np, 3, np.float64).to_dense()[4].tolist()
    [0.0, -1.0, 0.0, -1.0, 4.0, -1.0, 0.0, -1.0, 0.0]
    """
    from hpcgpu.kernels.matrix import CSRMatrix

    n = side * side
    row, col = xp.divmod(xp.arange(n, dtype=np.int64), side)
    # Neighbours in column order: up, left, centre, right, down.
    offsets = ((-1, 0, -1.0), (0, -1, -1.0), (0, 0, 4.0), (0, 1, -1.0), (1, 0, -1.0))
    columns, valid = [], []
    for dr, dc, _ in offsets:
        r, c = row + dr, col + dc
        valid.append((r >= 0) & (r < side) & (c >= 0) & (c < side))
        columns.append(r * side + c)
    valid = xp.stack(valid, axis=1)
    indices = xp.stack(columns, axis=1)[valid].astype(np.int32)
    values = xp.asarray(np.array([v for _, _, v in offsets], dtype=dtype))
    data = xp.broadcast_to(values, (n, len(offsets)))[valid]
    indptr = xp.concatenate([xp.zeros(1, np.int64), xp.cumsum(valid.sum(axis=1))]).astype(np.int32)
    return CSRMatrix(data, indices, indptr, (n, n))


def spmv(recorder, backend, dtype, side, steps, budget_s, *, cache=None):
    """One ``spmv`` line for ``backend`` on the Laplacian of a ``side x side`` grid."""
    from hpcgpu.kernels.matrix import spmv as product

    dtype = np.dtype(dtype)
    matrix = poisson_matrix(backend.xp, side, dtype)
    n = matrix.shape[0]
    x = backend.asarray(np.random.default_rng(SEED).standard_normal(n).astype(dtype))
    y = backend.empty((n,), dtype)

    def call():
        for _ in range(steps):
            product(matrix, x, y, backend=backend)

    durations = measure(call, synchronize=backend.synchronize, budget_s=budget_s, min_repeats=2)
    seconds = float(np.median(durations)) / steps
    index_size = matrix.indices.dtype.itemsize
    nbytes = (matrix.nnz * (dtype.itemsize + index_size) + (n + 1) * index_size + 2 * n * dtype.itemsize)
    rate = nbytes / seconds
    copy = copy_bandwidth(backend, nbytes)
    extra = {}
    if not backend.on_gpu:
        from hpcgpu.bench.plain import triad_bandwidth

        triad = triad_bandwidth(nbytes)
        extra.update(triad_gb_per_s=triad / 1e9, fraction_of_triad=rate / triad)
    if backend.name == "numba":
        extra.update(_plain_spmv_ratio(matrix, x, y, product, backend, nbytes))
        if "bytes_moved_per_product" in extra:
            extra["moved_gb_per_s"] = extra["bytes_moved_per_product"] / seconds / 1e9
    return recorder.add(case="spmv", backend=backend.name, dtype=dtype.name, size=side,
                        metric="bytes_per_s", value=rate, unit="B/s", durations=durations,
                        gb_per_s=rate / 1e9, rows=n, nnz=matrix.nnz, bytes_per_product=nbytes,
                        seconds_per_product=seconds, products_per_call=steps,
                        matrix="poisson-5-point", copy_gb_per_s=copy / 1e9, fraction_of_copy=rate / copy,
                        **extra)


def _plain_spmv_ratio(matrix, x, y, product, backend, nbytes):
    """The plain ``prange`` CSR row loop's rate on the same matrix, timed in turns with ours;
    and the variant :mod:`hpcgpu.autotune` chose (``spmv_variant``)."""
    from hpcgpu.bench import plain
    from hpcgpu.kernels.matrix import raw_kernels

    out = np.empty_like(y)
    zero = matrix.data.dtype.type(0)
    ours, theirs = plain.paired_seconds(
        lambda: product(matrix, x, y, backend=backend),
        lambda: plain.csr_spmv(matrix.data, matrix.indices, matrix.indptr, x, out, zero), rounds=7)
    variant = raw_kernels(backend).spmv_variant(matrix.data.dtype)
    extra = {"plain_gb_per_s": nbytes / theirs / 1e9, "ratio_to_plain": theirs / ours,
             "plain_kernel": "njit(parallel, fastmath) prange over CSR rows", "spmv_variant": variant}
    moved = spmv_bytes_moved(matrix)
    if moved is not None:
        extra["bytes_moved_per_product"] = moved
    return extra


def spmv_bytes_moved(matrix):
    """Bytes one ``numba`` SpMV of ``matrix`` (host CSR) moves when it reads bands, else None.

    Rows in banded runs move their values, ``x`` and ``y`` (no indices, no
    ``indptr``); the other rows what a CSR row loop moves.
    """
    from hpcgpu.kernels.matrix import raw_kernels

    kernels = raw_kernels("numba")
    if kernels.spmv_variant(matrix.data.dtype) != "banded":
        return None
    structure = kernels.band_structure(matrix.indices, matrix.indptr)
    if structure is None:
        return None
    item, index = matrix.data.dtype.itemsize, matrix.indices.dtype.itemsize
    covered, bands = structure.covered_rows, len(structure.offsets)
    others = matrix.shape[0] - covered
    return (covered * (bands + 2) * item + (matrix.nnz - covered * bands) * (item + index)
            + others * (index + 2 * item) + index)


def _gemm_tf32(recorder, backend, dtype, n, steps, budget_s, *, cache=None):
    if backend.name != "cupy" or np.dtype(dtype) != np.float32:
        return None
    return gemm(recorder, backend, dtype, n, steps, budget_s, allow_tf32=True, cache=cache)


def gemm_tiles(recorder, backend, dtype, n, steps, budget_s, *, cache=None):
    """``gemm_tiles`` lines: the ``cuda`` backend's other tile sizes (``VARIANTS`` of at least
    32 x 32 in :func:`hpcgpu.kernels.matrix.raw_kernels`), timed on the kernel itself, to choose
    its ``LAUNCH`` on a GPU."""
    if backend.name != "cuda" or backend.simulated:
        return None
    from hpcgpu.kernels.matrix import raw_kernels

    kernels = raw_kernels(backend)

    dtype = np.dtype(dtype)
    host_a, host_b = _gemm_operands(backend, n, dtype)
    a, b = backend.asarray(host_a), backend.asarray(host_b)
    c = backend.empty((n, n), dtype)
    key = (n, dtype.name)
    if cache is not None and key not in cache:
        cache[key] = _cublas_rate(backend, a, b, c, budget_s)
    results = []
    for launch in kernels.VARIANTS:
        if min(launch.block_m, launch.block_n) < 32:
            continue
        durations = measure(lambda: kernels.gemm(a, b, c, launch), synchronize=backend.synchronize,
                            budget_s=budget_s, min_repeats=2)
        rate = 2.0 * n**3 / float(np.median(durations))
        extra = {"gflops": rate / 1e9, "tiles": launch._asdict(),
                 "relative_error": _relative_error(backend, c, host_a, host_b)}
        if cache is not None:
            extra.update(cublas_flops_per_s=cache[key], fraction_of_cublas=rate / cache[key])
        results.append(recorder.add(case="gemm_tiles", backend=backend.name, dtype=dtype.name, size=n,
                                    metric="flops_per_s", value=rate, unit="flop/s", durations=durations,
                                    **extra))
    return results


def cg(recorder, backend, dtype, side, steps, budget_s, *, cache=None):
    """Time to solution of Jacobi-preconditioned CG on the Poisson matrix of a ``side x side`` grid.

    Right-hand side from a random solution; tolerance 1e-6 (float32) or
    1e-10 (float64) on the relative residual.
    """
    from hpcgpu.kernels.matrix import conjugate_gradient, spmv as product

    dtype = np.dtype(dtype)
    side = max(8, side // 8)  # CG costs ~side iterations of a side^2 SpMV: keep the case short
    matrix = poisson_matrix(backend.xp, side, dtype)
    solution = backend.asarray(np.random.default_rng(SEED).standard_normal(side * side).astype(dtype))
    b = product(matrix, solution, backend=backend)
    tol = 1e-6 if dtype == np.float32 else 1e-10
    results = []

    def call():
        results.append(conjugate_gradient(matrix, b, tol=tol, backend=backend))

    durations = measure(call, synchronize=backend.synchronize, budget_s=budget_s, min_repeats=2, max_repeats=5)
    seconds = float(np.median(durations))
    result = results[-1]
    error = float(backend.xp.abs(result.x - solution).max() / backend.xp.abs(solution).max())
    return recorder.add(case="cg", backend=backend.name, dtype=dtype.name, size=side, metric="solves_per_s",
                        value=1.0 / seconds, unit="1/s", durations=durations, seconds_to_solution=seconds,
                        iterations=result.iterations, final_relative_residual=result.residuals[-1],
                        tolerance=tol, relative_error=error, rows=side * side, preconditioner="jacobi")


def _cg_partitions(recorder, backend, dtype, size, budget_s, workers):
    from hpcgpu.cluster import start_cluster
    from hpcgpu.kernels.matrix import conjugate_gradient as local_cg, spmv as product
    from hpcgpu.linalg import conjugate_gradient as distributed_cg

    dtype = np.dtype(dtype)
    side = max(16, size // 4)
    matrix = poisson_matrix(np, side, dtype)  # host CSR: the workers build their own rows from it
    solution = np.random.default_rng(SEED).standard_normal(side * side).astype(dtype)
    b = product(matrix, solution, backend="numpy")
    tol = 1e-5 if dtype == np.float32 else 1e-8
    local_results, results = [], []
    device_matrix = poisson_matrix(backend.xp, side, dtype)
    device_b = backend.asarray(b)
    local = measure(lambda: local_results.append(local_cg(device_matrix, device_b, tol=tol, backend=backend)),
                    synchronize=backend.synchronize, budget_s=budget_s / 2, min_repeats=2, max_repeats=5)
    gpus = backend.on_gpu and not backend.simulated
    client = start_cluster(workers=workers, threads_per_worker=None if gpus else 1, gpus=gpus,
                           dashboard_address="127.0.0.1:0", quiet=True)
    try:
        client.wait_for_workers(workers)
        durations = measure(lambda: results.append(distributed_cg(matrix, b, client=client, tol=tol,
                                                                  backend=backend.name)),
                            synchronize=lambda: None, budget_s=budget_s / 2, min_repeats=2, max_repeats=5)
    finally:
        local_cluster = client.cluster
        client.close()
        local_cluster.close()
    iterations, local_iterations = results[-1].iterations, local_results[-1].iterations
    per_iteration = float(np.median(durations)) / iterations
    local_per_iteration = float(np.median(local)) / local_iterations
    error = float(np.abs(np.asarray(results[-1].x) - solution).max() / np.abs(solution).max())
    return recorder.add(case="cg_partitions", backend=backend.name, dtype=dtype.name, size=side,
                        metric="iterations_per_s", value=1.0 / per_iteration, unit="1/s", durations=durations,
                        workers=workers, partitions=workers, iterations=iterations,
                        local_iterations=local_iterations, seconds_per_iteration=per_iteration,
                        local_seconds_per_iteration=local_per_iteration,
                        overhead_s_per_iteration=per_iteration - local_per_iteration, tolerance=tol,
                        relative_error=error, rows=side * side, preconditioner="jacobi")


CASES = {"gemm": gemm, "gemm_tf32": _gemm_tf32, "gemm_tiles": gemm_tiles, "spmv": spmv, "cg": cg}
"""Case name -> ``function(recorder, backend, dtype, size, steps, budget_s, *, cache)``."""


def run(recorder, backends, *, sizes=(1024, 2048), dtypes=("float32",), steps=10, budget_s=20.0,
        cases=None, workers=None):
    """Run the matrix suite; results go to ``recorder`` (numpy first, for the ratios).

    ``sizes`` are the matrix side ``n`` for GEMM and the grid side for SpMV;
    ``steps`` SpMV products per timed call; ``cases`` names from
    :data:`CASES` (default all); ``workers`` (2 or more) adds the
    ``cg_partitions`` case on that many local workers for every backend but
    ``numpy``.

    Raises
    ------
    ConfigError
        A case not in :data:`CASES`, or ``workers < 2``.
    """
    from hpcgpu.errors import ConfigError

    names = list(CASES) if cases is None else list(cases)
    # before any case runs: a typo must not cost the cases before it (nor end in a bare KeyError)
    unknown = [name for name in names if name not in CASES]
    if unknown:
        raise ConfigError(f"cases must be among {', '.join(CASES)}; got {', '.join(map(repr, unknown))}")
    if workers is not None and workers < 2:
        raise ConfigError(f"workers must be >= 2 for the matrix benchmark's cg_partitions case; got {workers}")
    order = sorted(backends, key=lambda b: b.name != "numpy")
    cache = {}
    for name in names:
        function = CASES[name]
        for size in sizes:
            for dtype in dtypes:
                for backend in order:
                    # One failing backend must not hide the others' numbers.
                    try:
                        function(recorder, backend, dtype, size, steps, budget_s, cache=cache)
                    except Exception as error:  # noqa: BLE001 - reported; the CLI exits non-zero
                        recorder.error(case=name, backend=backend.name, dtype=np.dtype(dtype).name,
                                       size=size, error=error)
    for size in sizes if workers else ():
        for dtype in dtypes:
            for backend in order:
                if backend.name == "numpy":
                    continue
                try:
                    _cg_partitions(recorder, backend, dtype, size, budget_s, workers)
                except Exception as error:  # noqa: BLE001 - as above
                    recorder.error(case="cg_partitions", backend=backend.name, dtype=np.dtype(dtype).name,
                                   size=max(16, size // 4), error=error)
    return recorder.results
