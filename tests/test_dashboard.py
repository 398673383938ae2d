"""hpcgpu in the dask dashboard: the page, the panels in dask's menu, their data, publishing, a real browser.

The browser tests need Debian's ``chromium`` and ``chromium-driver`` and the
``selenium`` package; without them they skip, and fail instead under CI
(``CI`` set) or with ``HPCGPU_REQUIRE_BROWSER=1``. Their screenshots go to
``test-artifacts/`` at the top of the repository (or ``$HPCGPU_TEST_ARTIFACTS``).
"""

import asyncio
import contextlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import types
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

Document = pytest.importorskip("bokeh.document").Document  # a bare GPU image lacks it: skip there

from hpcgpu import Simulation, dashboard
from hpcgpu.cluster import start_cluster
from hpcgpu.dashboard import gpu as dashboard_gpu
from hpcgpu.dashboard import publishing
from hpcgpu.dashboard.gpu import gpu_stats
from hpcgpu.dashboard.page import STATIC
from hpcgpu.dashboard.panels import PANELS, DiagnosticsPanel, GpuPanel, PartitionsPanel, RunsPanel, panel_doc
from hpcgpu.dashboard.plugin import DashboardPlugin
from hpcgpu.workloads.weather import ShallowWater

ARTIFACTS = Path(os.environ.get("HPCGPU_TEST_ARTIFACTS") or Path(__file__).resolve().parents[1] / "test-artifacts")
REQUIRE_BROWSER = (os.environ.get("HPCGPU_REQUIRE_BROWSER", "0") not in ("", "0")
                   or os.environ.get("CI", "").lower() not in ("", "0", "false"))


def _get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read().decode()


def _base(client):
    """The dashboard's root URL (``.../status`` without ``status``)."""
    return client.dashboard_link.rsplit("/", 1)[0]


def _data(client):
    status, content_type, body = _get(dashboard.page_link(client) + "/data.json")
    assert status == 200 and content_type.startswith("application/json")
    return json.loads(body)  # strict JSON: NaN would not parse in a browser either


def _wait_for_run(client, name, until, timeout=20):
    """The run called ``name`` in data.json once ``until(run)`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        runs = [r for r in _data(client)["runs"] if r["name"] == name]
        if runs and until(runs[-1]):
            return runs[-1]
        if time.monotonic() > deadline:
            raise AssertionError(f"no run {name!r} satisfying the condition within {timeout} s; saw {runs}")
        time.sleep(0.2)


def _jet(nx=48, ny=48):
    return ShallowWater("unstable_jet", nx=nx, ny=ny, backend="numpy")


# -- the data endpoint ------------------------------------------------------------------
def test_cluster_prints_the_hpcgpu_page_beside_the_dashboard_also_for_a_running_scheduler(client, capsys):
    again = start_cluster(client.scheduler.address, quiet=False)  # the plugin is registered already: a no-op
    try:
        err = capsys.readouterr().err
        page = dashboard.page_link(again)
        assert page.endswith("/hpcgpu") and page.startswith(client.dashboard_link.rsplit("/", 1)[0])
        assert f"dask dashboard at {again.dashboard_link}, hpcgpu page at {page}" in err
    finally:
        again.close()


def test_page_is_the_packages_html_css_and_js_with_relative_links_only(client):
    page = dashboard.page_link(client)
    host = urllib.parse.urlsplit(page)
    connection = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
    connection.request("GET", host.path)
    response = connection.getresponse()
    # Relative, so the page also works behind a proxy that adds a prefix (jupyter-server-proxy).
    assert response.status == 302 and response.getheader("Location") == "hpcgpu/"
    connection.close()
    files = {"index.html": "text/html", "hpcgpu.css": "text/css", "hpcgpu.js": "javascript"}
    for name, content_type in files.items():
        status, served_type, body = _get(page + "/" + ("" if name == "index.html" else name))
        assert status == 200 and content_type in served_type
        assert body == (STATIC / name).read_text()
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", body)  # no external scripts, styles or fonts
    html = (STATIC / "index.html").read_text()
    assert '<link rel="stylesheet" href="hpcgpu.css">' in html and '<script src="hpcgpu.js"></script>' in html
    script = (STATIC / "hpcgpu.js").read_text()
    assert 'fetch(base + "/data.json"' in script


def test_the_page_files_are_package_data_of_the_wheel():
    config = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "hpcgpu.dashboard" in config["packages"]
    patterns = config["package-data"]["hpcgpu.dashboard"]
    shipped = {path for pattern in patterns for path in STATIC.parent.glob(pattern)}
    assert shipped == set(STATIC.iterdir()) and len(shipped) == 3


def test_data_json_answers_on_a_scheduler_without_any_run():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as local, \
            Client(local) as bare:
        assert dashboard.register(bare) is not None
        data = _data(bare)
    assert data["runs"] == [] and data["workers"] == []
    assert data["gpus"]["available"] is False and data["gpus"]["reason"]


def test_data_json_holds_a_runs_name_step_diagnostics_and_partitions(client):
    sim = Simulation(_jet(), stop_steps=60, progress=False, client=client, partitions=3, steps_per_task=2,
                     name="dashboard-unit-jet")
    sim.run()
    run = _wait_for_run(client, "dashboard-unit-jet", lambda r: r["status"] == "finished")
    assert run["step"] == 60 and run["model"] == repr(sim.model)
    assert run["time"] == pytest.approx(sim.time)
    assert run["steps_per_s"] is None or run["steps_per_s"] > 0
    if run["steps_per_s"] is not None:  # the panels' steps/s over time
        assert run["rates"]["steps_per_s"][-1] == pytest.approx(run["steps_per_s"])
    series = run["series"]
    assert series["step"] == [r["step"] for r in sim._records]
    for key in ("energy", "mass"):
        assert series[key] == pytest.approx(list(sim.diagnostics[key].values), rel=1e-12)
    assert set(run["workers"]) == set(sim._executor.workers)
    assert sum(w["partitions"] for w in run["workers"].values()) == 3
    assert sum(w["cells"] for w in run["workers"].values()) == 48 * 48 and run["unit"] == "cells"


def test_a_run_stopped_by_an_error_shows_as_failed_with_the_error(client):
    def blow_up(sim):
        if sim.step == 20:
            raise RuntimeError("blown up on purpose")

    sim = Simulation(_jet(), stop_steps=40, progress=False, client=client, name="dashboard-failing-jet")
    sim.add_callback(blow_up, 20)
    with pytest.raises(RuntimeError, match="on purpose"):
        sim.run()
    run = _wait_for_run(client, "dashboard-failing-jet", lambda r: r["status"] != "running")
    assert run["status"] == "failed" and run["error"] == "RuntimeError: blown up on purpose" and run["step"] == 20
    try:
        raise KeyError("an error being handled around a run that succeeds")
    except KeyError:
        sim.run(steps=20)
    # step 40 is published while the run is still going, then its end: wait for the end
    run = _wait_for_run(client, "dashboard-failing-jet", lambda r: r["step"] == 40 and r["status"] != "running")
    assert run["status"] == "finished" and run["error"] is None


def test_gpus_are_reported_as_not_available_without_nvml(client):
    data = _data(client)
    deadline = time.monotonic() + 10
    while data["gpus"]["updated"] is None and time.monotonic() < deadline:
        time.sleep(0.3)
        data = _data(client)  # asking for the data is what starts a round of GPU questions
    local = gpu_stats()
    assert data["gpus"]["available"] is local["available"]
    if not local["available"]:
        assert "not available" in data["gpus"]["reason"]


class _FakeNvml:
    """Two GPUs as NVML reports them; the second cannot read its power draw."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.initialised = 0

    def nvmlInit(self):
        self.initialised += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return int(uuid[-1])

    def nvmlDeviceGetIndex(self, handle):
        return handle

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}"

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=40 + handle)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=2**30 * (handle + 1), total=141 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle):
        if handle == 1:
            raise self.NVMLError("Not Supported")
        return 350_000

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 55


def test_gpu_stats_reads_the_workers_gpu_through_nvml(monkeypatch):
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setitem(dashboard_gpu._NVML, "pid", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # dask-cuda: the worker's GPU first
    stats = gpu_stats()
    assert stats["available"] and fake.initialised == 1
    (gpu,) = stats["gpus"]
    assert gpu == {"index": 1, "uuid": "GPU-1", "name": "NVIDIA H200", "utilization": 41,
                   "memory_used": 2 * 2**30, "memory_total": 141 * 2**30, "power_w": None,
                   "power_limit_w": 700.0, "temperature_c": 55.0}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0")
    assert [g["uuid"] for g in gpu_stats()["gpus"]] == ["GPU-0"] and fake.initialised == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert [g["power_w"] for g in gpu_stats()["gpus"]] == [350.0, None]  # no mask: every GPU of the host


def test_gpus_are_listed_once_with_the_workers_that_share_them():
    gpu = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "utilization": 90}

    class Scheduler:
        workers = {"tcp://a:1": None, "tcp://b:1": None, "tcp://c:1": None, "tcp://d:1": None}

        async def broadcast(self, msg, workers, on_error):
            assert msg == {"op": "hpcgpu_gpu_stats"}
            return {"tcp://a:1": {"available": True, "host": "n1", "gpus": [gpu]},
                    "tcp://b:1": {"available": True, "host": "n1", "gpus": [gpu]},
                    "tcp://c:1": {"available": False, "reason": "NVML not available: no driver"},
                    "tcp://d:1": OSError("worker gone")}

    plugin = DashboardPlugin()
    plugin.scheduler = Scheduler()
    asyncio.run(plugin._ask_workers())
    (device,) = plugin.gpus["devices"]
    assert plugin.gpus["available"] and device["workers"] == ["tcp://a:1", "tcp://b:1"] and device["host"] == "n1"
    assert "no driver" in plugin.gpus["reason"] and "worker gone" in plugin.gpus["reason"]


def test_plugin_survives_bad_records_and_no_scheduler():
    plugin = DashboardPlugin()
    assert plugin.snapshot()["runs"] == []  # never started: no scheduler, still an answer
    assert plugin.receive(record={"no id": 1}) == "OK"
    assert plugin.receive(record=None) == "OK"
    plugin.receive(record={"id": "r", "name": "r", "step": 3, "diagnostics": [{"step": 0, "energy": float("nan")}]})
    plugin.receive(record={"id": "r", "step": 5, "diagnostics": [{"step": 0}, {"step": 4, "energy": 2.0, "new": 1}]})
    (run,) = plugin.snapshot()["runs"]
    assert run["step"] == 5 and run["series"] == {"step": [0, 4], "energy": [None, 2.0], "new": [None, 1]}
    json.dumps(plugin.snapshot(), allow_nan=False)


def test_a_new_run_shows_when_the_page_already_keeps_max_runs():
    # the run just received was evicted before its status and time were set: after MAX_RUNS runs (a long
    # notebook session, a scaling sweep) no new run reached the page
    from hpcgpu.dashboard.plugin import MAX_RUNS

    plugin = DashboardPlugin()
    for i in range(MAX_RUNS):
        plugin.receive(record={"id": f"old-{i}", "name": f"old-{i}", "status": "finished", "step": 10})
    plugin.receive(record={"id": "new", "name": "new", "status": "running", "step": 1})
    runs = [run["id"] for run in plugin.snapshot()["runs"]]
    assert len(runs) == MAX_RUNS and runs[0] == "new" and "old-0" not in runs  # the oldest finished one went
    plugin.receive(record={"id": "newer", "name": "newer", "status": "finished", "step": 1})
    assert "newer" in plugin.runs and "old-1" not in plugin.runs


def test_publishing_is_rate_limited_and_never_raises():
    local = Simulation(_jet(8, 8), stop_steps=2, progress=False)
    assert dashboard.publish(local) is False  # no cluster: nothing to publish to
    local.run()

    class Broken:
        _executor = property(lambda self: 1 / 0)

    assert dashboard.publish(Broken()) is False


def test_a_run_publishes_about_once_a_second(client, monkeypatch):
    sent = []
    monkeypatch.setattr(publishing, "_deliver", lambda client, record: _record(sent, record))
    sim = Simulation(_jet(), progress=False, client=client, steps_per_task=2, name="dashboard-rate-jet")
    sim.run(wall_time_limit=2.5)
    time.sleep(0.2)  # the last record goes out through the client's event loop
    assert 2 <= len(sent) <= 5, [r["step"] for r in sent]
    assert sent[-1]["status"] == "finished" and sent[-1]["step"] == sim.step
    assert [r["status"] for r in sent[:-1]] == ["running"] * (len(sent) - 1)
    rows = [row["step"] for r in sent for row in r["diagnostics"]]
    assert rows == [r["step"] for r in sim._records]  # every diagnostics row once, in order


async def _record(sent, record):
    await asyncio.sleep(0.05)  # on its way for a while: the last record must still follow
    sent.append(record)


# -- the panels in dask's own dashboard ------------------------------------------------------
def test_the_panels_are_listed_in_individual_plots_json_beside_task_stream(client):
    status, content_type, body = _get(_base(client) + "/individual-plots.json")
    plots = json.loads(body)  # what JupyterLab's dask extension reads to list its panels
    assert plots["Individual Task Stream"] == "/individual-task-stream"
    for path in PANELS:
        assert plots["Individual " + path.strip("/").split("-", 1)[1].replace("-", " ").title()] == path
    assert len(PANELS) == 4


def test_the_status_pages_menu_links_the_hpcgpu_page_and_each_panel(client):
    status, content_type, body = _get(client.dashboard_link)
    links = dict(re.findall(r'<a href="([^"]+)">\s*([^<]*?)\s*</a>', body))
    assert links["individual-task-stream"] == "Task Stream"  # dask's "More..." list, where the panels go
    assert links["hpcgpu"] == "Hpcgpu"  # the top bar
    for path, (name, _) in PANELS.items():
        assert links[path.strip("/")] == name
    assert {"hpcgpu Runs", "hpcgpu Diagnostics", "hpcgpu Partitions", "hpcgpu GPUs"} == {n for n, _ in PANELS.values()}


def test_each_panel_is_a_bokeh_document_served_by_the_dashboard(client):
    for path, (name, _) in PANELS.items():
        status, content_type, body = _get(_base(client) + path)
        assert status == 200 and content_type.startswith("text/html")
        assert f"<title>Dask: {name}</title>" in body and "bokeh" in body.lower()


def _scheduler_process(tmp_path, *extra):
    """``dask scheduler`` in a subprocess on free ports; yields (its address, its dashboard's root URL)."""
    scheduler_file = tmp_path / "scheduler.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not scheduler_file.exists() or not scheduler_file.read_text().strip():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"dask scheduler did not start: {process.communicate()[1][-2000:]}")
        time.sleep(0.2)
    identity = json.loads(scheduler_file.read_text())
    return process, identity["address"], f"http://127.0.0.1:{identity['services']['dashboard']}"


@pytest.mark.parametrize("preload", [True, False], ids=["preload", "first-client"])
def test_a_scheduler_started_from_the_command_line_lists_the_panels(tmp_path, preload):
    process, address, base = _scheduler_process(tmp_path, *(["--preload", "hpcgpu.dashboard.preload"] if preload
                                                            else []))
    try:
        if preload:  # there before any client
            plots = json.loads(_get(base + "/individual-plots.json")[2]).values()
        else:
            assert "/individual-hpcgpu-runs" not in json.loads(_get(base + "/individual-plots.json")[2]).values()
            with contextlib.closing(start_cluster(address, quiet=True)):
                plots = json.loads(_get(base + "/individual-plots.json")[2]).values()
        assert set(PANELS) <= set(plots)
        assert 'href="individual-hpcgpu-runs"' in _get(base + "/status")[2]
        assert json.loads(_get(base + "/hpcgpu/data.json")[2])["runs"] == []
    finally:
        process.terminate()
        process.wait(timeout=30)


def _fed_plugin():
    """A plugin holding two runs, as two published records each, and one GPU."""
    plugin = DashboardPlugin()
    for rate, step in ((None, 10), (25.0, 60)):
        plugin.receive(record={
            "id": "jet-1", "name": "jet", "model": "ShallowWater(...)", "status": "running", "step": step,
            "time": 60.0 * step, "dt": 60.0, "steps_per_s": rate, "wall_s": step / 25, "backend": "numba",
            "partitions": 3, "steps_per_task": 2, "unit": "rows",
            "workers": {"tcp://a:1": {"partitions": 2, "rows": 32}, "tcp://b:1": {"partitions": 1, "rows": 16}},
            "diagnostics": [{"step": s, "mass": 8.0, "energy": 3.0 - s / 100} for s in range(step - 10, step, 5)]})
    plugin.receive(record={"id": "md-1", "name": "md", "status": "finished", "step": 5, "steps_per_s": 9.0,
                           "diagnostics": [{"step": 5, "temperature": 1.5}]})
    plugin.runs["jet-1"]["first_seen"] += 1  # the newer one
    return plugin


def test_the_panels_show_runs_steps_per_second_diagnostics_and_partitions():
    plugin = _fed_plugin()
    runs = RunsPanel(plugin)
    runs.update()
    data = runs.source.data
    assert data["name"] == ["jet", "md"] and data["status"] == ["running", "finished"]
    assert data["step"] == [60.0, 5.0] and data["steps_per_s"] == [25.0, 9.0] and data["layout"] == ["3 x 2", ""]
    assert runs.rates.data["name"] == ["jet", "md"] and runs.rates.data["ys"] == [[25.0], [9.0]]

    diagnostics = DiagnosticsPanel(plugin)
    diagnostics.update()  # follows the newest running run
    assert diagnostics.choice.select.value == "jet-1"
    assert diagnostics.source.data == {"step": [0.0, 5.0, 50.0, 55.0], "energy": [3.0, 2.95, 2.5, 2.45],
                                       "mass": [8.0, 8.0, 8.0, 8.0]}
    assert [f.title.text for f in diagnostics.figures.values()] == ["energy: 2.45 (-1.8e-01)", "mass: 8 (+0.0e+00)"]
    diagnostics.choice.select.value = "md-1"  # the viewer picks a run: it stays picked
    diagnostics.update()
    diagnostics.update()
    assert diagnostics.source.data == {"step": [5.0], "temperature": [1.5]} and list(diagnostics.figures) == [
        "temperature"]

    partitions = PartitionsPanel(plugin)
    partitions.update()
    assert partitions.source.data == {"worker": ["tcp://a:1", "tcp://b:1"], "items": [32, 16], "partitions": [2, 1]}
    assert list(partitions.figure.y_range.factors) == ["tcp://a:1", "tcp://b:1"]
    assert partitions.figure.title.text == "jet: 3 partitions on 2 workers (rows per worker)"


def test_the_gpu_panel_shows_utilisation_memory_and_power_or_no_gpu_and_why():
    plugin = DashboardPlugin()
    panel = GpuPanel(plugin)
    plugin.gpus.update(available=False, reason="NVML not available: no driver", devices=[], updated=time.time())
    panel.update()
    assert panel.status.text == "<b>no GPU</b> (NVML not available: no driver)"
    assert not panel.utilization.visible and panel.source.data["label"] == []
    plugin.gpus.update(available=True, reason=None, updated=time.time(), devices=[
        {"host": "n1", "index": 0, "name": "NVIDIA H200", "workers": ["tcp://a:1"], "utilization": 87,
         "memory_used": 40 * 2**30, "memory_total": 141 * 2**30, "power_w": 512.5, "power_limit_w": 700.0,
         "temperature_c": 61.0}])
    panel.update()
    assert panel.status.text == "<b>1 GPU</b>" and panel.utilization.visible and panel.power.visible
    data = panel.source.data
    assert data["label"] == ["n1 #0 NVIDIA H200"] and data["utilization"] == [87.0]
    assert data["memory_used"] == [40.0 * 2**30] and data["power_w"] == [512.5] and data["power_limit_w"] == [700.0]
    assert panel.memory.title.text == "GPU memory: 40.0 GiB / 141.0 GiB"


def test_a_panel_document_is_themed_like_dasks_and_survives_a_broken_record(caplog):
    from distributed.dashboard.components.scheduler import BOKEH_THEME

    plugin = _fed_plugin()
    doc = Document()
    panel_doc(RunsPanel, "hpcgpu Runs", plugin, doc)
    assert doc.title == "Dask: hpcgpu Runs" and doc.theme is BOKEH_THEME
    assert doc.get_model_by_name("hpcgpu-runs").data["name"] == ["jet", "md"]
    plugin.runs["jet-1"]["rates"] = {"t": 5}  # corrupt: the update fails, is logged once, and raises nothing
    (callback,) = doc.session_callbacks
    callback.callback()
    callback.callback()
    failures = [r for r in caplog.records if "RunsPanel failed to update" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelname == "WARNING"


# -- a real browser -----------------------------------------------------------------------
def _browser():
    """A headless Chromium WebDriver, or skip (fail when a browser is required) saying what is missing."""
    missing = []
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package (pip install -e '.[test]')")
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        missing.append("Chromium and its driver (apt-get install chromium chromium-driver)")
    if missing:
        message = "the browser test needs " + " and ".join(missing)
        if REQUIRE_BROWSER:
            pytest.fail(message + " (required: CI or HPCGPU_REQUIRE_BROWSER=1)")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1100", "--hide-scrollbars"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


class _Stop(Exception):
    pass


@contextlib.contextmanager
def _running(client, name):
    """A weather run on ``client`` in a thread, stopped on leaving; yields a dict that gets its last ``step``."""
    stop = threading.Event()
    outcome = {}

    def stop_when_asked(sim):
        if stop.is_set():
            raise _Stop

    def run():
        sim = Simulation(_jet(96, 64), progress=False, client=client, partitions=2, steps_per_task=2, name=name)
        sim.add_callback(stop_when_asked, 20)
        try:
            sim.run(wall_time_limit=90)
        except _Stop:
            pass
        except BaseException as error:  # noqa: BLE001 - reported by the caller
            outcome["error"] = error
        outcome["step"] = sim.step

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield outcome
    finally:
        stop.set()
        thread.join(timeout=30)
    assert "error" not in outcome, outcome.get("error")


def _screenshot(browser, name):
    """Save the whole page (up to 4000 px tall) under ARTIFACTS; returns the path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, min(4000, max(1100, height + 140)))
    browser.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s")
        time.sleep(0.25)


def test_browser_sees_the_status_page_and_a_live_run_on_the_hpcgpu_page(client):
    name = "browser-unstable-jet"
    browser = _browser()
    try:
        with _running(client, name) as outcome:
            browser.get(client.dashboard_link)
            _wait(lambda: "Dask" in browser.title, 20, "the dask status page did not load")
            assert "needs bokeh" not in browser.page_source
            _wait(lambda: browser.execute_script("return document.querySelectorAll('[class*=bk]').length"), 20,
                  "the Bokeh status page did not render")
            _screenshot(browser, "dashboard-status.png")

            browser.get(dashboard.page_link(client))

            def step_shown():
                return browser.execute_script(
                    "for (const card of document.querySelectorAll('.run')) {"
                    "  if (card.querySelector('.run-name').textContent === arguments[0])"
                    "    return card.querySelector('.run-step').textContent; }"
                    "return null;", name)

            first = int(_wait(step_shown, 30, f"the hpcgpu page did not show the run {name!r}").replace(",", ""))
            second = int(_wait(lambda: (s := step_shown()) and int(s.replace(",", "")) > first and s, 20,
                               f"the step shown stayed at {first}").replace(",", ""))
            assert second > first
            _wait(lambda: browser.execute_script(
                "return document.querySelectorAll('.run .spark polyline').length >= 3"
                " && document.querySelectorAll('.run .partitions tr').length >= 3"), 10,
                "diagnostics sparklines and partitions did not appear")
            # The page's own stylesheet applies (a separate file now): the header is laid out as flex.
            assert browser.execute_script("return getComputedStyle(document.querySelector('header')).display") == "flex"
            assert "not available" in browser.find_element("id", "gpus").text or "utilisation" in \
                browser.find_element("id", "gpus").text
            path = _screenshot(browser, "dashboard-hpcgpu.png")
            assert path.stat().st_size > 10_000
    finally:
        browser.quit()
    assert outcome["step"] >= second


# What a Bokeh panel shows, read from the browser: the rendered text (inside Bokeh's shadow DOM),
# the table's rows as drawn, the canvases drawn, and a named model's data.
_PANEL_STATE = """
const texts = [], rows = [];
let canvases = 0;
(function walk(root) {
  for (const el of root.querySelectorAll("*")) {
    if (el.tagName === "CANVAS" && el.width > 0 && el.height > 0) canvases++;
    if (el.classList.contains("slick-row"))
      rows.push(Array.from(el.querySelectorAll(".slick-cell"), cell => cell.textContent));
    if (el.shadowRoot) {
      for (const node of el.shadowRoot.childNodes)
        if (node.nodeType === Node.TEXT_NODE || node.tagName === "DIV") texts.push(node.textContent);
      walk(el.shadowRoot);
    }
  }
})(document);
const doc = window.Bokeh && Bokeh.documents.length ? Bokeh.documents[0] : null;
const model = doc ? doc.get_model_by_name(arguments[0]) : null;
let data = null;
if (model && model.data) {
  data = {};
  for (const [key, column] of (model.data instanceof Map ? model.data : Object.entries(model.data)))
    data[key] = Array.from(column, value => typeof value === "number" && !isFinite(value) ? null : value);
}
return JSON.stringify({text: texts.join(" "), rows, canvases, data, title: document.title,
                       model_text: model && model.text !== undefined ? model.text : null,
                       model_title: model && model.title ? model.title.text : null});
"""


def test_browser_shows_each_hpcgpu_panel_with_live_values_of_a_running_simulation(client):
    name = "panels-unstable-jet"
    browser = _browser()

    def state(model_name):
        return json.loads(browser.execute_script(_PANEL_STATE, model_name))

    def run_row():
        return next((row for row in state("hpcgpu-runs")["rows"] if row and row[0] == name), None)

    def steps_per_s(row):
        return float(row[3].replace(",", "")) if row and row[3] != "-" else 0.0  # "-": none yet (NaN)

    try:
        with _running(client, name) as outcome:
            browser.get(client.dashboard_link)  # dask's status page: the panels sit in its "More..." menu
            _wait(lambda: "Dask" in browser.title, 20, "the dask status page did not load")
            menu = browser.execute_script(
                "return Array.from(document.querySelectorAll('.dropdown-content a'), a => a.textContent.trim())")
            assert "Task Stream" in menu and {n for n, _ in PANELS.values()} <= set(menu)

            browser.get(_base(client) + "/individual-hpcgpu-runs")
            assert browser.title == "Dask: hpcgpu Runs"
            # The table as drawn shows the run and a positive steps/s, then a later step: live values.
            row = _wait(lambda: (r := run_row()) and steps_per_s(r) > 0 and r, 30,
                        f"the runs table did not show {name!r} with steps/s > 0")
            first = int(row[2].replace(",", ""))
            later = _wait(lambda: (r := run_row()) and int(r[2].replace(",", "")) > first and r, 20,
                          f"the runs table's step stayed at {first}")
            assert later[1] == "running" and steps_per_s(later) > 0 and later[7] == "2 x 2"
            rates = state("hpcgpu-rates")
            assert rates["canvases"] > 0 and name in rates["data"]["name"]
            assert all(y > 0 for y in rates["data"]["ys"][rates["data"]["name"].index(name)])
            _screenshot(browser, "dashboard-panel-runs.png")

            browser.get(_base(client) + "/individual-hpcgpu-diagnostics")
            diagnostics = _wait(lambda: (d := state("hpcgpu-diagnostics"))["data"] and
                                len(d["data"].get("step", [])) >= 3 and d, 30, "no diagnostics in the panel")
            assert {"energy", "mass", "enstrophy"} <= set(diagnostics["data"]) and diagnostics["canvases"] >= 3
            assert all(v > 0 for v in diagnostics["data"]["mass"])
            assert f"{name}:" in diagnostics["text"]  # the run's line above the plots
            energy = state("hpcgpu_diagnostic_energy")
            assert energy["model_title"].startswith("energy: ")  # with the last value
            shown = len(diagnostics["data"]["step"])
            _wait(lambda: len(state("hpcgpu-diagnostics")["data"]["step"]) > shown, 20,
                  "the diagnostics panel did not grow")
            _screenshot(browser, "dashboard-panel-diagnostics.png")

            browser.get(_base(client) + "/individual-hpcgpu-partitions")
            partitions = _wait(lambda: (d := state("hpcgpu-partitions"))["data"] and d["data"]["worker"] and d, 30,
                               "no partitions in the panel")
            assert sorted(partitions["data"]["worker"]) == sorted(client.scheduler_info()["workers"])
            # the grid's blocks are counted in cells: 96 x 64 of them
            assert sum(partitions["data"]["items"]) == 96 * 64 and partitions["data"]["partitions"] == [1, 1]
            assert partitions["canvases"] > 0
            assert state("hpcgpu_partitions")["model_title"] == f"{name}: 2 partitions on 2 workers (cells per worker)"
            _screenshot(browser, "dashboard-panel-partitions.png")

            browser.get(_base(client) + "/individual-hpcgpu-gpus")
            gpus = _wait(lambda: (d := state("hpcgpu-gpu-status"))["model_text"] and "asking" not in d["model_text"]
                         and d, 20, "the GPU panel did not get the workers' answer")
            if gpu_stats()["available"]:
                table = state("hpcgpu-gpus")["data"]
                assert table["label"] and all(0 <= u <= 100 for u in table["utilization"])
                assert all(m > 0 for m in table["memory_total"])
            else:  # this machine: the workers have no GPU, and the panel says so and why
                assert "no GPU" in gpus["text"] and "NVML" in gpus["text"]
                assert state("hpcgpu-gpus")["data"]["label"] == []
            _screenshot(browser, "dashboard-panel-gpus.png")
    finally:
        browser.quit()
    assert outcome["step"] >= int(later[2].replace(",", ""))
