"""The commands of the README and of the documentation's pages, run as they are written.

The commands are read from README.md and the Markdown pages of docs/
themselves, so that an edit there that breaks one fails here (the 4-worker
K = 16 example once needed a grid bigger than the default one and failed as
written). Text moved from the README to a page of docs/ stays tested.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The README first, then the site's pages in a fixed order: a command is taken from the first that has it.
# Not the journal: it is history, and its commands are those of their day.
PAGES = [README, *sorted(page for page in (ROOT / "docs").glob("*.md") if page.name != "journal.md"),
         *sorted((ROOT / "docs").glob("*/*.md"))]


def _documented_text():
    return "\n".join(page.read_text(encoding="utf-8") for page in PAGES)


def _readme_command(prefix):
    """The inline command of the README and the pages of docs/ that starts with ``prefix``.

    Where the README and a page both give it, they must give it alike, so the one run tests both.
    """
    found = set(re.findall(r"`(" + re.escape(prefix) + r"[^`]*)`", _documented_text()))
    assert found, f"no `{prefix}...` command in the README or docs/"
    assert len(found) == 1, f"the README and docs/ give `{prefix}...` differently: {sorted(found)}"
    return found.pop()


def _hpcgpu(command, cwd):
    words = shlex.split(command)
    assert words[0] == "hpcgpu"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, "-P", "-m", "hpcgpu.cli", *words[1:]], capture_output=True, text=True,
                          timeout=1800, env=env, cwd=cwd)


def _summary(folder):
    (run,) = (folder / "hpcgpu-output").iterdir()
    return json.loads((run / "summary.json").read_text())


@pytest.mark.slow
def test_the_readmes_command_line_cluster_example_runs_as_written(tmp_path):
    command = _readme_command("hpcgpu run weather --ny ")
    assert "--workers 4" in command and "--steps-per-task 16" in command
    result = _hpcgpu(command, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(tmp_path)
    steps = int(shlex.split(command)[shlex.split(command).index("--steps") + 1])
    assert summary["step"] == steps and summary["workers"] == 4 and summary["steps_per_task"] == 16
    assert abs(summary["mass_relative_change"]) < 1e-12


@pytest.mark.slow
def test_the_readmes_scheduler_command_runs_on_a_scheduler_of_ones_own(tmp_path):
    from hpcgpu.cluster import start_cluster

    command = _readme_command("hpcgpu run weather --scheduler ")
    client = start_cluster(workers=2, quiet=True)
    try:
        address = client.scheduler.address
        result = _hpcgpu(command.replace("tcp://SCHEDULER_HOST:8786", address), tmp_path)
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(tmp_path)
    assert summary["executor"] == "distributed" and summary["workers"] == 2 and summary["step"] > 0
    assert abs(summary["mass_relative_change"]) < 1e-12


@pytest.mark.slow
def test_the_readmes_process_grid_command_runs_as_written(tmp_path):
    command = _readme_command("hpcgpu run weather --nx 512 --ny 512 --workers 2 --partitions 4 --grid ")
    result = _hpcgpu(command, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(tmp_path)
    # a channel: the blocks at the walls step less frame, so they hold a few more rows
    assert summary["process_grid"] == "2x2" and sum(summary["block_rows"]) == 512
    assert summary["block_cols"] == [256, 256] and summary["partitions"] == 4
    assert abs(summary["mass_relative_change"]) < 1e-12
    assert "partitions on a 2x2 process grid" in result.stdout


def test_the_readmes_user_grid_model_runs_as_written_and_partitions_bitwise(tmp_path):
    found = re.search(r"<!-- user-grid-model-example[^>]*-->\s*```python\n(.*?)```", _documented_text(), re.S)
    assert found, "no user grid model example in the README or docs/"
    source = found.group(1)
    body = [line for line in source.splitlines() if line.strip()]
    model_lines = body[body.index("class Heat(GridModelBase):"):body.index('if __name__ == "__main__":')]
    assert len(model_lines) <= 40 and sum(line.lstrip().startswith("def ") for line in model_lines) <= 8
    script = tmp_path / "heat.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bitwise equal on a 2x2 process grid: True" in done.stdout
