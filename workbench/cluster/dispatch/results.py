"""What a cell produced on each rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ABORTED", "CellResult", "failure_of", "format_remote", "reply_metadata"]

# ipykernel drops requests queued behind one that failed; say so instead of a task uuid.
ABORTED = (
    "the engine dropped this work because the work before it on that rank failed "
    "(ipykernel aborts what was queued behind an error); run it again"
)


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

    @classmethod
    def of_reply(
        cls,
        rank: int,
        engine_id: int,
        md: dict[str, Any],
        failure: tuple[str, str, str] | None = None,
    ) -> CellResult:
        """The outputs a reply's metadata collected (either cell path), and the cell's
        error (``failure_of``) when it raised."""
        ename, evalue, traceback = failure if failure is not None else (None, None, None)
        return cls(
            rank=rank,
            engine_id=engine_id,
            stdout=md.get("stdout", ""),
            stderr=md.get("stderr", ""),
            outputs=list(md.get("outputs", [])),
            execute_result=md.get("execute_result"),
            ename=ename,
            evalue=evalue,
            traceback=traceback,
        )


def reply_metadata(future: Any) -> dict[str, Any]:
    """A pending or finished cell's output metadata: an ipyparallel ``AsyncResult`` of
    one engine keeps it in a list of one, a direct reply as it is."""
    md = future.metadata[0] if isinstance(future.metadata, list) else future.metadata
    return md  # type: ignore[no-any-return]


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


def failure_of(future: Any) -> tuple[str, str, str] | None:
    """A finished cell's error, if it raised: the remote exception's name, text and
    traceback, whichever way ipyparallel reports it."""
    import ipyparallel as ipp

    try:
        future.get(0)
    except ipp.error.RemoteError as exc:
        return exc.ename, str(exc.evalue), format_remote(exc)
    except ipp.error.CompositeError as exc:
        ename, evalue, tb, _ = exc.elist[0]
        return ename, str(evalue), tb
    except ipp.error.TaskAborted:
        return "TaskAborted", ABORTED, ABORTED
    return None
