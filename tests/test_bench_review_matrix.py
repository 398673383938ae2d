"""``hpcgpu bench matrix`` from Python: bad arguments are refused before any case runs."""

import io

import pytest

from hpcgpu.backends import get_backend
from hpcgpu.bench import matrix as bench
from hpcgpu.bench.harness import Recorder
from hpcgpu.errors import ConfigError


@pytest.mark.parametrize("kwargs, words", [
    (dict(cases=["gemm", "lu"]), ["cases", "'lu'", "gemm", "spmv", "cg"]),
    (dict(workers=1), ["workers", ">= 2"]),
])
def test_bad_arguments_are_a_config_error_before_any_case_runs(kwargs, words):
    stream = io.StringIO()
    with pytest.raises(ConfigError) as error:
        bench.run(Recorder("matrix", stream=stream), [get_backend("numpy")], sizes=(8,), budget_s=0.01, **kwargs)
    for word in words:
        assert word in str(error.value)
    assert stream.getvalue() == ""  # nothing was measured first
