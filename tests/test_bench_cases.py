"""Benchmark cases: every model ``hpcgpu bench`` and ``hpcgpu plan --check`` time comes from a workload's declaration.

The suites name no model class, model case or model keyword: the source of
``hpcgpu/bench`` and ``hpcgpu/plan`` is scanned (parsed, not imported) for
the names the registered workloads' models use, so a suite that builds a
model by hand again fails here. The cases themselves are checked by
building each at its smallest size and stepping it.
"""

import ast
import importlib
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from hpcgpu import registry
from hpcgpu.errors import ConfigError

SOURCE = Path(registry.__file__).resolve().parent
BENCH_FILES = sorted((SOURCE / "bench").glob("*.py"))
PLAN_FILES = sorted((SOURCE / "plan").glob("*.py"))
KEYWORD_FILES = BENCH_FILES + [SOURCE / "plan" / "check.py"]
"""Files that must pass no model keyword: the suites and ``plan --check`` (``hpcgpu plan``'s own options are the
cost models' sizes, declared by the workloads as ``PlanOption``)."""

SHARED_PARAMETERS = {"self", "dtype", "backend"}
"""Constructor parameters every model has: the suites pass them to a case, as the case's own signature asks."""

GENERIC_NAMES = {"n", "seed", "case", "parameters", "params"}
"""Parameter names that mean something of their own in the suites' functions (a count, the seed of the worker to
kill, the JSON lines' case field, a cost model's parameters): allowed as names of the suites' own parameters."""

ENGLISH_CASE_NAMES = {"rest"}
"""Model case names that are also plain words: only a string that is exactly the name counts."""

EXEMPT_CALLS = {"add", "error", "map_overlap"}
"""Calls whose keywords are not a model's: a JSON line's fields (``recorder.add``, ``recorder.error``) and dask's
``map_overlap(boundary=...)``."""


def _model_facts():
    """``(class names, case names, constructor keywords)`` of every registered workload's model."""
    classes, cases, keywords = set(), set(), set()
    for declared in registry.workloads().values():
        for case in declared.benchmarks.values():
            cases.add(case.name)
        if declared.model is None:
            continue
        cls = declared.model_class()
        classes.add(cls.__name__)
        keywords |= set(inspect.signature(cls.__init__).parameters) - SHARED_PARAMETERS
        try:
            catalogue = importlib.import_module(cls.__module__.rsplit(".", 1)[0] + ".cases")
        except ImportError:
            continue
        cases |= set(getattr(catalogue, "CASES", {}))
    keywords.discard("kwargs")
    return classes, cases, keywords


def _kernel_names(tree):
    """Names bound to hpcgpu's kernels (``from hpcgpu.kernels import md``, ``from hpcgpu.kernels.x import f``)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpcgpu.kernels"):
            bound |= {alias.asname or alias.name for alias in node.names}
    return bound


def _callee(call):
    """``(name called, the name it is an attribute of or None)`` of an ``ast.Call``."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr, func.value.id if isinstance(func.value, ast.Name) else None
    return (func.id if isinstance(func, ast.Name) else None), None


def hard_coded_models(text, classes, cases, keywords, check_keywords=True):
    """What in ``text`` (Python source) builds a model by hand: a list of ``(line, what)``.

    A model class name anywhere (code, docstring or comment); a model case
    name as a word (as a whole string for plain-English names); and, with
    ``check_keywords``, a model constructor keyword passed to a call that is
    not a kernel or a JSON line, or taken as a parameter by a function.
    """
    found = []
    for name in sorted(classes | (cases - ENGLISH_CASE_NAMES)):
        for match in re.finditer(rf"\b{re.escape(name)}\b", text):
            found.append((text.count("\n", 0, match.start()) + 1, f"names {name!r}"))
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in ENGLISH_CASE_NAMES & cases:
            found.append((node.lineno, f"names the case {node.value!r}"))
    if not check_keywords:
        return found
    kernels = _kernel_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name, owner = _callee(node)
            if name in EXEMPT_CALLS or name in kernels or owner in kernels:
                continue
            found += [(node.lineno, f"passes {k.arg}=") for k in node.keywords if k.arg in keywords]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
            found += [(node.lineno, f"takes {a.arg}") for a in arguments if a.arg in keywords - GENERIC_NAMES]
    return sorted(found)


FACTS = _model_facts()


def test_the_scan_knows_the_models_it_looks_for():
    classes, cases, keywords = FACTS
    assert {"ShallowWater", "LennardJones", "NBody", "BarotropicVorticity"} <= classes
    assert {"turbulence", "unstable_jet", "plummer", "lj_liquid", "rest"} <= cases
    assert {"nx", "ny", "n", "n_cells", "temperature", "Lx"} <= keywords


def test_the_scan_finds_a_model_built_by_hand():
    # the lines the suites held before their models came from the declarations: each must be caught
    built = '''
from hpcgpu import registry
from hpcgpu.kernels import nbody

def soak(minutes, nx=256):
    return registry.get("weather").model_class()("unstable_jet", nx=nx, ny=nx, backend="numba")

def kernel(positions, masses, recorder):
    nbody.accelerations(positions, masses, softening=0.01)
    recorder.add(case="direct", boundary="walls")
    return registry.get("md").model_class()(3, temperature=1.44)
'''
    found = {what for _, what in hard_coded_models(built, *FACTS)}
    assert found == {"names 'unstable_jet'", "passes nx=", "passes ny=", "takes nx", "passes temperature="}
    assert hard_coded_models('x = "rest"\n"""at rest"""\n', *FACTS) == [(1, "names the case 'rest'")]


@pytest.mark.parametrize("path", BENCH_FILES + PLAN_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_bench_and_plan_build_no_model_by_hand(path):
    found = hard_coded_models(path.read_text(), *FACTS, check_keywords=path in KEYWORD_FILES)
    assert not found, (f"{path.parent.name}/{path.name} builds a model by hand (declare a BenchmarkCase in the "
                       f"workload instead): " + "; ".join(f"line {line}: {what}" for line, what in found))


def test_plan_check_imports_only_public_bench_names():
    tree = ast.parse((SOURCE / "plan" / "check.py").read_text())
    private = [f"{node.module}:{alias.name}" for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpcgpu.bench")
               for alias in node.names
               if alias.name.startswith("_") or any(part.startswith("_") for part in node.module.split("."))]
    assert not private


def _every_case():
    return [(name, purpose, case) for name, declared in registry.workloads().items()
            for purpose, case in declared.benchmarks.items()]


@pytest.mark.parametrize("name, purpose, case", _every_case(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_declared_case_builds_and_steps_at_its_smallest_size(name, purpose, case):
    assert purpose in registry.BENCHMARK_PURPOSES
    model = case.model(case.min_size, backend="numpy")
    assert model.name == name and model.dtype == np.dtype(case.dtype)
    state = model.initial_state()
    dt = case.dt(model, state)
    assert dt > 0
    model.step(state, dt, 1)
    size = case.recorded_size(model, case.min_size)
    assert size is not None and isinstance(case.described(model), dict)
    # what the case builds for a quick run and by default is refused nowhere below its smallest
    for default in (case.default_size(quick=True), case.default_size()):
        case.check_size(default)


@pytest.mark.parametrize("name", sorted(registry.benchmarked("scaling")))
def test_a_scaling_case_grows_by_its_scale(name):
    # weak scaling on 2 workers is twice one worker's work: more cells, atoms, or bodies (N^2 work)
    _, case = registry.benchmark_case("scaling", name)
    size = case.min_size * 2
    one, two = (case.model(size, backend="numpy", scale=s) for s in (1, 2))
    work = {"cells per side": lambda m: m.grid.nx * m.grid.ny, "atoms": lambda m: m.n,
            "bodies": lambda m: m.n ** 2}[case.size_unit]
    assert work(two) / work(one) == pytest.approx(2.0, rel=0.3)


def test_the_suites_defaults_come_from_the_declarations():
    # hpcgpu's own: weather is the model soak, the energy probe and plan --check run
    for purpose in ("soak", "energy", "plan_check"):
        assert registry.benchmark_case(purpose)[0].name == "weather"
    assert registry.benchmark_case("step", "nbody")[0].name == "astro"  # hpcgpu plan's name works too
    assert set(registry.benchmarked("scaling")) == {"astro", "md", "weather"}


def test_the_weather_case_reads_plan_sizes_and_says_what_the_cost_model_needs():
    declared, case = registry.benchmark_case("plan_check")
    model = case.model((64, 32), dtype="float32", backend="numpy", scale=2)
    assert declared.plan_parameters(model) == {"nx": 64, "ny": 64, "periodic": True}  # eddies in a periodic box
    assert case.recorded_size(model, (64, 32)) == [64, 64]


@pytest.mark.parametrize("size, why", [(40, "size=40 atoms"), (2.5e4, "whole number"), (True, "whole number")])
def test_a_size_below_the_case_or_not_whole_is_refused_with_its_unit(size, why):
    _, case = registry.benchmark_case("step", "md")
    with pytest.raises(ConfigError, match=why):
        case.model(size, backend="numpy")


@pytest.mark.parametrize("scale", [0, 1.5, True])
def test_a_scale_that_is_not_a_worker_count_is_refused(scale):
    _, case = registry.benchmark_case("scaling", "weather")
    with pytest.raises(ConfigError, match="scale must be a whole number >= 1"):
        case.model(16, backend="numpy", scale=scale)


def test_a_purpose_or_workload_without_a_case_is_refused_with_the_valid_ones():
    with pytest.raises(ConfigError, match="purpose must be one of 'step', 'scaling'"):
        registry.benchmark_case("speed")
    with pytest.raises(ConfigError, match="'vorticity' declares no 'scaling' benchmark case; ones that do: 'astro'"):
        registry.benchmark_case("scaling", "vorticity")
    with pytest.raises(ConfigError, match="unknown workload 'wether'"):
        registry.benchmark_case("step", "wether")
