"""Show per-rank cell results in rank order; identical failures are grouped."""

from __future__ import annotations

import sys

from IPython.display import publish_display_data

from workbench.cluster.results import CellResult
from workbench.errors import RankError

__all__ = ["show_results"]


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
    failed = {r.rank: r.traceback or f"{r.ename}: {r.evalue}" for r in results if not r.ok}
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
