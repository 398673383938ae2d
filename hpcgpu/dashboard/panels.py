"""The hpcgpu panels: Bokeh documents in dask's own dashboard, beside Task Stream.

Four panels, each a Bokeh document served by the scheduler's dashboard
(:mod:`hpcgpu.dashboard.dask_dashboard` adds them), listed in dask's "More..."
menu and in ``/individual-plots.json``, which JupyterLab's dask extension
reads to offer its panels:

====================================  =====================================================
``/individual-hpcgpu-runs``           every run: status, step, steps/s (table and over time)
``/individual-hpcgpu-diagnostics``    one run's diagnostics against step, one plot each
``/individual-hpcgpu-partitions``     one run's partitions and items per worker
``/individual-hpcgpu-gpus``           each GPU's utilisation, memory and power ("no GPU" and why)
====================================  =====================================================

They are built like dask's own panels (``DashboardComponent``, dask's Bokeh
theme, refreshed by a periodic callback) from what
:class:`~hpcgpu.dashboard.plugin.DashboardPlugin` holds. Models that tests
and scripts read by name: the column data sources ``hpcgpu-runs``,
``hpcgpu-rates``, ``hpcgpu-diagnostics``, ``hpcgpu-partitions`` and
``hpcgpu-gpus``, and the divs ``hpcgpu-gpu-status`` and
``hpcgpu-diagnostics-status``.
"""

import logging
import math

from bokeh.layouts import column, gridplot
from bokeh.models import (ColumnDataSource, CustomJS, DataTable, Div, FactorRange, HoverTool, NumberFormatter,
                          NumeralTickFormatter, Select, TableColumn)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from distributed.dashboard.components import DashboardComponent, add_periodic_callback
from distributed.dashboard.components.scheduler import BOKEH_THEME

__all__ = ["PANELS", "RunsPanel", "DiagnosticsPanel", "PartitionsPanel", "GpuPanel", "panel_doc", "plot_order"]

logger = logging.getLogger(__name__)

INTERVAL_MS = 1000        # the records arrive at most once a second
NO_RUN = "No hpcgpu simulation has run on this cluster yet."
_NOT_PLOTTED = {"step", "time", "wall_s"}  # diagnostics rows carry these; they are the axes, not curves
_ACCENT = "#1f77b4"
_SPARE = "#d9d9d9"  # the unused part of a bar: memory total, power limit


class RunsPanel(DashboardComponent):
    """Every run on the cluster: a table (status, step, steps/s, ...) and steps/s over time."""

    COLUMNS = ("id", "name", "status", "step", "steps_per_s", "time", "wall_s", "backend", "layout", "model")

    def __init__(self, plugin, **kwargs):
        self.plugin = plugin
        self.source = ColumnDataSource({key: [] for key in self.COLUMNS}, name="hpcgpu-runs")
        self.rates = ColumnDataSource({"xs": [], "ys": [], "name": [], "color": []}, name="hpcgpu-rates")
        rates = figure(title="Steps per second", x_axis_type="datetime", tools="pan,wheel_zoom,box_zoom,reset",
                       height=260, name="hpcgpu_rates", **_width(kwargs))
        rates.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, source=self.rates, legend_field="name")
        rates.add_tools(HoverTool(tooltips="@name", line_policy="nearest"))
        rates.legend.location = "top_left"
        rates.y_range.start = 0
        rates.yaxis.axis_label = "steps/s"
        numbers = {"step": NumberFormatter(format="0,0"), "steps_per_s": NumberFormatter(format="0,0.0"),
                   "time": NumberFormatter(format="0,0.[000]"), "wall_s": NumberFormatter(format="0,0.0")}
        titles = {"steps_per_s": "steps/s", "time": "model time", "wall_s": "wall s",
                  "layout": "partitions x steps/task"}
        widths = {"name": 160, "model": 560, "layout": 150}
        table = DataTable(source=self.source, index_position=None, width_policy="max", height=220, reorderable=False,
                          columns=[TableColumn(field=key, title=titles.get(key, key), width=widths.get(key, 100),
                                               **({"formatter": numbers[key]} if key in numbers else {}))
                                   for key in self.COLUMNS if key != "id"])
        # BokehJS redraws a table's cells when its view's row indices change, so new values in as many
        # rows as before (a run's step, its steps/s) would never show: redraw on every new data.
        self.source.js_on_change("data", CustomJS(args={"table": table}, code="table.view.change.emit()"))
        self.root = column(rates, table, **kwargs)

    def update(self):
        runs = self.plugin.current_runs()
        self.source.data = {
            "id": [r["id"] for r in runs],
            "name": [str(r.get("name", r["id"])) for r in runs],
            "status": [str(r.get("status", "")) for r in runs],
            "step": [_nan(r.get("step")) for r in runs],
            "steps_per_s": [_nan(r.get("steps_per_s")) for r in runs],
            "time": [_nan(r.get("time")) for r in runs],
            "wall_s": [_nan(r.get("wall_s")) for r in runs],
            "backend": [str(r.get("backend") or "") for r in runs],
            "layout": [f"{r['partitions']} x {r.get('steps_per_task', 1)}" if r.get("partitions") else ""
                       for r in runs],
            "model": [str(r.get("model", "")) for r in runs],
        }
        plotted = [r for r in runs if r.get("rates")]
        self.rates.data = {
            "xs": [[t * 1000.0 for t in r["rates"]["t"]] for r in plotted],  # Bokeh datetimes: ms
            "ys": [list(r["rates"]["steps_per_s"]) for r in plotted],
            "name": [str(r.get("name", r["id"])) for r in plotted],
            "color": [Category10_10[i % 10] for i in range(len(plotted))],
        }


class _RunChoice:
    """A run picker: follows the newest running run until the viewer picks one."""

    def __init__(self):
        self.select = Select(title="run", options=[], value="", width=420)
        self.select.on_change("value", self._picked)
        self.pinned = None
        self._setting = False

    def _picked(self, attr, old, new):
        if not self._setting:
            self.pinned = new or None

    def choose(self, runs):
        """The chosen run among ``runs`` (newest running first), or None."""
        by_id = {r["id"]: r for r in runs}
        run_id = self.pinned if self.pinned in by_id else runs[0]["id"] if runs else ""
        options = [(r["id"], f"{r.get('name', r['id'])} ({r.get('status', '')})") for r in runs]
        self._setting = True
        try:
            if self.select.options != options:
                self.select.options = options
            if self.select.value != run_id:
                self.select.value = run_id
        finally:
            self._setting = False
        return by_id.get(run_id)


class DiagnosticsPanel(DashboardComponent):
    """One run's diagnostics against step: one small plot per quantity, titled with its last value."""

    def __init__(self, plugin, **kwargs):
        self.plugin = plugin
        self.choice = _RunChoice()
        self.source = ColumnDataSource({"step": []}, name="hpcgpu-diagnostics")
        self.status = Div(text=NO_RUN, name="hpcgpu-diagnostics-status")
        self.plots = column(sizing_mode="stretch_width")
        self.figures = {}
        self._shown = None
        self.root = column(self.choice.select, self.status, self.plots, **kwargs)

    def update(self):
        run = self.choice.choose(self.plugin.current_runs())
        series = (run or {}).get("series") or {}
        steps = series.get("step") or []
        shown = None if run is None else (run["id"], len(steps), steps[-1] if steps else None)
        if shown == self._shown:
            return
        self._shown = shown
        keys = plot_order(series, (run or {}).get("plot_first"))
        data = {"step": [_nan(s) for s in steps]}
        data.update({k: [_nan(v) for v in series[k]] for k in keys})
        if list(self.figures) != keys:
            self.figures = {k: self._figure(k) for k in keys}
            self.source.data = data
            self.plots.children = [gridplot(list(self.figures.values()), ncols=3, sizing_mode="stretch_width",
                                            toolbar_location=None)] if keys else []
        else:
            self.source.data = data
        for key, fig in self.figures.items():
            fig.title.text = f"{key}: {_last_and_change(data[key])}"
            values = [v for v in data[key] if math.isfinite(v)]
            # Rounding-level wiggles of a conserved quantity draw flat, not as full-height noise.
            fig.y_range.min_interval = max(map(abs, values), default=0.0) * 1e-9 or None
        self.status.text = (NO_RUN if run is None else
                            f"{run.get('name', run['id'])}: {len(steps)} diagnostics rows, {run.get('status', '')}")

    def _figure(self, key):
        fig = figure(title=key, height=190, tools="pan,wheel_zoom,box_zoom,reset", min_width=240,
                     sizing_mode="stretch_width", name=f"hpcgpu_diagnostic_{key}")
        fig.line(x="step", y=key, source=self.source, line_width=1.5, color=_ACCENT)
        fig.add_tools(HoverTool(tooltips=[("step", "@step{0,0}"), (key, f"@{{{key}}}{{0.000000g}}")],
                                mode="vline"))
        fig.xaxis.axis_label = "step"
        return fig


class PartitionsPanel(DashboardComponent):
    """One run's partitions on each worker: items (rows, atoms, ...) per worker as bars."""

    def __init__(self, plugin, **kwargs):
        self.plugin = plugin
        self.choice = _RunChoice()
        self.source = ColumnDataSource({"worker": [], "items": [], "partitions": []}, name="hpcgpu-partitions")
        self.figure = figure(title="Partitions per worker", y_range=FactorRange(), tools="", toolbar_location=None,
                             height=300, name="hpcgpu_partitions", **_width(kwargs))
        self.figure.hbar(y="worker", right="items", height=0.7, color=_ACCENT, source=self.source)
        self.figure.add_tools(HoverTool(tooltips="@worker: @partitions partitions, @items{0,0} items",
                                        point_policy="follow_mouse"))
        self.figure.x_range.start = 0
        self.figure.xaxis.formatter = NumeralTickFormatter(format="0,0")
        self.root = column(self.choice.select, self.figure, **kwargs)

    def update(self):
        run = self.choice.choose(self.plugin.current_runs())
        workers = (run or {}).get("workers") or {}
        unit = (run or {}).get("unit") or "items"
        names = sorted(workers)
        self.figure.y_range.factors = names
        self.source.data = {"worker": names, "items": [workers[w].get(unit, 0) for w in names],
                            "partitions": [workers[w].get("partitions", 0) for w in names]}
        if run is None:
            self.figure.title.text = NO_RUN
        elif not names:
            self.figure.title.text = f"{run.get('name', run['id'])}: one process, not partitioned"
        else:
            self.figure.title.text = (f"{run.get('name', run['id'])}: {run.get('partitions')} partitions on "
                                      f"{len(names)} workers ({unit} per worker)")
            self.figure.xaxis.axis_label = unit


class GpuPanel(DashboardComponent):
    """Each GPU of the workers: utilisation, memory and power as bars, or "no GPU" and why."""

    COLUMNS = ("label", "utilization", "memory_used", "memory_total", "power_w", "power_limit_w",
               "temperature_c", "workers")

    def __init__(self, plugin, **kwargs):
        self.plugin = plugin
        self.source = ColumnDataSource({key: [] for key in self.COLUMNS}, name="hpcgpu-gpus")
        self.status = Div(text="asking the workers...", name="hpcgpu-gpu-status")
        y_range = FactorRange()
        self.utilization = self._bars("GPU utilisation (%)", y_range, "utilization", None)
        self.utilization.x_range.end = 100
        self.memory = self._bars("GPU memory", y_range, "memory_used", "memory_total")
        self.memory.xaxis.formatter = NumeralTickFormatter(format="0.0 b")
        self.power = self._bars("GPU power (W)", y_range, "power_w", "power_limit_w")
        self.root = column(self.status, self.utilization, self.memory, self.power, **kwargs)

    def _bars(self, title, y_range, value, spare):
        fig = figure(title=title, y_range=y_range, tools="", toolbar_location=None, height=160,
                     sizing_mode="stretch_width", name=f"hpcgpu_gpu_{value}")
        if spare is not None:
            fig.hbar(y="label", right=spare, height=0.7, color=_SPARE, source=self.source)
        fig.hbar(y="label", right=value, height=0.7, color="#76B900", source=self.source)  # dask's GPU green
        fig.add_tools(HoverTool(tooltips=f"@label (@workers): @{value}", point_policy="follow_mouse"))
        fig.x_range.start = 0
        return fig

    def update(self):
        gpus = self.plugin.current_gpus()
        devices = (gpus.get("devices") or []) if gpus.get("available") else []
        labels = [f"{d.get('host') or '?'} #{d.get('index')} {d.get('name') or ''}".strip() for d in devices]
        self.source.data = {"label": labels, "workers": [", ".join(d.get("workers", ())) for d in devices],
                            **{key: [_nan(d.get(key)) for d in devices] for key in self.COLUMNS[1:-1]}}
        self.utilization.y_range.factors = labels
        for fig in (self.utilization, self.memory, self.power):
            fig.visible = bool(devices)
        if devices:
            used = sum(d.get("memory_used") or 0 for d in devices)
            total = sum(d.get("memory_total") or 0 for d in devices)
            self.memory.title.text = f"GPU memory: {_bytes(used)} / {_bytes(total)}"
            text = f"<b>{len(devices)} GPU{'s' if len(devices) > 1 else ''}</b>"
            if gpus.get("reason"):
                text += f"; some workers report no GPU: {_escape(gpus['reason'])}"
        elif gpus.get("updated") is None:
            text = "asking the workers..."
        else:
            text = f"<b>no GPU</b> ({_escape(gpus.get('reason') or 'none found')})"
        self.status.text = text


#: path on the dashboard -> (name in dask's menu, panel class)
PANELS = {
    "/individual-hpcgpu-runs": ("hpcgpu Runs", RunsPanel),
    "/individual-hpcgpu-diagnostics": ("hpcgpu Diagnostics", DiagnosticsPanel),
    "/individual-hpcgpu-partitions": ("hpcgpu Partitions", PartitionsPanel),
    "/individual-hpcgpu-gpus": ("hpcgpu GPUs", GpuPanel),
}


def panel_doc(cls, name, plugin, doc):
    """Fill the Bokeh document ``doc`` with a ``cls`` panel on ``plugin``, refreshed every second.

    As dask's own individual panels: the panel stretches to its frame and
    takes dask's Bokeh theme.
    """
    panel = cls(plugin, sizing_mode="stretch_both")
    _guarded(panel)
    add_periodic_callback(doc, panel, INTERVAL_MS)
    doc.add_root(panel.root)
    doc.title = f"Dask: {name}"
    doc.theme = BOKEH_THEME


def _guarded(panel):
    """Make ``panel.update`` log (once) instead of raising: a broken record must not flood the scheduler log."""
    update = panel.update

    def guarded():
        try:
            update()
        except Exception as error:  # noqa: BLE001 - shown as a stale panel, reported once
            if not getattr(panel, "_failed", False):
                panel._failed = True
                logger.warning("hpcgpu dashboard: %s failed to update (%s: %s)", type(panel).__name__,
                               type(error).__name__, error, exc_info=True)

    panel.update = guarded
    guarded()


def _width(kwargs):
    return {"sizing_mode": "stretch_width"} if kwargs.get("sizing_mode") else {"width": 800}


def _nan(value):
    """A float for Bokeh; NaN (a gap in a line, blank in a table) for None or junk."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def plot_order(series, first=None):
    """The diagnostics of ``series`` to plot: those the workload declares first (in its order), then the rest sorted.

    ``first`` is the run's ``plot_first``, from :attr:`hpcgpu.registry.Workload.diagnostics`.

    Examples
    --------
    >>> plot_order({"step": [], "mass": [], "energy": [], "max_cfl": []}, ["energy", "enstrophy"])
    ['energy', 'mass', 'max_cfl']
    """
    plotted = [k for k in series if k not in _NOT_PLOTTED]
    declared = [k for k in first or () if k in plotted]
    return declared + sorted(k for k in plotted if k not in declared)


def _last_and_change(values):
    """The last finite value, and its change relative to the first (conserved quantities: rounding level)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "-"
    first, last = finite[0], finite[-1]
    return f"{last:.6g}" + (f" ({(last - first) / abs(first):+.1e})" if first else "")


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024


def _escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
