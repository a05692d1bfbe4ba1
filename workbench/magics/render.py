"""Show per-rank cell results in rank order; identical failures are grouped."""

from __future__ import annotations

import re
import sys

from IPython import get_ipython
from IPython.display import publish_display_data

from workbench.cluster.dispatch.results import CellResult
from workbench.errors import RankError

__all__ = ["as_this_cell", "show_results"]

# IPython's label of a frame in a cell: "Cell In[4], line 2" (the engine's own count),
# with colour codes between the words in a colour traceback.
_ANSI = r"(?:\x1b\[[0-9;]*m)*"
_CELL_IN = re.compile(rf"(Cell{_ANSI}\s*{_ANSI}In\[)(\d+)(\])")


def show_results(
    results: list[CellResult], *, label_single: bool = True, show: list[int] | None = None
) -> None:
    """Print every rank's stdout/stderr/displays in rank order, then raise on any failure.

    With one target rank and ``label_single=False`` the output is shown unlabelled; with
    ``show``, only those ranks' outputs are shown (a failure anywhere still raises).
    """
    labelled = label_single or len(results) > 1
    for result in sorted(results, key=lambda r: r.rank):
        if show is not None and result.rank not in show:
            continue
        prefix = f"[rank {result.rank}] " if labelled else ""
        if result.stdout:
            _write(sys.stdout, prefix, result.stdout)
        if result.stderr:
            _write(sys.stderr, prefix, result.stderr)
        for output in result.outputs:
            data = output.get("data", {}) if isinstance(output, dict) else {}
            if data:
                publish_display_data(data, metadata=output.get("metadata", {}))
        if result.execute_result is not None:
            data = result.execute_result.get("data", {})
            if set(data) == {"text/plain"}:
                _write(sys.stdout, f"{prefix}Out: ", data["text/plain"] + "\n", inline=True)
            elif data:
                publish_display_data(data, metadata=result.execute_result.get("metadata", {}))
    # IPython counts the cell before running it: the running cell is In[count - 1]
    count = getattr(get_ipython(), "execution_count", None)
    count = count - 1 if isinstance(count, int) else None
    failed = {
        r.rank: as_this_cell(r.traceback, count) or f"{r.ename}: {r.evalue}"
        for r in results
        if not r.ok
    }
    if failed:
        first = next(r for r in sorted(results, key=lambda r: r.rank) if not r.ok)
        raise RankError(
            f"{first.ename}: {first.evalue} (failed on ranks {sorted(failed)})", failures=failed
        )


def _write(stream: object, prefix: str, text: str, *, inline: bool = False) -> None:
    """Prefix the block with the rank label (on its own line unless ``inline``)."""
    if not prefix:
        print(text, end="", file=stream)  # type: ignore[call-overload]
        return
    body = text if text.endswith("\n") else text + "\n"
    header = prefix if inline else prefix.rstrip() + "\n"
    print(header + body, end="", file=stream)  # type: ignore[call-overload]


def as_this_cell(traceback: str | None, count: int | None) -> str | None:
    """A rank's traceback with its cell's frames labelled ``Cell In[count]``, the number
    the notebook shows beside the cell, instead of the engine's own count (an engine runs
    only the ``%%wb`` cells, so its numbers trail the notebook's). The first "Cell In[k]"
    is the cell that ran; frames of an earlier engine cell keep their numbers, which no
    notebook cell is known to match."""
    if not traceback or not isinstance(count, int):
        return traceback
    first = _CELL_IN.search(traceback)
    if first is None:
        return traceback
    engine = first.group(2)
    return _CELL_IN.sub(
        lambda m: f"{m.group(1)}{count}{m.group(3)}" if m.group(2) == engine else m.group(0),
        traceback,
    )
