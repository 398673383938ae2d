"""Kernel variants chosen by measuring: the choice is kept per machine, reused, and pinned by HPCGPU_AUTOTUNE=0."""

import json

import numpy as np
import pytest

from hpcgpu import autotune
from hpcgpu.errors import ConfigError


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty cache folder for this test, and no choices remembered by the process."""
    monkeypatch.setenv("HPCGPU_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(autotune.AUTOTUNE_ENV, raising=False)
    autotune.forget()
    yield tmp_path / autotune.FILE_NAME
    autotune.forget()


def counting_variants(calls, slow="a"):
    """Two variants; ``slow`` sleeps a millisecond per call, so the other one wins."""
    import time

    def variant(name):
        def run():
            calls.append(name)
            if name == slow:
                time.sleep(0.001)
        return run

    return {"a": variant("a"), "b": variant("b")}


def test_the_fastest_variant_is_chosen_and_written_beside_the_kernel_cache(store):
    calls = []
    assert autotune.choose("test.kernel", counting_variants(calls), default="a") == "b"
    assert {"a", "b"} <= set(calls)
    saved = json.loads(store.read_text())
    entry = saved[autotune.machine_key()]
    assert entry["numba"] and entry["cpu"]
    record = entry["kernels"]["test.kernel"]
    assert record["choice"] == "b" and record["default"] == "a"
    assert record["seconds"]["a"] > record["seconds"]["b"]


def test_tuning_a_tiny_kernel_takes_well_under_a_second(store):
    import time

    start = time.perf_counter()
    autotune.choose("test.kernel", counting_variants([]), default="a")
    assert time.perf_counter() - start < 1.0


def test_a_later_process_reuses_the_file_without_timing(store):
    autotune.choose("test.kernel", counting_variants([]), default="a")
    autotune.forget()  # as a new process: only the file remembers
    calls = []
    assert autotune.choose("test.kernel", counting_variants(calls, slow="b"), default="a") == "b"
    assert calls == []


_RACER = """
import random, sys, time
from hpcgpu import autotune
def variant():
    def run():
        time.sleep(0.002 * random.random())  # a coin toss: each process alone would pick either
    return run
time.sleep(float(sys.argv[1]) - time.time())  # start the timing together
print(autotune.choose("test.race", {"a": variant(), "b": variant()}, default="a"))
"""


def test_processes_tuning_at_once_all_take_the_one_choice_written(store):
    """Workers that time at once must not pick different variants: ranks would differ in the last bits."""
    import os
    import subprocess
    import sys
    import time

    start = f"{time.time() + 3.0:.3f}"
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, start], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ)) for _ in range(4)]
    picked = {racer.communicate(timeout=120)[0].strip() for racer in racers}
    written = json.loads(store.read_text())
    (entry,) = written.values()
    assert picked == {entry["kernels"]["test.race"]["choice"]}


def test_another_cpu_key_is_timed_afresh(store, monkeypatch):
    autotune.choose("test.kernel", counting_variants([]), default="a")
    autotune.forget()
    monkeypatch.setattr(autotune, "_describe_machine",
                        lambda: {"cpu": "another CPU", "llvm_cpu": "other", "features_sha256": "0", "numba": "0"})
    calls = []
    assert autotune.choose("test.kernel", counting_variants(calls, slow="b"), default="b") == "a"
    assert calls
    assert len(json.loads(store.read_text())) == 2  # both machines keep their entries


def test_autotune_off_pins_the_default_without_timing_or_writing(store, monkeypatch):
    monkeypatch.setenv(autotune.AUTOTUNE_ENV, "0")
    calls = []
    assert autotune.choose("test.kernel", counting_variants(calls), default="a") == "a"
    assert calls == [] and not store.exists()
    assert autotune.choices()["enabled"] is False


def test_a_corrupt_file_is_timed_again_and_replaced(store):
    store.write_text("{not json")
    assert autotune.choose("test.kernel", counting_variants([]), default="a") == "b"
    assert json.loads(store.read_text())[autotune.machine_key()]["kernels"]["test.kernel"]["choice"] == "b"


def test_use_pins_a_variant_and_restores(store):
    with autotune.use("test.kernel", "a"):
        assert autotune.choose("test.kernel", counting_variants([]), default="b") == "a"
        assert autotune.choices()["kernels"]["test.kernel"]["pinned"] is True
    assert autotune.choose("test.kernel", counting_variants([]), default="a") == "b"


def test_bad_variant_names_the_parameter(store):
    with pytest.raises(ConfigError, match="default must be one of"):
        autotune.choose("test.kernel", counting_variants([]), default="c")
    with autotune.use("test.kernel", "c"), pytest.raises(ConfigError, match="variant must be one of.*'c'"):
        autotune.choose("test.kernel", counting_variants([]), default="a")


def test_the_nbody_float64_inverse_sqrt_is_tuned_and_listed(store):
    from hpcgpu.kernels.nbody import _numba

    variant = _numba.inverse_sqrt_variant(np.float64)
    assert variant in _numba.INVERSE_SQRT_VARIANTS
    listed = autotune.choices()["kernels"]["nbody.direct.inverse_sqrt.float64"]
    assert listed["choice"] == variant and set(listed["seconds"]) == set(_numba.INVERSE_SQRT_VARIANTS)
    assert sum(listed["seconds"].values()) < 0.01  # tiny input: well under a second with the turns
    assert _numba.inverse_sqrt_variant(np.float32) == _numba.DEFAULT_INVERSE_SQRT
