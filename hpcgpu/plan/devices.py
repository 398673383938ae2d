"""The device a plan is for: a named profile, or one measured by ``hpcgpu bench`` on that device.

:func:`device_profile` takes a name of :data:`~hpcgpu.plan.profiles.DEVICES`
or a ``.jsonl`` file; :func:`measured_device` reads the records a device's benchmarks wrote
(copy bandwidth, GEMM or N-body flop rates, the shallow-water and N-body
kernels' fractions of their roofline, the memory size) into a
:class:`~hpcgpu.plan.profiles.DeviceProfile`; what a file lacks comes from
the named GPU or CPU profile and says so in the profile's sources.
``hpcgpu plan --device results.jsonl`` goes through them.

Examples
--------
>>> import json, tempfile
>>> record = {"suite": "stencil", "case": "copy", "metric": "bytes_per_s", "value": 2.0e10, "backend": "numba"}
>>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
...     _ = f.write(json.dumps(record) + "\\n")
>>> profile = measured_device(f.name, memory_gb=16)
>>> profile.kind, profile.copy_bandwidth, profile.memory_bytes
('cpu', 20000000000.0, 16000000000.0)
"""

import json
from dataclasses import replace
from pathlib import Path

from hpcgpu.errors import ConfigError
from hpcgpu.plan.profiles import DEVICES, DeviceProfile, _positive
from hpcgpu.plan.workload_costs import WeatherCost

__all__ = ["device_profile", "measured_device"]


def device_profile(name_or_path, *, memory_gb=None):
    """The device profile named ``name_or_path``, or one measured by ``hpcgpu bench`` (a .jsonl path).

    Raises
    ------
    ConfigError
        An unknown name (the message lists the valid ones) or an unusable file.

    Examples
    --------
    >>> device_profile("h100").bandwidth
    3350000000000.0
    """
    if isinstance(name_or_path, DeviceProfile):
        return name_or_path
    text = str(name_or_path)
    if text.lower() in DEVICES:
        profile = DEVICES[text.lower()]
        if memory_gb is not None:
            profile = replace(profile, memory_bytes=_positive("memory_gb", memory_gb) * 1e9)
        return profile
    if text.endswith(".jsonl") or Path(text).is_file():
        return measured_device(text, memory_gb=memory_gb)
    raise ConfigError(f"device must be one of {sorted(DEVICES)} or a .jsonl file of `hpcgpu bench` "
                      f"results; got {name_or_path!r}")


def _median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def measured_device(path, *, memory_gb=None):
    """A device profile from the JSON lines of ``hpcgpu bench`` (one device model).

    Copy bandwidth: records with metric ``bytes_per_s`` whose case names a
    copy, else the ``copy_bytes_per_s`` of cluster acceptance's ``ceiling``
    records (``hpcgpu bench`` without a suite), else the ``copy_gb_per_s``
    the stencil and matrix suites record beside their kernels (median over
    records). Peak flop/s per dtype: GEMM records (metric ``flops_per_s``;
    not ``gemm_tf32``) and, for float32, the ``gemm_flops_per_s`` of the
    ``ceiling`` records, else the ``gflops`` of the one-process N-body case
    ``direct``; missing
    ones fall back to the named GPU or CPU profile. Fractions: the measured
    ``fraction_of_copy`` of ``shallow_water`` (best backend per dtype; on a
    CPU, where the fused step is bound by arithmetic, the flop rate of
    ``shallow_water_fused_step`` over the peak) and the N-body rate over the
    peak; others from the named profile of that kind.
    Memory: ``memory_gb`` if given, else the ``device_memory_bytes`` (GPU
    memory) or, without it, ``memory_bytes`` of a record (the smallest).

    Raises
    ------
    ConfigError
        No file, no bandwidth in it, or no memory size.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise ConfigError(f"device file {str(path)!r} cannot be read ({error}); give a named device "
                          f"{sorted(DEVICES)} or a .jsonl file of `hpcgpu bench` results") from error
    records = []
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    # cluster acceptance (`hpcgpu bench` without a suite) measures its roofs once per worker, in
    # "ceiling" records (copy bandwidth, float32 GEMM), and names each worker's backend in its inventory
    ceilings = [r for r in records if r.get("kind") == "ceiling" and r.get("copy_bytes_per_s")]
    inventories = [r for r in records if r.get("kind") == "inventory"]
    ok = [r for r in records if r.get("value") is not None or r.get("copy_gb_per_s") is not None]
    kind = "gpu" if any(r.get("backend") in ("cuda", "cupy") for r in ok + inventories) else "cpu"
    base = DEVICES["h100"] if kind == "gpu" else DEVICES["cpu"]
    copies = [r["value"] for r in ok if r.get("metric") == "bytes_per_s" and "copy" in str(r.get("case", ""))]
    if not copies:
        copies = [r["copy_bytes_per_s"] for r in ceilings]
    if not copies:
        copies = [r["copy_gb_per_s"] * 1e9 for r in ok if r.get("copy_gb_per_s")]
    if not copies:
        raise ConfigError(f"device file {str(path)!r} holds no copy bandwidth (records with metric "
                          "'bytes_per_s', a 'copy_gb_per_s' field or acceptance 'ceiling' records): run "
                          "`hpcgpu bench stencil` or `hpcgpu bench` there")
    peak = dict(base.peak_flops)
    for dtype in ("float32", "float64"):
        # not TF32 (gemm_tf32: a 10-bit mantissa, several times the float32 peak), and N-body from one
        # process only (direct_blocks adds up the rates of all its workers)
        gemm = [r["value"] for r in ok if r.get("metric") == "flops_per_s" and r.get("dtype") == dtype
                and not r.get("allow_tf32")]
        if dtype == "float32":
            gemm += [r["gemm_flops_per_s"] for r in ceilings if r.get("gemm_flops_per_s")]
        nbody = [r["gflops"] * 1e9 for r in ok if r.get("case") == "direct" and r.get("gflops")
                 and r.get("dtype") == dtype]
        if gemm or nbody:
            peak[dtype] = max(gemm or nbody)
    fractions = {family: dict(values) for family, values in base.fractions.items()}
    sources = dict(base.sources)
    for dtype in ("float32", "float64"):
        if kind == "cpu":
            # the fused step (Numba) is bound by arithmetic: its flop rate over the peak
            measured = [r["value"] * WeatherCost.flops_per_point_step / peak[dtype] for r in ok
                        if r.get("case") == "shallow_water_fused_step" and r.get("dtype") == dtype
                        and r.get("value")]
            what = "fused shallow-water step's flop rate over the peak"
        else:
            measured = [r["fraction_of_copy"] for r in ok if r.get("case") == "shallow_water"
                        and r.get("dtype") == dtype and r.get("fraction_of_copy")]
            what = "shallow_water fraction_of_copy"
        if measured:
            fractions["stencil"][dtype] = min(1.0, max(measured))
            sources["stencil"] = f"measured: {Path(path).name} ({what})"
        nbody = [r["gflops"] * 1e9 for r in ok if r.get("case") == "direct" and r.get("gflops")
                 and r.get("dtype") == dtype]
        if nbody:
            fractions["nbody"][dtype] = min(1.0, max(nbody) / peak[dtype])
            sources["nbody"] = f"measured: {Path(path).name} (N-body rate over the peak)"
    # the device's memory, not the host's: a GPU worker's inventory has both
    memory = [r.get("device_memory_bytes") or r.get("memory_bytes") for r in records]
    memory = [m for m in memory if m]
    if memory_gb is not None:
        memory_bytes = _positive("memory_gb", memory_gb) * 1e9
    elif memory:
        memory_bytes = float(min(memory))
    else:
        raise ConfigError(f"device file {str(path)!r} does not say how much memory the device has: "
                          "give memory_gb (--memory-gb)")
    return DeviceProfile(f"measured:{Path(path).name}", kind, memory_bytes, _median(copies), 1.0, peak,
                         fractions, sources, f"measured by hpcgpu bench ({Path(path).name}, {len(ok)} records)",
                         base.launch_s)
