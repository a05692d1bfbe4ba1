"""Which way a ``%%wb`` cell goes to each rank: straight to the engine's loopback cell
socket when it has one (``direct_channel.py``), else through the ipyparallel controller.

An engine's socket is asked for once: as it registers (``start_sequence.py``), or at the
first cell sent to it (an engine started by a recovery). An engine that cannot open one
(another host or network namespace, a kernel without the capture hooks) gets None and
its cells go through the controller.
"""

from __future__ import annotations

import ast
import inspect
import logging
from typing import TYPE_CHECKING, Any

from workbench.cluster.direct_channel import DirectCells
from workbench.cluster.live_output import LiveWatch, OnOutput
from workbench.cluster.ranks import RankAssignment
from workbench.engine.direct_cells import open_if_same_network
from workbench.engine.hosts import net_space
from workbench.errors import ConfigError, RankError

if TYPE_CHECKING:
    from workbench.cluster.dispatch import RankDispatch

__all__ = ["live_watch", "send_cell", "top_level_await"]

log = logging.getLogger("workbench.cluster")


def send_cell(
    dispatch: RankDispatch,
    code: str,
    targets: list[RankAssignment],
    timeout: float | None,
    direct: bool,
    *,
    live: bool = False,
) -> list[Any]:
    """Send ``code`` to every target rank; one future-like reply per rank, in order.
    With ``live`` a direct cell also streams its output while it runs."""
    cells = _direct_cells(dispatch, targets, timeout) if direct else None
    via_controller = [r.rank for r in targets if cells is None or cells.port(r.engine_id) is None]
    if via_controller and top_level_await(code):
        raise ConfigError(
            f"this cell uses top-level `await`, which ranks {via_controller} cannot run: "
            "their cells go through the ipyparallel controller, where the engines' kernel "
            "never answers such a cell. Run it on engines on this machine without "
            "--via-controller, or put the awaiting code in an async function `main()` and "
            "run it to completion in a thread: "
            "`ThreadPoolExecutor().submit(asyncio.run, main()).result()`"
        )
    futures: list[Any] = []
    for r in targets:
        future = None if cells is None else cells.send(r.engine_id, code, live=live)
        if future is None:
            future = dispatch.view(r.engine_id).execute(code, silent=False, block=False)
        futures.append(future)
    return futures


def live_watch(
    dispatch: RankDispatch,
    targets: list[RankAssignment],
    futures: list[Any],
    on_output: OnOutput | None,
) -> LiveWatch | None:
    """What hands each rank's output to ``on_output`` while the cell runs (None: no one
    asked; nothing is watched)."""
    if on_output is None:
        return None

    def drain() -> None:  # the direct path's progress messages (both paths may mix)
        if dispatch._direct is not None:
            dispatch._direct.drain_live()

    return LiveWatch(targets, futures, on_output, drain)


def top_level_await(code: str) -> bool:
    """Whether the cell (IPython syntax) awaits at top level; compiled here, never run."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        source = TransformerManager().transform_cell(code)
        compiled = compile(
            source, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
        )
    except (SyntaxError, ValueError):  # the engine reports its own SyntaxError
        return False
    return bool(compiled.co_flags & inspect.CO_COROUTINE)


def _direct_cells(
    dispatch: RankDispatch, targets: list[RankAssignment], timeout: float | None
) -> DirectCells | None:
    """The direct channels, opened for target engines that have none yet."""
    client = dispatch._client
    if client is None:
        return None
    cells = dispatch._direct
    if cells is None or cells.client is not client:
        if cells is not None:
            cells.close()
        cells = dispatch._direct = DirectCells(client)
    cells.keep_only({r.engine_id for r in dispatch.ranks})
    new = [r for r in targets if not cells.known(r.engine_id)]
    if not new:
        return cells
    futures = []
    for r in new:
        future = dispatch._direct_port_futures.pop(r.engine_id, None)
        if future is None:
            view = dispatch.view(r.engine_id)
            future = view.apply_async(open_if_same_network, net_space())
        futures.append(future)
    try:
        ports = dispatch.collect(new, futures, timeout)
    except RankError as exc:  # e.g. an engine without ipykernel's capture hooks
        log.warning("direct cell channels not opened, using the controller: %s", exc)
        ports = [None] * len(new)
    for r, port in zip(new, ports, strict=True):
        cells.add(r.engine_id, port)
    return cells
