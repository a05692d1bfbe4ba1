"""The stepper widget on a model defined in the notebook, in a real browser (JupyterLab +
headless Chromium + Playwright): the model class, dataset, loss and optimizer are written in
a cell, shipped to both ranks, and Phase ▶ / Step ▶▶ clicked in the rendered widget run it
under FSDP; the drawn figures gain memory samples, FSDP collectives and losses."""

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
    yield from sp.fresh_notebook("user_model.ipynb", sp.USER_CELLS)


@pytest.mark.timeout(240)
def test_stepper_widget_steps_a_model_defined_in_the_notebook(notebook: Path) -> None:
    with open_notebook(
        notebook, viewport=sp.VIEWPORT, failure_shot=sp.ARTIFACTS / "user-failure.png"
    ) as session:
        _drive(session)
    assert not session.leftovers, f"processes left after a clean shutdown: {session.leftovers}"


def _drive(session: BrowserSession) -> None:
    page = session.page
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
    # The status line names the strategy and the user's model (its factory, the class).
    status = page.locator(".widget-html").filter(has_text="next phase")
    assert "fsdp · Net ·" in status.inner_text(), status.inner_text()

    phase.click()  # builds the user's model on both ranks, then runs the data phase
    sp.wait_figures(page, "f.memory.points > 0")
    sp.wait_status(page, "rows.length === 2 && rows.every((r) => r[2] === 'forward')")
    after_phase = sp.figures(page)
    assert after_phase["memory"]["paths"] > before["memory"]["paths"], after_phase
    assert after_phase["comm"]["points"] >= 2, after_phase  # one data span per rank
    _shot(widget, "user-01-after-phase")

    step.click()
    sp.wait_status(page, "rows.every((r) => r[1] === '1')")
    sp.wait_figures(page, "f.comm.collectives > 0 && f.loss.points === 2")
    after_step = sp.figures(page)
    rows = sp.status_rows(page)
    assert [r[:3] for r in rows] == [["0", "1", "data"], ["1", "1", "data"]], rows
    assert all(float(r[3]) > 0 for r in rows), rows  # a real loss on every rank
    assert after_step["memory"]["points"] > after_phase["memory"]["points"], after_step
    assert after_step["comm"]["collectives"] > after_phase["comm"]["collectives"], after_step

    step.click()
    sp.wait_status(page, "rows.every((r) => r[1] === '2')")
    sp.wait_figures(page, "f.loss.points === 4")  # one loss per rank per step
    assert sp.figures(page)["comm"]["collectives"] > after_step["comm"]["collectives"]
    _shot(widget, "user-02-after-two-steps")

    session.run_cell(3)
    page.get_by_text(sp.STOPPED).wait_for()


def _shot(target: Any, name: str) -> None:
    target.screenshot(path=str(sp.ARTIFACTS / f"{name}.png"), animations="disabled")
