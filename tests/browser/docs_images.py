"""Regenerate the README screenshots of the stepper: ``python -m tests.browser.docs_images``.

Runs the same notebook as the browser tests in JupyterLab + headless Chromium, lets the
stepper run a few whole steps (Run N, so the timeline is not stretched by pauses between
clicks) and saves the widget with its memory, communication and loss tabs shown. The
browser test ``test_figures_browser`` runs this same ``shoot`` (into test-artifacts/) and
checks what the figures show; here the PNGs are written only when those checks pass.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.browser import stepper_page as sp
from tests.browser.figure_probes import drawn_figures, problems
from tests.browser.session import browser_missing, open_notebook

__all__ = ["DOCS", "IMAGES", "VIEWPORT", "main", "shoot"]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "images"
VIEWPORT = sp.PROJECTOR  # what a class sees (issue 49); the widget is shot whole
IMAGES = {"memory": "stepper.png", "communication": "stepper_comm.png", "loss": "stepper_loss.png"}


def shoot(out: Path, steps: int = 3) -> dict[str, Any]:
    """Drive the stepper ``steps`` steps, screenshot each tab into ``out``; returns what was
    drawn (``figure_probes.drawn_figures``, every tab shown once), the page's text after
    the start and the processes left behind after a clean shutdown."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wb-browser-nb-") as root:
        notebook = sp.write_notebook(Path(root) / "stepper.ipynb")
        with open_notebook(
            notebook, viewport=VIEWPORT, timeout_ms=180_000, failure_shot=out / "failure.png"
        ) as session:
            page = session.page
            for index in range(2):
                session.run_cell(index)
            page.get_by_text(sp.STARTED).wait_for()
            session.track()
            # The figures' views load plotly's bundle (5 MB) after the buttons are up. With
            # Run N clicked before the memory figure was drawn it stayed blank (default axes,
            # no title) in 3 of 4 tries on a loaded machine; waiting for it first, it drew.
            # All three, as the stepper's browser test waits before its first click.
            sp.show_stepper(session)
            count = page.locator(".wb-run-count input")
            count.fill(str(steps))
            count.press("Enter")
            page.get_by_role("button", name="Run N", exact=True).click()
            sp.wait_status(page, f"rows.length > 0 && rows.every((r) => r[1] === '{steps}')")
            # a figure not drawn yet is missing from ``f`` (its tab was never shown): wait
            sp.wait_figures(page, f"f.loss !== undefined && f.loss.points === {2 * steps}")
            widget = sp.widget(page)
            drawn: dict[str, Any] = {}
            for tab, kind in (("memory", "memory"), ("communication", "comm"), ("loss", "loss")):
                page.locator(".lm-TabBar-tab", has_text=tab).click()
                # a hidden tab's figure is re-fitted to the tab once shown
                sp.wait_figures(
                    page,
                    f"f.{kind} !== undefined && f.{kind}.width > 0"
                    f" && Math.abs(f.{kind}.plotWidth - f.{kind}.width) <= 2",
                )
                drawn[kind] = drawn_figures(page)[kind]
                widget.screenshot(path=str(out / IMAGES[tab]), animations="disabled")
            text = page.locator(".jp-Notebook").inner_text()
            session.run_cell(3)
            page.get_by_text(sp.STOPPED).wait_for()
    return {"drawn": drawn, "text": text, "leftovers": session.leftovers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS, help="folder for the PNGs")
    parser.add_argument(
        "--steps",
        type=int,
        default=3,
        help="whole steps to run first (3: every phase named at 1,280 px)",
    )
    args = parser.parse_args(argv)
    reason = browser_missing()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="wb-docs-images-") as staging:
        result = shoot(Path(staging), args.steps)
        wrong = problems(result["drawn"], result["text"])
        if result["leftovers"]:
            wrong.append(f"processes left behind: {result['leftovers']}")
        if wrong:
            print("not writing the screenshots:\n  " + "\n  ".join(wrong), file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        for name in IMAGES.values():
            (args.out / name).write_bytes((Path(staging) / name).read_bytes())
    print(f"wrote {', '.join(str(args.out / n) for n in IMAGES.values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
