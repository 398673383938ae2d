"""The tutorial notebooks: each runs top to bottom, and is stored clean with one parameter cell.

Every notebook in ``notebooks/`` is executed with nbclient on a kernel that
runs this test's Python (a kernel spec made for the test, so neither an
installed ``python3`` spec nor ``PATH`` decides which interpreter runs it), in a
temporary working directory (outputs such as Zarr stores and reports land
there, not in the repository), at the notebook's default (CPU-sized)
parameters. A cell that raises fails the test with the cell and its
traceback.
"""

import ast
import json
import os
import sys
from pathlib import Path

import pytest

# The test extra installs these; an environment without them (the GPU image) skips this module.
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402
from nbclient import NotebookClient  # noqa: E402

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
TUTORIALS = {"weather", "molecular_dynamics", "astrophysics", "matrix", "scaling_out", "cluster_acceptance"}

CELL_TIMEOUT_S = 300
"""Longest a single cell may run (the notebooks take under 2 minutes in all on a laptop CPU)."""
KERNEL_NAME = "hpcgpu-test-python"


def _ids(paths):
    return [p.stem for p in paths]


def _read(path):
    return nbformat.read(path, as_version=4)


def _parameter_cells(notebook):
    return [c for c in notebook.cells if "parameters" in c.get("metadata", {}).get("tags", [])]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """``(kernel spec directory, environment)`` for notebook kernels that run this test's Python."""
    root = tmp_path_factory.mktemp("kernels")
    spec_dir = root / KERNEL_NAME
    spec_dir.mkdir()
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python {sys.version_info.major}.{sys.version_info.minor} (hpcgpu tests)",
            "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    env = dict(os.environ)
    # conftest.py turns the CUDA simulator on for the kernel tests; notebooks run as a user's would.
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    # Idle OpenMP threads (Numba's parallel kernels) sleep instead of spinning: on a CI runner whose
    # cores are shared, spinning threads slow small parallel kernels down a hundredfold.
    env.setdefault("OMP_WAIT_POLICY", "passive")
    return root, env


def test_every_tutorial_is_there():
    assert TUTORIALS <= {p.stem for p in NOTEBOOKS}, f"missing: {TUTORIALS - {p.stem for p in NOTEBOOKS}}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_stored_without_outputs_or_execution_counts(path):
    notebook = _read(path)
    nbformat.validate(notebook)
    dirty = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
             and (cell.outputs or cell.execution_count is not None or "execution" in cell.metadata)]
    assert not dirty, (f"{path.name}: code cells {dirty} hold outputs, execution counts or timings; "
                       "clear them before committing (Jupyter: Edit > Clear Outputs of All Cells)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_has_one_parameter_cell_of_plain_assignments_near_the_top(path):
    notebook = _read(path)
    cells = _parameter_cells(notebook)
    assert len(cells) == 1, f"{path.name}: {len(cells)} cells tagged 'parameters'; want exactly one"
    cell = cells[0]
    assert cell.cell_type == "code"
    assert notebook.cells.index(cell) <= 3, "the parameter cell belongs near the top"
    tree = ast.parse(cell.source)
    assert tree.body and all(isinstance(node, (ast.Assign, ast.AnnAssign)) for node in tree.body), \
        "the parameter cell holds only assignments (papermill and readers rely on it)"
    assert "#" in cell.source, "the parameter cell says in comments what to set on a GPU"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_a_tutorial_and_closes_what_it_starts(path):
    notebook = _read(path)
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")
    prose = sum(len(c.source) for c in notebook.cells if c.cell_type == "markdown")
    assert prose > 1500, f"{path.name}: {prose} characters of explanation; a tutorial explains"
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    if "hpcgpu.start_cluster(" in code or "hpcgpu.cluster(" in code:
        assert "client.close()" in code and "cluster.close()" in code, \
            f"{path.name} starts a cluster and must close the client and the cluster"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_executes(path, tmp_path, kernel):
    spec_dir, env = kernel
    notebook = _read(path)
    before = sorted(NOTEBOOK_DIR.iterdir())
    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_dir)]))
    client = NotebookClient(notebook, km=manager, timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)  # a failing cell raises CellExecutionError with its traceback
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert sorted(NOTEBOOK_DIR.iterdir()) == before, "the notebook wrote into the repository"
