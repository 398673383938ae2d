"""Rich display in Jupyter: every public object's ``_repr_html_`` states its key facts as escaped HTML."""

import html.parser

import matplotlib
import numpy as np
import pytest
import xarray as xr

from hpcgpu import Simulation
from hpcgpu.io import html_views
from hpcgpu.workloads.astro import NBody
from hpcgpu.workloads.md import LennardJones
from hpcgpu.workloads.vorticity import BarotropicVorticity
from hpcgpu.workloads.weather import ShallowWater

matplotlib.use("Agg")

_VOID = {"br", "hr", "img", "input", "meta", "link", "col", "wbr"}


class _Balance(html.parser.HTMLParser):
    """Records tag nesting errors and the visible text of an HTML fragment."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] != "style":
            self.text.append(data)


def visible_text(fragment):
    """The text a browser shows for ``fragment``, after checking that its tags nest and close."""
    parser = _Balance()
    parser.feed(fragment)
    parser.close()
    assert not parser.errors, parser.errors
    assert not parser.stack, f"unclosed tags: {parser.stack}"
    assert fragment.lstrip().startswith("<") and "<script" not in fragment
    return " ".join(parser.text)


# Small models of every workload, on the numpy reference backend (no compilation).
MODELS = {
    "weather": lambda: ShallowWater("unstable_jet", nx=32, ny=16, backend="numpy"),
    "astro": lambda: NBody("galaxy_collision", n=64, backend="numpy"),
    "md": lambda: LennardJones(3, cutoff=1.5, temperature=1.2, backend="numpy"),
    "vorticity": lambda: BarotropicVorticity("rossby_wave", nx=16, ny=12, backend="numpy"),
}

# What each summary must say: its kind and sizes.
MODEL_FACTS = {
    "weather": ["ShallowWater", "unstable_jet", "32 x 16 cells", "4000 km x 2000 km", "periodic, wall", "numpy",
                "float64"],
    "astro": ["NBody", "galaxy_collision", "bodies", "64", "direct", "numpy"],
    "md": ["LennardJones", "atoms", "108", "3 x 3 x 3", "0.8442", "LJ cut at 1.5, shifted", "numpy"],
    "vorticity": ["BarotropicVorticity", "rossby_wave", "16 x 12 points", "FFT", "numpy"],
}
STATE_FACTS = {
    "weather": ["ShallowWaterState", "32 x 16", "u", "v", "h", "16x32", "float64", "host (numpy)"],
    "astro": ["NBodyState", "bodies", "64", "positions", "3x64", "masses"],
    "md": ["MDState", "atoms", "108", "positions", "3x108", "ids", "int64", "step", "rebuilds", "NeighborList"],
    "vorticity": ["VorticityState", "zeta", "psi", "12x16"],
}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_model_summary_names_the_case_sizes_and_backend(kind):
    model = MODELS[kind]()
    text = visible_text(model._repr_html_())
    for fact in MODEL_FACTS[kind]:
        assert fact in text, (fact, text)
    assert "all parameters" in text  # the attributes, collapsed


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_state_summary_lists_every_array_with_shape_dtype_and_range(kind):
    model = MODELS[kind]()
    state = model.initial_state()
    text = visible_text(state._repr_html_())
    for fact in STATE_FACTS[kind]:
        assert fact in text, (fact, text)
    first = model.field_names[0]
    array = getattr(state, first)
    assert html_views.format_value(float(array.min())) in text and html_views.format_value(float(array.max())) in text


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_simulation_summary_shows_step_time_executor_and_latest_diagnostics(kind):
    model = MODELS[kind]()
    sim = Simulation(model, stop_steps=4, diagnostics=2, progress=False, name=f"demo-{kind}")
    before = visible_text(sim._repr_html_())
    assert f"demo-{kind}" in before and "step 0 time" in before
    assert "diagnostics at step" not in before  # nothing recorded before run()
    sim.run()
    text = visible_text(sim._repr_html_())
    assert f"Simulation: demo-{kind}" in text and repr(model) in text
    assert "step 4 time" in text
    assert "executor local" in text and "backend numpy" in text and "steps/s" in text
    assert "diagnostics at step 4 (3 records" in text
    first = next(k for k in sim.diagnostics.data_vars if k not in ("step", "wall_s"))
    assert first in text


def test_distributed_simulation_summary_names_partitions_without_gathering():
    class Executor:  # what the distributed executor describes, standing in for a cluster
        granularity = 4

        def describe(self):
            return {"executor": "distributed", "backend": "auto", "partitions": 3, "steps_per_task": 4,
                    "workers": 2, "rows_per_partition": [6, 5, 5]}

        def global_state(self):
            raise AssertionError("the display gathered the state")

    model = MODELS["weather"]()
    sim = Simulation(model, stop_steps=4, progress=False)
    sim._executor = Executor()
    text = visible_text(sim._repr_html_())
    for fact in ("executor distributed", "partitions 3", "steps per task 4", "workers 2", "rows per partition 6, 5, 5"):
        assert fact in text, (fact, text)


def test_names_and_values_are_escaped():
    model = MODELS["weather"]()
    name = "<img src=x onerror=alert(1)> & jet"
    sim = Simulation(model, stop_steps=2, progress=False, name=name)
    page = sim._repr_html_()
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt; &amp; jet" in page
    assert name in visible_text(page)
    assert html_views.table([("<k>", "<v>")]) == (
        '<table class="hpcgpu-table"><tr><th>&lt;k&gt;</th><td>&lt;v&gt;</td></tr></table>')


def test_format_value_is_short_and_total():
    assert html_views.format_value(np.float32(0.1)) == "0.1"
    assert html_views.format_value(float("nan")) == "nan" and html_views.format_value(None) == "-"
    assert html_views.format_value(np.zeros((2, 3), np.float32)) == "(2, 3) float32"
    assert html_views.format_value([1, 2.5]) == "1, 2.5" and html_views.format_value(np.int64(7)) == "7"


def test_diagnostics_are_an_xarray_dataset_whose_variables_plot():
    import matplotlib.pyplot as plt

    model = MODELS["weather"]()
    sim = Simulation(model, stop_steps=6, diagnostics=2, progress=False).run()
    diagnostics = sim.diagnostics
    assert isinstance(diagnostics, xr.Dataset)
    assert diagnostics.sizes["time"] == 4 and np.array_equal(diagnostics.step, [0, 2, 4, 6])
    assert {"mass", "energy", "enstrophy", "max_cfl"} <= set(diagnostics.data_vars)
    assert diagnostics.attrs["case"] == "unstable_jet"
    for name in diagnostics.data_vars:
        lines = diagnostics[name].plot()
        assert lines[0].get_xydata().shape == (4, 2), name
        plt.close("all")
    assert isinstance(diagnostics.energy, xr.DataArray)
