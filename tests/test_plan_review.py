"""``hpcgpu plan``: defects found in review (bad ``--check`` options, what a measured profile takes as its peak)."""

import argparse
import json

import pytest

from hpcgpu.errors import ConfigError
from hpcgpu.plan import run_command
from hpcgpu.plan.devices import measured_device


def _check_args(**given):
    options = dict(check=True, workload=None, nx=None, ny=None, steps_per_task=None, dtype=None, json=False)
    return argparse.Namespace(**{**options, **given})


@pytest.mark.parametrize("option, value", [("nx", 0), ("ny", 0), ("steps_per_task", 0)])
def test_check_refuses_a_zero_option_instead_of_running_with_the_default(option, value):
    # a zero used to be dropped as falsy: the check then ran ~15 s on the default grid and exited 0
    with pytest.raises(ConfigError, match=option):
        run_command(_check_args(**{option: value}))


def test_a_measured_profile_takes_neither_tf32_gemm_nor_a_multi_worker_nbody_rate_as_its_peak(tmp_path):
    lines = [
        {"suite": "copy", "case": "copy", "backend": "cupy", "dtype": "float32", "metric": "bytes_per_s",
         "value": 4.0e12, "memory_bytes": 141e9},
        {"suite": "matrix", "case": "gemm", "backend": "cupy", "dtype": "float32", "metric": "flops_per_s",
         "value": 50e12, "gflops": 50e3, "allow_tf32": False},
        {"suite": "matrix", "case": "gemm_tf32", "backend": "cupy", "dtype": "float32", "metric": "flops_per_s",
         "value": 400e12, "gflops": 400e3, "allow_tf32": True},
        {"suite": "nbody", "case": "direct", "backend": "cuda", "dtype": "float64", "metric": "interactions_per_s",
         "value": 1e11, "gflops": 2e3},
        {"suite": "nbody", "case": "direct_blocks", "backend": "cuda", "dtype": "float64",
         "metric": "interactions_per_s", "value": 8e11, "gflops": 16e3, "workers": 8},
    ]
    path = tmp_path / "bench.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    profile = measured_device(path)
    assert profile.peak("float32") == 50e12
    assert profile.peak("float64") == 2e12
    # the one-process rate over the one-process peak
    assert profile.fraction("nbody", "float64") == pytest.approx(1.0)


def test_a_measured_profile_reads_the_output_of_cluster_acceptance(tmp_path):
    # `hpcgpu bench > results.jsonl` then `hpcgpu plan --device results.jsonl` (README): the acceptance
    # records carry the roofs as "ceiling" records and the memory in each worker's inventory
    lines = [
        {"suite": "acceptance", "kind": "inventory", "worker": "tcp://a:1", "backend": "cuda", "device": "NVIDIA H200",
         "memory_bytes": 2.0e12, "device_memory_bytes": 141e9},
        {"suite": "acceptance", "kind": "ceiling", "worker": "tcp://a:1", "copy_bytes_per_s": 4.0e12,
         "gemm_flops_per_s": 50e12, "copy_bytes": 2**29, "gemm_n": 8192, "gemm_library": "cuBLAS"},
        {"suite": "acceptance", "kind": "kernel", "worker": "tcp://a:1", "family": "stencil/diffusion",
         "backend": "cuda", "rate": 1e11, "roof_rate": 5e11, "fraction_of_roof": 0.2},
    ]
    path = tmp_path / "acceptance.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    profile = measured_device(path)
    assert profile.kind == "gpu" and profile.copy_bandwidth == 4.0e12
    assert profile.peak("float32") == 50e12
    # the GPU's memory, not the host's
    assert profile.memory_bytes == 141e9


def test_the_bound_column_names_the_exchange_where_messages_take_most_of_the_step():
    from hpcgpu.plan import plan

    # MD of 10^7 atoms over the dask comm path: at 64 GPUs (4 x 4 x 4 bricks) the step is mostly the three
    # stages of the ghost exchange, 0.35 ms of latency each
    result = plan("md", atoms=10**7, steps=10**6, device="h200", interconnect="ucx-ndr", max_gpus=64)
    one, many = result.row(1), result.row(64)
    assert one.compute_s > one.exchange_s and one.bound == "bandwidth"
    assert many.exchange_s > 1.5 * many.compute_s and many.bound == "exchange"
    assert "exchange" in result.table().splitlines()[-2]
