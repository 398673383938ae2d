"""The client's side of the dashboard: register the scheduler plugin, publish status records.

A :class:`~hpcgpu.Simulation` running on a dask client publishes a small
status record after a batch of steps, at most once a second, without waiting
for the scheduler: publishing never slows a run down, and a cluster without
the plugin (or a scheduler that cannot import hpcgpu) only means no views.
Nothing here imports dask, Bokeh or Tornado at import time: ``import hpcgpu``
stays light.
"""

import asyncio
import logging
import math
import sys
import threading
import time
import uuid
import weakref

from hpcgpu import registry

__all__ = ["register", "page_link", "publish", "status_record"]

logger = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 1.0   # at most one record per simulation per this many seconds
SEND_TIMEOUT_S = 10.0      # a record not delivered by then is dropped (the next one carries the news)
MAX_DIAGNOSTICS = 200      # diagnostic rows per record: a long stretch between records is thinned to this

# Per client: the plugin is registered (True), failed to register (an error string), or not yet tried.
_clients = weakref.WeakKeyDictionary()


def register(client):
    """Add the hpcgpu page and panels to the dashboard of ``client``'s scheduler; returns the page's URL.

    Installs :class:`hpcgpu.dashboard.plugin.DashboardPlugin` on the
    scheduler: the page at ``/hpcgpu``, its data at ``/hpcgpu/data.json``
    and the Bokeh panels in dask's own menu. Registering twice is harmless.
    The scheduler must be able to import hpcgpu (install it where the
    scheduler runs).

    Parameters
    ----------
    client : distributed.Client

    Returns
    -------
    str or None
        The page's URL, or None when the scheduler refused the plugin (the
        reason is logged as a warning) or has no dashboard.
    """
    from hpcgpu.dashboard.plugin import PLUGIN_NAME, DashboardPlugin

    try:
        client.register_plugin(DashboardPlugin(), name=PLUGIN_NAME)
    except Exception as error:  # noqa: BLE001 - the page is optional; the run is not
        _clients[client] = f"{type(error).__name__}: {error}"
        logger.warning("hpcgpu: no hpcgpu page in the dask dashboard: the scheduler refused the plugin (%s: %s); "
                       "install hpcgpu where the scheduler runs", type(error).__name__, error)
        return None
    _clients[client] = True
    return page_link(client)


def page_link(client):
    """The URL of the hpcgpu page beside ``client.dashboard_link`` (None without a dashboard)."""
    try:
        link = client.dashboard_link
    except Exception:  # noqa: BLE001 - no dashboard service on this scheduler
        return None
    if not link:
        return None
    link = link.rstrip("/")
    return link[: -len("status")] + "hpcgpu" if link.endswith("/status") else link + "/hpcgpu"


def publish(simulation, finished=False):
    """Send ``simulation``'s status to its cluster's hpcgpu page, if it runs on one.

    Called by the driver after each batch of steps and when ``run`` stops.
    Returns at once: the record goes out on the client's event loop, at most
    once per second per simulation, one at a time (a record is dropped while
    the previous one is still on its way, except the last one, ``finished``,
    which follows it). Never raises.

    Parameters
    ----------
    simulation : hpcgpu.Simulation
    finished : bool
        ``run`` has stopped: the page shows the run as finished, or as
        failed with the error when called while an exception leaves ``run``.

    Returns
    -------
    bool
        Whether a record was handed to the event loop.
    """
    try:
        client = getattr(simulation._executor, "client", None)
        if client is None or getattr(client, "status", None) not in ("running", "connecting", "newly-created"):
            return False
        state = _clients.get(client)
        if isinstance(state, str):
            return False  # the scheduler refused the plugin once: do not ask on every batch
        # What this simulation sent last lives on it: it goes when the simulation goes.
        publisher = vars(simulation).get("_dashboard_publisher")
        if publisher is None:
            publisher = simulation._dashboard_publisher = _Publisher(simulation)
        error = _leaving(sys._getframe(1)) if finished else None
        return publisher.maybe_send(client, simulation, finished, error)
    except Exception as error:  # noqa: BLE001 - never raise into the run
        logger.debug("hpcgpu dashboard: publish failed (%s: %s)", type(error).__name__, error)
        return False


def status_record(simulation, *, run_id=None, status="running", steps_per_s=None, since_step=None, error=None):
    """The status record of ``simulation`` that the page shows (msgpack-ready builtins).

    Parameters
    ----------
    simulation : hpcgpu.Simulation
    run_id : str, optional
        Key of the run on the page (default: the name).
    status : str
        ``"running"``, ``"finished"`` or ``"failed"``.
    steps_per_s : float, optional
        Recent rate, steps per second of wall time.
    since_step : int, optional
        Include diagnostics recorded after this step (default: all).
    error : BaseException, optional
        What stopped a failed run (shown as ``error``).

    Returns
    -------
    dict
        ``id``, ``name``, ``model`` (its repr), ``status``, ``step``, ``time``,
        ``dt``, ``steps_per_s``, ``wall_s``, ``error``, ``diagnostics`` (rows of the
        recorded diagnostics), ``plot_first`` (the diagnostics the model's
        workload declares, to show first: :attr:`hpcgpu.registry.Workload.diagnostics`), ``workers`` (``{address: {"partitions": n,
        unit: items}}``), ``unit``, ``partitions``, ``steps_per_task``,
        ``backend``.
    """
    rows = [r for r in list(simulation._records) if since_step is None or r.get("step", 0) > since_step]
    if len(rows) > MAX_DIAGNOSTICS:
        stride = math.ceil(len(rows) / MAX_DIAGNOSTICS)
        rows = rows[::-1][::stride][::-1]  # thin, keeping the newest
    executor = simulation._executor
    declared = registry.for_model(simulation.model)
    record = {
        "id": run_id or simulation.name,
        "name": str(simulation.name),
        "model": _short(repr(simulation.model), 400),
        "status": status,
        "step": int(simulation.step),
        "time": _float(simulation.time),
        "dt": _float(simulation.dt),
        "steps_per_s": _float(steps_per_s),
        "wall_s": _float(simulation._wall_time()),
        "diagnostics": [{str(k): _float(v) for k, v in row.items() if _is_number(v)} for row in rows],
        "plot_first": [] if declared is None else [str(k) for k in declared.diagnostics],
        "backend": str(getattr(simulation.model, "backend_request", "") or ""),
        "error": None if error is None else _short(f"{type(error).__name__}: {error}", 1000),
    }
    owners = getattr(executor, "owner", None)
    if owners:
        unit = getattr(executor, "unit", "items")
        sizes = [b - a for a, b in getattr(executor, "bounds", ())] or [0] * len(owners)
        workers = {}
        for owner, size in zip(owners, sizes):
            entry = workers.setdefault(str(owner), {"partitions": 0, unit: 0})
            entry["partitions"] += 1
            entry[unit] += int(size)
        record.update(workers=workers, unit=unit, partitions=len(owners),
                      steps_per_task=int(getattr(executor, "steps_per_task", 1)))
    return record


class _Publisher:
    """What one simulation last sent: rate limit, steps/s, diagnostics already sent."""

    def __init__(self, simulation):
        self.run_id = f"{simulation.name}-{uuid.uuid4().hex[:8]}"
        self.sent_at = None          # perf_counter of the last record
        self.sent_step = None        # step of the last record
        self.sent_diagnostics = None  # step of the newest diagnostics row sent
        self.rate = None
        self.in_flight = False
        self.last_word = None        # a final record waiting for the one in flight
        self.lock = threading.Lock()  # in_flight and last_word: the run's thread and the event loop's

    def maybe_send(self, client, simulation, finished, error=None):
        now = time.perf_counter()
        if not finished and (self.in_flight or self.sent_at is not None and now - self.sent_at < PUBLISH_INTERVAL_S):
            return False
        if self.sent_at is not None and simulation.step > self.sent_step and now > self.sent_at:
            self.rate = (simulation.step - self.sent_step) / (now - self.sent_at)
        status = "running" if not finished else "failed" if error is not None else "finished"
        record = status_record(simulation, run_id=self.run_id, status=status, steps_per_s=self.rate,
                               since_step=self.sent_diagnostics, error=error)
        if record["diagnostics"]:
            self.sent_diagnostics = record["diagnostics"][-1].get("step", self.sent_diagnostics)
        # The next run() starts a fresh rate: the pause between runs is not stepping time.
        self.sent_at, self.sent_step = (None, None) if finished else (now, simulation.step)
        with self.lock:
            if self.in_flight:
                # A run's last record is never dropped: it goes out after the one on its way.
                self.last_word = record
                return True
            self.in_flight = True
        try:
            client.loop.add_callback(_send, client, record, self)
        except Exception:
            self.in_flight = False
            raise
        return True


async def _send(client, record, publisher):
    """On the client's event loop: deliver ``record``, then a last record that came meanwhile."""
    try:
        while record is not None:
            await _deliver(client, record)
            with publisher.lock:
                record, publisher.last_word = publisher.last_word, None
                publisher.in_flight = record is not None
    finally:
        with publisher.lock:
            if record is not None:  # cancelled on the way (the client is closing)
                publisher.in_flight, publisher.last_word = False, None


async def _deliver(client, record):
    """Register the plugin once per client, then hand ``record`` to the scheduler's page."""
    from hpcgpu.dashboard.plugin import PLUGIN_NAME, PUBLISH_OP, DashboardPlugin

    if isinstance(_clients.get(client), str):
        return
    try:
        if _clients.get(client) is not True:
            from distributed.protocol.pickle import dumps

            await asyncio.wait_for(client.scheduler.register_scheduler_plugin(
                plugin=dumps(DashboardPlugin()), name=PLUGIN_NAME, idempotent=True), SEND_TIMEOUT_S)
            _clients[client] = True
        await asyncio.wait_for(getattr(client.scheduler, PUBLISH_OP)(record=record), SEND_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - no page, never a failed run
        if _clients.get(client) is not True:
            _clients[client] = f"{type(error).__name__}: {error}"
            logger.warning("hpcgpu: no hpcgpu page in the dask dashboard (%s: %s)", type(error).__name__, error)
        else:
            logger.debug("hpcgpu dashboard: a status record was dropped (%s: %s)", type(error).__name__, error)


def _leaving(frame):
    """The exception now propagating out of ``frame`` (the driver's), if any."""
    error = sys.exc_info()[1]
    tb = getattr(error, "__traceback__", None)
    while tb is not None:
        if tb.tb_frame is frame:
            return error
        tb = tb.tb_next
    return None


def _is_number(value):
    return isinstance(value, (int, float)) or hasattr(value, "__float__") and not isinstance(value, str)


def _float(value):
    """A plain float (numpy scalars do not pack over msgpack); None for None or junk."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _short(text, limit):
    return text if len(text) <= limit else text[: limit - 3] + "..."
