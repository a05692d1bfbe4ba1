"""Live plotly figures that follow their box's width (issue 49: figures that use the width
they have).

plotly's FigureWidget front end (an anywidget since plotly 6) measures its container once,
when it draws; it gets no Lumino resize message, and listens to nothing else. plotly.js
itself re-measures a figure drawn with ``config={"responsive": True}`` on the window's
``resize`` event, but collapsing JupyterLab's file browser, or any other change of the
notebook's width, resizes no window. ``WidthWatch`` is the missing link: an empty, full-width
anywidget beside the figures whose ResizeObserver turns a change of its own width into the
window ``resize`` event plotly.js waits for. Nothing is sent to the kernel.
"""

from __future__ import annotations

from typing import Any

import anywidget
import plotly.graph_objects as go

__all__ = ["RESPONSIVE", "WidthWatch", "responsive"]

# plotly.js re-measures (``Plots.resize``) a figure with this config on window ``resize``
# when its layout is autosized (no fixed width).
RESPONSIVE = {"responsive": True}

# A width seen once is not an event: the first observation only records it. Changes within
# DEBOUNCE_MS (a sidebar's animation) make one event.
_ESM = """
const DEBOUNCE_MS = 100;
export default {
  render({ el }) {
    let last = null;
    let timer = null;
    const observer = new ResizeObserver((entries) => {
      const width = Math.round(entries[entries.length - 1].contentRect.width);
      if (width === 0 || width === last) return;  // hidden (a closed tab), or unchanged
      const first = last === null;
      last = width;
      if (first) return;
      clearTimeout(timer);
      timer = setTimeout(() => window.dispatchEvent(new Event("resize")), DEBOUNCE_MS);
    });
    observer.observe(el);
    return () => { observer.disconnect(); clearTimeout(timer); };
  },
};
"""


class WidthWatch(anywidget.AnyWidget):  # type: ignore[misc]
    """Place it in the same box as the figures, as wide as they may grow; it takes no
    height."""

    _esm = _ESM

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.layout.width = "100%"
        self.layout.height = "0px"
        self.layout.margin = "0px"


def responsive(figure: go.Figure) -> go.FigureWidget:
    """``figure`` as a FigureWidget that plotly.js re-measures on window ``resize``. (The
    widget takes no ``config`` argument; its synced ``_config`` trait is what its front end
    hands plotly.js.)"""
    widget = go.FigureWidget(figure)
    widget._config = {**widget._config, **RESPONSIVE}
    return widget
