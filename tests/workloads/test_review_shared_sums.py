"""One order-independent sum for the diagnostics of the weather and N-body models.

``exact_total`` (weather) and ``_fsum`` (astro) were the same function twice;
it now lives once, in :mod:`hpcgpu.workloads.sums`, which imports no model,
and both diagnostics use it.
"""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcgpu.workloads.astro import diagnostics as astro_diagnostics
from hpcgpu.workloads.weather import diagnostics as weather_diagnostics

ROOT = Path(__file__).resolve().parents[2]


def test_both_diagnostics_use_the_one_shared_function():
    from hpcgpu.workloads.sums import exact_total

    assert weather_diagnostics.exact_total is exact_total
    assert astro_diagnostics.exact_total is exact_total
    assert not hasattr(astro_diagnostics, "_fsum")
    # defined in one module only: no copy left behind
    for module in (weather_diagnostics, astro_diagnostics):
        assert "def exact_total" not in Path(module.__file__).read_text()
        assert "def _fsum" not in Path(module.__file__).read_text()


def test_exact_total_is_correctly_rounded_whatever_the_order():
    from hpcgpu.workloads.sums import exact_total

    values = np.array([1e16, 1.0, -1e16, 0.1, 0.2, 0.3])
    assert exact_total(values) == math.fsum(values.tolist())
    assert exact_total(values[::-1]) == exact_total(values)
    assert exact_total(np.array([0.1] * 10)) == 1.0
    assert exact_total([]) == 0.0


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("values, check", [
    ([np.inf, -np.inf, 1.0], math.isnan),                     # fsum: ValueError (inf - inf)
    ([1e308, 1e308], lambda total: total == math.inf),       # fsum: OverflowError
    ([np.nan, 1.0], math.isnan),
])
def test_a_blown_up_state_sums_to_nan_or_inf_not_an_exception(values, check):
    from hpcgpu.workloads.sums import exact_total

    assert check(exact_total(np.array(values)))


def test_the_shared_module_imports_no_model_and_makes_no_cycle():
    code = ("import sys; import hpcgpu.workloads.sums; "
            "assert not [m for m in sys.modules if m.startswith(('hpcgpu.workloads.weather', "
            "'hpcgpu.workloads.astro', 'hpcgpu.workloads.md'))], sorted(sys.modules); "
            "import workloads.astro, workloads.weather; "
            "import hpcgpu.workloads.astro.diagnostics, hpcgpu.workloads.weather.diagnostics")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
