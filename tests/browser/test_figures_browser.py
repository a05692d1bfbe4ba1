"""What a class sees on a projector, in a real browser (JupyterLab + headless Chromium):
the memory figure names phases and steps on its axis (no fractional sample numbers), its
peak labels sit inside their panels, identical rank curves say so, and no output reads as a
widget's repr, neither in a live notebook nor in a committed walkthrough opened unrun;
that walkthrough, saved unrun, is byte for byte what git has, and its figures, drawn live,
follow their box's width.

The first test runs ``docs_images.shoot``, the code that makes the README screenshots, and
leaves its PNGs in test-artifacts/browser/docs/ (look at them there).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.browser import stepper_page as sp
from tests.browser.docs_images import IMAGES, shoot
from tests.browser.figure_probes import REPR, problems
from tests.browser.session import browser_missing, open_notebook
from workbench.magics.progress import startup_line

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def browser() -> None:
    reason = browser_missing()
    if reason:
        pytest.skip(reason)


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("browser")
def test_readme_screenshots_show_phases_steps_and_whole_labels() -> None:
    out = sp.ARTIFACTS / "docs"
    result = shoot(out, steps=3)  # 3 steps: every phase name fits the 1,280 px figure
    drawn = result["drawn"]
    assert problems(drawn, result["text"]) == []
    assert not result["leftovers"], f"processes left after a clean shutdown: {result['leftovers']}"
    # the start-up bar closed itself (a closed widget's view is removed: nothing is left of
    # it on a live page; its saved line is what the next test reads) and no repr is shown
    assert startup_line(2) not in result["text"]
    # both ranks' panels, each naming the five DDP phases of every step it drew
    memory = drawn["memory"]["axes"]
    assert set(memory) == {"x", "x2"}
    for ticks in memory.values():
        labels = [line for tick in ticks for line in tick]
        assert [t for t in labels if t.startswith("step")] == [f"step {i}" for i in range(3)]
    # the timeline names every step on its top axis
    top = [line for tick in drawn["comm"]["axes"]["x2"] for line in tick]
    assert top == [f"step {i}" for i in range(3)]
    # DDP reports one loss on every rank: one legend entry says so
    assert "ranks 0–1 identical" in drawn["loss"]["legend"], drawn["loss"]["legend"]
    assert all((out / name).stat().st_size > 10_000 for name in IMAGES.values())


# Save the current notebook through JupyterLab's own command; resolves once it is written.
SAVE = """async () => {
  const app = window.jupyterapp;
  const context = app.shell.currentWidget.context;
  await context.save();
  return context.model.dirty;
}"""

# The committed figures as a reader sees them unrun: plotly's renderer shows each one's
# saved PNG (drawn, not broken) until the mouse enters it.
PICTURES = """() => Array.from(document.querySelectorAll('.jp-RenderedPlotly')).map(
  (node) => { const img = node.querySelector('img.plot-img');
              return Boolean(img && img.complete && img.naturalWidth > 0
                             && img.getBoundingClientRect().height > 0); })"""


# The first committed figure drawn live (plotly's renderer draws into its own node):
# the node's width and the width plotly drew, or null before it is drawn.
LIVE_FIGURE = """() => {
  const node = document.querySelector('.jp-RenderedPlotly');
  const drawn = node && node._fullLayout && node.querySelector('.plot-container');
  return drawn && drawn.style.display !== 'none'
    ? {width: node.clientWidth, plotWidth: node._fullLayout.width} : null;
}"""


def _fits_its_box(page: Any) -> list[int]:
    """Open the file browser, then close it; after each, wait until the live figure is
    drawn as wide as its box. The two widths."""
    fits = "(f) => f && f.width > 0 && Math.abs(f.plotWidth - f.width) <= 2"
    page.wait_for_function(f"() => ({fits})(({LIVE_FIGURE})())")
    widths = []
    for side in ("expandLeft", "collapseLeft"):
        before = page.evaluate(LIVE_FIGURE)["width"]
        page.evaluate(f"() => window.jupyterapp.shell.{side}()")
        page.wait_for_function(
            f"() => {{ const f = ({LIVE_FIGURE})(); return f && f.width !== {before}; }}"
        )
        page.wait_for_function(f"() => ({fits})(({LIVE_FIGURE})())")
        widths.append(page.evaluate(LIVE_FIGURE)["width"])
    return widths


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("browser")
def test_a_committed_walkthrough_opened_unrun_shows_no_widget_repr() -> None:
    """What a reader sees before running anything: saved outputs only, every figure shown.
    Then the reader saves it, unrun: the file is byte for byte what git has (issue 49:
    JupyterLab wrote plotly's numbers back as JavaScript holds them, "0.0" as "0", and its
    plotly renderer added a PNG of every figure it drew). Notebook 02: a stepper's
    figures, with their state in meta. Pointed at, a saved figure is drawn live and
    follows its box when the file browser opens and closes."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    with tempfile.TemporaryDirectory(prefix="wb-browser-saved-") as root:
        notebook = Path(root) / "02_data_parallel.ipynb"
        shutil.copy(ROOT / "notebooks" / notebook.name, notebook)
        committed = notebook.read_bytes()
        with open_notebook(notebook, viewport=sp.VIEWPORT) as session:
            page = session.page
            page.get_by_text("workbench: 2 ranks").first.wait_for()  # outputs are drawn
            page.wait_for_function(f"() => ({PICTURES})().length === 3", timeout=30_000)
            with contextlib.suppress(PlaywrightTimeout):  # the assertion below says which
                page.wait_for_function(f"() => ({PICTURES})().every(Boolean)", timeout=10_000)
            pictures = page.evaluate(PICTURES)
            text = page.locator(".jp-Notebook").inner_text()
            assert page.evaluate(SAVE) is False
            saved = notebook.read_bytes()
            # Pointed at (the event its renderer listens to), a saved figure is drawn live,
            # and it follows its box's width.
            page.locator(".jp-RenderedPlotly img.plot-img").first.dispatch_event("mouseenter")
            fits = _fits_its_box(page)
    assert fits[0] < fits[1] - 100, fits
    assert not session.leftovers, session.leftovers
    assert pictures == [True] * 3, pictures
    if saved != committed:
        changed = [
            (a[:100], b[:100])
            for a, b in zip(
                committed.decode().splitlines(), saved.decode().splitlines(), strict=False
            )
            if a != b
        ]
        raise AssertionError(f"saving changed {len(changed)} lines, e.g. {changed[:5]}")
    shown = REPR.search(text)
    assert shown is None, text[shown.start() : shown.start() + 80]
    assert startup_line(2) in text
    assert not re.search(r"Error displaying widget|Loading widget", text)
