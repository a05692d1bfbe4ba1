"""``Dashboard``: the cluster at a glance — ranks, hosts, devices, state, memory per rank.

State comes from ``Cluster.status()`` and an engine probe; the widget only shows it.
Refreshes on demand (button or ``refresh()``); with ``interval`` it also refreshes on the
kernel's event loop while the kernel is idle, so it never competes with a running cell
for the ipyparallel client.
"""

from __future__ import annotations

import asyncio
import html
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench import validate
from workbench.cluster import Cluster
from workbench.cluster.state import LIVE
from workbench.engine.probe import engine_memory
from workbench.errors import WorkbenchError
from workbench.plots.engines import engine_memory_figure
from workbench.plots.style import format_bytes

__all__ = ["Dashboard"]

_COLUMNS = ("rank", "engine", "host", "pid", "device", "backend", "state")


class Dashboard:
    """A panel over one cluster (default: the running one)."""

    def __init__(self, cluster: Cluster | None = None, *, interval: float | None = None) -> None:
        interval = validate.seconds(
            "interval", interval, minimum=validate.MIN_REFRESH_S, none_means="refresh on demand"
        )
        self.cluster = cluster if cluster is not None else Cluster.current()
        self.interval = interval
        self.rows: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.table = widgets.HTML()
        self.message = widgets.HTML()
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.figure = go.FigureWidget(engine_memory_figure({}))
        self.root = widgets.VBox(
            [widgets.HBox([self.refresh_button]), self.table, self.message, self.figure]
        )
        self._task: asyncio.Task[None] | None = None
        self.refresh()
        if interval:
            self._start_auto(interval)

    def __repr__(self) -> str:
        return f"<workbench.Dashboard {self.cluster!r}>"

    def refresh(self) -> None:
        """Re-read status and memory from every rank and redraw."""
        self.message.value = ""
        self.rows = self.cluster.status()
        alive = [r["rank"] for r in self.rows if r["state"] != "dead"]
        try:
            self.memory = self.cluster.run(engine_memory, ranks=alive, timeout=10) if alive else []
        except WorkbenchError as exc:  # busy or dying engines: show it, keep the table
            self.memory = []
            self.message.value = f"<pre style='color:#b00020'>{html.escape(str(exc))}</pre>"
        self._render(alive)

    def _render(self, alive: list[int]) -> None:
        by_rank = dict(zip(alive, self.memory, strict=False))
        head = "".join(f"<th>{c}</th>" for c in (*_COLUMNS, "rss"))
        body = "".join(
            "<tr>"
            + "".join(f"<td>{html.escape(str(row[c]))}</td>" for c in _COLUMNS)
            + f"<td>{format_bytes(by_rank[row['rank']]['rss']) if row['rank'] in by_rank else '-'}"
            "</td></tr>"
            for row in self.rows
        )
        self.table.value = f"<table><tr>{head}</tr>{body}</table>"
        fresh = engine_memory_figure(by_rank)
        with self.figure.batch_update():
            self.figure.data = ()
            self.figure.add_traces(list(fresh.data))

    def _start_auto(self, interval: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no kernel loop (plain Python): refresh on demand only

        async def tick() -> None:
            while True:
                await asyncio.sleep(interval)
                if self.cluster.state not in LIVE:
                    return
                self.refresh()

        self._task = loop.create_task(tick())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.root.close()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        return self.root._repr_mimebundle_(**kwargs)  # type: ignore[no-any-return]
