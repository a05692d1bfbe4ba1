"""Live output of ``%%wb`` and ``%wb run`` in a notebook (``magics/live_view.py``), and
``--show RANKS``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from IPython.core.error import UsageError

from workbench.cluster import Cluster
from workbench.cluster.ranks import RankAssignment
from workbench.magics import live_view
from workbench.magics.live_view import LiveView, rank_labels

WAIT_FOR_MARKER = (
    "import os, time\nend = time.monotonic() + 60\n"
    "while not os.path.exists({marker!r}) and time.monotonic() < end:\n"
    "    time.sleep(0.02)\n"
)


class FakeFrontEnd:
    """Stands in for IPython's display(): records the live display's updates and clears,
    and creates ``marker`` once both ranks' first line was shown."""

    def __init__(self, marker: Path | None) -> None:
        self.marker = marker
        self.created: list[dict[str, Any]] = []
        self.updates: list[str] = []
        self.clears: list[bool] = []

    def display(self, data: dict[str, Any], raw: bool, display_id: bool) -> Any:
        assert raw and display_id
        self.created.append(data)
        return self

    def update(self, data: dict[str, Any], raw: bool) -> None:
        self.updates.append(data["text/plain"])
        text = data["text/plain"]
        if self.marker is not None and "[rank 0] first" in text and "[rank 1] first" in text:
            self.marker.touch()

    def clear_output(self, wait: bool = False) -> None:
        self.clears.append(wait)


@pytest.fixture
def front_end(ipython_shell: Any, cluster: Cluster, tmp_path: Path) -> Iterator[FakeFrontEnd]:
    """The magics as in a notebook's kernel, with a recording front end."""
    fake = FakeFrontEnd(tmp_path / "shown")

    def in_a_notebook(ranks: list[RankAssignment], show: Any) -> LiveView:
        return LiveView(ranks, show)

    with (
        mock.patch("workbench.magics.core.live_view", in_a_notebook),
        mock.patch("workbench.magics.script_cmds.live_view", in_a_notebook),
        mock.patch.object(live_view, "display", fake.display),
        mock.patch.object(live_view, "clear_output", fake.clear_output),
    ):
        yield fake


@pytest.mark.engines
@pytest.mark.parametrize("line", ["", "--via-controller"])
def test_cell_output_shows_while_it_runs_then_the_final_output_replaces_it(
    ipython_shell: Any, front_end: FakeFrontEnd, capsys: Any, line: str
) -> None:
    marker = str(front_end.marker)
    cell = "print('first', rank, flush=True)\n" + WAIT_FOR_MARKER.format(marker=marker)
    cell += f"print('marker seen' if os.path.exists({marker!r}) else 'no marker')"
    ipython_shell.run_cell_magic("wb", line, cell)
    # The final output is today's, grouped per rank in rank order.
    assert capsys.readouterr().out == (
        "[rank 0]\nfirst 0\nmarker seen\n[rank 1]\nfirst 1\nmarker seen\n"
    )
    assert front_end.created == [{}]  # one display, created empty (nbval compares nothing)
    assert any("[rank 0] first 0" in u and "[rank 1] first 1" in u for u in front_end.updates)
    assert front_end.clears == [True]  # cleared as the final output arrives


@pytest.mark.engines
def test_a_run_script_streams_too(
    ipython_shell: Any, front_end: FakeFrontEnd, capsys: Any, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nrank = int(os.environ['RANK'])\nprint('first', rank, flush=True)\n"
        + WAIT_FOR_MARKER.format(marker=str(front_end.marker))
        + "print('done', rank)\n"
    )
    ipython_shell.run_line_magic("wb", f"run {script}")
    assert capsys.readouterr().out == "[rank 0]\nfirst 0\ndone 0\n[rank 1]\nfirst 1\ndone 1\n"
    assert front_end.marker is not None and front_end.marker.exists()
    assert front_end.clears == [True]


@pytest.mark.engines
def test_show_limits_the_live_and_final_output(
    ipython_shell: Any, front_end: FakeFrontEnd, capsys: Any
) -> None:
    front_end.marker = None
    cell = "import time\nprint('line', rank, flush=True)\ntime.sleep(0.6)"
    ipython_shell.run_cell_magic("wb", "--show 1", cell)
    assert capsys.readouterr().out == "[rank 1]\nline 1\n"
    assert front_end.updates and all("[rank 0]" not in u for u in front_end.updates)
    assert any("[rank 1] line 1" in u for u in front_end.updates)


@pytest.mark.engines
def test_show_is_validated_like_ranks(ipython_shell: Any, cluster: Cluster, tmp_path: Path) -> None:
    for bad, why in [("2", "outside this cluster"), ("x", "not a rank"), ("1-0", "empty")]:
        with pytest.raises(UsageError, match=rf"--show '{bad}' is not valid: .*{why}"):
            ipython_shell.run_cell_magic("wb", f"--show {bad}", "print(rank)")
    script = tmp_path / "ran.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    with pytest.raises(UsageError, match=r"--show '5' .*valid ranks are 0\.\.1"):
        ipython_shell.run_line_magic("wb", f"run --show 5 {script}")
    assert not (tmp_path / "ran").exists()  # refused before anything ran


def _rank(rank: int, host: str) -> RankAssignment:
    fields = {f.name: 0 for f in dataclasses.fields(RankAssignment)}
    fields.update(rank=rank, host=host, master_addr="", backend="gloo", device="cpu")
    return RankAssignment(**fields)


def test_labels_name_the_host_when_ranks_span_several() -> None:
    one = [_rank(0, "a"), _rank(1, "a")]
    two = [_rank(0, "a"), _rank(1, "b")]
    assert rank_labels(one) == {0: "[rank 0]", 1: "[rank 1]"}
    assert rank_labels(two) == {0: "[a:rank 0]", 1: "[b:rank 1]"}
    view = LiveView(two, None)
    with mock.patch.object(live_view, "display", FakeFrontEnd(None).display):
        view([(1, "stdout", "hello\n")])
    assert view.text() == "[b:rank 1] hello"


def test_partial_lines_progress_bars_and_the_cap() -> None:
    fake = FakeFrontEnd(None)
    view = LiveView([_rank(0, "a"), _rank(1, "a")], None)
    with mock.patch.object(live_view, "display", fake.display):
        view([(0, "stdout", "a"), (1, "stderr", "10%\r")])
        assert view.text() == "[rank 0] a"  # a bar just rewound shows once redrawn
        view([(0, "stdout", "b\nc"), (1, "stderr", "50%\r90%")])
        assert view.text() == "[rank 0] ab\n[rank 0] c\n[rank 1] 90%"
        view([(0, "stdout", "".join(f"{i}\n" for i in range(2 * live_view._MAX_LINES)))])
    lines = view.text().split("\n")
    assert lines[0] == f"[{view.dropped} earlier lines are in the final output]"
    assert lines[-2:] == [f"[rank 0] {2 * live_view._MAX_LINES - 1}", "[rank 1] 90%"]
    assert fake.created == [{}] and len(fake.updates) == 3
    view([(1, "stdout", "x" * (10 * live_view._MAX_LINE))])  # a line that never ends
    assert view.text().endswith("[rank 1] " + "x" * live_view._MAX_LINE)


def test_no_live_view_outside_a_notebook(ipython_shell: Any) -> None:
    # A terminal IPython (and a script) shows the final output only, as before.
    assert live_view.live_view([_rank(0, "a")], None) is None
