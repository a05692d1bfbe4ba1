"""The stepper widget in a real browser: JupyterLab + headless Debian Chromium + Playwright.

What only a browser can show: the widget and its plotly figures actually render in
JupyterLab, a click on a rendered button reaches the kernel, the kernel drives both ranks,
and the new events arrive back as points and bars in the figures. The notebook runs exactly
what a user types (``%load_ext workbench``, ``%wb start -n 2``, a ``Stepper``, ``%wb stop``).

Screenshots go to ``test-artifacts/browser/`` (git-ignored). Every process the test starts
(JupyterLab, the kernel, the cluster's controller and engines, the browser) is tracked and
must be gone at the end; stragglers are killed and fail the test.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.browser.lab import LabServer, kill_all, living

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1900}
TIMEOUT_MS = 60_000  # one wait (cluster start on a busy 2-core machine is the slowest)

CELLS = [
    "%load_ext workbench",
    "%wb start -n 2",
    "import workbench as wb\n"
    'stepper = wb.Stepper(model="mlp-tiny", strategy="dp", batch_size=8)\n'
    "stepper",
    "%wb stop",
]

# The notebook panel is ready for input once its session is ready and the kernel is idle.
KERNEL_READY = """() => {
  const app = window.jupyterapp;
  const panel = app && app.shell && app.shell.currentWidget;
  const ctx = panel && panel.sessionContext;
  const kernel = ctx && ctx.session && ctx.session.kernel;
  return Boolean(ctx && ctx.isReady && kernel && kernel.status === 'idle'
                 && panel.content && panel.content.widgets.length === %d);
}"""

# Run one cell through JupyterLab's own command (what Shift+Enter does, minus focus games).
RUN_CELL = """(index) => {
  const app = window.jupyterapp;
  const notebook = app.shell.currentWidget.content;
  notebook.activeCellIndex = index;
  void app.commands.execute('notebook:run-cell');
  return notebook.activeCellIndex;
}"""

# What the rendered plotly graph divs hold: data points per figure, collectives in the comm
# timeline, and how many non-empty SVG marks (area/line paths, bar rectangles) are drawn.
FIGURES = """() => {
  const out = {};
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const title = (gd.layout && gd.layout.title && gd.layout.title.text) || '';
    const kind = title.startsWith('Memory') ? 'memory'
               : title.startsWith('Compute') ? 'comm'
               : title.startsWith('Loss') ? 'loss' : null;
    if (!kind) continue;
    let points = 0, collectives = 0;
    for (const t of gd._fullData || []) {
      const n = t.x ? t.x.length : 0;
      points += n;
      const key = (t.meta && t.meta.key) || '';
      if (key.startsWith('timeline/op/')) collectives += n;
    }
    const drawn = (sel) => [...gd.querySelectorAll(sel)]
      .filter((p) => (p.getAttribute('d') || '').length > 8).length;
    out[kind] = {
      points, collectives,
      paths: drawn('.scatterlayer path.js-fill, .scatterlayer path.js-line'),
      bars: drawn('.barlayer .point path'),
      width: gd.clientWidth,  // the container (0 while its tab is hidden)
      plotWidth: gd._fullLayout.width,  // what plotly drew
    };
  }
  return out;
}"""

# Rows of the stepper's status table: [rank, step, next phase, loss].
STATUS_ROWS = """() => {
  const table = [...document.querySelectorAll('.widget-html table')]
    .find((t) => t.textContent.includes('next phase'));
  if (!table) return null;
  return [...table.querySelectorAll('tr')].slice(1)
    .map((r) => [...r.cells].map((c) => c.textContent.trim()));
}"""


def _notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)


@pytest.fixture
def playwright_api() -> Any:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found; install Debian's chromium (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright (Python) is not installed; pip install -e '.[test]'")
    return sync_playwright


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="wb-browser-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _descendants() -> set[psutil.Process]:
    return set(psutil.Process().children(recursive=True))


@pytest.mark.timeout(240)
def test_stepper_widget_drives_the_cluster_from_the_browser(
    playwright_api: Any, workdir: Path
) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    root, state = workdir / "root", workdir / "state"
    root.mkdir()
    state.mkdir()
    _notebook(root / "stepper.ipynb")
    lab = LabServer(root, state)
    seen: set[psutil.Process] = set()  # every process this test started, however deep
    page = None
    passed = False
    try:
        lab.start()
        with playwright_api() as pw:
            context = pw.chromium.launch_persistent_context(
                str(workdir / "chromium-profile"),  # fresh --user-data-dir
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_FLAGS,
                viewport=VIEWPORT,
            )
            try:
                page = context.new_page()
                page.set_default_timeout(TIMEOUT_MS)
                _drive(page, lab, seen)
                passed = True
            finally:
                seen |= _descendants()
                if page is not None and not passed:
                    with contextlib.suppress(Exception):  # never hide the real failure
                        _shot(page, "failure")
                context.close()
    finally:
        seen |= _descendants()
        with contextlib.suppress(Exception):  # the server may be gone; the sweep decides
            lab.shutdown_kernels()
        lab.stop()
        _, _ = psutil.wait_procs(living(seen), timeout=15)
        stragglers = living(seen)
        names = [f"{p.pid} {_cmdline(p)}" for p in stragglers]
        kill_all(stragglers)
    if passed:
        assert not names, f"processes left behind after a clean shutdown: {names}"


def _drive(page: Any, lab: LabServer, seen: set[psutil.Process]) -> None:
    page.goto(lab.url("lab/tree/stepper.ipynb", reset=""))
    page.wait_for_function(KERNEL_READY % len(CELLS))
    page.evaluate("() => { window.jupyterapp.shell.collapseLeft(); }")
    _shot(page, "01-kernel-ready")

    page.evaluate(RUN_CELL, 0)
    page.evaluate(RUN_CELL, 1)
    page.get_by_text("workbench: 2 ranks").wait_for()
    seen |= _descendants()  # controller + engines, before anything could orphan them
    page.evaluate(RUN_CELL, 2)
    phase = page.get_by_role("button", name="Phase ▶", exact=True)
    step = page.get_by_role("button", name="Step ▶▶", exact=True)
    phase.wait_for()
    widget = page.locator(".jp-OutputArea-output").filter(has=phase)
    page.wait_for_function(f"() => Object.keys(({FIGURES})()).length === 3")
    page.wait_for_function(f"() => ({STATUS_ROWS})() !== null")
    before = page.evaluate(FIGURES)
    assert before["memory"]["width"] > 300 and before["memory"]["points"] == 0, before
    assert before["comm"]["points"] == 0, before
    assert _status(page) == []  # the run is built on every rank by the first action
    assert page.get_by_text("built on every rank by the first").is_visible()
    _shot(widget, "02-widget")

    phase.click()
    page.wait_for_function(f"() => ({FIGURES})().memory.points > 0")
    page.wait_for_function(f"() => ({STATUS_ROWS})().every((r) => r[2] === 'forward')")
    after_phase = page.evaluate(FIGURES)
    assert after_phase["memory"]["paths"] > before["memory"]["paths"], after_phase
    _assert_fills(after_phase["memory"])
    assert after_phase["comm"]["points"] >= 2, after_phase  # one data span per rank
    _shot(widget, "03-after-phase")

    step.click()
    page.wait_for_function(f"() => ({STATUS_ROWS})().every((r) => r[1] === '1')")
    page.wait_for_function(f"() => ({FIGURES})().comm.collectives > 0")
    after_step = page.evaluate(FIGURES)
    rows = _status(page)
    assert [r[:3] for r in rows] == [["0", "1", "data"], ["1", "1", "data"]], rows
    assert all(float(r[3]) > 0 for r in rows), rows  # a real loss on every rank
    assert after_step["memory"]["points"] > after_phase["memory"]["points"], after_step
    assert after_step["comm"]["points"] > after_phase["comm"]["points"], after_step
    assert after_step["loss"]["points"] == 2, after_step  # one loss per rank
    _shot(widget, "04-step1-memory")

    # A few more steps through Run N (the kernel runs it as a task between comm messages).
    controls = page.locator(".widget-hbox").filter(has=phase)
    count = controls.locator("input[type=number]")
    count.fill("3")
    count.press("Enter")
    controls.get_by_role("button", name="Run N", exact=True).click()
    page.wait_for_function(f"() => ({STATUS_ROWS})().every((r) => r[1] === '4')")
    page.wait_for_function(f"() => ({FIGURES})().loss.points === 8")
    after_run = page.evaluate(FIGURES)
    assert after_run["memory"]["points"] > after_step["memory"]["points"], after_run
    assert after_run["comm"]["collectives"] > after_step["comm"]["collectives"], after_run
    _shot(widget, "05-run-memory")

    # Hidden tabs cannot measure their width; showing one re-fits its figure to the tab.
    for tab, kind in (("communication", "comm"), ("loss", "loss")):
        page.locator(".lm-TabBar-tab", has_text=tab).click()
        page.wait_for_function(
            f"() => {{ const f = ({FIGURES})().{kind}; "
            "return f.width > 0 && Math.abs(f.plotWidth - f.width) <= 2; }"
        )
        _assert_fills(page.evaluate(FIGURES)[kind])
        _shot(widget, f"06-run-{kind}")
    comm = page.evaluate(FIGURES)["comm"]
    assert comm["bars"] >= after_run["comm"]["collectives"] > 0, comm

    page.evaluate(RUN_CELL, 3)
    page.get_by_text("workbench: cluster stopped").wait_for()
    _shot(page, "07-stopped")


def _assert_fills(figure: dict[str, Any]) -> None:
    """The figure is drawn across its whole (visible) container, not at plotly's 700 px."""
    assert figure["width"] > 700 and abs(figure["plotWidth"] - figure["width"]) <= 2, figure


def _status(page: Any) -> list[list[str]]:
    rows = page.evaluate(STATUS_ROWS)
    assert rows is not None, "status table not rendered"
    return rows  # type: ignore[no-any-return]


def _shot(target: Any, name: str) -> None:
    target.screenshot(path=str(ARTIFACTS / f"{name}.png"), animations="disabled")


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:160]
    except psutil.Error:
        return "?"
