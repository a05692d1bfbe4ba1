"""The start-up bar's saved output is a line of text, in a real kernel run by nbclient
(what notebooks/build.py and strict nbval see), never the widget's repr."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from workbench.magics.progress import notebook_progress, startup_line

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.mark.engines  # a real kernel, run by nbclient
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
    (output,) = nb.cells[0].outputs
    assert output.output_type == "display_data"
    assert output.data["text/plain"] == startup_line(2)
    assert "IntProgress(" not in str(output.data)
    assert WIDGET_VIEW in output.data  # a live front end still draws the bar


def test_no_bar_outside_a_notebook_kernel() -> None:
    update, close = notebook_progress(2)
    assert update is None
    close()  # a no-op, safe to call
