"""The hpcgpu page in the dask dashboard: its data, its publishing, and a real browser on it.

The browser test needs Debian's ``chromium`` and ``chromium-driver`` and the
``selenium`` package; without them it skips, and fails instead under CI
(``CI`` set) or with ``HPCGPU_REQUIRE_BROWSER=1``. Its screenshots go to
``test-artifacts/`` at the top of the repository (or ``$HPCGPU_TEST_ARTIFACTS``).
"""

import asyncio
import json
import os
import shutil
import sys
import threading
import time
import urllib.request
import types
from pathlib import Path

import pytest

from hpcgpu import Simulation, _dashboard_plugin, dashboard
from hpcgpu._dashboard_plugin import DashboardPlugin, gpu_stats
from hpcgpu.cluster import cluster
from hpcgpu.workloads.weather import ShallowWater

ARTIFACTS = Path(os.environ.get("HPCGPU_TEST_ARTIFACTS") or Path(__file__).resolve().parents[1] / "test-artifacts")
REQUIRE_BROWSER = (os.environ.get("HPCGPU_REQUIRE_BROWSER", "0") not in ("", "0")
                   or os.environ.get("CI", "").lower() not in ("", "0", "false"))


def _get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read().decode()


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
    again = cluster(client.scheduler.address, quiet=False)  # the plugin is registered already: a no-op
    try:
        err = capsys.readouterr().err
        page = dashboard.page_link(again)
        assert page.endswith("/hpcgpu") and page.startswith(client.dashboard_link.rsplit("/", 1)[0])
        assert f"dask dashboard at {again.dashboard_link}, hpcgpu page at {page}" in err
    finally:
        again.close()


def test_page_is_self_contained_html_that_polls_data_json(client):
    for suffix in ("", "/"):
        status, content_type, body = _get(dashboard.page_link(client) + suffix)
        assert status == 200 and content_type.startswith("text/html")
        assert "data.json" in body and "fetch(" in body
        assert "<script src" not in body and "http://" not in body.replace("http://www.w3.org/2000/svg", "")


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
    series = run["series"]
    assert series["step"] == [r["step"] for r in sim._records]
    for key in ("energy", "mass"):
        assert series[key] == pytest.approx(list(sim.diagnostics[key].values), rel=1e-12)
    assert set(run["workers"]) == set(sim._executor.workers)
    assert sum(w["partitions"] for w in run["workers"].values()) == 3
    assert sum(w["rows"] for w in run["workers"].values()) == 48 and run["unit"] == "rows"


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
    run = _wait_for_run(client, "dashboard-failing-jet", lambda r: r["step"] == 40)
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
    monkeypatch.setitem(_dashboard_plugin._NVML, "pid", None)
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


def test_publishing_is_rate_limited_and_never_raises():
    local = Simulation(_jet(8, 8), stop_steps=2, progress=False)
    assert dashboard.publish(local) is False  # no cluster: nothing to publish to
    local.run()

    class Broken:
        _executor = property(lambda self: 1 / 0)

    assert dashboard.publish(Broken()) is False


def test_a_run_publishes_about_once_a_second(client, monkeypatch):
    sent = []
    monkeypatch.setattr(dashboard, "_deliver", lambda client, record: _record(sent, record))
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
    stop = threading.Event()
    outcome = {}

    def stop_when_asked(sim):
        if stop.is_set():
            raise _Stop

    def run():
        sim = Simulation(_jet(96, 64), progress=False, client=client, partitions=2, steps_per_task=2, name=name)
        sim.add_callback(stop_when_asked, 20)
        try:
            sim.run(wall_time_limit=60)
        except _Stop:
            pass
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            outcome["error"] = error
        outcome["step"] = sim.step

    thread = threading.Thread(target=run, name=name, daemon=True)
    browser = _browser()
    thread.start()
    try:
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
        assert "not available" in browser.find_element("id", "gpus").text or "utilisation" in \
            browser.find_element("id", "gpus").text
        path = _screenshot(browser, "dashboard-hpcgpu.png")
        assert path.stat().st_size > 10_000
    finally:
        stop.set()
        browser.quit()
        thread.join(timeout=30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["step"] >= second
