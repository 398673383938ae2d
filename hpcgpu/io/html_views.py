"""HTML summaries of hpcgpu objects for Jupyter (their ``_repr_html_``).

Notebooks show the last expression of a cell through its ``_repr_html_``:
a :class:`~hpcgpu.Simulation`, a model or a state then appears as a small
table of the facts a researcher checks first (case, sizes, backend, step,
the latest diagnostics) instead of a one-line ``repr``. This module holds
the shared pieces: escaping, number formatting and table building. Every
value is escaped, so names and parameters that contain ``<`` or ``&`` show
as text and never as markup.

Building a summary never moves a state between devices or across a
cluster: array summaries reduce on the array's own device and return a few
scalars.

Examples
--------
>>> from hpcgpu.io import html_views
>>> html_views.table([("name", "jet <1>"), ("steps", 10)])[:38]
'<table class="hpcgpu-table"><tr><th>na'
>>> html_views.format_value(0.000123456)
'0.0001235'
"""

import dataclasses
import html
import math
import numbers

__all__ = ["escape", "format_value", "table", "summary", "array_row", "state_html", "model_html", "model_time", "simulation_html"]

_STYLE = ("<style>.hpcgpu-repr{font-family:var(--jp-ui-font-family,sans-serif);font-size:12px;}"
          ".hpcgpu-repr table.hpcgpu-table{border-collapse:collapse;margin:2px 0 6px 0;}"
          ".hpcgpu-repr .hpcgpu-table th,.hpcgpu-repr .hpcgpu-table td{border:1px solid #ddd;"
          "padding:1px 6px;text-align:left;}"
          ".hpcgpu-repr .hpcgpu-table th{font-weight:600;}"
          ".hpcgpu-repr summary{cursor:pointer;}</style>")


def escape(value):
    """``str(value)`` with ``&``, ``<``, ``>`` and quotes escaped for HTML."""
    return html.escape(str(value), quote=True)


def format_value(value):
    """A short text for a table cell (not yet escaped).

    Floats get four significant digits (``nan`` and ``inf`` as such), booleans
    and integers print as they are, arrays as ``shape dtype``, sequences as
    their comma-separated items, anything else as ``str``.

    Examples
    --------
    >>> format_value(1234567.0), format_value(3), format_value((2.0, 0.5))
    ('1.235e+06', '3', '2, 0.5')
    """
    if value is None:
        return "-"
    if isinstance(value, (bool, str)):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{tuple(value.shape)} {value.dtype}"
    if isinstance(value, (tuple, list)):
        return ", ".join(format_value(v) for v in value)
    return str(value)


def table(rows, header=None):
    """An HTML table with escaped cells.

    Parameters
    ----------
    rows : iterable of sequence
        One sequence of cells per row. In rows of two cells the first is a
        row heading (``<th>``), as in a key/value table.
    header : sequence, optional
        Column headings.

    Returns
    -------
    str
    """
    parts = ['<table class="hpcgpu-table">']
    if header is not None:
        parts.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        row = list(row)
        if header is None and len(row) == 2:
            parts.append(f"<tr><th>{escape(row[0])}</th><td>{escape(format_value(row[1]))}</td></tr>")
        else:
            parts.append("<tr>" + "".join(f"<td>{escape(format_value(c))}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    return "".join(parts)


def summary(title, sections):
    """A titled block of sections: the whole ``_repr_html_`` of an object.

    Parameters
    ----------
    title : str
        Shown in bold at the top (escaped).
    sections : iterable of (str or None, str, bool)
        ``(heading, html, open)``: ``html`` is already built (e.g. by
        :func:`table`); a heading makes the section collapsible
        (``<details>``, expanded when ``open``); ``None`` shows it plainly.

    Returns
    -------
    str
    """
    parts = [_STYLE, f'<div class="hpcgpu-repr"><div><strong>{escape(title)}</strong></div>']
    for heading, body, expanded in sections:
        if heading is None:
            parts.append(body)
        else:
            flag = " open" if expanded else ""
            parts.append(f"<details{flag}><summary>{escape(heading)}</summary>{body}</details>")
    parts.append("</div>")
    return "".join(parts)


def _location(array):
    """Where an array lives, from its type: ``"GPU (cupy)"`` or ``"host (numpy)"``."""
    module = type(array).__module__.partition(".")[0]
    return "GPU (cupy)" if module == "cupy" else f"host ({module})"


def array_row(name, array):
    """``[name, shape, dtype, where, min, max, mean]`` of an array (reduced on its device)."""
    shape = "x".join(str(n) for n in array.shape) or "scalar"
    stats = ["-", "-", "-"]
    if getattr(array, "size", 0):
        try:
            data = array if array.dtype.kind in "biu" else array.astype("float64", copy=False)
            stats = [float(data.min()), float(data.max()), float(data.mean())]
        except (TypeError, ValueError):  # a dtype without an order (complex, object)
            pass
    return [name, shape, str(array.dtype), _location(array), *stats]


_ARRAY_HEADER = ("field", "shape", "dtype", "where", "min", "max", "mean")


def state_html(state, title=None, facts=()):
    """The ``_repr_html_`` of a model state: a frozen dataclass of arrays.

    Parameters
    ----------
    state : dataclass instance
        Its array fields (anything with ``shape`` and ``dtype``) are listed
        with shape, dtype, device and min/max/mean; its scalar fields
        (``step``, counters) join ``facts``; other fields show their type.
    title : str, optional
        Default: the state's class name.
    facts : sequence of (str, object)
        Key facts shown first (e.g. the number of bodies).

    Returns
    -------
    str
    """
    arrays, scalars = [], list(facts)
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            arrays.append(array_row(field.name, value))
        elif value is None or isinstance(value, (numbers.Number, str, bool)):
            scalars.append((field.name, value))
        else:
            scalars.append((field.name, type(value).__name__))
    sections = []
    if scalars:
        sections.append((None, table(scalars), True))
    sections.append((None, table(arrays, header=_ARRAY_HEADER), True))
    return summary(title or type(state).__name__, sections)


def model_html(model, facts):
    """The ``_repr_html_`` of a model: key facts, then all its attributes (collapsed).

    Parameters
    ----------
    model
        A model with ``attributes()`` (a flat dict, as written to files).
    facts : sequence of (str, object)
        The headline rows: case, sizes, backend, ...

    Returns
    -------
    str
    """
    title = f"{type(model).__name__}: {getattr(model, 'name', '')} / {getattr(model, 'case', '')}"
    attributes = sorted(model.attributes().items())
    return summary(title, [(None, table(facts), True), ("all parameters", table(attributes), False)])


def model_time(model, time):
    """Model time as text, in days too for models that count seconds (their ``time_unit``: :mod:`hpcgpu.registry`).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> model_time(SimpleNamespace(name="weather"), 129600.0)
    '1.296e+05 s (1.5 days)'
    >>> model_time(SimpleNamespace(name="md"), 40.0)
    '40'
    """
    from hpcgpu import registry

    text = format_value(float(time))
    declared = registry.for_model(model)  # each workload declares its time unit
    if declared is not None and declared.time_unit == "s":
        text += " s" + (f" ({time / 86400:.3g} days)" if time >= 3600 else "")
    return text


def simulation_html(sim):
    """An HTML summary of a :class:`~hpcgpu.simulation.Simulation` for Jupyter: the run, where it runs and its
    latest diagnostics.

    Shows what is known on the client (no state is gathered, nothing is
    computed): name, model, step, model time, dt, stop criteria, the
    executor (partitions, steps per task, workers), timing and the last
    recorded diagnostics.

    Examples
    --------
    >>> from hpcgpu import Simulation
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> sim = Simulation(ShallowWater("gravity_wave", nx=8, ny=8, backend="numpy"), stop_steps=2, diagnostics=1,
    ...                  progress=False)
    >>> "diagnostics at step 2" in simulation_html(sim.run())
    True
    """
    stops = [f"{sim.stop_steps} steps" if sim.stop_steps is not None else None,
             f"t = {sim.stop_time:g}" if sim.stop_time is not None else None,
             f"{sim.wall_time_limit:g} s wall" if sim.wall_time_limit is not None else None]
    facts = [("name", sim.name), ("model", repr(sim.model)), ("step", sim.step),
             ("time", model_time(sim.model, sim.time)), ("dt", sim.dt),
             ("stop at", ", ".join(s for s in stops if s) or "-")]
    try:
        executor = sim._executor.describe()
    except Exception:  # noqa: BLE001 - a display must not fail on a closed executor
        executor = {}
    facts += [(key.replace("_", " "), value) for key, value in executor.items()]
    timing = sim.timing
    if timing["steps"]:
        facts += [("JIT warm-up (s)", timing["warmup_s"]), ("run time (s)", timing["run_s"]),
                  ("steps/s", timing["steps"] / timing["run_s"] if timing["run_s"] > 0 else float("nan"))]
    sections = [(None, table(facts), True)]
    if sim._records:
        last = sim._records[-1]
        rows = [(key, value) for key, value in last.items() if key not in ("step", "time")]
        heading = f"diagnostics at step {last['step']} ({len(sim._records)} records: sim.diagnostics)"
        sections.append((heading, table(rows), True))
    return summary(f"Simulation: {sim.name}", sections)
