"""``hpcgpu bench io``: snapshot and checkpoint write rates per rank and in all, beside a NumPy write."""

import io
import json
import os

import pytest

pytest.importorskip("dask")
pytest.importorskip("zarr")

from hpcgpu.bench import io as bench_io  # noqa: E402
from hpcgpu.errors import ConfigError  # noqa: E402


def test_every_rank_and_the_aggregate_report_rates_beside_numpy(client, tmp_path):
    out = io.StringIO()
    lines = bench_io.run(client, folder=tmp_path, size=32, dtype="float64", snapshots=2, stream=out)
    assert [json.loads(text) for text in out.getvalue().splitlines()] == lines
    by_case = {}
    for line in lines:
        by_case.setdefault((line["case"], line["scope"]), []).append(line)
        assert line["suite"] == "io" and line["bytes"] > 0 and line["seconds"] > 0 and line["ratio_to_numpy"] > 0
    assert len(by_case["snapshot", "rank"]) == 2 * 2  # 2 ranks, 2 snapshots
    assert len(by_case["checkpoint", "rank"]) == 2
    # a snapshot stores u, v, h and the derived vorticity of the whole grid; the NumPy write the same bytes;
    # a rank writes (and a checkpoint holds) its state fields only
    assert by_case["snapshot", "aggregate"][0]["bytes"] == 2 * 4 * 32 * 32 * 8
    assert by_case["numpy", "aggregate"][0]["bytes"] == 4 * 32 * 32 * 8
    assert sum(line["bytes"] for line in by_case["snapshot", "rank"]) == 2 * 3 * 32 * 32 * 8
    assert by_case["checkpoint", "rank"][0]["bytes"] > by_case["snapshot", "rank"][0]["bytes"]  # .npy headers
    assert os.listdir(tmp_path) == []  # what it wrote is removed


def test_bad_sizes_are_refused_by_name(client):
    with pytest.raises(ConfigError, match="size"):
        bench_io.run(client, size=8)
    with pytest.raises(ConfigError, match="snapshots"):
        bench_io.run(client, size=32, snapshots=0)


def test_an_fsspec_url_is_measured_for_snapshots_and_the_numpy_baseline(client, tmp_path, monkeypatch):
    url = f"file://{tmp_path}/remote"
    monkeypatch.setattr(bench_io, "_is_local", lambda fs: False)  # as object storage would be
    lines = bench_io.run(client, folder=url, size=32, dtype="float32", snapshots=2, stream=io.StringIO())
    cases = {(line["case"], line["scope"]) for line in lines}
    assert ("snapshot", "aggregate") in cases and ("numpy", "aggregate") in cases
    assert not any(case == "checkpoint" for case, _ in cases)  # POSIX files only: not measured at a URL
    assert all(line["folder"] == url and line["bytes_per_s"] > 0 for line in lines)
    assert os.listdir(tmp_path / "remote") == []


def test_an_unknown_url_protocol_is_refused_by_name(client):
    with pytest.raises(ConfigError, match="folder 'nosuchprotocol://x'"):
        bench_io.run(client, folder="nosuchprotocol://x", size=32)
