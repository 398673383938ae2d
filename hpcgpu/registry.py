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
built-in ones. The declaration names its modules by path, so loading the
registry imports no physics: the command-line module is imported when the
parser is built, the cost model when ``hpcgpu plan`` asks for it, the model
class when a benchmark builds one (:meth:`Workload.model_class`).

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
import sys
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Callable

from hpcgpu.errors import ConfigError

__all__ = ["lazy_exports", "GROUP", "PlanOption", "Workload", "workloads", "get", "broken", "for_model", "plan_workloads",
           "get_plan", "clear_cache"]

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
        one by name (the benchmarks); None when it declares none.
    """

    name: str
    cli: str
    plan: str = None
    plan_name: str = None
    plan_sizes: tuple = ()
    plan_options: tuple = ()
    time_unit: str = ""
    conserved: tuple = ()
    grid_points: Callable = None
    diagnostics: tuple = ()
    model: str = None
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
