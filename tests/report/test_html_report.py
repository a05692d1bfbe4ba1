from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from plotly.offline import get_plotlyjs

from workbench.errors import ConfigError
from workbench.plots import comm_timeline_figure, loss_figure, memory_figure, synthetic_events
from workbench.report import ReportSection, figure_div_id, render_report, write_report
from workbench.trace.events import Metric

EVIL = "<script>alert('x')</script>"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[ReportSection]]:
    events = synthetic_events(2)
    sections = [
        ReportSection(
            title="Memory & time <per rank>",
            text="First paragraph: DDP keeps full grads.\n\nSecond paragraph with " + EVIL,
            table=[
                {"rank": 0, "peak MiB": 123.456789, "note": EVIL},
                {"rank": 1, "peak MiB": 120.0, "<b>extra</b>": "a & b"},
            ],
            figures=[memory_figure(events, capacity=1 << 30), comm_timeline_figure(events)],
        ),
        ReportSection(title="Loss", figures=[loss_figure(events)]),
        ReportSection(title="Text only", text="No figures here."),
    ]
    path = tmp_path_factory.mktemp("report") / "nested" / "run.html"
    written = write_report(path, sections, title=f"Run {EVIL}")
    return written, path.read_text(encoding="utf-8"), sections


def test_file_is_written_where_asked(report) -> None:
    written, text, _ = report
    assert written.exists() and written.name == "run.html"
    assert text.startswith("<!DOCTYPE html>")


def test_plotly_library_is_embedded_exactly_once_in_head(report) -> None:
    _, text, _ = report
    library = get_plotlyjs()
    assert text.count(library) == 1
    assert text.index(library) < text.index("</head>")
    # offline: no script is loaded from anywhere
    assert re.findall(r"<script[^>]*\bsrc=", text) == []


def test_every_figure_has_its_div(report) -> None:
    _, text, sections = report
    expected = [figure_div_id(i, j) for i, s in enumerate(sections) for j in range(len(s.figures))]
    assert len(expected) == 3
    for div_id in expected:
        assert f'id="{div_id}"' in text
    assert text.count('class="plotly-graph-div"') == 3


def test_everything_that_is_not_a_figure_is_escaped(report) -> None:
    _, text, _ = report
    assert EVIL not in text
    escaped = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    # where EVIL was fed: the title (in <title> and <h1>), a paragraph and a table cell
    assert text.count(escaped) == 4
    assert "<td>&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;</td>" in text
    assert "<th>&lt;b&gt;extra&lt;/b&gt;</th>" in text
    assert "<td>a &amp; b</td>" in text
    assert "<h2>Memory &amp; time &lt;per rank&gt;</h2>" in text


def test_prose_table_and_sections_in_order(report) -> None:
    _, text, _ = report
    assert "<p>First paragraph: DDP keeps full grads.</p>" in text
    assert text.count("<section>") == 3
    headings = re.findall(r"<h2>(.*?)</h2>", text)
    assert headings == ["Memory &amp; time &lt;per rank&gt;", "Loss", "Text only"]
    # union of columns, empty cell where a row lacks one, numbers right-aligned
    assert re.search(
        r"<tr><td class='num'>0</td><td class='num'>123.457</td>.*?<td></td></tr>", text
    )


def test_bad_sections_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sections\\[0\\] is a str"):
        write_report(tmp_path / "a.html", ["nope"], title="t")  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="table row 0 is a list"):
        write_report(tmp_path / "b.html", [ReportSection("s", table=[[1, 2]])], title="t")  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="figure 0 is a dict"):
        write_report(tmp_path / "c.html", [ReportSection("s", figures=[{}])], title="t")  # type: ignore[list-item]


def _drawn(text: str, div_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The data and layout the report hands ``Plotly.newPlot`` for one figure div."""
    call = re.search(r"Plotly\.newPlot\(\s*\"" + re.escape(div_id) + r"\",\s*", text)
    assert call is not None, div_id
    decoder = json.JSONDecoder()
    data, end = decoder.raw_decode(text, call.end())
    layout, _ = decoder.raw_decode(text, text.index("{", end))
    return data, layout


def test_report_figures_carry_phase_axes_peak_labels_and_identical_ranks() -> None:
    events = synthetic_events(3)
    same = [
        Metric(rank=r, step=s, name="loss", value=2.0 - s / 4) for s in range(3) for r in (0, 1)
    ]
    figures = [memory_figure(events), comm_timeline_figure(events), loss_figure(same)]
    text = render_report([ReportSection("run", figures=figures)], title="t")
    _, memory = _drawn(text, figure_div_id(0, 0))
    for suffix in ("", "2"):
        axis = memory[f"xaxis{suffix}"]
        names = {re.sub(r"<[^>]+>", "", line) for t in axis["ticktext"] for line in t.split("<br>")}
        assert {"data", "forward", "backward", "optimizer", "step 0", "step 2"} <= names
        assert all(float(v).is_integer() for v in axis["tickvals"])
    for label in (a for a in memory["annotations"] if a["name"].startswith("peak")):
        axis = memory["yaxis" + label["yref"][1:]]
        assert label["yanchor"] == "bottom" and 0 < label["y"] < axis["range"][1]
    _, timeline = _drawn(text, figure_div_id(0, 1))
    assert timeline["xaxis2"]["ticktext"][0] == "<b>step 0</b>"
    loss, _ = _drawn(text, figure_div_id(0, 2))
    assert [t["name"] for t in loss if t.get("showlegend", True)] == ["ranks 0–1 identical"]
