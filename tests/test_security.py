"""Secure defaults, TLS, and a real multi-node run over network namespaces.

The multi-node tests build three Linux network namespaces joined by veth
pairs to a bridge (a scheduler "node" and two worker "nodes", each with its
own IP address), start ``dask scheduler`` and ``dask worker`` processes
inside them, and drive the weather model from this process over TCP and
then TLS, and cut one worker node off the network in the middle of a run.
They need root (and iproute2); elsewhere they are skipped with that reason,
and fail instead where they are required (``CI`` set, or
``HPCGPU_REQUIRE_NETNS=1``: ``.ci/run`` sets it).
"""

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu.cluster import start_cluster, worker_info
from hpcgpu.errors import ClusterError, ConfigError
from hpcgpu.workloads.weather import ShallowWater


def test_local_cluster_binds_the_scheduler_and_dashboard_to_localhost():
    client = start_cluster(workers=1, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        assert client.scheduler.address.startswith("tcp://127.0.0.1:")
        assert client.dashboard_link.startswith("http://127.0.0.1:")
        assert all(w.startswith("tcp://127.0.0.1:") for w in worker_info(client))
    finally:
        local = client.cluster
        client.close()
        local.close()


def _refused(address, security=None):
    from distributed import Client

    with pytest.raises(Exception) as info:  # noqa: PT011 - OSError, TimeoutError or an SSL error
        Client(address, security=security, timeout=3)
    return info.value


def test_tls_cluster_lets_in_only_holders_of_its_certificates():
    from distributed import Security

    client = start_cluster(workers=1, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", tls=True,
                     quiet=True)
    try:
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        assert client.submit(sum, [1, 2, 3]).result() == 6
        _refused(address.replace("tls://", "tcp://"))  # no certificate, no TLS
        _refused(address, Security.temporary())  # a certificate from another authority
        assert len(worker_info(client)) == 1
    finally:
        local = client.cluster
        client.close()
        local.close()
    with pytest.raises(ConfigError, match="tls=True with an address needs security"):
        start_cluster("tls://127.0.0.1:1", tls=True)
    with pytest.raises(ConfigError, match="tls must be True or False"):
        start_cluster(workers=1, tls="yes")


# -- many nodes over network namespaces ---------------------------------------------------
REQUIRE_NETNS = (os.environ.get("HPCGPU_REQUIRE_NETNS", "0") not in ("", "0")
                 or os.environ.get("CI", "").lower() not in ("", "0", "false"))


def _cannot_run(reason):
    """Skip, or fail where the multi-node tests are required (CI, HPCGPU_REQUIRE_NETNS=1)."""
    if REQUIRE_NETNS:
        pytest.fail(f"{reason} (required here: CI or HPCGPU_REQUIRE_NETNS=1)")
    pytest.skip(reason)

_TAG = f"hg{os.getpid() % 10000}"
_SUBNET = f"10.{70 + os.getpid() % 50}.{os.getpid() % 250}"
NODES = {"scheduler": f"{_SUBNET}.2", "worker-a": f"{_SUBNET}.3", "worker-b": f"{_SUBNET}.4"}


def _ip(*args, namespace=None):
    command = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace, "ip", *args]
    subprocess.run(command, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def network():
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None:
        _cannot_run("creates network namespaces and a bridge: needs root and iproute2 (ip)")
    bridge = f"{_TAG}br"
    namespaces = {}
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{_SUBNET}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for index, (node, address) in enumerate(NODES.items()):
            namespace = f"{_TAG}-{node}"
            outside, inside = f"{_TAG}v{index}", f"{_TAG}p{index}"
            _ip("netns", "add", namespace)
            namespaces[node] = namespace
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", namespace)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("addr", "add", f"{address}/24", "dev", inside, namespace=namespace)
            _ip("link", "set", inside, "up", namespace=namespace)
            _ip("link", "set", "lo", "up", namespace=namespace)
    except subprocess.CalledProcessError as error:
        _teardown(bridge, namespaces)
        _cannot_run(f"network namespaces unavailable here: {error.stderr.strip()}")
    yield namespaces
    _teardown(bridge, namespaces)


def _teardown(bridge, namespaces):
    for namespace in namespaces.values():
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _start(namespace, *args, log):
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-P", *args], env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def _stop(processes):
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def _tls_files(tmp_path, security):
    """Write a Security object's in-memory PEM contents to files for the dask command lines."""
    paths = {}
    for name, content in (("ca", security.tls_ca_file), ("cert", security.tls_scheduler_cert),
                          ("key", security.tls_scheduler_key)):
        path = tmp_path / f"{name}.pem"
        path.write_text(content)
        paths[name] = str(path)
    return paths


def _cluster_on_nodes(network, tmp_path, tls=None):
    """Scheduler and two workers in their namespaces; returns (address, processes)."""
    scheme = "tls" if tls else "tcp"
    address = f"{scheme}://{NODES['scheduler']}:8786"
    flags = [] if not tls else ["--tls-ca-file", tls["ca"], "--tls-cert", tls["cert"], "--tls-key", tls["key"]]
    log = open(tmp_path / f"cluster-{scheme}.log", "w")
    processes = [_start(network["scheduler"], "-m", "distributed.cli.dask_scheduler", "--host", NODES["scheduler"],
                        "--port", "8786", "--dashboard-address", f"{NODES['scheduler']}:8787", "--protocol", scheme,
                        *flags, log=log)]
    for node in ("worker-a", "worker-b"):
        processes.append(_start(network[node], "-m", "distributed.cli.dask_worker", address, "--host", NODES[node],
                                "--nthreads", "1", "--nworkers", "1", "--name", node, *flags, log=log))
    return address, processes


def test_weather_across_nodes_over_tcp_equals_the_single_process_run(network, tmp_path):
    model = ShallowWater("unstable_jet", nx=48, ny=40, backend="numba")
    reference = Simulation(model, stop_steps=60, progress=False).run()
    address, processes = _cluster_on_nodes(network, tmp_path)
    try:
        client = start_cluster(address, timeout=30, quiet=True)
        client.wait_for_workers(2, timeout=60)
        hosts = sorted(w["host"] for w in worker_info(client).values())
        assert hosts == sorted([NODES["worker-a"], NODES["worker-b"]])  # two machines, as far as dask knows
        sim = Simulation(model, stop_steps=60, progress=False, client=client, partitions=2, steps_per_task=2).run()
        np.testing.assert_array_equal(sim.state.h, reference.state.h)
        np.testing.assert_array_equal(sim.state.u, reference.state.u)
        sim.close()
        client.close()
    finally:
        _stop(processes)


def test_a_worker_node_cut_off_mid_run_is_found_within_10_s_and_the_run_goes_on_without_it(network, tmp_path):
    # no FIN, no RST: the cut node's sockets stay open on every side, and only its silence shows
    model = ShallowWater("unstable_jet", nx=48, ny=40, backend="numba")
    steps, cable = 400, f"{_TAG}v2"  # worker-b's end of its veth pair, on the bridge
    reference = Simulation(model, stop_steps=steps, progress=False).run()
    address, processes = _cluster_on_nodes(network, tmp_path)
    cut, recovered = {}, {}
    try:
        client = start_cluster(address, timeout=30, quiet=True)
        client.wait_for_workers(2, timeout=60)
        victim = next(a for a, w in worker_info(client).items() if w["host"] == NODES["worker-b"])
        sim = Simulation(model, stop_steps=steps, progress=False, client=client, partitions=2, steps_per_task=2)

        def cut_off(simulation):
            if simulation.step == 250 and not cut:
                _ip("link", "set", cable, "down")
                cut["at"] = time.monotonic()

        recover = type(sim)._recover

        def timed_recover(self, error, max_restarts):
            recovered.setdefault("at", time.monotonic())
            return recover(self, error, max_restarts)

        sim._recover = timed_recover.__get__(sim)
        sim.add_callback(cut_off, 50)
        with pytest.warns(RuntimeWarning, match=r"restarted from the checkpoint at step 200 on 1 worker\(s\)"):
            sim.run(checkpoint=tmp_path / "checkpoints", checkpoint_every=100)
        detected = recovered["at"] - cut["at"]
        print(f"the network cut was found {detected:.2f} s after it")  # docs/journal.md (pytest -s)
        assert detected < 10, f"the cut was found {detected:.1f} s after it (the rank timeout is 300 s)"
        assert victim not in worker_info(client)
        assert sim.step == steps
        np.testing.assert_array_equal(sim.state.h, reference.state.h)
        sim.close()
        client.close()
    finally:
        subprocess.run(["ip", "link", "set", cable, "up"], capture_output=True)
        _stop(processes)


def test_tls_across_nodes_admits_only_certificate_holders(network, tmp_path):
    from distributed import Security

    security = Security.temporary()
    files = _tls_files(tmp_path, security)
    address, processes = _cluster_on_nodes(network, tmp_path, tls=files)
    intruder = None
    try:
        trusted = Security(tls_ca_file=files["ca"], tls_client_cert=files["cert"], tls_client_key=files["key"],
                           require_encryption=True)
        client = start_cluster(address, security=trusted, timeout=30, quiet=True)
        client.wait_for_workers(2, timeout=60)
        model = ShallowWater("unstable_jet", nx=32, ny=24, backend="numba")
        reference = Simulation(model, stop_steps=20, progress=False).run()
        sim = Simulation(model, stop_steps=20, progress=False, client=client, partitions=2).run()
        np.testing.assert_array_equal(sim.state.h, reference.state.h)
        sim.close()
        # A worker without the certificates cannot join ...
        log = open(tmp_path / "intruder.log", "w")
        intruder = _start(network["worker-a"], "-m", "distributed.cli.dask_worker", address, "--host",
                          NODES["worker-a"], "--nthreads", "1", "--name", "intruder", log=log)
        time.sleep(8)
        assert len(worker_info(client)) == 2
        assert "intruder" not in {w["name"] for w in worker_info(client).values()}
        # ... and a client without them cannot connect.
        with pytest.raises(ConfigError, match="speaks TLS: pass security"):
            start_cluster(address, timeout=3, quiet=True)
        _refused(address.replace("tls://", "tcp://"))
        with pytest.raises(ClusterError):
            start_cluster(address, security=Security.temporary(), timeout=3, quiet=True)
        client.close()
    finally:
        _stop(processes + ([intruder] if intruder else []))
