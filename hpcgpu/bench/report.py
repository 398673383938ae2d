"""Acceptance thresholds (a TOML file) and the self-contained HTML report.

Thresholds, with their defaults (a file may set any of them, under a
``[thresholds]`` table)::

    [thresholds]
    peer_fraction = 0.7        # a worker's copy bandwidth, GEMM or kernel rate below 70 % of
                               # the median of its peers fails
    transfer_fraction = 0.5    # a worker pair's bandwidth below 50 % of the median pair fails
                               # (through tasks and through the communicator, each path on its own)
    strong_efficiency = 0.5    # strong-scaling parallel efficiency below this fails
    weak_efficiency = 0.7      # weak-scaling parallel efficiency below this fails
    plain_ratio = 1.0          # a numba kernel slower than a plain Numba kernel of the same job
                               # (hpcgpu.bench.plain, timed in turns) fails
    correctness = true         # a kernel that disagrees with numpy fails

The report embeds its charts as PNG data (matplotlib), so the one HTML file
can be mailed or attached to a ticket: a pass/fail summary, the inventory, a
roofline chart per worker, scaling curves, the transfer-bandwidth heatmaps
(through dask tasks and through the partitioned engine's communicator) with
the communicator's round trips and collective latencies, energy and the
balance of a mixed cluster.

Examples
--------
>>> Thresholds().peer_fraction
0.7
>>> Thresholds.from_mapping({"thresholds": {"strong_efficiency": 0.8}}).strong_efficiency
0.8
"""

import base64
import html
import io
import math
import tomllib
from dataclasses import dataclass, fields

from hpcgpu.errors import ConfigError

__all__ = ["Thresholds", "write_html"]


@dataclass(frozen=True)
class Thresholds:
    """Pass/fail limits of cluster acceptance (see the module docstring)."""

    peer_fraction: float = 0.7
    transfer_fraction: float = 0.5
    strong_efficiency: float = 0.5
    weak_efficiency: float = 0.7
    plain_ratio: float = 1.0
    correctness: bool = True

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type is bool or f.name == "correctness":
                if not isinstance(value, bool):
                    raise ConfigError(f"thresholds.{f.name} must be true or false; got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"thresholds.{f.name} must be a number between 0 and 1; got {value!r}")

    @classmethod
    def from_mapping(cls, mapping):
        """Thresholds from a parsed TOML document (its ``[thresholds]`` table)."""
        unknown_tables = set(mapping) - {"thresholds"}
        if unknown_tables:
            raise ConfigError(f"the thresholds file may only hold a [thresholds] table; found "
                              f"{', '.join(sorted(unknown_tables))}")
        table = mapping.get("thresholds", {})
        names = [f.name for f in fields(cls)]
        if not isinstance(table, dict):
            # `thresholds = 1` instead of a [thresholds] table: say so, not a TypeError from set()
            raise ConfigError(f"thresholds must be a [thresholds] table of {', '.join(names)}; got {table!r}")
        unknown = sorted(set(table) - set(names))
        if unknown:
            raise ConfigError(f"unknown threshold(s) {', '.join(unknown)}; valid keys: {', '.join(names)}")
        return cls(**table)

    @classmethod
    def from_toml(cls, path):
        """Read a TOML file; errors name the file and the key."""
        try:
            with open(path, "rb") as stream:
                document = tomllib.load(stream)
        except OSError as error:
            raise ConfigError(f"thresholds file {path}: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"thresholds file {path} is not valid TOML: {error}") from None
        try:
            return cls.from_mapping(document)
        except ConfigError as error:
            raise ConfigError(f"thresholds file {path}: {error}") from None


def _png(figure):
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return f'<img alt="chart" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _short(worker):
    return worker.replace("tcp://", "").replace("tls://", "")


def _roofline(records):
    """Achieved rate against the roofs, per worker: one point per kernel family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = [r for r in records if r["kind"] == "kernel" and r.get("fraction_of_roof") is not None]
    workers = sorted({r["worker"] for r in kernels})
    fig, ax = plt.subplots(figsize=(7, 4))
    families = sorted({r["family"] for r in kernels})
    for i, w in enumerate(workers):
        mine = {r["family"]: r["fraction_of_roof"] for r in kernels if r["worker"] == w}
        ax.bar([f + i / (len(workers) + 1) for f in range(len(families))], [mine.get(f, 0) for f in families],
               width=1 / (len(workers) + 1), label=_short(w))
    ax.axhline(1.0, color="k", lw=1, ls="--")
    ax.set_xticks(range(len(families)), families, rotation=20, ha="right")
    ax.set_ylabel("fraction of roofline floor")
    ax.set_title("Kernels against their roofs (memory: copy bandwidth; compute: GEMM rate)")
    ax.legend(fontsize=7)
    return _png(fig)


def _scaling_chart(records):
    import matplotlib.pyplot as plt

    runs = [r for r in records if r["kind"] == "scaling"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, mode in zip(axes, ("strong", "weak")):
        for workload in sorted({r["workload"] for r in runs}):
            series = sorted((r["workers"], r["efficiency"]) for r in runs if r["workload"] == workload
                            and r["mode"] == mode)
            if series:
                line, = ax.plot(*zip(*series), marker="o", label=workload)
                ceiling = sorted((r["workers"], r["side_by_side_efficiency"]) for r in runs if r["workload"] == workload
                                 and r["mode"] == mode and "side_by_side_efficiency" in r)
                if ceiling:  # what copies side by side reach with no engine: the hardware's share of the loss
                    ax.plot(*zip(*([(1, 1.0)] + ceiling)), ls=":", color=line.get_color(), lw=1)
        ax.axhline(1.0, color="k", lw=1, ls="--")
        ax.set_xlabel("workers")
        ax.set_title(f"{mode} scaling")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("parallel efficiency")
    return _png(fig)


# The two paths data takes between workers, as the transfers section names them.
_PATHS = (("transfer", "through tasks (scheduler)"), ("comm", "through the communicator (rank to rank)"))


def _heatmap(records):
    """One bandwidth heatmap per path (tasks, communicator), side by side, one colour scale."""
    import matplotlib.pyplot as plt
    import numpy as np

    pairs = {kind: [r for r in records if r["kind"] == kind and "source" in r] for kind, _ in _PATHS}
    workers = sorted({r[end] for rows in pairs.values() for r in rows for end in ("source", "destination")})
    if not workers:
        return "<p>One worker: no pairs to measure.</p>"
    panels = [(title, pairs[kind]) for kind, title in _PATHS if pairs[kind]]
    index = {w: i for i, w in enumerate(workers)}
    grids = []
    for _, rows in panels:
        grid = np.full((len(workers), len(workers)), np.nan)
        for r in rows:
            value = r["bandwidth_bytes_per_s"]
            grid[index[r["source"]], index[r["destination"]]] = value / 1e9 if math.isfinite(value) else np.nan
        grids.append(grid)
    top = max((float(np.nanmax(g)) for g in grids if np.isfinite(g).any()), default=1.0)
    side = 3.5 + 0.3 * len(workers)
    fig, axes = plt.subplots(1, len(panels), figsize=(side * len(panels) + 1, side), squeeze=False)
    labels = [_short(w) for w in workers]
    for k, (ax, (title, _), grid) in enumerate(zip(axes[0], panels, grids)):
        # from zero: a 5 % spread must not look like 100 %; one scale: the paths compare at a glance
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=top)
        ax.set_xticks(range(len(workers)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(workers)), labels if k == 0 else [], fontsize=7)
        ax.set_xlabel("destination")
        if k == 0:
            ax.set_ylabel("source")
        ax.set_title(f"Bandwidth {title}", fontsize=9)
    fig.colorbar(image, ax=list(axes[0]), label="GB/s")
    return _png(fig)


def _transfers(records):
    """The transfers section: the heatmaps, then a table per path and the communicator's collectives."""
    comm = [r for r in records if r["kind"] == "comm"]
    small = next((r["small_bytes"] for r in comm if "small_bytes" in r), 4096)
    parts = [
        '<h2 id="transfers">Transfers</h2>',
        "<p>Two paths between every ordered pair of workers. <b>Tasks</b>: a task on the destination that needs "
        "an array made on the source, through dask's scheduler (latency: an 8-byte array, the scheduler's round "
        "trip included; bandwidth from a large one). <b>Communicator</b>: what the partitioned engine's ranks "
        f"use, rank to rank without the scheduler: the median ping-pong round trip of a {small}-byte NumPy array "
        "and the one-way bandwidth of a large one (twice its size over its round trip). The bandwidth "
        "threshold judges each path's pairs against the other pairs of the same path.</p>",
        _heatmap(records),
        "<h3>Through tasks</h3>",
        _table([r for r in records if r["kind"] == "transfer"],
               ["source", "destination", "latency_s", "bandwidth_bytes_per_s", "same_host"]),
        "<h3>Through the communicator</h3>",
        _table(comm, ["source", "destination", "protocol", "round_trip_s", "round_trip_p90_s",
                      "bandwidth_bytes_per_s", "bytes", "same_host", "error"]) if comm
        else "<p>Not measured (one worker, or records from before the communicator).</p>",
        _table([r for r in records if r["kind"] == "collective"],
               ["op", "workers", "protocol", "latency_s", "p90_s", "repeats"]),
    ]
    return "".join(parts)


def _table(rows, columns):
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(c)))}</td>" for c in columns) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return "" if value is None else str(value)


def write_html(records, path, title="hpcgpu cluster acceptance"):
    """Write the self-contained HTML report of acceptance ``records`` to ``path``; returns the path."""
    summary = [r for r in records if r["kind"] == "summary"][-1]
    balance = [r for r in records if r["kind"] == "balance"][-1]
    run = [r for r in records if r["kind"] == "run"]
    verdict = "PASSED" if summary["passed"] else "FAILED"
    failed = "".join(f"<li>{html.escape(line)}</li>" for line in summary["failed"]) or "<li>none</li>"
    sections = [
        f"<h1>{html.escape(title)}</h1>",
        f'<h2 id="summary">Summary: <span class="{verdict.lower()}">{verdict}</span></h2>',
        f"<p>{summary['checks']} checks, {len(summary['failed'])} failed"
        + (f"; {run[-1]['workers']} workers on {run[-1]['hosts']} host(s), {run[-1]['seconds']:.0f} s" if run else "")
        + f"</p><ul>{failed}</ul>",
        '<h2 id="inventory">Inventory</h2>',
        _table([r for r in records if r["kind"] == "inventory"],
               ["worker", "host", "device", "device_memory_bytes", "cpu_cores", "memory_bytes", "driver_cuda",
                "cuda_runtime", "backend", "numpy", "numba", "hpcgpu"]),
        '<h2 id="ceilings">Ceilings</h2>',
        _table([r for r in records if r["kind"] == "ceiling"],
               ["worker", "copy_bytes_per_s", "gemm_flops_per_s", "gemm_library", "error"]),
        '<h2 id="roofline">Roofline</h2>', _roofline(records),
        _table([r for r in records if r["kind"] == "kernel"],
               ["worker", "family", "rate", "unit", "roof", "fraction_of_roof", "max_relative_error", "passed"]),
        '<h2 id="scaling">Scaling</h2>', _scaling_chart(records),
        _table([r for r in records if r["kind"] == "scaling"],
               ["workload", "mode", "workers", "size", "seconds_per_step", "efficiency", "side_by_side_efficiency"]),
        _transfers(records),
        '<h2 id="energy">Energy</h2>',
        _table([r for r in records if r["kind"] == "energy"],
               ["worker", "available", "source", "joules_per_step", "watts", "why"]),
        '<h2 id="balance">Balance</h2>',
        f"<p>Device models: {'mixed' if balance['mixed'] else 'uniform'}.</p>",
        _table([{"worker": w, "device": balance["devices"].get(w), "relative_speed": balance["relative_speed"].get(w),
                 "partition_weight": balance["partition_weights"].get(w)} for w in sorted(balance["devices"])],
               ["worker", "device", "relative_speed", "partition_weight"]),
        '<h2 id="checks">All checks</h2>',
        _table([r for r in records if r["kind"] == "verdict"], ["subject", "check", "passed", "detail"]),
    ]
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}.passed{color:green}.failed{color:red}")
    with open(path, "w") as stream:
        stream.write(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                     f"<style>{style}</style></head><body>{''.join(sections)}</body></html>")
    return path
