"""What the drawn figures show a reader who does not hover, read off the rendered SVG.

``drawn_figures`` returns, per figure (memory, comm, loss): each x axis's tick labels as
drawn (one list of text lines per tick), each annotation's box and the box of the panel it
belongs to (page pixels), and the legend's entries. ``problems`` turns that and the page's
text into a list of what a reader would find wrong (empty when all is well); the browser test
and ``python -m tests.browser.docs_images`` both refuse screenshots it objects to.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["PHASES", "REPR", "drawn_figures", "overlapping_labels", "problems"]

PHASES = ("data", "forward", "backward", "sync", "optimizer")
# A widget's repr as its saved output would show it (ipywidgets names, plotly's FigureWidget).
REPR = re.compile(r"\b(IntProgress|FloatProgress|HBox|VBox|Tab|Output|FigureWidget)\(")

DRAWN = """() => {
  const kinds = {Memory: 'memory', Compute: 'comm', Loss: 'loss'};
  const out = {};
  const box = (r) => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom});
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const title = (gd.layout && gd.layout.title && gd.layout.title.text) || '';
    const kind = kinds[title.split(' ')[0]];
    if (!kind || !gd._fullLayout) continue;
    const fl = gd._fullLayout;
    const origin = gd.getBoundingClientRect();
    const lines = (text) => {
      const parts = [...text.querySelectorAll('tspan.line')];
      return (parts.length ? parts : [text]).map((t) => t.textContent).filter((t) => t);
    };
    const axes = {};
    const boxes = {};
    for (const key of Object.keys(fl).filter((k) => /^xaxis\\d*$/.test(k))) {
      const id = fl[key]._id;
      const texts = [...gd.querySelectorAll(`g.${id}tick text`)];
      axes[id] = texts.map(lines);
      // every drawn line of every tick label, and every tick mark, as page boxes
      const labels = texts.flatMap((text, tick) => {
        const parts = [...text.querySelectorAll('tspan.line')];
        return (parts.length ? parts : [text]).filter((t) => t.textContent)
          .map((t) => ({tick, text: t.textContent, box: box(t.getBoundingClientRect())}));
      });
      const ticks = [...gd.querySelectorAll(`path.${id}tick`)]
        .map((t) => box(t.getBoundingClientRect())).filter((b) => b.bottom > b.top);
      boxes[id] = {labels, ticks};
    }
    // the y axes' numbers, which sit next to the first x labels of each panel
    const numbers = [...gd.querySelectorAll('g.ytick text, g[class^="y"][class$="tick"] text')]
      .map((t) => ({tick: -1, text: t.textContent, box: box(t.getBoundingClientRect())}));
    const annotations = [...gd.querySelectorAll('g.annotation')].map((el) => {
      const spec = fl.annotations[Number(el.getAttribute('data-index'))] || {};
      const ya = spec.yref && fl[spec.yref.replace('y', 'yaxis').split(' ')[0]];
      const xa = spec.xref && fl[spec.xref.replace('x', 'xaxis').split(' ')[0]];
      const panel = ya && xa ? {
        left: origin.left + xa._offset, right: origin.left + xa._offset + xa._length,
        top: origin.top + ya._offset, bottom: origin.top + ya._offset + ya._length,
      } : null;
      const text = el.querySelector('.annotation-text-g') || el;
      return {name: spec.name || '', text: el.textContent, box: box(text.getBoundingClientRect()),
              panel};
    });
    const legend = [...gd.querySelectorAll('.legend .traces .legendtext')]
      .map((t) => t.textContent);
    out[kind] = {axes, boxes, numbers, annotations, legend};
  }
  return out;
}"""


def drawn_figures(page: Any) -> dict[str, dict[str, Any]]:
    return page.evaluate(DRAWN)  # type: ignore[no-any-return]


def problems(drawn: dict[str, dict[str, Any]], page_text: str) -> list[str]:
    """What is wrong with the drawn memory figure and the page, for a reader who looks."""
    out = []
    memory = drawn.get("memory")
    if not memory or not memory["axes"]:
        return ["no memory figure drawn"]
    for axis, ticks in memory["axes"].items():
        labels = [line for tick in ticks for line in tick]
        numbers = [t for t in labels if re.fullmatch(r"[-−]?\d+(\.\d+)?", t)]
        if numbers:
            out.append(f"memory {axis} has numeric sample ticks {numbers[:5]}")
        missing = [p for p in PHASES if p not in labels]
        if missing:
            out.append(f"memory {axis} tick labels lack {missing}: {labels[:12]}")
        if not any(re.fullmatch(r"step \d+", t) for t in labels):
            out.append(f"memory {axis} names no step: {labels[:12]}")
    out += overlapping_labels(drawn, "memory")
    peaks = [a for a in memory["annotations"] if a["name"].startswith("peak")]
    if not peaks:
        out.append("memory figure has no peak label")
    for label in peaks:
        box, panel = label["box"], label["panel"]
        inside = panel is not None and (
            box["left"] >= panel["left"] - 1
            and box["right"] <= panel["right"] + 1
            and box["top"] >= panel["top"] - 1
            and box["bottom"] <= panel["bottom"] + 1
        )
        if not inside:
            out.append(f"{label['name']} ({label['text']!r}) at {box} leaves its panel {panel}")
    shown = REPR.search(page_text)
    if shown:
        seen = page_text[shown.start() : shown.start() + 60]
        out.append(f"widget repr text on the page: {seen!r}")
    return out


def _overlap(a: dict[str, float], b: dict[str, float], slack: float = 2) -> bool:
    """Boxes that share more than ``slack`` px both ways (a text line's box has a pixel or
    two of leading that touches the next line's without any glyph doing so)."""
    across = min(a["right"], b["right"]) - max(a["left"], b["left"])
    down = min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
    return across > slack and down > slack


def overlapping_labels(
    drawn: dict[str, dict[str, Any]], kind: str, axes: tuple[str, ...] | None = None
) -> list[str]:
    """Tick labels of figure ``kind`` (on ``axes``, default all) drawn over each other or
    struck by a tick mark."""
    figure = drawn.get(kind, {})
    out = []
    for axis, found in figure.get("boxes", {}).items():
        if axes is not None and axis not in axes:
            continue
        numbers = figure.get("numbers", []) if kind == "memory" else []
        out += _collisions(f"{kind} {axis}", found["labels"] + numbers, found["ticks"])
    return out


def _collisions(
    axis: str, labels: list[dict[str, Any]], ticks: list[dict[str, float]]
) -> list[str]:
    """Tick labels of different ticks drawn over each other, tick marks striking a label."""
    out = []
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if a["tick"] != b["tick"] and _overlap(a["box"], b["box"]):
                out.append(f"{axis}: label {a['text']!r} overlaps {b['text']!r}")
        # a tick is a line (a box of no width: widened by a px each side); any crossing at
        # all strikes the text
        if any(_overlap(a["box"], {**t, "left": t["left"] - 1, "right": t["right"] + 1}, 0)
               for t in ticks):  # fmt: skip
            out.append(f"{axis}: a tick mark runs through the label {a['text']!r}")
    return out
