from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("IPython", "ipywidgets", "ipyparallel", "anywidget")


def test_plots_and_report_do_not_import_notebook_packages() -> None:
    """Building and updating figures and writing a report must work in a plain script."""
    code = (
        "import sys, tempfile, pathlib\n"
        "from workbench.plots import demo_events, memory_figure, update_memory_figure\n"
        "from workbench.report import ReportSection, write_report\n"
        "ev = demo_events(2)\n"
        "fig = memory_figure(ev[:30])\n"
        "update_memory_figure(fig, ev[30:])\n"
        "out = pathlib.Path(tempfile.mkdtemp()) / 'r.html'\n"
        "write_report(out, [ReportSection('m', figures=[fig])], title='t')\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
