"""A self-contained HTML report: headings, prose, tables and plotly figures in one file.

plotly.js is embedded once in <head>; every figure is a div plus a small script that calls
``Plotly.newPlot``. The file opens offline, can be attached to an issue or archived with a
run, and everything that is not a figure is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.basedatatypes import BaseFigure
from plotly.offline import get_plotlyjs

from workbench.errors import ConfigError

__all__ = ["ReportSection", "figure_div_id", "render_report", "write_report"]

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1100px; color: #222; line-height: 1.45; padding: 0 1rem; }
h1 { border-bottom: 2px solid #4C78A8; padding-bottom: .3rem; }
section { margin: 2.2rem 0; }
table { border-collapse: collapse; margin: 1rem 0; font-size: .92rem; }
th, td { border: 1px solid #ccc; padding: .3rem .6rem; text-align: left; vertical-align: top; }
th { background: #f2f4f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.figure { margin: 1rem 0; }
"""


@dataclass(slots=True)
class ReportSection:
    """One section: a heading, prose (blank lines separate paragraphs), a table, figures."""

    title: str
    text: str = ""
    table: list[dict[str, Any]] | None = None
    figures: list[go.Figure] = field(default_factory=list)


def figure_div_id(section: int, figure: int) -> str:
    """The id of the div holding figure ``figure`` of section ``section`` (both from 0)."""
    return f"wb-figure-{section}-{figure}"


def write_report(path: str | Path, sections: Iterable[ReportSection], *, title: str) -> Path:
    """Write the report to ``path`` (parent folders are created); returns the path."""
    target = Path(path)
    document = render_report(sections, title=title)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(document, encoding="utf-8")
    return target


def render_report(sections: Iterable[ReportSection], *, title: str) -> str:
    """The report as one HTML string (what ``write_report`` writes)."""
    sections = list(sections)
    for i, section in enumerate(sections):
        if not isinstance(section, ReportSection):
            raise ConfigError(
                f"sections[{i}] is a {type(section).__name__}; give ReportSection objects"
            )
    body = "\n".join(_section(i, s) for i, s in enumerate(sections))
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{html.escape(str(title))}</title>\n<style>{_STYLE}</style>\n"
        # The config line mirrors what plotly's own full-page output writes before the library.
        "<script type='text/javascript'>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>\n"
        f"<script type='text/javascript'>{get_plotlyjs()}</script>\n"
        f"</head>\n<body>\n<h1>{html.escape(str(title))}</h1>\n{body}\n</body>\n</html>\n"
    )


def _section(index: int, section: ReportSection) -> str:
    parts = [f"<section>\n<h2>{html.escape(str(section.title))}</h2>"]
    for paragraph in _paragraphs(section.text):
        parts.append(f"<p>{html.escape(paragraph)}</p>")
    if section.table is not None:
        parts.append(_table(section.table, where=f"section {section.title!r}"))
    for j, fig in enumerate(section.figures):
        if not isinstance(fig, BaseFigure):
            raise ConfigError(
                f"section {section.title!r} figure {j} is a {type(fig).__name__}; "
                f"give plotly go.Figure objects"
            )
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=figure_div_id(index, j),
            config={"displaylogo": False, "responsive": True},
        )
        parts.append(f"<div class='figure'>{div}</div>")
    parts.append("</section>")
    return "\n".join(parts)


def _paragraphs(text: str) -> list[str]:
    blocks = [" ".join(block.split()) for block in str(text).split("\n\n")]
    return [b for b in blocks if b]


def _table(rows: Sequence[dict[str, Any]], *, where: str) -> str:
    columns: list[str] = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: table row {i} is a {type(row).__name__}; give dicts")
        for key in row:
            if key not in columns:
                columns.append(key)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    lines = [f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>"]
    for row in rows:
        cells = "".join(_cell(row.get(c)) for c in columns)
        lines.append(f"<tr>{cells}</tr>")
    lines.append("</tbody>\n</table>")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "<td></td>"
    if isinstance(value, bool):
        return f"<td>{value}</td>"
    if isinstance(value, int):
        return f"<td class='num'>{value}</td>"
    if isinstance(value, float):
        return f"<td class='num'>{value:.6g}</td>"
    return f"<td>{html.escape(str(value))}</td>"
