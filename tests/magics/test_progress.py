"""The start-up bar's saved output is a line of text, in a real kernel run by nbclient
(what notebooks/build.py and strict nbval see), never the widget's repr."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from workbench.magics.progress import notebook_progress, startup_line

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.mark.timeout(120)
def test_bar_output_reads_as_text_where_no_bar_is_drawn() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from workbench.magics.progress import notebook_progress\n"
            "update, close = notebook_progress(2)\n"
            "update('engines', 2, 2)\n"
            "update('group', 1, 2)\n"
            "close()"
        )
    ]
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    # nbclient keeps what the bar's close() left: the line alone, no widget to look up
    (output,) = nb.cells[0].outputs
    assert output.output_type == "display_data"
    assert dict(output.data) == {"text/plain": startup_line(2)}


@pytest.mark.timeout(120)
def test_an_open_bar_is_a_widget_with_the_same_line() -> None:
    """What a live front end draws, and what strict nbval reads (it applies no display
    updates and skips the widget part): the bar, with the line as its plain text."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from workbench.magics.progress import notebook_progress\n"
            "update, close = notebook_progress(3)"
        )
    ]
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    (output,) = nb.cells[0].outputs
    assert output.data["text/plain"] == startup_line(3)
    assert set(output.data) == {"text/plain", WIDGET_VIEW}


def test_no_bar_outside_a_notebook_kernel() -> None:
    update, close = notebook_progress(2)
    assert update is None
    close()  # a no-op, safe to call
