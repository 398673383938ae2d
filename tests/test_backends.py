"""Backends: selection, availability reports, lazy GPU imports."""

import os
import pickle
import subprocess
import sys

import pytest

import hpcgpu
from hpcgpu.backends import BACKEND_NAMES, Backend, backend_info, backend_status, get_backend
from hpcgpu.errors import BackendUnavailable, ConfigError


def _python(code, **env):
    environment = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    environment.update(env)
    return subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          env=environment, timeout=120)


def test_import_loads_no_gpu_module_and_no_xarray():
    result = _python(
        "import sys, hpcgpu, hpcgpu.workloads.weather; "
        "print(sorted(m for m in sys.modules if m.startswith(('cupy', 'numba.cuda', 'numba_cuda', 'rmm'))))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_info_lists_every_backend_with_a_reason():
    statuses = backend_info()
    assert [s.name for s in statuses] == list(BACKEND_NAMES)
    assert statuses[0].usable and statuses[1].usable
    for status in statuses:
        assert status.detail


def test_auto_picks_cuda_on_a_gpu_else_numba():
    expected = "cuda" if (backend_status("cuda").usable and not get_backend("cuda").simulated) else "numba"
    assert get_backend("auto").name == expected
    assert hpcgpu.get_backend().name == expected


def test_gpu_backends_without_gpu_raise_backend_unavailable():
    result = _python(
        "import hpcgpu\n"
        "from hpcgpu.backends import backend_status\n"
        "if backend_status('cupy').usable: print('GPU'); raise SystemExit\n"
        "for name in ('cuda', 'cupy'):\n"
        "    try:\n"
        "        hpcgpu.get_backend(name)\n"
        "    except hpcgpu.BackendUnavailable as e:\n"
        "        print(name, 'unavailable:', e)\n")
    assert result.returncode == 0, result.stderr
    if result.stdout.strip() == "GPU":
        pytest.skip("a GPU is usable here")
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "not usable here" in line and ("missing" in line or "driver" in line or "GPU" in line)


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match="backend must be one of"):
        get_backend("opencl")
    with pytest.raises(ConfigError, match="backend must be one of"):
        get_backend(3)


def test_backend_round_trips_through_pickle_and_moves_arrays():
    backend = Backend("numba")
    clone = pickle.loads(pickle.dumps(backend))
    assert clone == backend and clone.xp is backend.xp
    array = backend.asarray([1.0, 2.0, 3.0])
    assert backend.to_host(array).sum() == 6.0
    assert backend.kernels("stencil").__name__ == "hpcgpu.kernels.stencil._numba"


def test_simulator_makes_cuda_usable_for_tests_only():
    result = _python("from hpcgpu.backends import backend_status, get_backend; "
                     "s = backend_status('cuda'); print(s.usable, 'simulator' in s.detail); "
                     "print(get_backend('auto').name)", NUMBA_ENABLE_CUDASIM="1")
    assert result.returncode == 0, result.stderr
    usable, mentions, auto = result.stdout.split()
    assert usable == "True" and mentions == "True"
    assert auto in ("numba", "cuda")
    if not backend_status("cupy").usable:
        assert auto == "numba"  # the simulator is never picked by 'auto'


def test_unusable_backend_error_says_what_was_found():
    with pytest.raises((BackendUnavailable, ConfigError)) as info:
        Backend("cupy") if not backend_status("cupy").usable else Backend("nothing")
    assert "cupy" in str(info.value) or "nothing" in str(info.value)


@pytest.mark.parametrize("name", ["cuda", "cupy"])
def test_a_gpu_backend_on_a_machine_without_a_gpu_says_there_is_no_gpu(monkeypatch, name):
    # it used to say only "package missing: cupy (pip install 'hpcgpu[cuda]')": installing CuPy on a
    # machine without a GPU does not help
    from hpcgpu import _gpu_probe

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(_gpu_probe, "cupy_distribution", lambda: None)
    monkeypatch.setattr(_gpu_probe, "probe_driver", lambda: _gpu_probe.DriverReport(
        False, problem="no NVIDIA driver found (libcuda could not be loaded)"))
    with pytest.raises(BackendUnavailable, match="no usable GPU: no NVIDIA driver found"):
        get_backend(name)
    # with a GPU and its driver, the missing package is what to fix
    monkeypatch.setattr(_gpu_probe, "probe_driver", lambda: _gpu_probe.DriverReport(True, 12040, ("GPU",)))
    with pytest.raises(BackendUnavailable, match="package missing: cupy"):
        get_backend(name)
