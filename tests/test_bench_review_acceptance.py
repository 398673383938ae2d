"""Cluster acceptance: defects found in review (failed kernel checks, strict JSON lines, threshold files)."""

import io
import json
import math

import numpy as np
import pytest

from hpcgpu.bench import acceptance
from hpcgpu.bench.report import Thresholds, write_html
from hpcgpu.errors import ConfigError


def _records(workers):
    records = []
    for w in workers:
        records.append({"kind": "inventory", "worker": w, "device": "cpu"})
        records.append({"kind": "ceiling", "worker": w, "copy_bytes_per_s": 1e11, "gemm_flops_per_s": 1e12})
    return records


def test_a_worker_whose_kernel_checks_failed_is_a_failed_verdict_not_a_crash(tmp_path):
    # what run_acceptance emits when probes.kernel_checks raises on a worker (_on_each's {"error": ...})
    records = _records(["a", "b"])
    records.append({"kind": "kernel", "worker": "a", "family": "stencil/diffusion", "rate": 1.0, "passed": True,
                    "max_relative_error": 0.0, "tolerance": 1e-12})
    records.append({"kind": "kernel", "worker": "b", "error": "KilledWorker: lost"})
    verdicts = acceptance.judge(records, Thresholds(), ["a", "b"])
    failed = [(v["subject"], v["check"], v["detail"]) for v in verdicts if v["kind"] == "verdict" and not v["passed"]]
    assert failed == [("b", "kernel checks ran", "KilledWorker: lost")]
    assert verdicts[-1]["kind"] == "summary" and not verdicts[-1]["passed"]
    write_html(records + verdicts, tmp_path / "r.html")


def test_json_lines_are_strict_json_even_with_infinite_or_nan_values():
    # a kernel that raised has max_relative_error inf (probes._check); a noisy pair an inf bandwidth
    stream = io.StringIO()
    records = []
    record = acceptance._emit(records, {"kind": "transfer", "bandwidth_bytes_per_s": math.inf,
                                        "bandwidths_measured": [math.inf, 1e9], "latency_s": np.float32("nan"),
                                        "nested": {"x": -math.inf}}, stream)

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    line = json.loads(stream.getvalue(), parse_constant=refuse)
    assert line["bandwidth_bytes_per_s"] is None and line["bandwidths_measured"] == [None, 1e9]
    assert line["latency_s"] is None and line["nested"] == {"x": None}
    # the record judged and reported keeps its value
    assert record["bandwidth_bytes_per_s"] == math.inf and records == [record]


@pytest.mark.parametrize("text", ["thresholds = 1\n", "thresholds = [0.5, 0.7]\n", "thresholds = 'strict'\n"])
def test_a_thresholds_entry_that_is_not_a_table_is_a_clear_error(tmp_path, text):
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"thresholds must be a \[thresholds\] table of peer_fraction"):
        Thresholds.from_toml(path)
