"""pdb on a rank typed into JupyterLab's stdin box (issue 45), in a real browser: a
``%%wb --ranks 1`` cell stops at its ``breakpoint()``, the input box under the cell is
labelled ``[rank 1] (Pdb)``, ``p y`` shows 41 and ``c`` lets the cell finish with 42."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser import stepper_page as sp

pytestmark = pytest.mark.browser

CELLS = [
    sp.CELLS[0],
    sp.CELLS[1],
    "%%wb --ranks 1\ny = 41\nbreakpoint()\ny += 1\nprint('y is', y)",
    sp.CELLS[3],
]

# The stdin box of cell ``index``: its prompt label, and whether an input is open there.
STDIN = """(index) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
  const boxes = cell.node.querySelectorAll('.jp-Stdin');
  const open = [...boxes].filter(b => b.querySelector('input:not([disabled])'));
  const last = open.length ? open[open.length - 1] : null;
  return {
    prompt: last ? last.querySelector('.jp-Stdin-prompt').innerText : null,
    text: (cell.node.querySelector('.jp-OutputArea') || {innerText: ''}).innerText,
  };
}"""


@pytest.fixture
def notebook() -> Iterator[Path]:
    yield from sp.fresh_notebook("debug.ipynb", CELLS)


def _answer(page: object, line: str) -> None:
    """Type ``line`` into the open stdin box of cell 2 and press Enter."""
    box = page.locator(".jp-Stdin-input:not([disabled])").last  # type: ignore[attr-defined]
    box.fill(line)
    box.press("Enter")


@pytest.mark.timeout(240)
def test_pdb_commands_typed_into_the_stdin_box_reach_the_rank(notebook: Path) -> None:
    with sp.started(notebook, "debug-failure.png") as session:
        page = session.page
        session.run_cell(2)
        waiting = f"() => ({STDIN})(2).prompt !== null"
        page.wait_for_function(waiting, timeout=60_000)
        assert page.evaluate(STDIN, 2)["prompt"].strip() == "[rank 1] (Pdb)"
        _answer(page, "p y")
        page.wait_for_function(
            f"() => {{ const s = ({STDIN})(2); return s.prompt !== null "
            "&& s.text.split('\\n').includes('41'); }",
            timeout=30_000,
        )
        _answer(page, "c")
        page.get_by_text("y is 42").wait_for(timeout=30_000)
        session.run_cell(3)
        page.get_by_text(sp.STOPPED).wait_for()
    assert not session.leftovers, f"processes left after a clean shutdown: {session.leftovers}"
