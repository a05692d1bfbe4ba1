"""The walkthrough notebooks are built from their sources in ``notebooks/src/``.

Each source is a jupytext "percent" script (``# %%`` code cells, ``# %% [markdown]`` prose,
``# %% tags=["nbval-ignore-output"]`` for a cell whose output nbval must not compare). The
committed ``.ipynb`` is that script executed top to bottom in a fresh kernel; strict nbval in
``make test`` then re-runs it and compares outputs. Change a notebook by editing its source,
then ``make notebooks`` (all) or ``python notebooks/build.py 06`` (one).

    python notebooks/build.py [--check] [NAME ...]

``--check`` executes nothing: it lists notebooks whose cells differ from their sources,
whose saved outputs show a widget's repr (``IntProgress(value=0, ...)``) as text, or that a
save from JupyterLab would change (a number JavaScript writes differently: ``0.0`` as ``0``,
an integer past 2**53; a plotly figure saved without its picture). Every build writes
notebooks as JupyterLab would save them; ``--stable`` makes a committed notebook so without
executing it.

Why each plotly figure carries a PNG: JupyterLab's plotly renderer (jupyterlab-plotly's
``RenderedPlotly``) shows an output's ``image/png`` when it has one and draws the
interactive figure only when the mouse enters that picture. An output without one it draws
at once, then adds a PNG of the drawing to the output (``setData``), which marks the
notebook changed: a save, or JupyterLab's autosave, then rewrites every figure. So a
committed figure holds its picture, drawn here by the same plotly.js in headless Chromium;
nbval does not compare ``image/png``.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path
from typing import Any

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
# As JupyterLab writes it back once the kernel runs: the display name is ipykernel's own.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
CELL_TIMEOUT_S = 600
PLOTLY = "application/vnd.plotly.v1+json"
# A figure's picture: as wide as a notebook's output box at 1,280 px with the file browser
# open (the picture is shown at its own size; wider would scroll), as tall as the figure or
# plotly's renderer's default (360 px) for one with no height.
PICTURE_WIDTH = 800
PICTURE_HEIGHT = 360
# Debian's Chromium (what the browser tests drive), else Playwright's own.
CHROMIUM = Path("/usr/bin/chromium")


def sources(names: list[str] | None = None) -> list[Path]:
    """Source scripts, all or those whose file name starts with one of ``names``."""
    found = sorted(SOURCES.glob("[0-9][0-9]_*.py"))
    if not names:
        return found
    chosen = [p for p in found if any(p.stem.startswith(n) for n in names)]
    missing = [n for n in names if not any(p.stem.startswith(n) for p in found)]
    if missing:
        valid = ", ".join(p.stem for p in found)
        raise SystemExit(f"no notebook source matches {missing}; valid: {valid}")
    return chosen


def notebook_path(source: Path) -> Path:
    return HERE / f"{source.stem}.ipynb"


def from_source(source: Path) -> nbformat.NotebookNode:
    """The notebook a source describes, unexecuted."""
    nb = jupytext.read(source)
    nb.metadata = {"kernelspec": dict(KERNELSPEC)}
    for cell in nb.cells:
        tags = cell.metadata.get("tags")
        cell.metadata = {"tags": list(tags)} if tags else {}
    return nb


def _shape(nb: nbformat.NotebookNode) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in nb.cells]


def differences(source: Path) -> list[str]:
    """How the committed notebook's cells differ from its source (empty when they match)."""
    path = notebook_path(source)
    if not path.exists():
        return [f"{path.name} does not exist"]
    want = _shape(from_source(source))
    have = _shape(nbformat.read(path, as_version=4))
    out = []
    if len(want) != len(have):
        out.append(f"{path.name}: {len(have)} cells, its source has {len(want)}")
    for index, (w, h) in enumerate(zip(want, have, strict=False)):
        if w != h:
            out.append(f"{path.name} cell {index}: differs from {source.name} ({h[1][:50]!r})")
            break
    return out


@functools.cache
def _widget_repr() -> re.Pattern[str]:
    """``Name(`` for every ipywidgets widget class (and plotly's FigureWidget)."""
    import ipywidgets

    names = {
        name
        for name, value in vars(ipywidgets).items()
        if isinstance(value, type) and issubclass(value, ipywidgets.Widget)
    }
    return re.compile(r"\b(" + "|".join(sorted(names | {"FigureWidget"})) + r")\(")


def widget_reprs(nb: nbformat.NotebookNode) -> list[str]:
    """Saved outputs whose text is a widget's repr: what every reader without a live kernel
    (GitHub, nbviewer, JupyterLab before it runs) would see in place of the widget."""
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", ()):
            for text in (output.get("text", ""), output.get("data", {}).get("text/plain", "")):
                text = "".join(text) if isinstance(text, list) else text
                match = _widget_repr().search(text)
                if match:
                    found.append(f"cell {index}: {text[match.start() : match.start() + 60]!r}")
    return found


# JavaScript keeps integers exactly up to 2**53 (Number.MAX_SAFE_INTEGER).
_JS_EXACT = 2**53
# Under this, JSON.stringify writes an integral number with neither point nor exponent.
_JS_PLAIN = 1e21


def as_javascript_writes(value: Any) -> Any:
    """``value`` (a notebook's JSON) as it comes back from JupyterLab, which parses and
    re-serialises it in JavaScript: an integral float comes back an int (0.0 as 0, 1e+16
    as 10000000000000000) and an int past 2**53 loses its last digits."""
    if isinstance(value, dict):
        return {k: as_javascript_writes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_javascript_writes(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < _JS_PLAIN:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _JS_EXACT:
        return int(float(value))  # the nearest double, as JavaScript holds it
    return value


def unstable_numbers(value: Any, where: str = "") -> list[str]:
    """Where ``value`` (a notebook's JSON) holds a number that a save from JupyterLab
    would write differently, and the number."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in unstable_numbers(v, f"{where}/{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in unstable_numbers(v, f"{where}/{i}")]
    after = as_javascript_writes(value)
    if type(after) is not type(value) or after != value:
        return [f"{where} = {value!r}"]
    return []


def _stable(value: Any) -> Any:
    """Integral floats as ints (what JupyterLab writes back) and ints past 2**53 as strings
    (the figures' nanosecond times: their readers take either)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _JS_EXACT:
        return str(value)
    return as_javascript_writes(value)


def figures_without_picture(nb: nbformat.NotebookNode) -> list[str]:
    """Plotly outputs with no ``image/png``: JupyterLab adds one when it draws them, so
    opening the notebook changes it."""
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", ()):
            data = output.get("data", {})
            if PLOTLY in data and "image/png" not in data:
                found.append(f"cell {index}: a plotly figure without its PNG")
    return found


# Plotly.toImage draws a figure off-screen and answers a data URL; the figure's own config
# (none in a notebook's output) and the size of the picture. The same call the renderer makes.
_TO_IMAGE = """async ([figure, width, height]) => {
  const url = await Plotly.toImage(
    {data: figure.data, layout: figure.layout, config: figure.config || {}},
    {format: 'png', width: width, height: height});
  return url.slice(url.indexOf(',') + 1);
}"""


def with_pictures(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with a PNG beside every plotly figure that has none (see the module's doc),
    drawn by the plotly.js of the ``plotly`` package, the version its JupyterLab renderer
    bundles."""
    missing = [
        output["data"]
        for cell in nb.cells
        for output in cell.get("outputs", ())
        if PLOTLY in output.get("data", {}) and "image/png" not in output["data"]
    ]
    if not missing:
        return nb
    import plotly
    from playwright.sync_api import sync_playwright

    script = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM) if CHROMIUM.exists() else None,
            args=["--no-sandbox", "--disable-gpu"],
        )
        try:
            page = browser.new_page()
            page.set_content("<!DOCTYPE html><html><body></body></html>")
            page.add_script_tag(path=str(script))
            for data in missing:
                figure = data[PLOTLY]
                height = figure.get("layout", {}).get("height") or PICTURE_HEIGHT
                width = figure.get("layout", {}).get("width") or PICTURE_WIDTH
                data["image/png"] = page.evaluate(_TO_IMAGE, [figure, width, height])
        finally:
            browser.close()
    return nb


def round_trip_stable(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with every number as JupyterLab would save it."""
    return nbformat.from_dict(_stable(nb))


def as_jupyterlab_saves(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` as JupyterLab saves it after opening it unrun (numbers as JavaScript writes
    them, the running kernel's name, a picture beside each figure), so that opening and
    saving the committed notebook changes no byte."""
    nb = round_trip_stable(nb)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    return with_pictures(nb)


def build(source: Path) -> Path:
    """Execute the source in a fresh kernel, from the notebooks folder, and write the .ipynb."""
    nb = from_source(source)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNELSPEC["name"],
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute()
    for cell in nb.cells:  # execution timestamps would change every build
        cell.metadata.pop("execution", None)
    path = notebook_path(source)
    # what JupyterLab would save: opening and saving the notebook changes no byte
    nb = as_jupyterlab_saves(nb)
    nbformat.write(nb, path)
    shown = widget_reprs(nb)
    if shown:
        raise SystemExit(f"{path.name} saves widget repr text: " + "; ".join(shown))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebook number or name prefix, e.g. 06")
    parser.add_argument("--check", action="store_true", help="compare only; execute nothing")
    parser.add_argument(
        "--stable",
        action="store_true",
        help="execute nothing: rewrite the committed notebooks as a save from JupyterLab "
        "would (integral floats as ints, a PNG beside each plotly figure), so opening one "
        "changes no byte",
    )
    opts = parser.parse_args(argv)
    chosen = sources(opts.names)
    if opts.stable:
        for s in chosen:
            path = notebook_path(s)
            nbformat.write(as_jupyterlab_saves(nbformat.read(path, as_version=4)), path)
        return 0
    if opts.check:
        problems = [line for s in chosen for line in differences(s)]
        for s in chosen:
            if notebook_path(s).exists():
                nb = nbformat.read(notebook_path(s), as_version=4)
                problems += [f"{notebook_path(s).name} {line}" for line in widget_reprs(nb)]
                problems += [
                    f"{notebook_path(s).name} changes when saved from JupyterLab: {line}"
                    for line in unstable_numbers(nb)[:3] + figures_without_picture(nb)[:3]
                ]
                if nb.metadata.get("kernelspec") != KERNELSPEC:
                    problems.append(f"{notebook_path(s).name}: kernelspec is not {KERNELSPEC}")
        print("\n".join(problems) or f"{len(chosen)} notebooks match their sources")
        return 1 if problems else 0
    for source in chosen:
        print(f"building {notebook_path(source).name} from {source.name}", flush=True)
        build(source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
