"""The stepper widget in a real browser: JupyterLab + headless Debian Chromium + Playwright.

What only a browser can show: the widget and its plotly figures actually render in
JupyterLab, a click on a rendered button reaches the kernel, the kernel drives both ranks,
and the new events come back as points and bars in the drawn figures. The notebook runs what
a user types (``%load_ext workbench``, ``%wb start -n 2``, a ``Stepper``, ``%wb stop``).

Screenshots go to ``test-artifacts/browser/`` (git-ignored). Every process the test starts
(JupyterLab, the kernel, the cluster's controller and engines, Chromium) must be gone after
a clean shutdown; stragglers are killed either way and fail the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import stepper_page as sp
from tests.browser.session import BrowserSession, open_notebook

pytestmark = pytest.mark.browser


@pytest.fixture
def notebook() -> Iterator[Path]:
    yield from sp.fresh_notebook("stepper.ipynb")


@pytest.mark.timeout(240)
def test_stepper_widget_drives_the_cluster_from_the_browser(notebook: Path) -> None:
    with open_notebook(
        notebook, viewport=sp.VIEWPORT, failure_shot=sp.ARTIFACTS / "failure.png"
    ) as session:
        _drive(session)
    assert not session.leftovers, f"processes left after a clean shutdown: {session.leftovers}"


def _drive(session: BrowserSession) -> None:
    page = session.page
    _shot(page, "01-kernel-ready")
    session.run_cell(0)
    session.run_cell(1)
    page.get_by_text(sp.STARTED).wait_for()
    session.track()  # controller + engines, before anything could orphan them
    session.run_cell(2)
    phase = page.get_by_role("button", name="Phase ▶", exact=True)
    step = page.get_by_role("button", name="Step ▶▶", exact=True)
    phase.wait_for()
    widget = sp.widget(page)
    sp.wait_figures(page, "Object.keys(f).length === 3")
    sp.wait_status(page, "true")
    before = sp.figures(page)
    assert before["memory"]["points"] == 0 and before["comm"]["points"] == 0, before
    assert sp.status_rows(page) == []  # the run is built on every rank by the first action
    assert page.get_by_text("built on every rank by the first").is_visible()
    _shot(widget, "02-widget")

    phase.click()
    sp.wait_figures(page, "f.memory.points > 0")
    sp.wait_status(page, "rows.length === 2 && rows.every((r) => r[2] === 'forward')")
    after_phase = sp.figures(page)
    assert after_phase["memory"]["paths"] > before["memory"]["paths"], after_phase
    assert after_phase["comm"]["points"] >= 2, after_phase  # one data span per rank
    _assert_fills(after_phase["memory"])
    _shot(widget, "03-after-phase")

    step.click()
    sp.wait_status(page, "rows.every((r) => r[1] === '1')")
    sp.wait_figures(page, "f.comm.collectives > 0 && f.loss.points === 2")
    after_step = sp.figures(page)
    rows = sp.status_rows(page)
    assert [r[:3] for r in rows] == [["0", "1", "data"], ["1", "1", "data"]], rows
    assert all(float(r[3]) > 0 for r in rows), rows  # a real loss on every rank
    assert after_step["memory"]["points"] > after_phase["memory"]["points"], after_step
    assert after_step["comm"]["points"] > after_phase["comm"]["points"], after_step
    _shot(widget, "04-step1-memory")

    # A few more steps through Run N (the kernel runs it as a task between comm messages).
    controls = page.locator(".widget-hbox").filter(has=phase)
    count = controls.locator("input[type=number]")
    count.fill("3")
    count.press("Enter")
    controls.get_by_role("button", name="Run N", exact=True).click()
    sp.wait_status(page, "rows.every((r) => r[1] === '4')")
    sp.wait_figures(page, "f.loss.points === 8")  # one loss per rank per step
    after_run = sp.figures(page)
    assert after_run["memory"]["points"] > after_step["memory"]["points"], after_run
    assert after_run["comm"]["collectives"] > after_step["comm"]["collectives"], after_run
    _shot(widget, "05-run-memory")

    # A hidden tab cannot measure its width; showing it re-fits its figure to the tab.
    for tab, kind in (("communication", "comm"), ("loss", "loss")):
        page.locator(".lm-TabBar-tab", has_text=tab).click()
        sp.wait_figures(
            page, f"f.{kind}.width > 0 && Math.abs(f.{kind}.plotWidth - f.{kind}.width) <= 2"
        )
        _assert_fills(sp.figures(page)[kind])
        _shot(widget, f"06-run-{kind}")
    comm = sp.figures(page)["comm"]
    assert comm["bars"] >= after_run["comm"]["collectives"] > 0, comm

    session.run_cell(3)
    page.get_by_text(sp.STOPPED).wait_for()
    _shot(page, "07-stopped")


def _assert_fills(figure: dict[str, Any]) -> None:
    """The figure is drawn across its whole (visible) container, not at plotly's 700 px."""
    assert figure["width"] > 700 and abs(figure["plotWidth"] - figure["width"]) <= 2, figure


def _shot(target: Any, name: str) -> None:
    target.screenshot(path=str(sp.ARTIFACTS / f"{name}.png"), animations="disabled")
