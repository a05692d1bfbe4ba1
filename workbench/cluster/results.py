"""What a cell produced on each rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CellResult", "format_remote"]


@dataclass(slots=True, kw_only=True)
class CellResult:
    """Output of one ``%%wb`` cell on one rank."""

    rank: int
    engine_id: int
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)  # display_data bundles
    execute_result: dict[str, Any] | None = None
    ename: str | None = None
    evalue: str | None = None
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        return self.ename is None


def format_remote(exc: Any) -> str:
    """The remote traceback without ipyparallel's "[engine:apply]" header line, so identical
    failures on different ranks compare equal."""
    try:
        lines = list(exc.render_traceback())
    except Exception:
        return f"{exc.ename}: {exc.evalue}"
    if lines and lines[0].startswith("[") and lines[0].rstrip().endswith("]"):
        lines = lines[1:]
    return "\n".join(lines)
