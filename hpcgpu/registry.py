"""The workload registry: the models ``hpcgpu run``, ``hpcgpu plan`` and the dashboard know of.

Core imports no workload. Each model declares itself once, in a small
:class:`Workload` object, and registers it under the entry-point group
``hpcgpu.workloads`` of its distribution. hpcgpu's own four models do so in
its ``pyproject.toml``::

    [project.entry-points."hpcgpu.workloads"]
    weather = "hpcgpu.workloads.weather.workload:WORKLOAD"

and a user's own model plugs in the same way from its own package: once it
is installed, ``hpcgpu run NAME``, ``hpcgpu plan NAME`` (when it declares a
cost model) and the summaries, HTML views and dashboard read it like the
built-in ones; ``hpcgpu bench`` and ``hpcgpu plan --check`` benchmark it
through the cases it declares (:class:`BenchmarkCase`). The declaration names its modules by path, so loading the
registry imports no physics: the command-line module is imported when the
parser is built, the cost model when ``hpcgpu plan`` asks for it, the model
class when a benchmark builds one (:meth:`BenchmarkCase.model`).

A plugin that fails to load (an import error, an entry point that is not a
:class:`Workload`, a name that differs from the entry point's) is left out
and remembered: :func:`broken` says which entry point failed and why, and
asking for that workload by name raises a :class:`~hpcgpu.errors.ConfigError`
with that text. The other workloads keep working.

Examples
--------
>>> from hpcgpu import registry
>>> registry.get("weather").time_unit
's'
>>> registry.get("wether")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
hpcgpu.errors.ConfigError: unknown workload 'wether'; registered: ...
"""

import importlib
import operator
import sys
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Callable

from hpcgpu.errors import ConfigError

__all__ = ["lazy_exports", "GROUP", "PlanOption", "BenchmarkCase", "BENCHMARK_PURPOSES", "Workload", "workloads", "get",
           "broken", "for_model", "plan_workloads", "get_plan", "benchmark_case", "benchmarked", "clear_cache"]

GROUP = "hpcgpu.workloads"
"""The entry-point group a workload registers its :class:`Workload` under."""

_OWN_DISTRIBUTION = "hpcgpu"


@dataclass(frozen=True)
class PlanOption:
    """An option of ``hpcgpu plan`` that a workload's cost model takes (``--name`` on the command line).

    ``type`` is ``int``, ``float`` or ``bool`` (a flag); ``count`` marks a
    float option (``--atoms 1e7``) passed on as an int when it is whole.
    """

    name: str
    type: type = int
    help: str = ""
    count: bool = False

    @property
    def flag(self):
        return "--" + self.name.replace("_", "-")


BENCHMARK_PURPOSES = {
    "step": "one model stepped in one process, and split over a few workers (hpcgpu bench md, hpcgpu bench nbody)",
    "scaling": "a model split over 1..N workers, weak (scale = workers) and strong (hpcgpu bench scaling, "
               "the cluster acceptance of hpcgpu bench)",
    "soak": "a model run on a cluster while workers are killed (hpcgpu bench soak)",
    "energy": "joules per step on each worker (the cluster acceptance's energy probe)",
    "plan_check": "the run that hpcgpu plan --check measures to test the cost model (needs a cost model and "
                  "Workload.plan_parameters)",
    "io": "snapshots and checkpoints written by a grid model's ranks (hpcgpu bench io; the model needs "
          "output_variables and attributes)",
}
"""What a benchmark case may be declared for (the keys of ``Workload.benchmarks``), and who reads it.

A suite that runs one workload and is given none runs the first registered
workload that declares its purpose (hpcgpu's own first, by name)."""


@dataclass(frozen=True)
class BenchmarkCase:
    """A model the benchmarks build for a workload: how to build it at a size, and the facts they need.

    The benchmark suites and ``hpcgpu plan --check`` build every model they
    time through a case its workload declares (``Workload.benchmarks``), so
    they name no model class, case or keyword: a user's registered workload
    is benchmarked the same way as the built-in ones.

    Parameters
    ----------
    name : str
        The case's name in the benchmarks' JSON lines (``"case"``).
    build : callable
        ``build(size, *, dtype, backend, scale) -> model``. ``size`` is in
        the units of the workload's ``plan_sizes`` (one number per name; a
        workload with one size takes a bare number). ``scale`` (>= 1) asks
        for ``scale`` times one worker's work, grown along the axis the
        engine splits: weak scaling on ``scale`` workers.
    size_unit : str
        What ``size`` counts: ``"cells per side"``, ``"atoms"``, ``"bodies"``.
    size : int or tuple of int
        The size of one run when the caller gives none.
    quick_size : int or tuple of int, optional
        A small size for quick runs (``hpcgpu bench --quick``); default ``size``.
    min_size : int
        The smallest number each entry of ``size`` may be.
    dtype : str
        The dtype when the caller gives none.
    time_step : callable, optional
        ``time_step(model, state) -> dt``; default ``model.suggested_dt(state)``.
    size_of : callable, optional
        ``size_of(model)``: the size the model has (after rounding: atoms on
        a lattice), recorded in the JSON lines; default the size asked for.
    facts : callable, optional
        ``facts(model) -> dict``: what the JSON lines record of the model
        beside its size (a state point, a cutoff); default none.

    Examples
    --------
    A user's workload declares its case next to its other facts (the
    builder imports the model only when called, so reading the declaration
    stays light)::

        def diffusion_case(size, *, dtype, backend, scale):
            from my_package.model import Diffusion
            nx, ny = size if isinstance(size, (tuple, list)) else (size, size)
            return Diffusion(nx=nx, ny=ny * scale, dtype=dtype, backend=backend)

        CASE = BenchmarkCase("square", diffusion_case, "cells per side", size=1024, min_size=16)
        WORKLOAD = Workload(name="diffusion", cli="my_package.cli", plan_sizes=("nx", "ny"),
                            benchmarks={"scaling": CASE, "step": CASE})

    >>> from hpcgpu import registry
    >>> declared, case = registry.benchmark_case("step", "md")
    >>> model = case.model(256, backend="numpy")  # atoms, on an fcc lattice
    >>> case.name, case.size_of(model), model.dtype.name
    ('lj_liquid', 256, 'float64')
    """

    name: str
    build: Callable
    size_unit: str
    size: object
    quick_size: object = None
    min_size: int = 1
    dtype: str = "float64"
    time_step: Callable = None
    size_of: Callable = None
    facts: Callable = None

    def default_size(self, quick=False):
        """The size of a run given none: :attr:`quick_size` (if declared) when ``quick``, else :attr:`size`."""
        return self.quick_size if quick and self.quick_size is not None else self.size

    def check_size(self, size, parameter="size"):
        """``size`` if each of its numbers is a whole number >= ``min_size``; ConfigError naming it otherwise."""
        numbers = size if isinstance(size, (tuple, list)) else (size,)
        if not numbers or any(not _whole(n) or n < self.min_size for n in numbers):
            raise ConfigError(f"{parameter}={_plain_size(size)} {self.size_unit}: the {self.name!r} benchmark case "
                              f"needs {'each' if isinstance(size, (tuple, list)) else 'a'} whole number >= "
                              f"{self.min_size}")
        return size

    def model(self, size=None, *, dtype=None, backend="auto", scale=1):
        """The case's model at ``size`` (default :attr:`size`), ``scale`` times one worker's work.

        Raises
        ------
        ConfigError
            A size below ``min_size`` or a ``scale`` below 1 (and whatever
            the model itself refuses).
        """
        size = self.check_size(self.size if size is None else size)
        if not _whole(scale) or scale < 1:
            raise ConfigError(f"scale must be a whole number >= 1 (workers sharing the work); got {scale!r}")
        return self.build(size, dtype=self.dtype if dtype is None else dtype, backend=backend, scale=scale)

    def dt(self, model, state):
        """The time step of a run of ``model`` from ``state``."""
        return model.suggested_dt(state) if self.time_step is None else self.time_step(model, state)

    def recorded_size(self, model, asked):
        """The size a JSON line records for ``model`` (built for ``asked``): ``size_of(model)`` or ``asked``."""
        size = asked if self.size_of is None else self.size_of(model)
        return list(size) if isinstance(size, tuple) else size

    def described(self, model):
        """``facts(model)``, or ``{}`` when the case declares none."""
        return {} if self.facts is None else dict(self.facts(model))


def _whole(number):
    """Whether ``number`` is an integer (NumPy's too), not a bool."""
    if isinstance(number, bool):
        return False
    try:
        operator.index(number)
    except TypeError:
        return False
    return True


def _plain_size(size):
    return "x".join(str(n) for n in size) if isinstance(size, (tuple, list)) else repr(size)


@dataclass(frozen=True)
class Workload:
    """One workload's declaration: everything core needs to know of it, in one place.

    Parameters
    ----------
    name : str
        The name of ``hpcgpu run NAME`` and of the model (``model.name``).
    cli : str
        Module path of its command line: ``HELP``, ``DESCRIPTION``,
        ``add_arguments(parser)`` and ``run(args)`` (returns the exit status).
    plan : str, optional
        ``"module:Class"`` of its ``hpcgpu plan`` cost model (a frozen
        dataclass with ``name``, ``steps``, ``dtype``, ``size()``,
        ``describe()`` and ``cost(partitions, device, link, scheduler)``);
        None when it has none.
    plan_name : str, optional
        Its name under ``hpcgpu plan`` (default ``name``).
    plan_sizes : tuple of str
        The cost model's parameters that say the problem size (required).
    plan_options : tuple of PlanOption
        Its ``hpcgpu plan`` options beyond ``--steps`` and ``--dtype``.
    plan_kernel : str, optional
        The kernel family whose roofline fraction its cost model's compute
        term uses (``"stencil"``, ``"md"``, ``"nbody"``: the device
        profiles of :mod:`hpcgpu.plan.profiles`); ``hpcgpu plan --check``
        reports it.
    time_unit : str
        ``"s"`` when model time counts seconds (shown with days too), else
        the name of its unit (``""``: shown as a bare number).
    conserved : tuple of str
        Diagnostics whose relative change over the run the summary reports
        (``<name>_relative_change``).
    grid_points : callable, optional
        ``grid_points(model)``: points one step updates; the summary then
        reports ``point_updates_per_s``. None for models without a grid.
    diagnostics : tuple of str
        The diagnostics the dashboard plots first, in this order (the
        others follow).
    model : str, optional
        ``"module:Class"`` of the model class, for code in core that builds
        one by name; None when it declares none.
    benchmarks : dict of str to BenchmarkCase
        The models ``hpcgpu bench`` and ``hpcgpu plan --check`` build, by
        purpose (:data:`BENCHMARK_PURPOSES`); one case may serve several.
    plan_parameters : callable, optional
        ``plan_parameters(model) -> dict``: the cost model's options that
        describe ``model`` (its ``plan_sizes`` and the like), so that
        ``hpcgpu plan --check`` can predict the run it measures.
    """

    name: str
    cli: str
    plan: str = None
    plan_name: str = None
    plan_sizes: tuple = ()
    plan_options: tuple = ()
    plan_kernel: str = None
    time_unit: str = ""
    conserved: tuple = ()
    grid_points: Callable = None
    diagnostics: tuple = ()
    model: str = None
    benchmarks: dict = field(default_factory=dict, compare=False)
    plan_parameters: Callable = None
    entry_point: str = field(default="", compare=False)

    def cli_module(self):
        """The command-line module (``HELP``, ``DESCRIPTION``, ``add_arguments``, ``run``), imported now."""
        return importlib.import_module(self.cli)

    def cost_model(self):
        """The ``hpcgpu plan`` cost-model class, imported now."""
        if self.plan is None:
            raise ConfigError(f"workload {self.name!r} declares no cost model for hpcgpu plan")
        return _attribute(self.plan)

    def model_class(self):
        """The model class, imported now: ``registry.get("weather").model_class()("rest", nx=8, ny=8)``.

        Benchmarks build their models through :attr:`benchmarks` instead.

        Raises
        ------
        ConfigError
            The workload declares no model class (``model=None``).
        """
        if self.model is None:
            raise ConfigError(f"workload {self.name!r} declares no model class (Workload(model=...))")
        return _attribute(self.model)


def _attribute(path):
    """The object ``"module:attribute"`` names, its module imported now."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


_cache = {}


def _load():
    if "workloads" in _cache:
        return _cache["workloads"], _cache["broken"]
    found, failed = {}, {}
    entries = list(metadata.entry_points(group=GROUP))
    # hpcgpu's own first, then the others by distribution; by name within a distribution
    entries.sort(key=lambda e: (_dist(e) != _OWN_DISTRIBUTION, _dist(e), e.name))
    for entry in entries:
        where = f"entry point {entry.name!r} = {entry.value!r} (group {GROUP!r}, distribution {_dist(entry)!r})"
        if entry.name in found or entry.name in failed:
            failed.setdefault(f"{entry.name} ({_dist(entry)})", f"{where}: the name is already registered")
            continue
        try:
            declared = entry.load()
        except Exception as error:  # noqa: BLE001 - a broken plugin must not take the others down
            failed[entry.name] = f"{where} failed to load: {type(error).__name__}: {error}"
            continue
        if not isinstance(declared, Workload):
            failed[entry.name] = f"{where} is a {type(declared).__name__}, not an hpcgpu.registry.Workload"
        elif declared.name != entry.name:
            failed[entry.name] = f"{where} declares the name {declared.name!r}, not {entry.name!r}"
        else:
            found[entry.name] = replace(declared, entry_point=where)
    _cache["workloads"], _cache["broken"] = found, failed
    return found, failed


def _dist(entry):
    dist = getattr(entry, "dist", None)
    return dist.metadata["Name"] if dist is not None else "?"


def workloads():
    """``{name: Workload}`` of every workload that loaded: hpcgpu's own first, by name."""
    return dict(_load()[0])


def broken():
    """``{name: message}`` of the plugins that failed to load; each message names the entry point."""
    return dict(_load()[1])


def get(name):
    """The :class:`Workload` called ``name``.

    Raises
    ------
    ConfigError
        Unknown name (the message lists the registered ones) or a plugin
        that failed to load (the message names its entry point and error).
    """
    found, failed = _load()
    if name in found:
        return found[name]
    if name in failed:
        raise ConfigError(f"workload {name!r} is not usable: {failed[name]}")
    raise ConfigError(f"unknown workload {name!r}; registered: {', '.join(repr(n) for n in found) or 'none'}")


def for_model(model):
    """The declaration of ``model``'s workload (by ``model.name``), or None for a model no one registered."""
    return _load()[0].get(getattr(model, "name", None))


def plan_workloads():
    """``{plan name: Workload}`` of the workloads with an ``hpcgpu plan`` cost model, by plan name."""
    planned = {w.plan_name or w.name: w for w in _load()[0].values() if w.plan is not None}
    return dict(sorted(planned.items()))


def get_plan(name):
    """The :class:`Workload` that ``hpcgpu plan NAME`` means; ConfigError naming the valid ones otherwise."""
    planned = plan_workloads()
    if name in planned:
        return planned[name]
    if name in _load()[1]:
        raise ConfigError(f"workload {name!r} is not usable: {_load()[1][name]}")
    raise ConfigError(f"workload must be one of {', '.join(repr(w) for w in planned)}; got {name!r}")


def benchmark_case(purpose, workload=None):
    """``(Workload, BenchmarkCase)``: the case ``workload`` declares for ``purpose``.

    Parameters
    ----------
    purpose : str
        One of :data:`BENCHMARK_PURPOSES`.
    workload : str, optional
        Its name, or its ``hpcgpu plan`` name (``"nbody"``); default the first
        registered workload that declares ``purpose``.

    Raises
    ------
    ConfigError
        An unknown purpose or workload, or one that declares no case for
        ``purpose`` (the message names those that do).

    Examples
    --------
    >>> declared, case = benchmark_case("scaling", "nbody")
    >>> declared.name, case.size_unit
    ('astro', 'bodies')
    """
    if purpose not in BENCHMARK_PURPOSES:
        raise ConfigError(f"purpose must be one of {', '.join(repr(p) for p in BENCHMARK_PURPOSES)}; got {purpose!r}")
    declaring = benchmarked(purpose)
    if workload is None:
        if not declaring:
            raise ConfigError(f"no registered workload declares a {purpose!r} benchmark case "
                              f"(Workload(benchmarks={{{purpose!r}: BenchmarkCase(...)}}))")
        declared = next(iter(declaring.values()))
    else:
        found = _load()[0]
        declared = found.get(workload) or plan_workloads().get(workload) or get(workload)
    if purpose not in declared.benchmarks:
        raise ConfigError(f"workload {workload!r} declares no {purpose!r} benchmark case; ones that do: "
                          f"{', '.join(repr(n) for n in declaring) or 'none'}")
    return declared, declared.benchmarks[purpose]


def benchmarked(purpose):
    """``{name: Workload}`` of the registered workloads that declare a case for ``purpose``, in registry order."""
    return {name: w for name, w in _load()[0].items() if purpose in w.benchmarks}


def clear_cache():
    """Forget the loaded entry points (after installing a plugin in a running process)."""
    _cache.clear()


def lazy_exports(package, homes):
    """``(__getattr__, __dir__)`` for a workload package whose public names load on first use (PEP 562).

    ``homes`` maps each name to the submodule that defines it. The registry
    imports a package's ``workload`` module to read its declaration, and
    that must not import the physics (nor its kernels): the package's
    ``__init__`` therefore only names where things live.

    Examples
    --------
    In ``workloads/md/__init__.py``::

        __getattr__, __dir__ = lazy_exports(__name__, {"LennardJones": "model", "MDState": "state"})
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        namespace[name] = value  # found directly from now on
        return value

    def __dir__():
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
