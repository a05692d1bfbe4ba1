"""``Cluster.run_script``: a script file run on the ranks as ``torchrun`` would run it.

The kernel checks the path and the arguments, then sends every chosen rank one cell that
calls ``workbench.engine.script_run.run_script`` with them as literals (``repr`` of
strings: data, never user code to evaluate). Being a cell, it shares everything with
``%%wb``: the direct channel, per-rank outputs and tracebacks, the timeout's hang report,
dead-engine reports and the blocked-rank bookkeeping.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from workbench import validate

if TYPE_CHECKING:
    from workbench.cluster.dispatch.debug_inbox import Prompter
    from workbench.cluster.dispatch.live_output import OnOutput
    from workbench.cluster.dispatch.results import CellResult

__all__ = ["ScriptRuns", "script_args", "script_path"]


def script_path(path: object, name: str = "path") -> str:
    """The script's absolute path (relative paths start at the current folder), or the
    standard error naming the value."""
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise validate.invalid(name, path, "not a path", "give a Python script, e.g. 'train.py'")
    full = os.path.abspath(os.fspath(path))
    if not os.path.isfile(full):
        why = "a folder, not a file" if os.path.isdir(full) else "no such file"
        raise validate.invalid(
            name, os.fspath(path), why, f"give a Python script (relative to {os.getcwd()})"
        )
    return full


def script_args(args: object) -> list[str]:
    """The script's arguments as strings: a list (or tuple) of str, int or float."""
    valid = "give a list of arguments, e.g. ['--epochs', '2']"
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise validate.invalid("args", args, "not a list of arguments", valid)
    bad = [a for a in args if isinstance(a, bool) or not isinstance(a, str | int | float)]
    if bad:
        raise validate.invalid("args", args, f"{bad[0]!r} is not a str or a number", valid)
    return [str(a) for a in args]


class ScriptRuns:
    """Mixed into ``Cluster`` (after ``RankDispatch``, whose ``execute`` it uses)."""

    execute: Callable[..., list[CellResult]]  # RankDispatch.execute

    def run_script(
        self,
        path: str | os.PathLike[str],
        args: Sequence[str | int | float] = (),
        *,
        ranks: int | Sequence[int] | None = None,
        timeout: float | None = None,
        direct: bool = True,
        trace: bool = False,
        on_output: OnOutput | None = None,
        on_prompt: Prompter | None = None,
    ) -> list[CellResult]:
        """Run the script at ``path`` as ``__main__`` on the chosen ranks (default all),
        with ``sys.argv = [path, *args]`` and torchrun's environment; per-rank outputs in
        rank order, failures in the results (``CellResult.ok``) as for ``execute``.

        While it runs, its ``torch.distributed.init_process_group`` adopts the cluster's
        group (a different backend or world size is an error naming both), and
        ``destroy_process_group()`` leaves that group alone (``engine/group_guard.py``);
        at its end its ``atexit`` handlers run, its own process groups are destroyed and
        ``sys.argv``, ``sys.path``, the working directory, the environment and signal
        handlers are put back (``engine/script_run.py``). ``sys.exit(0)`` is success; any
        other code fails that rank. The engines read the file from their own file system
        and run in this process's working directory when they have it.

        ``trace=True`` records the run's collectives (one span per rank, named after the
        script) and the memory of the model it wraps in DDP where ``wb.traced`` records:
        ``%wb trace pull`` / ``plot`` / ``export`` and ``TraceLog`` draw them with the
        traced loops' events (``engine/script_trace.py``).

        ``on_prompt`` answers the script's ``breakpoint()`` as for ``execute``.
        """
        full = script_path(path)
        argv = script_args(args)
        validate.seconds("timeout", timeout, none_means="no limit")
        validate.boolean("trace", trace)
        run_id = uuid.uuid4().hex[:12]  # one TORCHELASTIC_RUN_ID for every rank of the run
        code = (
            "__import__('workbench.engine.script_run', fromlist=['run_script']).run_script("
            f"{full!r}, {argv!r}, {os.getcwd()!r}, {run_id!r}, {trace!r})"
        )
        return self.execute(
            code,
            ranks=ranks,
            timeout=timeout,
            direct=direct,
            on_output=on_output,
            on_prompt=on_prompt,
        )
