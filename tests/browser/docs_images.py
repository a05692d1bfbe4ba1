"""Regenerate the README screenshots of the stepper: ``python -m tests.browser.docs_images``.

Runs the same notebook as the browser test in JupyterLab + headless Chromium, lets the
stepper run a few whole steps (Run N, so the timeline is not stretched by pauses between
clicks) and saves the widget with its memory tab and its communication tab shown.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.browser import stepper_page as sp
from tests.browser.session import browser_missing, open_notebook

__all__ = ["main"]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "images"
VIEWPORT = {"width": 1200, "height": 1600}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS, help="folder for the PNGs")
    parser.add_argument("--steps", type=int, default=4, help="whole steps to run first")
    args = parser.parse_args(argv)
    reason = browser_missing()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wb-browser-nb-") as root:
        notebook = sp.write_notebook(Path(root) / "stepper.ipynb")
        with open_notebook(notebook, viewport=VIEWPORT) as session:
            page = session.page
            for index in range(3):
                session.run_cell(index)
            page.get_by_text(sp.STARTED).wait_for()
            session.track()
            phase = page.get_by_role("button", name="Phase ▶", exact=True)
            phase.wait_for()
            controls = page.locator(".widget-hbox").filter(has=phase)
            count = controls.locator("input[type=number]")
            count.fill(str(args.steps))
            count.press("Enter")
            controls.get_by_role("button", name="Run N", exact=True).click()
            sp.wait_status(page, f"rows.length > 0 && rows.every((r) => r[1] === '{args.steps}')")
            sp.wait_figures(page, f"f.loss.points === {2 * args.steps}")
            widget = sp.widget(page)
            widget.screenshot(path=str(args.out / "stepper.png"), animations="disabled")
            page.locator(".lm-TabBar-tab", has_text="communication").click()
            sp.wait_figures(
                page, "f.comm.width > 0 && Math.abs(f.comm.plotWidth - f.comm.width) <= 2"
            )
            widget.screenshot(path=str(args.out / "stepper_comm.png"), animations="disabled")
            session.run_cell(3)
            page.get_by_text(sp.STOPPED).wait_for()
    if session.leftovers:
        print(f"killed processes left behind: {session.leftovers}", file=sys.stderr)
    print(f"wrote {args.out / 'stepper.png'} and {args.out / 'stepper_comm.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
