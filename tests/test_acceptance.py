"""Cluster acceptance (``hpcgpu bench`` without a suite): records, verdicts, thresholds, the HTML report."""

import json
import os
import statistics
import subprocess
import sys

import pytest

from hpcgpu.bench import acceptance, probes, second_look
from hpcgpu.bench.report import Thresholds, write_html
from hpcgpu.cluster import worker_info
from hpcgpu.errors import ConfigError


def test_quick_acceptance_from_the_command_line_writes_json_lines_and_an_html_report(tmp_path):
    report = tmp_path / "report.html"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, "-P", "-m", "hpcgpu.cli", "bench", "--quick", "--workers", "2",
                             "--report", str(report)], capture_output=True, text=True, timeout=600, env=env,
                            cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr  # 1: some threshold failed on this busy machine
    assert "about" in result.stderr and "min" in result.stderr  # the time estimate comes first
    records = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"inventory", "ceiling", "kernel", "energy", "transfer", "scaling", "verdict", "balance", "summary",
            "run"} <= kinds
    workers = {r["worker"] for r in records if r["kind"] == "inventory"}
    assert len(workers) == 2
    kernels = [r for r in records if r["kind"] == "kernel"]
    assert {r["family"] for r in kernels} == set(probes.FAMILY_MODEL)
    assert all(r["passed"] and r["max_relative_error"] <= r["tolerance"] for r in kernels)
    # a unit error would be off by 1000: the quick SpMV (65,536 rows, banded) is cache-resident and has
    # measured 5.8x the DRAM copy roof here, so the bound leaves room for caches
    assert all(0 < r["fraction_of_roof"] < 20 for r in kernels), [(r["family"], r["fraction_of_roof"]) for r in kernels]
    pairs = {(r["source"], r["destination"]) for r in records if r["kind"] == "transfer"}
    assert len(pairs) == 2 and all(r["bandwidth_bytes_per_s"] > 0 for r in records if r["kind"] == "transfer")
    scaling = {(r["workload"], r["mode"], r["workers"]) for r in records if r["kind"] == "scaling"}
    assert scaling == {(w, m, n) for w in acceptance.WORKLOADS for m in ("strong", "weak") for n in (1, 2)}
    # each count timed in every round, judged by the median of its runs
    for r in (r for r in records if r["kind"] == "scaling"):
        assert len(r["runs_s_per_step"]) == acceptance.SCALING_ROUNDS
        assert r["seconds_per_step"] == statistics.median(r["runs_s_per_step"])
        base = next(b for b in records if b["kind"] == "scaling" and b["workers"] == 1
                    and (b["workload"], b["mode"]) == (r["workload"], r["mode"]))
        share = r["workers"] if r["mode"] == "strong" else 1
        assert r["efficiency"] == base["seconds_per_step"] / (share * r["seconds_per_step"])
        # each weak line on 2 workers carries what 2 copies of the one-worker run reach side by side
        assert ("side_by_side_efficiency" in r) == (r["mode"] == "weak" and r["workers"] == 2)
        if "side_by_side_efficiency" in r:
            assert 0.2 < r["side_by_side_efficiency"] < 2.0
            detail = next(v["detail"] for v in records if v["kind"] == "verdict"
                          and v["subject"] == f"{r['workload']} on 2 workers" and v["check"] == "weak scaling efficiency")
            assert f"2 copies side by side, no engine: {r['side_by_side_efficiency']:.0%}" in detail
    energy = [r for r in records if r["kind"] == "energy"]
    assert all(r["available"] or r["why"] for r in energy)
    summary = [r for r in records if r["kind"] == "summary"][0]
    assert result.returncode == (0 if summary["passed"] else 1)
    page = report.read_text()
    for section in ("summary", "inventory", "ceilings", "roofline", "scaling", "transfers", "energy", "balance"):
        assert f'id="{section}"' in page
    assert page.count("data:image/png;base64,") == 3  # roofline, scaling curves, transfer heatmap
    assert "<script" not in page and 'src="http' not in page  # self-contained: nothing to fetch


def test_a_throttled_worker_is_flagged_as_the_outlier(client):
    workers = sorted(worker_info(client))
    slow, fast = workers[1], workers[0]
    client.run(probes.set_throttle, 3.0, workers=[slow])
    try:
        records = acceptance.run_acceptance(client, quick=True, workloads=(), transfer_bytes=2**20)
    finally:
        client.run(probes.set_throttle, 1.0, workers=[slow])
    verdicts = [r for r in records if r["kind"] == "verdict" and r["check"].endswith("vs peers")
                and r["subject"] in workers]
    failed = {(r["subject"], r["check"]) for r in verdicts if not r["passed"]}
    assert (slow, "copy bandwidth vs peers") in failed and (slow, "GEMM rate vs peers") in failed
    assert not any(subject == fast for subject, _ in failed)
    # below its peer, the throttled worker's kernels were measured twice, and were slow both times
    slow_kernels = [r for r in records if r["kind"] == "kernel" and r["worker"] == slow]
    assert slow_kernels and all(len(r["rates_measured"]) == 2 for r in slow_kernels)
    assert (slow, "stencil/diffusion rate vs peers") in failed
    assert not any("rates_measured" in r for r in records if r["kind"] == "kernel" and r["worker"] == fast)
    summary = records[-2]
    assert summary["kind"] == "summary" and not summary["passed"]
    assert any(line.startswith(slow) for line in summary["failed"])


def _synthetic(devices, rates):
    records = []
    for w, device in devices.items():
        records.append({"kind": "inventory", "worker": w, "device": device})
        records.append({"kind": "ceiling", "worker": w, "copy_bytes_per_s": 1e11, "gemm_flops_per_s": 1e12})
        records.append({"kind": "kernel", "worker": w, "family": "stencil/diffusion", "rate": rates[w],
                        "passed": True, "max_relative_error": 0.0, "tolerance": 1e-12})
    return records


def test_mixed_devices_are_detected_with_relative_speeds_and_weights():
    devices = {"a": "NVIDIA H100", "b": "NVIDIA H100", "c": "NVIDIA A100"}
    verdicts = acceptance.judge(_synthetic(devices, {"a": 3e10, "b": 3e10, "c": 1.5e10}), Thresholds(), list(devices))
    balance = [v for v in verdicts if v["kind"] == "balance"][0]
    assert balance["mixed"] and balance["relative_speed"] == {"a": 1.0, "b": 1.0, "c": 0.5}
    assert balance["partition_weights"] == pytest.approx({"a": 0.4, "b": 0.4, "c": 0.2})
    failed = [v for v in verdicts if v["kind"] == "verdict" and not v["passed"]]
    assert [(v["subject"], v["check"]) for v in failed] == [("c", "stencil/diffusion rate vs peers")]
    uniform = acceptance.judge(_synthetic({"a": "x", "b": "x"}, {"a": 1.0, "b": 1.0}), Thresholds(), ["a", "b"])
    assert not [v for v in uniform if v["kind"] == "balance"][0]["mixed"]
    assert uniform[-1] == {"kind": "summary", "passed": True, "checks": 8, "failed": []}


def test_the_report_renders_from_synthetic_records(tmp_path):
    records = _synthetic({"a": "cpu"}, {"a": 1.0})
    records += acceptance.judge(records, Thresholds(), ["a"])
    path = write_html(records, tmp_path / "r.html")
    assert "PASSED" in path.read_text() and "One worker: no pairs to measure" in path.read_text()


def test_copies_side_by_side_that_cannot_run_leave_the_weak_line_with_the_reason(client, monkeypatch):
    workers = sorted(worker_info(client))
    # a copy that fails on its worker raises on the client
    with pytest.raises(ValueError, match="no-such-workload"):
        acceptance._side_by_side(client, "no-such-workload", workers, 2, True, 1)

    def small_nbody(workload, mode, count, largest, quick):
        from hpcgpu.workloads.astro import NBody

        n = 64 * (count if mode == "weak" else largest)
        model = NBody("plummer", n=n, backend="numpy")
        return model, model.initial_state(), 0.001, 4, 1, n

    def broken(*args):
        raise RuntimeError("the copies could not start")

    monkeypatch.setattr(acceptance, "_scaling_case", small_nbody)
    monkeypatch.setattr(acceptance, "_side_by_side", broken)
    monkeypatch.setattr(acceptance, "SCALING_SECONDS", {True: 0.05, False: 0.05})
    records = []
    acceptance._scaling(client, "nbody", workers, True, None, records)
    weak = next(r for r in records if r["mode"] == "weak" and r["workers"] == 2)
    # the line keeps its efficiency, judged as before; the reason stands in for the figure
    assert weak["side_by_side_error"] == "RuntimeError: the copies could not start"
    assert "side_by_side_efficiency" not in weak and weak["efficiency"] > 0


def test_a_weak_line_is_judged_by_its_threshold_and_shown_beside_the_copies_side_by_side(tmp_path):
    records = _synthetic({"a": "cpu", "b": "cpu"}, {"a": 1.0, "b": 1.0})
    records += [{"kind": "scaling", "workload": "md", "mode": "weak", "workers": 1, "seconds_per_step": 3e-3,
                 "efficiency": 1.0, "size": 6912},
                {"kind": "scaling", "workload": "md", "mode": "weak", "workers": 2, "seconds_per_step": 5e-3,
                 "efficiency": 0.6, "size": 13824, "side_by_side_efficiency": 0.9}]
    verdicts = acceptance.judge(records, Thresholds(), ["a", "b"])
    weak = next(v for v in verdicts if v["kind"] == "verdict" and v["check"] == "weak scaling efficiency")
    # the hardware's ceiling explains a failure; it does not excuse it
    assert not weak["passed"] and weak["detail"] == "60% (threshold 70%; 2 copies side by side, no engine: 90%)"
    page = write_html(records + verdicts, tmp_path / "r.html").read_text()
    assert "side_by_side_efficiency" in page and "0.9" in page


@pytest.mark.parametrize("text, match", [
    ("[thresholds]\npeer_fraction = 1.5\n", r"thresholds.peer_fraction must be a number between 0 and 1; got 1.5"),
    ("[thresholds]\npeer_fraction = 'high'\n", "thresholds.peer_fraction must be a number between 0 and 1"),
    ("[thresholds]\ncorrectness = 1\n", "thresholds.correctness must be true or false; got 1"),
    ("[thresholds]\npeer_fractoin = 0.5\n", "unknown threshold.s. peer_fractoin; valid keys: peer_fraction, "),
    ("[limits]\npeer_fraction = 0.5\n", r"may only hold a \[thresholds\] table; found limits"),
    ("[thresholds\n", "is not valid TOML"),
])
def test_threshold_files_with_bad_keys_or_values_are_clear_errors(tmp_path, text, match):
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        Thresholds.from_toml(path)


def test_threshold_file_values_are_used(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("[thresholds]\nstrong_efficiency = 0.9\ncorrectness = false\n")
    thresholds = Thresholds.from_toml(path)
    assert thresholds.strong_efficiency == 0.9 and not thresholds.correctness and thresholds.peer_fraction == 0.7
    with pytest.raises(ConfigError, match="No such file"):
        Thresholds.from_toml(tmp_path / "missing.toml")


def test_estimate_grows_with_the_cluster():
    small, large = acceptance.estimate_seconds(2, True), acceptance.estimate_seconds(16, True, hosts=4)
    assert 0 < small < 180 < large and acceptance.estimate_seconds(2, False) > small


def test_acceptance_measures_the_communicator_beside_the_task_path(client, tmp_path):
    workers = sorted(worker_info(client))
    records = acceptance.run_acceptance(client, quick=True, workloads=(), transfer_bytes=2**20)
    tasks = {(r["source"], r["destination"]) for r in records if r["kind"] == "transfer"}
    comm = [r for r in records if r["kind"] == "comm"]
    assert {(r["source"], r["destination"]) for r in comm} == tasks == {tuple(workers), tuple(workers[::-1])}
    for r in comm:
        # tcp: the ranks' own sockets (the direct path), not dask's comm layer
        assert r["transport"] == "direct" and r["protocol"] == "tcp" and r["small_bytes"] == 4096
        assert 0 < r["round_trip_s"] <= r["round_trip_p90_s"] and r["bandwidth_bytes_per_s"] > 0
        assert r["bytes"] == 2**20
    collectives = {r["op"]: r for r in records if r["kind"] == "collective"}
    assert set(collectives) == {"allreduce", "barrier"}
    assert all(r["latency_s"] > 0 and r["workers"] == 2 for r in collectives.values())
    judged = {r["subject"] for r in records
              if r["kind"] == "verdict" and r["check"] == "communicator bandwidth vs peers"}
    assert judged == {f"{a} -> {b}" for a, b in tasks}
    page = write_html(records, tmp_path / "report.html").read_text()
    assert "Through tasks" in page and "Through the communicator" in page and "round_trip_s" in page
    for r in comm:
        assert f"{r['round_trip_s']:.4g}" in page and f"{r['bandwidth_bytes_per_s']:.4g}" in page
    assert f"{collectives['allreduce']['latency_s']:.4g}" in page
    assert page.count("data:image/png;base64,") == 3  # roofline, scaling, and both paths' heatmaps in one chart


def _pairs(kind, bandwidths, **extra):
    return [{"kind": kind, "source": a, "destination": b, "bandwidth_bytes_per_s": value, **extra}
            for (a, b), value in bandwidths.items()]


def test_transfer_fraction_judges_each_path_against_its_own_pairs(tmp_path):
    workers = ["a", "b", "c"]
    records = _synthetic({w: "cpu" for w in workers}, {w: 1.0 for w in workers})
    pairs = [(s, d) for s in workers for d in workers if s != d]
    # tasks: every pair alike; the communicator: one pair at a fifth of the others (and far above the task path)
    records += _pairs("transfer", {p: 1e9 for p in pairs}, latency_s=0.01, same_host=True)
    records += _pairs("comm", {p: (2e9 if p == ("b", "c") else 1e10) for p in pairs}, round_trip_s=1e-3,
                      round_trip_p90_s=2e-3, bytes=2**20, small_bytes=4096, protocol="tcp", same_host=True)
    records.append({"kind": "collective", "op": "allreduce", "workers": 3, "protocol": "tcp", "latency_s": 7.5e-4,
                    "p90_s": 9e-4, "repeats": 50})
    verdicts = acceptance.judge(records, Thresholds(), workers)
    failed = [(v["subject"], v["check"]) for v in verdicts if v["kind"] == "verdict" and not v["passed"]]
    assert failed == [("b -> c", "communicator bandwidth vs peers")]
    assert sum(v.get("check") == "transfer bandwidth vs peers" for v in verdicts) == len(pairs)
    page = write_html(records + verdicts, tmp_path / "r.html").read_text()
    assert "Through the communicator" in page and f"{7.5e-4:.4g}" in page and page.count("data:image/png;base64,") == 3
    broken = acceptance.judge(_synthetic({"a": "cpu"}, {"a": 1.0}) + [{"kind": "comm", "error": "CommTimeout: x"}],
                              Thresholds(), ["a"])
    assert ("cluster", "communicator ran") in [(v["subject"], v["check"]) for v in broken
                                               if v["kind"] == "verdict" and not v["passed"]]


def test_a_worker_below_its_peers_is_measured_again_and_judged_by_its_faster_run():
    runs = {"a": [{"family": "md", "rate": 10.0, "passed": True}, {"family": "gemm", "rate": 5.0, "passed": True}],
            "b": [{"family": "md", "rate": 5.5, "passed": True}, {"family": "gemm", "rate": 5.0, "passed": True}],
            "c": [{"family": "md", "rate": 9.0, "passed": True}, {"family": "gemm", "rate": 5.2, "passed": True}],
            "broken": {"error": "RuntimeError: no device"}}
    # b: 5.5 against the median 9.5 of a and c (58% < 70%); a and c are within their peers
    assert second_look.below_peers(runs, 0.7) == ["b"]
    assert second_look.below_peers(runs, 0.5) == []
    again = [{"family": "md", "rate": 8.0, "passed": False}, {"family": "gemm", "rate": 4.0, "passed": True}]
    kept = second_look.keep_faster(runs["b"], again)
    # the faster run of each family; correctness must hold in both runs
    assert kept == [{"family": "md", "rate": 8.0, "passed": False, "rates_measured": [5.5, 8.0]},
                    {"family": "gemm", "rate": 5.0, "passed": True, "rates_measured": [5.0, 4.0]}]
    # a family the second run lacks keeps its first record untouched
    assert second_look.keep_faster(runs["b"], again[1:])[0] == runs["b"][0]


def test_a_transfer_pair_below_the_others_is_picked_for_a_second_look():
    bandwidths = {("a", "b"): 1e9, ("b", "a"): 0.3e9, ("a", "c"): 1.1e9, ("c", "a"): float("inf")}
    # (b, a): 0.3 against the median 1.05 of the finite others; inf (too fast to time) is left out
    assert second_look.pairs_below_peers(bandwidths, 0.5) == [("b", "a")]
    assert second_look.pairs_below_peers(bandwidths, 0.2) == []
    assert second_look.pairs_below_peers({("a", "b"): 1.0}, 0.5) == []  # no other pair to compare with


def test_a_slow_spell_of_one_worker_does_not_fail_acceptance(client, monkeypatch):
    """The first kernel run of one worker is made slow (as a busy host makes it); the second look passes it."""
    workers = sorted(worker_info(client))
    calls = {}
    real = acceptance._on_each

    def first_run_slow(client_, ws, hosts, function, *args, key):
        results = real(client_, ws, hosts, function, *args, key=key)
        if function is probes.kernel_checks and ws == [workers[1]]:
            calls[workers[1]] = calls.get(workers[1], 0) + 1
            if calls[workers[1]] == 1:
                # far below anything a busy host gives the second run (at 0.3 a loaded CI run measured
                # the second look slower than the slowed first one)
                results[workers[1]] = [{**c, "rate": c["rate"] * 0.01} for c in results[workers[1]]]
        return results

    monkeypatch.setattr(acceptance, "_on_each", first_run_slow)
    records = acceptance.run_acceptance(client, quick=True, workloads=(), transfer_bytes=2**20)
    assert calls[workers[1]] == 2
    kernels = [r for r in records if r["kind"] == "kernel" and r["worker"] == workers[1]]
    for r in kernels:
        assert r["rate"] == r["rates_measured"][1] > r["rates_measured"][0]
    # judged by the kept (second) run: with two workers the peer median is the other worker's rate
    peer = {r["family"]: r["rate"] for r in records if r["kind"] == "kernel" and r["worker"] == workers[0]}
    verdicts = {r["check"]: r for r in records if r["kind"] == "verdict" and r["subject"] == workers[1]}
    for r in kernels:
        ratio = r["rate"] / peer[r["family"]]
        verdict = verdicts[f"{r['family']} rate vs peers"]
        assert verdict["detail"].startswith(f"{ratio:.0%} of the median") and verdict["passed"] == (ratio >= 0.7)


def test_the_second_look_goes_on_while_it_raises_the_median_the_others_are_judged_by(monkeypatch):
    # b is slow once, then faster than a's first run: a falls below it and gets its own second look
    rates = {"a": [1.0, 1.9], "b": [0.5, 2.0]}
    calls = []

    def fake_on_each(client, workers, hosts, function, *args, key):
        (w,) = workers
        calls.append(w)
        return {w: [{"family": "md", "rate": rates[w].pop(0), "passed": True}]}

    monkeypatch.setattr(acceptance, "_on_each", fake_on_each)
    runs = acceptance._kernel_checks(None, ["a", "b"], {"a": "h", "b": "h"}, {"a": {}, "b": {}}, True, 0.7)
    assert calls == ["a", "b", "b", "a"]  # each worker at most twice
    assert runs["a"][0]["rates_measured"] == [1.0, 1.9] and runs["b"][0]["rates_measured"] == [0.5, 2.0]
    assert second_look.below_peers(runs, 0.7) == []
