"""One notebook open in JupyterLab in headless Debian Chromium, and everything torn down after.

``open_notebook`` starts a private JupyterLab, launches ``/usr/bin/chromium`` through
Playwright (never a downloaded browser) with a fresh profile, opens the notebook with
``?reset`` and returns once its kernel is ready. On exit it shuts the kernel, the browser and
JupyterLab down, waits for every process started under this one (kernel, ipyparallel
controller and engines, Chromium) to go, and kills what is left: those are reported in
``leftovers`` so a test can fail on them.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.browser.lab import LabServer

__all__ = ["CHROMIUM", "BrowserSession", "browser_missing", "open_notebook"]

CHROMIUM = Path("/usr/bin/chromium")
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
# The profile directory's prefix (a recognisable name in `ps`; clean-up goes by pid, never by name).
PROFILE_PREFIX = "wb-browser-test-"

# The notebook panel takes input once its session is ready and its kernel idle (keys or
# commands sent earlier are lost or race the kernel start).
KERNEL_READY = """(cells) => {
  const app = window.jupyterapp;
  const panel = app && app.shell && app.shell.currentWidget;
  const ctx = panel && panel.sessionContext;
  const kernel = ctx && ctx.session && ctx.session.kernel;
  return Boolean(ctx && ctx.isReady && kernel && kernel.status === 'idle'
                 && panel.content && panel.content.widgets.length === cells);
}"""

# Run one cell through JupyterLab's own command (what Shift+Enter runs, without depending on
# keyboard focus); the caller waits for the cell's output.
RUN_CELL = """(index) => {
  const app = window.jupyterapp;
  const notebook = app.shell.currentWidget.content;
  notebook.activeCellIndex = index;
  void app.commands.execute('notebook:run-cell');
  return notebook.activeCellIndex;
}"""


def browser_missing() -> str | None:
    """Why a real-browser run cannot happen here, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found; install Debian's chromium (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright (Python) is not installed; pip install -e '.[test]'"
    return None


@dataclass
class BrowserSession:
    page: Any  # playwright.sync_api.Page
    lab: LabServer
    # Processes under this one that are not ours (e.g. a test session's shared cluster).
    baseline: set[psutil.Process] = field(default_factory=set)
    seen: set[psutil.Process] = field(default_factory=set)
    leftovers: list[str] = field(default_factory=list)  # "pid cmdline", filled on exit

    def track(self) -> None:
        """Remember every process started under this one so far (before any is orphaned)."""
        self.seen |= _descendants() - self.baseline

    def run_cell(self, index: int) -> None:
        self.page.evaluate(RUN_CELL, index)


@contextlib.contextmanager
def open_notebook(
    notebook: Path,
    *,
    viewport: dict[str, int],
    timeout_ms: int = 60_000,
    failure_shot: Path | None = None,
) -> Iterator[BrowserSession]:
    """Serve ``notebook``'s folder, open it in Chromium, wait for its kernel; then clean up."""
    import nbformat
    from playwright.sync_api import sync_playwright

    cells = len(nbformat.read(notebook, as_version=4).cells)
    baseline = _descendants()
    workdir = Path(tempfile.mkdtemp(prefix=PROFILE_PREFIX))
    state = workdir / "state"
    state.mkdir()
    lab = LabServer(notebook.parent, state)
    session: BrowserSession | None = None
    ok = False
    try:
        lab.start()
        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                str(workdir / "profile"),  # a fresh --user-data-dir
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_FLAGS,
                viewport=viewport,
            )
            page = context.new_page()
            page.set_default_timeout(timeout_ms)
            session = BrowserSession(page, lab, baseline)
            try:
                page.goto(lab.url(f"lab/tree/{notebook.name}", reset=""))
                page.wait_for_function(KERNEL_READY, arg=cells)
                page.evaluate("() => { window.jupyterapp.shell.collapseLeft(); }")
                yield session
                ok = True
            finally:
                session.track()
                if not ok and failure_shot is not None:
                    with contextlib.suppress(Exception):  # never hide the real failure
                        page.screenshot(path=str(failure_shot))
                context.close()
    finally:
        seen = _descendants() - baseline
        if session is not None:
            seen |= session.seen
        with contextlib.suppress(Exception):  # the server may be gone; the sweep decides
            lab.shutdown_kernels()
        lab.stop()
        psutil.wait_procs(_living(seen), timeout=15)
        stragglers = _living(seen)
        if session is not None:
            session.leftovers = [f"{p.pid} {_cmdline(p)}" for p in stragglers]
        _kill_all(stragglers)
        shutil.rmtree(workdir, ignore_errors=True)


def _descendants() -> set[psutil.Process]:
    return set(psutil.Process().children(recursive=True))


def _living(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (zombies count as gone: they hold no resources)."""
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


def _kill_all(procs: list[psutil.Process], grace: float = 3.0) -> None:
    """SIGTERM, wait ``grace`` seconds, then SIGKILL whatever is left."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace)


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:160]
    except psutil.Error:
        return "?"
