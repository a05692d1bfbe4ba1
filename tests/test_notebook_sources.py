"""The committed walkthrough notebooks are their sources in notebooks/src/, cell for cell."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _builder():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("notebook_build", ROOT / "notebooks/build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = _builder()


def test_every_notebook_has_a_source() -> None:
    notebooks = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    sources = {p.stem for p in BUILD.sources()}
    assert notebooks == sources


@pytest.mark.parametrize("source", BUILD.sources(), ids=lambda p: p.stem)
def test_notebook_matches_its_source(source: Path) -> None:
    assert BUILD.differences(source) == []


@pytest.mark.parametrize("source", BUILD.sources(), ids=lambda p: p.stem)
def test_saved_outputs_show_no_widget_repr(source: Path) -> None:
    """A reader without a live kernel sees an output's text: never ``IntProgress(...)``."""
    import nbformat

    nb = nbformat.read(BUILD.notebook_path(source), as_version=4)
    assert BUILD.widget_reprs(nb) == []


def test_widget_repr_text_is_found() -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("%wb start -n 2")
    shown = {"text/plain": "IntProgress(value=0, description='starting', max=4)"}
    cell.outputs = [nbformat.v4.new_output("display_data", data=shown)]
    nb.cells = [cell, nbformat.v4.new_code_cell("print(1)")]
    nb.cells[1].outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="HBox(children=())")
    ]
    assert [line.split(":")[0] for line in BUILD.widget_reprs(nb)] == ["cell 0", "cell 1"]
    cell.outputs[0].data["text/plain"] = "workbench: starting 2 engines and their process group"
    assert [line.split(":")[0] for line in BUILD.widget_reprs(nb)] == ["cell 1"]


def test_a_changed_source_is_reported(tmp_path: Path) -> None:
    source = BUILD.sources()[0]
    changed = tmp_path / source.name
    changed.write_text(source.read_text().replace("%load_ext workbench", "%load_ext other", 1))
    original = BUILD.notebook_path
    try:
        BUILD.notebook_path = lambda s: original(source)
        assert BUILD.differences(changed) != []
    finally:
        BUILD.notebook_path = original


@pytest.mark.parametrize("source", BUILD.sources(), ids=lambda p: p.stem)
def test_a_save_from_jupyterlab_changes_no_byte(source: Path) -> None:
    """JupyterLab parses a notebook's JSON into JavaScript numbers and writes them back:
    the committed file must be what that writes (``0.0`` comes back ``0``, a nanosecond
    time past 2**53 loses digits), or opening a notebook shows a git diff. It also writes
    the running kernel's name, and its plotly renderer adds a PNG to every figure that has
    none. The browser test saves 02 from JupyterLab itself; this checks every notebook the
    same way, in Python."""
    import json

    import nbformat

    path = BUILD.notebook_path(source)
    text = path.read_text()
    assert BUILD.unstable_numbers(json.loads(text)) == []
    saved = nbformat.from_dict(BUILD.as_javascript_writes(json.loads(text)))
    assert nbformat.writes(saved) + "\n" == text
    assert saved.metadata["kernelspec"] == BUILD.KERNELSPEC
    assert BUILD.figures_without_picture(saved) == []


def test_the_kernel_name_is_the_one_jupyterlab_writes() -> None:
    """JupyterLab saves the display name of the kernel spec it started."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(BUILD.KERNELSPEC["name"])
    assert spec.display_name == BUILD.KERNELSPEC["display_name"]


def test_a_figure_without_its_picture_is_found() -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    figure = {BUILD.PLOTLY: {"data": [], "layout": {}}}
    nb.cells = [nbformat.v4.new_code_cell("fig"), nbformat.v4.new_code_cell("fig")]
    nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data=dict(figure))]
    nb.cells[1].outputs = [
        nbformat.v4.new_output("display_data", data={**figure, "image/png": "iVBORw0KGgo="})
    ]
    assert BUILD.figures_without_picture(nb) == ["cell 0: a plotly figure without its PNG"]


def test_the_numbers_javascript_writes_differently_are_found() -> None:
    found = BUILD.unstable_numbers({"a": [0.0, 0.5, 1e16, 1e-7, 2**53, 2**53 + 1, True, 3]})
    assert found == ["/a/0 = 0.0", "/a/2 = 1e+16", "/a/5 = 9007199254740993"]
    stable = BUILD.round_trip_stable({"x": [0.0, 2.5], "t0": 1796196948668017652})
    assert stable == {"x": [0, 2.5], "t0": "1796196948668017652"}
    assert BUILD.unstable_numbers(stable) == []
