"""The workload registry: hpcgpu's own workloads through entry points, and a user's plugin beside them.

A user's model is a distribution of its own that registers a
:class:`hpcgpu.registry.Workload` under the ``hpcgpu.workloads`` group. The
tests make one on the fly (a ``*.dist-info`` folder with METADATA and
entry_points.txt, and a tiny module) and put it on ``sys.path`` of a
subprocess, which is all ``importlib.metadata`` needs.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hpcgpu import registry
from hpcgpu.errors import ConfigError

TOY = '''
import json
import math
from dataclasses import dataclass

from hpcgpu.plan.workload_costs import kernel_time, step_cost
from hpcgpu.registry import BenchmarkCase, PlanOption, Workload

HELP = "a toy model (decay of one number)"
DESCRIPTION = "Decay x' = -x for --steps steps."


def add_arguments(parser):
    parser.add_argument("--steps", type=int, default=3)


def run(args):
    x = 1.0
    for _ in range(args.steps):
        x *= math.exp(-0.1)
    print(json.dumps({"toy": True, "steps": args.steps, "x": x}))
    return 0


@dataclass(frozen=True)
class ToyCost:
    cells: int
    steps: int
    dtype: str = "float64"

    name = "toy"

    def size(self):
        return {"cells": self.cells}

    def describe(self):
        return f"toy {self.cells} cells, {self.steps} steps"

    def cost(self, partitions, device, link, scheduler):
        owned = math.ceil(self.cells / partitions)
        seconds, bound = kernel_time(16 * owned, 2 * owned, device, "copy", self.dtype)
        return step_cost(scheduler, partitions, seconds, 0, 0, link, 8 * owned, bound)


class ToyModel:
    name = "toy"

    def __init__(self, cells, dtype, backend):
        self.cells, self.dtype, self.backend = cells, dtype, backend


def build_toy(size, *, dtype, backend, scale):
    return ToyModel(size * scale, dtype, backend)


DECAY = BenchmarkCase("decay", build_toy, "cells", size=64, min_size=4)

WORKLOAD = Workload(name="toy", cli="hpcgpu_toy", plan="hpcgpu_toy:ToyCost", plan_sizes=("cells",),
                    plan_options=(PlanOption("cells", float, "toy: cells", count=True),), time_unit="s",
                    conserved=("x",), benchmarks={"scaling": DECAY}, plan_parameters=lambda m: {"cells": m.cells})
'''


def _distribution(root, name, entry_points, modules):
    """A minimal installed distribution ``name`` under ``root``: its dist-info and its modules."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{registry.GROUP}]\n{lines}")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))


def _hpcgpu(root, *args):
    """``hpcgpu ARGS`` in a fresh interpreter with ``root`` on its path: (exit status, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    code = "import sys; from hpcgpu.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def plugins(tmp_path):
    """A toy workload's distribution, and a broken one beside it."""
    _distribution(tmp_path, "hpcgpu_toy", {"toy": "hpcgpu_toy:WORKLOAD"}, {"hpcgpu_toy": TOY})
    _distribution(tmp_path, "hpcgpu_broken", {"broken": "hpcgpu_broken_model:WORKLOAD",
                                              "notaworkload": "hpcgpu_broken_other:WORKLOAD"},
                  {"hpcgpu_broken_model": "raise ImportError('no module named physics')",
                   "hpcgpu_broken_other": "WORKLOAD = 42"})
    return tmp_path


def test_the_own_workloads_are_registered():
    assert list(registry.workloads()) == ["astro", "md", "vorticity", "weather"]
    assert list(registry.plan_workloads()) == ["md", "nbody", "weather"]
    assert registry.get("weather").time_unit == "s" and registry.get("md").time_unit != "s"
    assert registry.get("weather").conserved == ("mass", "energy", "enstrophy")
    assert registry.broken() == {}


def test_every_declaration_names_modules_that_exist():
    for declared in registry.workloads().values():
        module = declared.cli_module()
        assert callable(module.add_arguments) and callable(module.run) and module.HELP and module.DESCRIPTION
        if declared.plan is not None:
            cls = declared.cost_model()
            assert set(declared.plan_sizes) | {o.name for o in declared.plan_options} <= set(cls.__dataclass_fields__)


def test_an_unknown_workload_is_named_with_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown workload 'wether'; registered: 'astro', 'md', 'vorticity', 'weather'"):
        registry.get("wether")
    with pytest.raises(ConfigError, match=r"workload must be one of 'md', 'nbody', 'weather'; got 'astro'"):
        registry.get_plan("astro")


def test_a_plugin_is_benchmarked_through_the_case_it_declares(plugins):
    # cluster acceptance scales every workload with a scaling case: the user's one too, built by its own builder
    code = ("from hpcgpu import registry; from hpcgpu.bench import acceptance; "
            "declared, case = registry.benchmark_case('scaling', 'toy'); model = case.model(8, scale=3); "
            "print(list(acceptance.WORKLOADS), case.name, model.cells, model.dtype, declared.plan_parameters(model))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         timeout=300).stdout
    assert out.split("\n")[0] == "['nbody', 'md', 'weather', 'toy'] decay 24 float64 {'cells': 24}"


def test_a_model_no_one_registered_has_no_declaration():
    class Model:
        name = "somebody_elses"

    assert registry.for_model(Model()) is None and registry.for_model(object()) is None


def test_a_users_workload_plugs_into_run_and_plan(plugins):
    status, out, err = _hpcgpu(plugins, "run", "toy", "--steps", "4")
    assert status == 0, err
    assert json.loads(out) == {"toy": True, "steps": 4, "x": pytest.approx(0.6703200460356393)}

    status, out, err = _hpcgpu(plugins, "plan", "--help")
    assert status == 0 and "toy" in out and "--cells" in out
    status, out, err = _hpcgpu(plugins, "plan", "toy", "--cells", "1e6", "--steps", "10", "--json",
                               "--max-gpus", "2")
    assert status == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and all(r["workload"] == "toy" for r in rows) and rows[0]["size"] == {"cells": 1000000}

    # hpcgpu's own workloads are unchanged beside it
    status, out, err = _hpcgpu(plugins, "plan", "md", "--atoms", "1e6", "--max-gpus", "2", "--json")
    assert status == 0, err


def test_a_broken_plugin_is_named_and_the_others_still_work(plugins):
    status, out, err = _hpcgpu(plugins, "run", "broken")
    assert status == 2
    assert "entry point 'broken' = 'hpcgpu_broken_model:WORKLOAD'" in err and "no module named physics" in err
    assert "hpcgpu_broken" in err  # the distribution
    status, out, err = _hpcgpu(plugins, "run", "notaworkload")
    assert status == 2 and "is a int, not an hpcgpu.registry.Workload" in err
    status, out, err = _hpcgpu(plugins, "run", "toy", "--steps", "1")
    assert status == 0, err
    status, out, err = _hpcgpu(plugins, "run", "--help")
    assert status == 0 and "weather" in out and "not usable" in out


def test_the_summary_and_time_come_from_the_declaration():
    from types import SimpleNamespace

    from hpcgpu.io.html_views import model_time

    assert model_time(SimpleNamespace(name="vorticity"), 7200.0).endswith("s (0.0833 days)")
    assert model_time(SimpleNamespace(name="astro"), 2.5) == "2.5"
    assert model_time(SimpleNamespace(name="toy_not_installed"), 7200.0) == "7200"


def test_core_builds_a_model_by_name_through_its_declaration():
    # core code that builds a model by name does so (benchmarks use a BenchmarkCase): core imports no workload
    assert registry.get("weather").model_class().__name__ == "ShallowWater"
    assert registry.get_plan("nbody").model_class() is registry.get("astro").model_class()
    model = registry.get("md").model_class()(3, backend="numpy")
    assert model.name == "md" and isinstance(model.initial_state(), model.state_type)
    with pytest.raises(ConfigError, match="declares no model class"):
        registry.Workload(name="toy", cli="hpcgpu_toy").model_class()


def test_reading_the_declarations_imports_no_model():
    # a workload package loads its public names on first use, so the CLI's parser stays light
    code = ("import sys; from hpcgpu import registry; registry.workloads(); "
            "print(sorted(m for m in sys.modules if m.startswith('hpcgpu.kernels') or (m.startswith("
            "'hpcgpu.workloads.') and m.count('.') > 2 and not m.endswith('.workload'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
