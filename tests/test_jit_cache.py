"""Compiled kernels are cached in the user's cache directory, never inside the installed package.

The README's quick start (``pip install . && hpcgpu run weather``) followed
by its test command (``pip install -e ".[test]" && pytest``) once broke
collection: Numba had cached the kernels into ``site-packages/hpcgpu``,
``pip`` left those files behind when it replaced the install, and the
leftover folder shadowed the editable install as a namespace package.
"""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hpcgpu import _jit_cache

REPOSITORY = Path(__file__).resolve().parents[1]

# One kernel of every family that caches, and the bench's copy loop.
COMPILE_EVERY_FAMILY = """
import numpy as np
from hpcgpu.kernels import matrix, md, nbody, stencil
from hpcgpu.bench import _copy
rng = np.random.default_rng(0)
stencil.diffuse(rng.random((16, 16)), diffusivity=0.1, dt=1.0, steps=3, backend="numba")
nbody.accelerations(rng.standard_normal((3, 20)), rng.random(20), softening=0.1, backend="numba")
matrix.matmul(rng.random((8, 8)), rng.random((8, 8)), backend="numba")
matrix.dot(rng.random(100), rng.random(100), backend="numba")
from hpcgpu.workloads.md import LennardJones
model = LennardJones(3, cutoff=1.5, skin=0.2, backend="numba")
model.step(model.initial_state(), 0.005, 2)
a = np.ones(1000); _copy.parallel_copy(a, np.empty_like(a))
print("compiled")
"""


def _cache_files(folders):
    return {path for folder in folders for pattern in ("*.nbi", "*.nbc") for path in Path(folder).rglob(pattern)}


def _environment(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_CACHE_DIR",
                                                             _jit_cache.CACHE_DIR_ENV)}
    env.update(extra)
    return env


def test_kernels_of_every_family_cache_into_the_cache_dir_not_the_package(tmp_path):
    folders = _jit_cache.package_folders()
    assert any(f.endswith("kernels") for f in folders) and any(f.endswith("workloads") for f in folders)
    before = _cache_files(folders)
    env = _environment(**{_jit_cache.CACHE_DIR_ENV: str(tmp_path / "cache")})
    result = subprocess.run([sys.executable, "-P", "-c", COMPILE_EVERY_FAMILY], env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
    cached = {p.parent.name.rsplit("_", 1)[0] for p in (tmp_path / "cache").rglob("*.nbi")}
    assert {"stencil", "nbody", "matrix", "md", "bench"} <= cached, cached
    assert _cache_files(folders) <= before, "a kernel was cached inside the package"


def test_the_cache_dir_follows_the_environment_and_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(_jit_cache.CACHE_DIR_ENV, str(tmp_path / "here"))
    assert _jit_cache.cache_dir() == str(tmp_path / "here")
    monkeypatch.delenv(_jit_cache.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert _jit_cache.cache_dir() == str(tmp_path / "xdg" / "hpcgpu" / "numba")


def test_a_users_numba_cache_dir_still_wins(tmp_path):
    env = _environment(NUMBA_CACHE_DIR=str(tmp_path / "numba"), **{_jit_cache.CACHE_DIR_ENV: str(tmp_path / "ours")})
    code = ("import numpy as np; from hpcgpu.kernels import stencil; "
            "stencil.laplacian(np.ones((8, 8)), backend='numba')")
    result = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((tmp_path / "numba").rglob("*.nbi")) and not (tmp_path / "ours").exists()


@pytest.mark.slow
def test_readme_install_then_run_then_editable_install_keeps_the_package_importable(tmp_path):
    """The README's two commands in order, in one environment: ``pip install .``, a run, ``pip install -e``.

    The new environment sees this test environment's dependencies through a
    path file, so nothing is downloaded; only hpcgpu itself is installed
    (its build backend, setuptools, comes from the index as for any pip install).
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = _environment(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "home" / ".cache"))
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-deps"]

    def check(command, cwd=tmp_path):
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"{command}: {result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        return result

    check([*pip, str(REPOSITORY)])
    installed = Path(site) / "hpcgpu"
    check([str(venv / "bin" / "hpcgpu"), "run", "weather", "--nx", "32", "--ny", "16", "--steps", "20",
           "--backend", "numba", "--no-progress", "--out", str(tmp_path / "out")])
    assert not _cache_files([installed]), "the run cached kernels inside site-packages"
    assert list((tmp_path / "home" / ".cache" / "hpcgpu").rglob("*.nbi")), "nothing was cached"
    record = next(Path(site).glob("hpcgpu-*.dist-info")) / "RECORD"
    listed = {line.split(",")[0] for line in record.read_text().splitlines()}
    strays = [p for p in installed.rglob("*") if p.is_file()
              and str(p.relative_to(site)) not in listed and p.suffix != ".pyc"]
    assert not strays, f"files in the install that pip did not put there: {strays[:5]}"
    check([*pip, "-e", str(REPOSITORY)])
    assert not installed.exists(), "pip left a folder behind that shadows the editable install"
    result = check([str(python), "-P", "-c", "import hpcgpu.kernels.stencil as s; print(s.MIN_POINTS, s.__file__)"])
    assert result.stdout.split()[1].startswith(str(REPOSITORY))
