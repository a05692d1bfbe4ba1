"""Each rank's output shown while a ``%%wb`` cell or ``%wb run`` runs, in a notebook.

One display, created empty when the first line arrives and updated in place with the
lines so far (``Cluster.execute`` calls ``on_output`` at most ten times a second), each
labelled ``[rank N]`` (``[host:rank N]`` when the ranks span several hosts). When the
results come back, the display is cleared (``clear_output(wait=True)``) as the final,
grouped output is shown, so what a notebook saves is what it saved before live output
existed:

- nbclient (which builds the committed notebooks) applies the update and the clear: the
  saved cell holds the final output only;
- nbval records neither updates nor clears: it sees one extra display whose data is empty
  and compares nothing of it (it skips ``metadata``), so strict nbval passes unchanged.

The display never held a widget: replacing a widget's output was what made later plotly
FigureWidgets draw blank axes in JupyterLab (commit 95807a8). A cell that fails with an
exception (timeout, a dead engine) keeps its live lines: they show where it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from IPython import get_ipython
from IPython.display import clear_output, display

from workbench.cluster.ranks import RankAssignment

__all__ = ["LiveView", "live_view"]

_MAX_LINES = 500  # shown live; earlier lines are counted (the final output has them all)
_MAX_LINE = 2000  # characters of one line shown live (its end: a progress bar's last state)


def live_view(ranks: list[RankAssignment], show: Iterable[int] | None) -> LiveView | None:
    """A live view for a notebook's kernel; None elsewhere (a terminal IPython, a script:
    nothing changes there)."""
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return None
    return LiveView(ranks, show)


def rank_labels(ranks: list[RankAssignment]) -> dict[int, str]:
    """``[rank N]``, or ``[host:rank N]`` when the ranks span more than one host."""
    many_hosts = len({r.host for r in ranks}) > 1
    return {
        r.rank: f"[{r.host}:rank {r.rank}]" if many_hosts else f"[rank {r.rank}]" for r in ranks
    }


class LiveView:
    """The ``on_output`` of ``Cluster.execute``: collects lines, updates one display."""

    def __init__(self, ranks: list[RankAssignment], show: Iterable[int] | None) -> None:
        self.labels = rank_labels(ranks)
        self.show = None if show is None else set(show)
        self.lines: list[str] = []
        self.dropped = 0
        self._partial: dict[tuple[int, str], str] = {}  # a line still being written
        self._handle: Any = None

    def __call__(self, chunks: list[tuple[int, str, str]]) -> None:
        new = False
        for rank, name, text in chunks:
            if self.show is not None and rank not in self.show:
                continue
            *done, rest = (self._partial.get((rank, name), "") + text).split("\n")
            self._partial[(rank, name)] = rest[-_MAX_LINE:]  # a line that never ends
            self.lines.extend(self._label(rank, line[-_MAX_LINE:]) for line in done)
            new = True
        if len(self.lines) > _MAX_LINES:
            self.dropped += len(self.lines) - _MAX_LINES
            del self.lines[: len(self.lines) - _MAX_LINES]
        if new:
            self.refresh()

    def _label(self, rank: int, line: str) -> str:
        """The labelled line as a terminal would leave it (``\r`` rewrites it)."""
        return f"{self.labels.get(rank, f'[rank {rank}]')} {line.rsplit(chr(13), 1)[-1]}"

    def text(self) -> str:
        """What the display shows: the lines so far, then the lines still being written
        (a progress bar's ``\\r`` updates: their last state)."""
        lines = list(self.lines)
        for (rank, _), partial in sorted(self._partial.items()):
            if partial.rsplit("\r", 1)[-1]:
                lines.append(self._label(rank, partial))
        if self.dropped:
            lines.insert(0, f"[{self.dropped} earlier lines are in the final output]")
        return "\n".join(lines)

    def refresh(self) -> None:
        text = self.text()
        if not text:
            return
        if self._handle is None:  # empty: nothing of it for nbval to compare
            self._handle = display({}, raw=True, display_id=True)
        self._handle.update({"text/plain": text}, raw=True)

    def finish(self) -> None:
        """The results came: the final output (shown next) replaces the live lines."""
        if self._handle is not None:
            clear_output(wait=True)
