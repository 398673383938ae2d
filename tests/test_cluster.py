"""Clusters: local CPU and GPU clusters, connecting by address, batch scripts."""

import json
import os
import shlex
import subprocess
import sys

import pytest
from _support import usable_backend

dask = pytest.importorskip("dask")  # a bare GPU image lacks it: skip there

import hpcgpu
from hpcgpu import Simulation
from hpcgpu.cluster import (LOCAL_CLUSTER_CONFIG, close_client, slurm_cluster, start_cluster, worker_environment,
                            worker_info)
from hpcgpu.errors import ClusterError, ConfigError
from hpcgpu.workloads.weather import ShallowWater


@pytest.fixture(autouse=True)
def _dask_default_client_and_scheduler_restored():
    """Each test here starts and closes clients of its own: afterwards, dask's default client and its
    ``scheduler`` option must be the ones before the test (a later test's to_zarr computes with them: with the
    option left at "dask.distributed" and no default client it raised, with a dead one it hung). A test that
    leaves another default client fails: start_cluster() leaking one is the bug users would hit (a Client
    whose constructor failed stayed the default and hung every later computation), which this fixture used
    to hide by registering the previous default again on top of it."""
    import dask
    from distributed.client import _get_global_client, _set_global_client

    scheduler, default = dask.config.get("scheduler", None), _get_global_client()
    yield
    left = _get_global_client()
    if scheduler is None:
        dask.config.config.pop("scheduler", None)
    else:
        dask.config.set(scheduler=scheduler)
    if left is not default:
        if left is not None:
            left.close()
        _set_global_client(default)
        pytest.fail(f"the test left {left!r} ({getattr(left, 'status', None)}) as dask's default client "
                    f"instead of {default!r}")


def _worker_settings(client, keys):
    """``[[value of each key] per worker]`` of dask's config on the workers."""
    return list(client.run(lambda keys: [dask.config.get(k) for k in keys], list(keys)).values())


def _scheduler_tick_ms(client):
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.periodic_callbacks["tick"].callback_time)


def _dask_default(key):
    return dask.config.get(key, config=dask.config.merge(*dask.config.defaults))


def test_hpcgpu_cluster_is_the_module_and_start_cluster_the_function():
    import types

    import hpcgpu.cluster as module

    assert isinstance(module, types.ModuleType) and hpcgpu.cluster is module
    assert hpcgpu.cluster.LOCAL_CLUSTER_CONFIG is LOCAL_CLUSTER_CONFIG  # the README's path to it
    assert hpcgpu.start_cluster is start_cluster and "start_cluster" in hpcgpu.__all__


def test_the_old_call_hpcgpu_cluster_still_works_for_a_release_with_a_deprecation_warning(monkeypatch):
    with pytest.warns(DeprecationWarning, match=r"call hpcgpu\.start_cluster") as warned:
        with pytest.raises(ConfigError, match="workers"):
            hpcgpu.cluster(workers=0, quiet=True)  # the real function, stopped by its input check
    assert warned[0].filename == __file__  # the warning points at the caller's line
    calls = []
    monkeypatch.setattr(hpcgpu.cluster, "start_cluster", lambda *args, **kwargs: calls.append((args, kwargs)) or "c")
    with pytest.warns(DeprecationWarning):
        assert hpcgpu.cluster("tcp://host:8786", workers=2) == "c"
    with pytest.warns(DeprecationWarning):
        assert hpcgpu.cluster.cluster(workers=1) == "c"  # ``from hpcgpu.cluster import cluster`` too
    assert calls == [(("tcp://host:8786",), {"workers": 2}), ((), {"workers": 1})]


def test_local_cpu_cluster_listens_on_localhost_and_prints_the_dashboard(capsys):
    client = hpcgpu.start_cluster(workers=2, gpus=False, dashboard_address="127.0.0.1:0")
    try:
        assert client.scheduler.address.startswith("tcp://127.0.0.1:")
        workers = worker_info(client)
        assert len(workers) == 2 and all(w.startswith("tcp://127.0.0.1:") for w in workers)
        assert "127.0.0.1" in client.dashboard_link
        assert client.dashboard_link in capsys.readouterr().err
        threads = client.run(lambda: os.environ["NUMBA_NUM_THREADS"])
        assert set(threads.values()) == {str(max(1, len(os.sched_getaffinity(0)) // 2))}
        # dask's periodic work wakes less often than dask's defaults, to leave the cores to the kernels
        assert _worker_settings(client, LOCAL_CLUSTER_CONFIG) == [list(LOCAL_CLUSTER_CONFIG.values())] * 2
        assert all(_dask_default(k) != v for k, v in LOCAL_CLUSTER_CONFIG.items())
        # the scheduler runs here: it was started under the same settings
        assert _scheduler_tick_ms(client) == 200
    finally:
        close_client(client)


def test_settings_the_user_chose_reach_the_workers():
    chosen = {"distributed.worker.profile.interval": "20ms", "distributed.admin.tick.interval": "50ms"}
    with dask.config.set(chosen):
        client = start_cluster(workers=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        assert _worker_settings(client, chosen) == [list(chosen.values())]
        # the ones left alone still get hpcgpu's setting
        monitor = "distributed.admin.system-monitor.interval"
        assert _worker_settings(client, [monitor]) == [[LOCAL_CLUSTER_CONFIG[monitor]]]
    finally:
        close_client(client)


def test_dask_defaults_keeps_dasks_own_intervals():
    client = start_cluster(workers=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True, dask_defaults=True)
    try:
        assert _worker_settings(client, LOCAL_CLUSTER_CONFIG) == [[_dask_default(k) for k in LOCAL_CLUSTER_CONFIG]]
        assert _scheduler_tick_ms(client) == 20
    finally:
        close_client(client)
    with pytest.raises(ConfigError, match="dask_defaults must be True or False"):
        start_cluster(workers=1, gpus=False, dask_defaults="yes")


def test_worker_info_does_not_read_the_clients_cached_identity():
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, protocol="tcp", dashboard_address=":0", host="127.0.0.1") as local:
        from distributed import Client

        with Client(local) as client:
            # what the client's periodic refresh leaves when it lands after
            # scheduler_info()'s own fetch: an identity without workers
            async def refresh_without_workers(n_workers=0):
                client._scheduler_identity = await client.scheduler.identity(n_workers=0)

            client._update_scheduler_info = refresh_without_workers
            assert client.scheduler_info()["workers"] == {}
            assert list(worker_info(client)) == list(local.scheduler.workers)


def test_worker_environment_gives_hand_started_workers_the_same_settings():
    # dask reads these variables into its config when it is imported: what
    # `dask worker` started with them would see
    env = {**os.environ, **worker_environment()}
    script = "import dask, json, sys; print(json.dumps([dask.config.get(k) for k in sys.argv[1:]]))"
    seen = subprocess.run([sys.executable, "-c", script, *LOCAL_CLUSTER_CONFIG], env=env, capture_output=True,
                          text=True, check=True)
    assert json.loads(seen.stdout) == list(LOCAL_CLUSTER_CONFIG.values())
    # and the CLI prints them as NAME=value lines
    printed = subprocess.run([sys.executable, "-P", "-m", "hpcgpu.cli", "info", "--worker-env"], capture_output=True,
                             text=True, check=True)
    assert dict(line.split("=", 1) for line in printed.stdout.split()) == worker_environment()


def test_connect_to_a_running_scheduler_by_address():
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, protocol="tcp", dashboard_address=":0",
                      host="127.0.0.1") as running:
        assert running.scheduler_address.startswith("tcp://")
        client = start_cluster(running.scheduler_address, quiet=True)
        try:
            assert client.submit(sum, [1, 2, 3]).result() == 6
        finally:
            client.close()


def test_bad_cluster_requests():
    with pytest.raises(ConfigError, match="rmm_pool_size and device_memory_limit apply to GPU clusters"):
        start_cluster(gpus=False, rmm_pool_size="1GB", quiet=True)
    with pytest.raises(ConfigError, match="workers must be >= 1"):
        start_cluster(workers=0, quiet=True)
    with pytest.raises(ConfigError, match="gpus must be"):
        start_cluster(gpus="some", quiet=True)
    with pytest.raises(ConfigError, match="address must look like"):
        start_cluster("nowhere", quiet=True)
    with pytest.raises(ConfigError, match="either address"):
        start_cluster("tcp://127.0.0.1:8786", jobqueue={}, quiet=True)
    # not silently ignored: a joined scheduler keeps its workers
    with pytest.raises(ConfigError, match="^workers, rmm_pool_size shape a new cluster; the scheduler at "
                                          "'tcp://127.0.0.1:8786' keeps the workers it has"):
        start_cluster("tcp://127.0.0.1:8786", workers=4, rmm_pool_size="1GB", quiet=True)


def test_gpus_required_without_a_gpu_is_a_cluster_error():
    from hpcgpu.backends import backend_status

    if backend_status("cupy").usable:
        pytest.skip("a GPU is usable here")
    with pytest.raises(ClusterError, match="no GPU is usable"):
        start_cluster(gpus=True, quiet=True)


def test_slurm_job_script_for_cpu_and_gpu_nodes():
    cpu = slurm_cluster(queue="compute", account="climate", cores=8, memory="32GB", walltime="02:00:00")
    try:
        script = cpu.job_script()
    finally:
        cpu.close()
    assert "#SBATCH -p compute" in script and "#SBATCH -A climate" in script
    assert "#SBATCH -t 02:00:00" in script and "export NUMBA_NUM_THREADS=8" in script
    assert "distributed.cli.dask_worker" in script
    # the workers start with the local clusters' quieter dask settings
    assert all(f"export {name}={shlex.quote(str(value))}" in script for name, value in worker_environment().items())
    # and bash reads the dict-valued one back unchanged (quoted: braces would expand)
    name = "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"
    line = next(line for line in script.splitlines() if line.startswith(f"export {name}="))
    echoed = subprocess.run(["bash", "-c", f"{line}; printf %s \"${name}\""], capture_output=True, text=True)
    assert echoed.stdout == worker_environment()[name]
    gpu = slurm_cluster(gpus=4, queue="gpu", cores=16, memory="128GB",
                        job_script_prologue=["export DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL=1s"])
    try:
        script = gpu.job_script()
    finally:
        gpu.close()
    assert "#SBATCH --gres=gpu:4" in script and "-m dask_cuda.cli" in script
    # a user's own export comes after hpcgpu's, so it wins
    exports = [line for line in script.splitlines() if "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL" in line]
    assert exports == ["export DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL=200ms",
                       "export DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL=1s"]
    plain = slurm_cluster(dask_defaults=True)
    try:
        assert "DASK_" not in plain.job_script()
    finally:
        plain.close()


@pytest.mark.gpu
def test_gpu_cluster_runs_partitions_on_the_gpu_with_an_rmm_pool():
    backend = usable_backend("cuda")
    if backend.simulated:
        pytest.skip("the CUDA simulator is not a GPU")
    pytest.importorskip("dask_cuda")
    rmm = pytest.importorskip("rmm")
    client = start_cluster(rmm_pool_size="2GB", dashboard_address="127.0.0.1:0", quiet=True)
    try:
        assert set(client.run(lambda: hpcgpu.get_backend("auto").name).values()) == {"cuda"}
        assert all(v.endswith("0") or v == "0" for v in client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]).values())
        assert set(client.run(lambda: type(rmm.mr.get_current_device_resource()).__name__).values()) <= {
            "PoolMemoryResource", "StatisticsResourceAdaptor", "TrackingResourceAdaptor"}
        model = ShallowWater("unstable_jet", nx=256, ny=128, backend="auto", dtype="float64")
        state = model.initial_state()
        dt = model.suggested_dt(state)
        local = ShallowWater("unstable_jet", nx=256, ny=128, backend="cuda", dtype="float64")
        expected = Simulation(local, local.initial_state(), dt=dt, stop_steps=60, progress=False).run()
        sim = Simulation(model, state, dt=dt, stop_steps=60, progress=False, client=client, partitions=2,
                         steps_per_task=4).run()
        got = sim.state
        for name in ("u", "v", "h"):
            assert (backend.to_host(getattr(got, name)) == backend.to_host(getattr(expected.state, name))).all()
    finally:
        local_cluster = client.cluster
        client.close()
        local_cluster.close()


def test_local_workers_keep_glibcs_own_malloc_thresholds():
    """dask's nannies set MALLOC_TRIM_THRESHOLD_=65536, which fixes glibc's thresholds: every large array
    is a fresh mmap and its page faults (the LJ step 32% slower). Local clusters leave it out."""
    code = """
import os
from hpcgpu.cluster import close_client, start_cluster
if __name__ == "__main__":
    client = start_cluster(workers=1, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    print(list(client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_").values()), os.environ.get("OMP_NUM_THREADS"))
    close_client(client)
"""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    result = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[0] == "[None]"



def test_a_script_without_the_main_guard_gets_an_error_that_says_what_to_do(tmp_path):
    """Local workers re-import the script that started them; one that starts a cluster at its top
    level used to end in multiprocessing's freeze_support() page and "Nanny failed to start"."""
    script = tmp_path / "unguarded.py"
    script.write_text("from hpcgpu.cluster import start_cluster\n"
                      "client = start_cluster(workers=1, threads_per_worker=1, gpus=False, "
                      "dashboard_address='127.0.0.1:0', quiet=True, timeout=30)\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert result.returncode != 0
    assert "ConfigError: start_cluster() ran while a dask worker process was importing your script" in result.stderr
    assert str(script) in result.stderr and 'if __name__ == "__main__":' in result.stderr


def _own_processes_and_ports():
    """This test process's child processes (not multiprocessing's resource tracker) and listening ports."""
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    children = [p.pid for p in me.children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
    return children, sorted(c.laddr.port for c in me.net_connections() if c.status == "LISTEN")


def _wait_for_nothing_left(before, seconds=10.0):
    import time

    deadline = time.monotonic() + seconds
    while _own_processes_and_ports() != before and time.monotonic() < deadline:
        time.sleep(0.2)
    return _own_processes_and_ports()


def test_client_close_stops_the_local_cluster_it_started():
    # the documented way to finish (client.close()) used to leave the workers and the dashboard port running
    # until the process ended: a notebook that ran the cell again got a second cluster on another port
    before = _own_processes_and_ports()
    client = start_cluster(workers=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    cluster = client.cluster
    assert _own_processes_and_ports() != before
    client.close()
    assert cluster.status.name == "closed"
    assert _wait_for_nothing_left(before) == before
    cluster.close()  # what notebooks still do after client.close(): harmless


def test_a_client_that_cannot_connect_leaves_no_cluster_behind():
    # the cluster is up before its client connects; a client that failed (here: a tiny timeout) used to
    # leave the cluster's worker and ports with nothing referring to them, and a bare TimeoutError
    before = _own_processes_and_ports()
    with pytest.raises(ClusterError, match="could not connect to its scheduler"):
        start_cluster(workers=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True, timeout=1e-4)
    assert _wait_for_nothing_left(before) == before


@pytest.mark.parametrize(("options", "message"), [
    ({"protocol": "foo"}, "protocol must be one of 'tcp', 'tls', 'ucx'"),
    ({"protocol": "ucx"}, "protocol='ucx' needs UCX"),
    ({"host": ""}, "host must be"),
    ({"host": 5}, "host must be"),
    ({"dashboard_address": "nonsense"}, "dashboard_address must be 'host:port'"),
    ({"dashboard_address": "127.0.0.1:99999"}, "dashboard_address must be"),
    ({"quiet": "no"}, "quiet must be True or False"),
    ({"security": "yes"}, "security must be a distributed.Security"),
    ({"jobqueue": "slurm"}, "jobqueue must be a dict"),
    ({"address": "tcp://127.0.0.1:notaport"}, "address must look like"),
    ({"address": "ftp://127.0.0.1:8786"}, "address must look like"),
    ({"address": "tcp://127.0.0.1:8786", "tls": True, "security": "certificates"}, "security must be"),
    ({"protocol": "tcp", "security": "temporary"}, "security holds TLS certificates"),
])
def test_bad_options_name_the_option_instead_of_a_dask_traceback(options, message):
    # each of these used to fail inside dask ("Cluster failed to start: Scheduler failed to start.", a
    # TypeError or ValueError) or, for host="", to listen on every interface
    from hpcgpu._gpu_probe import module_installed

    if options.get("protocol") == "ucx" and module_installed("distributed_ucxx"):
        pytest.skip("UCX is installed here")
    if options.get("security") == "temporary":
        from distributed import Security

        options = {**options, "security": Security.temporary()}
    with pytest.raises(ConfigError, match=message):
        # workers only for a new cluster (with an address it is an error of its own)
        start_cluster(**{"gpus": False, "timeout": 2, "quiet": True, **({} if "address" in options else {"workers": 1}),
                         **options})


def _certificates(require_encryption):
    """A Security holding a fresh certificate authority's certificates, as a user would build from files."""
    from distributed import Security

    made = Security.temporary()
    return Security(require_encryption=require_encryption, **{
        key: getattr(made, key) for key in ("tls_ca_file", "tls_scheduler_cert", "tls_scheduler_key",
                                            "tls_worker_cert", "tls_worker_key", "tls_client_cert",
                                            "tls_client_key")})


@pytest.mark.parametrize("options", [{"protocol": "tls"}, {"protocol": "tls://"},
                                     {"security": "certificates"}, {"security": "certificates", "tls": True}])
def test_every_way_of_asking_for_tls_gives_a_tls_cluster(options):
    # protocol="tls" alone used to fail inside dask, and certificates without require_encryption=True
    # (Security(tls_ca_file=...)'s default) started a plain tcp cluster without a word
    if options.get("security") == "certificates":
        options = {**options, "security": _certificates(require_encryption=False)}
    client = start_cluster(workers=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True, **options)
    try:
        assert client.scheduler.address.startswith("tls://127.0.0.1:")
        assert all(w.startswith("tls://") for w in worker_info(client))
        assert client.submit(sum, [1, 2]).result() == 3
    finally:
        close_client(client)


def test_tls_to_a_scheduler_by_a_tcp_address_is_refused_not_sent_in_the_clear():
    with pytest.raises(ConfigError, match="is not tls://"):
        start_cluster("tcp://127.0.0.1:8786", tls=True, security=_certificates(require_encryption=False),
                      quiet=True, timeout=1)


def test_tls_and_security_reach_a_batch_cluster(monkeypatch):
    # start_cluster(jobqueue=..., tls=True) used to start a plain tcp scheduler for the jobs; the batch
    # cluster is not started here (no Slurm), only what it is asked for is checked
    from distributed import Security

    asked = {}

    def fake_slurm_cluster(**kwargs):
        asked.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(hpcgpu.cluster, "slurm_cluster", fake_slurm_cluster)
    with pytest.raises(RuntimeError, match="stop here"):
        start_cluster(jobqueue={"queue": "compute"}, tls=True, quiet=True)
    assert asked["protocol"] == "tls" and isinstance(asked["security"], Security) and asked["queue"] == "compute"
    with pytest.raises(RuntimeError, match="stop here"):
        start_cluster(jobqueue={"queue": "compute", "protocol": "tcp"}, quiet=True)
    assert asked["protocol"] == "tcp"  # the dict's own choice wins


def test_a_second_local_cluster_while_the_first_runs_warns_and_names_it():
    """A notebook cell run twice: the first cluster keeps its workers until its client is closed."""
    def start():
        return start_cluster(workers=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)

    def named(caught, client):
        return any(str(client.dashboard_link) in str(w.message) for w in caught)

    # clients closed in the reverse order of their start: dask restores its scheduler option on close
    first = start()
    try:
        with pytest.warns(ResourceWarning, match="an earlier start_cluster.. call started") as caught:
            second = start()
        second_link = second.dashboard_link
        second.close()
        assert named(caught, first)
        with pytest.warns(ResourceWarning) as caught:
            start().close()
        assert named(caught, first) and not any(str(second_link) in str(w.message) for w in caught)
    finally:
        first.close()


def test_a_client_that_fails_to_connect_leaves_dask_s_scheduler_option_as_it_was():
    """Else every later dask computation in the process (xarray's to_zarr) asks for a client that is not there."""
    import dask
    from distributed.client import _get_global_client

    before, default = dask.config.get("scheduler", None), _get_global_client()
    for address in ("tcp://127.0.0.1:notaport", "ftp://127.0.0.1:8786"):
        with pytest.raises(ConfigError, match="address must look like"):
            start_cluster(address, quiet=True)
        # nor is the failed client dask's default client (later computations queued on it and hung)
        assert _get_global_client() is default
    assert dask.config.get("scheduler", None) == before


def test_dask_computations_after_a_start_cluster_that_failed_do_not_hang(tmp_path):
    """A Client makes itself dask's default client before it connects; one whose constructor failed (here: an
    address dask cannot parse) stayed the default, "connecting" for ever, and every later dask computation in
    the process queued its tasks on it and hung: a Zarr write with dask, xarray reading a Zarr store's values
    (seen as test_cluster.py followed by a Zarr test hanging, py-spy: Client.gather <- Client.get <- compute).
    The exception is kept, as a notebook keeps the last one, and the garbage collector run, so that the
    failed client is not freed by luck. Run in a subprocess with a timeout: the bug hangs."""
    pytest.importorskip("zarr")
    code = """
import gc, sys
import dask.array as da
from distributed.client import _get_global_client
from hpcgpu.cluster import start_cluster
from hpcgpu.errors import ConfigError
if __name__ == "__main__":
    kept = []
    for address in ("tcp://127.0.0.1:notaport", "ftp://127.0.0.1:8786"):
        try:
            start_cluster(address, quiet=True, timeout=5)
        except ConfigError as error:
            kept.append(error)  # what a notebook's sys.last_value does
    gc.collect()
    print("default client:", _get_global_client(), flush=True)
    da.arange(16, chunks=4).to_zarr(sys.argv[1])
    print("sum:", int(da.from_zarr(sys.argv[1]).sum().compute()), flush=True)
"""
    try:
        result = subprocess.run([sys.executable, "-P", "-c", code, str(tmp_path / "after.zarr")], capture_output=True,
                                text=True, timeout=120)
    except subprocess.TimeoutExpired as hung:
        printed = hung.stdout.decode() if isinstance(hung.stdout, bytes) else hung.stdout
        pytest.fail(f"the dask computations after a failed start_cluster() hung; the script had printed: {printed!r}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["default client: None", "sum: 120"]


def test_a_batch_cluster_leaves_ctrl_c_as_it_was():
    """dask-jobqueue, when first imported, makes SIGINT call sys.exit() in the whole process: after
    slurm_cluster(), Ctrl-C raised SystemExit instead of KeyboardInterrupt (seen as test_simulation's Ctrl-C
    tests failing after test_cluster.py). A subprocess: dask-jobqueue is imported once per process."""
    pytest.importorskip("dask_jobqueue")
    code = """
import signal
from hpcgpu.cluster import slurm_cluster
if __name__ == "__main__":
    slurm_cluster(queue="compute").close()
    print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""
    result = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True"]
