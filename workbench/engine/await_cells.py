"""A cell with top-level ``await`` on an engine.

ipykernel 7 runs such a cell on a branch that needs a shell-channel thread, which
ipyparallel's engine kernel does not have: the request fails inside the kernel and no
reply is ever sent (through the controller the cell waits forever). The direct cell path
(``direct_cells.py``) runs it here instead, the way that branch would: ``run_cell_async``
on the engine's running event loop, the same post-execute events, the same reply, and
SIGINT cancelling the cell rather than escaping into the event loop.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

__all__ = ["execute_cell"]


async def execute_cell(kernel: Any, code: str) -> dict[str, Any]:
    """The engine kernel's execute reply content for ``code``, awaited or not."""
    shell = kernel.shell
    try:
        transformed = shell.transform_cell(code)
        preprocessing_error = None
    except Exception:
        transformed, preprocessing_error = code, sys.exc_info()
    if not shell.should_run_async(
        code, transformed_cell=transformed, preprocessing_exc_tuple=preprocessing_error
    ):
        return dict(await kernel.do_execute(code, silent=False, store_history=True))
    task = asyncio.ensure_future(
        shell.run_cell_async(
            code,
            store_history=True,
            silent=False,
            transformed_cell=transformed,
            preprocessing_exc_tuple=preprocessing_error,
        )
    )
    loop = asyncio.get_running_loop()
    previous = signal.signal(signal.SIGINT, lambda *_: loop.call_soon_threadsafe(task.cancel))
    result = None
    try:
        result = await task
    except asyncio.CancelledError:
        pass  # interrupted while awaiting: reported below as a KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)
        shell.events.trigger("post_execute")
        shell.events.trigger("post_run_cell", result)
    return _reply(kernel, result)


def _reply(kernel: Any, result: Any) -> dict[str, Any]:
    shell = kernel.shell
    reply: dict[str, Any] = {
        "execution_count": shell.execution_count - 1,
        "user_expressions": {},
        "payload": [],
    }
    if result is not None and result.success:
        reply["status"] = "ok"
        return reply
    error = None if result is None else (result.error_before_exec or result.error_in_exec)
    if error is None:  # cancelled before the cell could report anything
        error = KeyboardInterrupt()
        shell.showtraceback((KeyboardInterrupt, error, None))
    reply.update(
        status="error",
        ename=type(error).__name__,
        evalue=str(error),
        traceback=getattr(shell, "_last_traceback", None) or [],
        engine_info=kernel.get_engine_info(method="execute"),
    )
    return reply
