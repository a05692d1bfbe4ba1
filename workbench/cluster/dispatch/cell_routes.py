"""Which way a ``%%wb`` cell goes to each rank: straight to the engine's loopback cell
socket when it has one (``direct_channel.py``), else through the ipyparallel controller.

``CellRoutes`` holds a cluster's pool of direct cells (one per client). An engine's socket
is asked for once: as it registers (``registration.py``), or at the first cell sent to it
(an engine started by a recovery). An engine that cannot open one (another host or network
namespace, a kernel without the capture hooks) gets None and its cells go through the
controller.
"""

from __future__ import annotations

import ast
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.cluster.dispatch.direct_channel import DirectCells
from workbench.cluster.dispatch.live_output import LiveWatch, OnOutput
from workbench.cluster.lifecycle.engines import EngineSet
from workbench.cluster.ranks import RankAssignment
from workbench.cluster.world import World
from workbench.engine.rank_debug import debug_label
from workbench.errors import ConfigError, RankError

__all__ = ["CellRoutes", "DebugAddresses", "live_watch", "send_cell", "top_level_await"]


@dataclass(frozen=True)
class DebugAddresses:
    """The kernel's debug socket (``debug_inbox.py``) as engines reach it: on loopback
    (direct cells), and as an engine reached through the controller does."""

    loopback: str
    controller: str


# engine id -> its DirectView (RankDispatch.view)
View = Callable[[int], Any]
# (targets, futures, timeout) -> results: RankDispatch.collect, with its death handling
Collect = Callable[[list[RankAssignment], list[Any], float | None], list[Any]]

log = logging.getLogger("workbench.cluster")


def send_cell(
    cells: DirectCells | None,
    view: View,
    code: str,
    targets: list[RankAssignment],
    *,
    live: bool = False,
    debug: DebugAddresses | None = None,
) -> list[Any]:
    """Send ``code`` to every target rank, through ``cells`` where it can (None: through
    the controller only); one future-like reply per rank, in order. With ``live`` a direct
    cell also streams its output while it runs; with ``debug`` its ``breakpoint()`` stops
    with the kernel answering (``engine/rank_debug.py``: the address travels in the direct
    request, or as the label of the controller's execute request: no extra message)."""
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
        direct_debug = None if debug is None else debug.loopback
        future = (
            None if cells is None else cells.send(r.engine_id, code, live=live, debug=direct_debug)
        )
        if future is None:
            label = None if debug is None else debug_label(debug.controller)
            future = view(r.engine_id).execute(code, silent=False, block=False, label=label)
        futures.append(future)
    return futures


def live_watch(
    cells: DirectCells | None,
    targets: list[RankAssignment],
    futures: list[Any],
    on_output: OnOutput | None,
) -> LiveWatch | None:
    """What hands each rank's output to ``on_output`` while the cell runs (None: no one
    asked; nothing is watched)."""
    if on_output is None:
        return None

    def drain() -> None:  # the direct path's progress messages (both paths may mix)
        if cells is not None:
            cells.drain_live()

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


class CellRoutes:
    """A cluster's pool of direct cells: made for its client, kept to its ranks' engines."""

    def __init__(self, engines: EngineSet, world: Callable[[], World]) -> None:
        self.engines = engines
        self.world = world  # reads the cluster's World (never written here)
        self.pool: DirectCells | None = None

    def _pool(self) -> DirectCells | None:
        """The pool of the current client (a new client, after a restart, gets a new one)."""
        client = self.engines.client
        if client is None:
            return None
        if self.pool is None or self.pool.client is not client:
            self.forget()
            self.pool = DirectCells(client)
        return self.pool

    def ask_port(self, engine_id: int) -> None:
        """As an engine registers: ask it to open its cell socket, so that the first cell
        sent to it goes at once."""
        pool = self._pool()
        if pool is not None:
            pool.ask_port(engine_id)

    def opened(
        self, targets: list[RankAssignment], view: View, collect: Collect, timeout: float | None
    ) -> DirectCells | None:
        """The pool, with a socket opened on each target engine that has none yet."""
        pool = self._pool()
        if pool is None:
            return None
        pool.keep_only({r.engine_id for r in self.world().ranks})
        new = [r for r in targets if not pool.known(r.engine_id)]
        if not new:
            return pool
        futures = [pool.port_request(r.engine_id, view(r.engine_id)) for r in new]
        try:
            ports = collect(new, futures, timeout)
        except RankError as exc:  # e.g. an engine without ipykernel's capture hooks
            log.warning("direct cell channels not opened, using the controller: %s", exc)
            ports = [None] * len(new)
        for r, port in zip(new, ports, strict=True):
            pool.add(r.engine_id, port)
        return pool

    def busy(self) -> set[int]:
        return set() if self.pool is None else self.pool.busy()

    def forget(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()
