from __future__ import annotations

import re
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from workbench.errors import ConfigError
from workbench.plots import comm_timeline_figure, loss_figure, memory_figure, synthetic_events
from workbench.report import ReportSection, figure_div_id, write_report

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
