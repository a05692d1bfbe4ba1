"""A ``%%wb`` cell's output in a real browser while it runs (JupyterLab + headless Debian
Chromium + Playwright): a cell printing once a second for 8 s on 2 ranks shows its first
line on both ranks long before it ends, then its final output, grouped per rank in rank
order, replaces the live lines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser import stepper_page as sp

pytestmark = pytest.mark.browser

TICKS = 8
CELLS = [
    sp.CELLS[0],
    sp.CELLS[1],
    "%%wb\nimport time\n"
    f"for i in range({TICKS}):\n"
    "    print('tick', i, 'rank', rank, flush=True)\n"
    "    time.sleep(1)\n"
    "print('done', rank)",
    sp.CELLS[3],
]

# The cell's output text and whether JupyterLab still shows it running ("[*]").
CELL_STATE = """(index) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
  const out = cell.node.querySelector('.jp-OutputArea');
  const prompt = cell.node.querySelector('.jp-InputPrompt');
  return {text: out ? out.innerText : '', running: prompt ? prompt.innerText.includes('*') : false};
}"""


@pytest.fixture
def notebook() -> Iterator[Path]:
    yield from sp.fresh_notebook("live.ipynb", CELLS)


@pytest.mark.timeout(240)
def test_each_ranks_first_line_shows_before_the_cell_finishes(notebook: Path) -> None:
    with sp.started(notebook, "live-failure.png") as session:
        page = session.page
        session.run_cell(2)
        # Both ranks' first line, while the cell still runs and before its last line.
        page.wait_for_function(
            f"""() => {{
              const s = ({CELL_STATE})(2);
              return s.text.includes('[rank 0] tick 0 rank 0')
                && s.text.includes('[rank 1] tick 0 rank 1');
            }}""",
            timeout=TICKS * 1000,
        )
        live = page.evaluate(CELL_STATE, 2)
        assert live["running"] and "done" not in live["text"], live
        # The final output replaces the live lines: grouped per rank, in rank order.
        finished = (
            f"() => {{ const s = ({CELL_STATE})(2); "
            "return !s.running && s.text.includes('done 1'); }"
        )
        page.wait_for_function(finished, timeout=60_000)
        final = page.evaluate(CELL_STATE, 2)["text"]
        ticks = "".join(f"tick {i} rank {{r}}\n" for i in range(TICKS))
        expected = "".join(f"[rank {r}]\n" + ticks.format(r=r) + f"done {r}\n" for r in (0, 1))
        assert final.strip() == expected.strip(), final
        session.run_cell(3)
        page.get_by_text(sp.STOPPED).wait_for()
    assert not session.leftovers, f"processes left after a clean shutdown: {session.leftovers}"
