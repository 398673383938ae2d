"""What cluster acceptance measures on each worker: inventory, ceilings, kernels, energy.

Every function here runs inside one dask worker (``client.submit(...,
workers=[address])``) on that worker's own backend (``"auto"``: its GPU, or
Numba on the CPU) and returns plain dicts, so only small results travel.

* :func:`inventory`: host, CPU, memory, devices, driver and library versions.
* :func:`ceilings`: the measured memory-copy bandwidth and GEMM rate: the
  roofs of the roofline every kernel is compared with.
* :func:`kernel_checks`: each kernel family's throughput as a fraction of
  its roofline floor (on the ``numba`` backend also ``ratio_to_plain``: over
  a plain Numba kernel of the same job, :mod:`hpcgpu.bench.plain`; the
  acceptance verdict flags one below ``plain_ratio``) (memory-bound kernels against the copy bandwidth,
  compute-bound ones against the GEMM rate) and a correctness check against
  the ``numpy`` reference on fresh random input, on the worker.
* :func:`energy_per_step`: joules per step of a workload's ``"energy"``
  benchmark case (hpcgpu's own: the weather model) from NVML (GPUs) or
  RAPL (Intel CPUs), or why it is not available.

:func:`set_throttle` is a test-only hook that makes one worker's timed
regions slower by a factor, to check that acceptance flags it.

Examples
--------
>>> inventory()["cpu_cores"] >= 1
True
"""

import math
import os
import platform
import socket
import time

import numpy as np

from hpcgpu.bench.harness import measure

__all__ = ["inventory", "ceilings", "kernel_checks", "energy_per_step", "set_throttle", "FAMILY_MODEL"]

_throttle = 1.0

# Roofline model of each kernel family: which roof bounds it and its work per item.
FAMILY_MODEL = {
    # family/case: (roof, bytes or flops per item, unit of the rate)
    "stencil/diffusion": ("memory", "2 * itemsize bytes per point update (one step)", "point_updates_per_s"),
    "nbody/direct": ("compute", "20 flops per interaction", "interactions_per_s"),
    "md/lj_forces": ("compute", "30 flops per listed pair", "pairs_per_s"),
    "matrix/gemm": ("compute", "2 n^3 flops", "flops_per_s"),
    "matrix/spmv": ("memory", "bytes of values, indices, x and y", "bytes_per_s"),
}
_FLOPS_PER_PAIR = 30.0
_FLOPS_PER_INTERACTION = 20.0


def set_throttle(factor):
    """Test only: stretch this worker's timed regions by ``factor`` (>= 1) to simulate a slow device."""
    global _throttle
    _throttle = float(factor)
    return _throttle


def _time(function, backend, repeats):
    """Median seconds of ``function()`` with the device synchronised (and the test throttle)."""
    def call():
        start = time.perf_counter()
        function()
        backend.synchronize()
        if _throttle > 1.0:
            time.sleep((_throttle - 1.0) * (time.perf_counter() - start))
    return float(np.median(measure(call, synchronize=backend.synchronize, repeats=repeats, warmup=1)))


def _backend(name):
    from hpcgpu.backends import get_backend

    return get_backend(name)


def inventory(backend="auto"):
    """Host, CPU, memory, devices, driver and library versions of this process's machine."""
    import numba

    from hpcgpu import __version__, _gpu_probe

    b = _backend(backend)
    info = {"host": socket.gethostname(), "pid": os.getpid(), "platform": platform.platform(),
            "python": platform.python_version(), "hpcgpu": __version__, "numpy": np.__version__,
            "numba": numba.__version__, "backend": b.name, "cpu_model": _cpu_model(),
            "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")}
    report = _gpu_probe.probe_driver()
    info["driver_cuda"] = report.version_text if report.loaded else None
    info["gpus"] = list(report.devices) if report.loaded else []
    info["device"] = info["cpu_model"]
    info["device_memory_bytes"] = info["memory_bytes"]
    if b.on_gpu:
        import cupy

        free, total = cupy.cuda.Device().mem_info
        info.update(device=cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode(),
                    device_memory_bytes=int(total), cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                    cupy=cupy.__version__)
    return info


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def ceilings(backend="auto", quick=False):
    """Measured roofs: ``copy_bytes_per_s`` (read + written) and ``gemm_flops_per_s`` (float32)."""
    from hpcgpu.kernels import matrix

    b = _backend(backend)
    nbytes = (2**30 if b.on_gpu else 2**28) // (2 if quick else 1)
    elements = nbytes // 8
    src = b.xp.ones(elements, dtype=np.float32)
    dst = b.xp.empty_like(src)
    if b.name == "numba":
        from hpcgpu.bench._copy import parallel_copy as copy
    else:
        def copy(a, c):
            c[...] = a
    copy_s = _time(lambda: copy(src, dst), b, 5)
    n = (4096 if b.on_gpu else 1024) if quick else (8192 if b.on_gpu else 2048)
    rng = np.random.default_rng(0)
    x, y = (b.asarray(rng.standard_normal((n, n)), dtype=np.float32) for _ in range(2))
    roof = "cupy" if b.on_gpu else "numpy"  # cuBLAS or the BLAS NumPy links
    gemm_s = _time(lambda: matrix.matmul(x, y, backend=roof), b, 3)
    return {"copy_bytes_per_s": 2 * src.nbytes / copy_s, "gemm_flops_per_s": 2.0 * n**3 / gemm_s,
            "copy_bytes": int(src.nbytes), "gemm_n": n, "gemm_library": "cuBLAS" if b.on_gpu else "BLAS"}


def _relative_error(result, reference):
    result, reference = np.asarray(result, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    scale = float(np.abs(reference).max()) or 1.0
    return float(np.abs(result - reference).max() / scale)


def _check(family, b, run, reference_inputs, tolerance, rate, unit, roof_rate, roof, **extra):
    """One kernel record: rate, fraction of the roof, and a float64 check against numpy."""
    try:
        error = _relative_error(b.to_host(run(b, reference_inputs)),
                                run(_backend("numpy"), reference_inputs))
    except Exception as exc:  # noqa: BLE001 - a failed check is a result, not a crash
        error, extra["error"] = math.inf, f"{type(exc).__name__}: {exc}"
    return {"family": family, "backend": b.name, "rate": rate, "unit": unit, "roof": roof,
            "roof_rate": roof_rate, "fraction_of_roof": rate / roof_rate if roof_rate else None,
            "max_relative_error": error, "tolerance": tolerance, "passed": bool(error <= tolerance), **extra}


def kernel_checks(ceiling, backend="auto", quick=False):
    """Every kernel family's rate as a fraction of its roofline floor, and a correctness check."""
    from hpcgpu.bench import plain
    from hpcgpu.kernels import matrix, md, nbody, stencil

    b = _backend(backend)
    rng = np.random.default_rng(int(time.time_ns() % 2**32))  # fresh inputs every run
    copy_bw, gemm = ceiling["copy_bytes_per_s"], ceiling["gemm_flops_per_s"]
    big = b.on_gpu
    out = []

    # stencil: one diffusion step, float32, memory-bound (one step: the fused multi-step kernel
    # reuses cache between steps, which a streaming roofline does not model)
    n, steps = (8192 if big else 4096) // (2 if quick else 1), 1
    field = b.asarray(rng.random((n, n)), dtype=np.float32)
    seconds = _time(lambda: stencil.diffuse(field, diffusivity=0.2, dt=1.0, steps=steps, backend=b), b, 5)
    small = rng.random((48, 40))
    plain_ratio = {}
    if b.name == "numba":
        # the kernels themselves, as bench stencil times them: the public function also checks
        # its input and returns a new array, which the plain loop does not
        work, updated = np.empty_like(field), np.empty_like(field)
        periodic = (stencil.CODES["periodic"],) * 3
        plain_ratio = _ratio_to_plain(
            lambda: stencil.raw_kernels(b).diffuse(field, work, 0.2, 0.2, 1, *periodic, 0.0),
            lambda: plain.diffusion_step(field, updated, np.float32(0.2), np.float32(0.2)))
    out.append(_check("stencil/diffusion", b,
                      lambda bb, x: stencil.diffuse(bb.asarray(x), diffusivity=0.2, dt=1.0, steps=3, backend=bb),
                      small, 1e-12, n * n * steps / seconds, "point_updates_per_s", copy_bw / 8.0, "memory",
                      size=n, **plain_ratio))

    # nbody: direct summation, float32, compute-bound
    n = (32768 if big else 4096) // (2 if quick else 1)
    positions = b.asarray(rng.standard_normal((3, n)), dtype=np.float32)
    masses = b.asarray(np.full(n, 1.0 / n), dtype=np.float32)
    seconds = _time(lambda: nbody.accelerations(positions, masses, softening=0.01, backend=b), b, 3)
    bodies = (rng.standard_normal((3, 200)), rng.random(200))
    if b.name == "numba":
        x, y, z = (np.ascontiguousarray(positions[k]) for k in range(3))
        accelerations = [np.empty(n, np.float32) for _ in range(3)]
        plain_ratio = _ratio_to_plain(
            lambda: nbody.accelerations(positions, masses, softening=0.01, backend=b),
            lambda: plain.nbody_accelerations(x, y, z, masses, np.float32(1e-4), np.float32(1), *accelerations))
    out.append(_check("nbody/direct", b,
                      lambda bb, x: nbody.accelerations(bb.asarray(x[0]), bb.asarray(x[1]), softening=0.01,
                                                        backend=bb),
                      bodies, 1e-11, n * n / seconds, "interactions_per_s", gemm / _FLOPS_PER_INTERACTION,
                      "compute", size=n, **plain_ratio))

    # md: Lennard-Jones forces from a neighbour list, float32
    atoms, box = _liquid((20 if big else 10) // (2 if quick else 1), rng)
    x32 = b.asarray(atoms, dtype=np.float32)
    neighbors = md.build_neighbor_list(x32, box, cutoff=2.5, skin=0.3, backend=b)
    pairs = float(b.to_host(neighbors.counts).sum())
    seconds = _time(lambda: md.lj_forces(x32, box, neighbors, cutoff=2.5, backend=b), b, 3)
    small, small_box = _liquid(4, rng)
    if b.name == "numba":
        forces = np.empty_like(x32)
        plain_ratio = _ratio_to_plain(lambda: md.lj_forces(x32, box, neighbors, cutoff=2.5, backend=b),
                                      lambda: plain.lj_forces(x32, box, 2.5, forces))

    def lj(bb, x):
        positions = bb.asarray(x)
        listed = md.build_neighbor_list(positions, small_box, cutoff=2.5, skin=0.3, backend=bb)
        return md.lj_forces(positions, small_box, listed, cutoff=2.5, backend=bb)[0]

    out.append(_check("md/lj_forces", b, lj, small, 1e-10, pairs / seconds, "pairs_per_s",
                      gemm / _FLOPS_PER_PAIR, "compute", size=atoms.shape[1], **plain_ratio))

    # matrix: GEMM against the GEMM roof, SpMV against the copy roof
    n = (4096 if big else 1024) // (2 if quick else 1)
    a, c = (b.asarray(rng.standard_normal((n, n)), dtype=np.float32) for _ in range(2))
    seconds = _time(lambda: matrix.matmul(a, c, backend=b), b, 3)
    pair = (rng.standard_normal((70, 50)), rng.standard_normal((50, 30)))
    out.append(_check("matrix/gemm", b, lambda bb, x: matrix.matmul(bb.asarray(x[0]), bb.asarray(x[1]), backend=bb),
                      pair, 1e-12, 2.0 * n**3 / seconds, "flops_per_s", gemm, "compute", size=n))
    side = (2048 if big else 512) // (2 if quick else 1)
    csr = _poisson(side)
    device_csr = matrix.CSRMatrix(*(b.asarray(v) for v in (csr.data.astype(np.float32), csr.indices, csr.indptr)),
                                  shape=csr.shape)
    vector = b.asarray(rng.standard_normal(csr.shape[0]), dtype=np.float32)
    seconds = _time(lambda: matrix.spmv(device_csr, vector, backend=b), b, 5)
    nbytes = csr.nnz * (4 + 4) + (csr.shape[0] + 1) * 4 + 2 * csr.shape[0] * 4
    if b.name == "numba":
        from hpcgpu.bench.matrix import spmv_bytes_moved

        # against the memory roof, the bytes the kernel moves: a banded read skips the indices
        nbytes = spmv_bytes_moved(device_csr) or nbytes
    small = _poisson(12)
    probe = rng.standard_normal(small.shape[0])
    plain_ratio = {}
    if b.name == "numba":
        product = np.empty_like(vector)
        result = np.empty_like(vector)
        plain_ratio = _ratio_to_plain(  # the kernels alone (the public function checks x each call)
            lambda: matrix.raw_kernels(b).spmv(device_csr.data, device_csr.indices, device_csr.indptr, vector,
                                               result),
            lambda: plain.csr_spmv(device_csr.data, device_csr.indices, device_csr.indptr, vector, product,
                                   np.float32(0)))
    out.append(_check("matrix/spmv", b,
                      lambda bb, x: matrix.spmv(x.to_backend(bb), bb.asarray(probe), backend=bb), small, 1e-12,
                      nbytes / seconds, "bytes_per_s", copy_bw, "memory", size=csr.shape[0], **plain_ratio))
    return out


def _ratio_to_plain(ours, theirs):
    """``{"ratio_to_plain": ...}``: the plain kernel's median time over ours, the two in turns."""
    from hpcgpu.bench import plain

    ours_s, theirs_s = plain.paired_seconds(ours, theirs, rounds=5)
    return {"ratio_to_plain": theirs_s / ours_s}


def _liquid(cells, rng):
    """A jittered fcc lattice at the LJ liquid density 0.8442: positions (3, 4 cells^3) and the box."""
    side = cells * (4 / 0.8442) ** (1 / 3)
    grid = (np.indices((cells,) * 3).reshape(3, -1) + 0.25) * (side / cells)
    offsets = ((0, 0, 0), (0.5, 0.5, 0), (0.5, 0, 0.5), (0, 0.5, 0.5))
    atoms = np.concatenate([grid + np.array(o)[:, None] * (side / cells) for o in offsets], axis=1)
    return np.mod(atoms + rng.normal(0, 0.05, atoms.shape), side), (side,) * 3


def _poisson(side):
    """The 5-point Laplacian on a ``side`` x ``side`` periodic grid as a host CSRMatrix."""
    from hpcgpu.kernels.matrix import CSRMatrix

    index = np.arange(side * side).reshape(side, side)
    columns = np.stack([index, np.roll(index, 1, 0), np.roll(index, -1, 0), np.roll(index, 1, 1),
                        np.roll(index, -1, 1)], axis=-1).reshape(-1, 5)
    data = np.tile([4.0, -1.0, -1.0, -1.0, -1.0], side * side)
    return CSRMatrix(data, columns.ravel(), np.arange(0, 5 * side * side + 1, 5), shape=(side * side,) * 2)


def energy_per_step(backend="auto", quick=False, workload=None):
    """Joules per step on this worker's device, or ``{"available": False, "why": ...}``.

    The model is the ``"energy"`` benchmark case of ``workload``
    (:class:`hpcgpu.registry.BenchmarkCase`; default the first registered
    workload that declares one), at its quick size when ``quick``.
    """
    from hpcgpu import registry

    b = _backend(backend)
    meter = _energy_meter(b)
    if isinstance(meter, str):
        return {"available": False, "why": meter}
    declared, case = registry.benchmark_case("energy", workload)
    size = case.default_size(quick)
    model = case.model(size, backend=b)
    state = model.initial_state()
    dt = case.dt(model, state)
    state = model.step(state, dt, 2)
    b.synchronize()
    steps = 0
    joules0, start = meter(), time.perf_counter()
    while time.perf_counter() - start < (1.0 if quick else 3.0):
        state = model.step(state, dt, 10)
        b.synchronize()
        steps += 10
    joules = meter() - joules0
    return {"available": True, "source": "NVML" if b.on_gpu else "RAPL", "joules_per_step": joules / steps,
            "steps": steps, "workload": declared.name, "case": case.name, "size": case.recorded_size(model, size),
            "seconds": time.perf_counter() - start, "watts": joules / (time.perf_counter() - start)}


def _energy_meter(b):
    """A function returning cumulative joules, or a string saying why there is none."""
    if b.on_gpu:
        try:
            import pynvml
        except ImportError:
            return "NVML bindings missing: pip install nvidia-ml-py"
        try:
            pynvml.nvmlInit()
            import cupy

            bus = cupy.cuda.Device().pci_bus_id
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except Exception as exc:  # noqa: BLE001
            return f"NVML energy counter unavailable ({type(exc).__name__}: {exc})"
        return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3
    path = "/sys/class/powercap/intel-rapl:0/energy_uj"
    if not os.path.exists(path):
        return f"no RAPL counter ({path} does not exist: not an Intel CPU, a VM, or powercap is not loaded)"
    try:
        with open(path) as stream:
            int(stream.read())
    except (OSError, ValueError) as exc:
        return f"RAPL counter not readable ({exc}); it usually needs root since CVE-2020-8694"

    def read():
        with open(path) as stream:
            return int(stream.read()) / 1e6
    return read
