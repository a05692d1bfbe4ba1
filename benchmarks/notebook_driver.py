"""Drive a fresh Jupyter kernel through nbclient and time what a notebook user waits for.

One ``NotebookRun`` starts a new kernel (its clock starts at the kernel-start request), runs
set-up cells, notes the moment the first output carrying a marker text arrives on iopub
(e.g. the first printed all-reduce result), then times further cells one round trip each
(request to reply and idle, as nbclient waits). Every process the kernel started is
snapshotted before the kernel shuts down; any still alive afterwards is killed by pid and
reported, so a benchmark says what each tool leaves behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

__all__ = ["KernelSpec", "NotebookRun", "RunTimes", "spec_dir"]

CELL_TIMEOUT_S = 300


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """A kernelspec written to a private directory (``argv`` as in kernel.json)."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    interrupt_mode: str = "signal"


def spec_dir(specs: list[KernelSpec]) -> Path:
    """A directory of kernelspecs that only the benchmark's kernel manager looks in."""
    root = Path(tempfile.mkdtemp(prefix="wb-bench-kernels-"))
    for spec in specs:
        d = root / spec.name
        d.mkdir()
        (d / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": spec.argv,
                    "display_name": spec.name,
                    "language": "python",
                    "env": spec.env,
                    "interrupt_mode": spec.interrupt_mode,
                }
            )
        )
    return root


@dataclass(slots=True)
class RunTimes:
    """Seconds since the kernel-start request, and per-cell round trips."""

    kernel_ready_s: float = 0.0
    cells_s: list[float] = field(default_factory=list)  # set-up cells, in order
    marker_s: float | None = None  # first output containing the marker
    marker_cell_text: str = ""  # that cell's outputs, for a correctness check
    round_trips_s: list[float] = field(default_factory=list)
    last_round_trip_text: str = ""
    stop_s: float | None = None
    left_after_stop: list[str] = field(default_factory=list)  # alive after the stop cell
    left_after_shutdown: list[str] = field(default_factory=list)  # killed by us


class _TimedClient(NotebookClient):
    """nbclient that timestamps the first output whose content contains ``marker``."""

    marker: str = ""
    t0: float = 0.0
    marker_at: float | None = None

    def output(self, outs: list, msg: dict, display_id: str | None, cell_index: int) -> Any:
        if self.marker_at is None and self.marker and self.marker in json.dumps(msg["content"]):
            self.marker_at = time.perf_counter() - self.t0
        return super().output(outs, msg, display_id, cell_index)


def _outputs_text(cell: Any) -> str:
    return json.dumps([dict(o) for o in cell.get("outputs", [])])


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
        except psutil.Error:
            continue
    return out


class NotebookRun:
    """One fresh kernel: ``await run.start(setup, marker)``, ``await run.round_trip(src)``,
    ``await run.stop(src)``; always ``await run.close()``."""

    def __init__(self, spec: KernelSpec, kernels: Path, env: dict[str, str] | None = None):
        self.spec = spec
        self.env = {**os.environ, **(env or {})}
        # Tools that launch "python" from PATH (nbdistributed) get this interpreter.
        bindir = str(Path(sys.executable).parent)
        self.env["PATH"] = os.pathsep.join([bindir, self.env.get("PATH", "")])
        self.km = AsyncKernelManager(
            kernel_name=spec.name,
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]),
        )
        self.nb = nbformat.v4.new_notebook()
        # An empty working directory: nothing there shadows an installed package.
        self.cwd = tempfile.mkdtemp(prefix="wb-bench-cwd-")
        self.client = _TimedClient(
            self.nb, km=self.km, timeout=CELL_TIMEOUT_S, startup_timeout=180, allow_errors=False
        )
        self.times = RunTimes()
        self._kernel_pid: int | None = None
        self._seen: dict[int, psutil.Process] = {}
        self._kc: Any = None

    def _snapshot(self) -> None:
        if self._kernel_pid is not None:
            for p in _tree(self._kernel_pid):
                self._seen.setdefault(p.pid, p)

    async def _cell(self, source: str) -> Any:
        cell = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        await self.client.async_execute_cell(cell, len(self.nb.cells) - 1)
        self._snapshot()
        return cell

    async def start(self, setup: list[str], marker: str) -> RunTimes:
        """Start the kernel, run ``setup``; the last cell must print ``marker``."""
        client = self.client
        client.marker = marker
        client.t0 = time.perf_counter()
        await client.async_start_new_kernel(env=self.env, cwd=self.cwd)
        await client.async_start_new_kernel_client()
        self._kernel_pid = getattr(self.km.provisioner, "pid", None)
        self.times.kernel_ready_s = time.perf_counter() - client.t0
        cell = None
        for source in setup:
            cell = await self._cell(source)
            self.times.cells_s.append(time.perf_counter() - client.t0)
        self.times.marker_s = client.marker_at
        self.times.marker_cell_text = _outputs_text(cell) if cell is not None else ""
        return self.times

    async def round_trip(self, source: str) -> float:
        start = time.perf_counter()
        cell = await self._cell(source)
        seconds = time.perf_counter() - start
        self.times.round_trips_s.append(seconds)
        self.times.last_round_trip_text = _outputs_text(cell)
        return seconds

    async def timed(self, source: str) -> tuple[float, str, bool]:
        """Run a cell that may fail: (seconds request to reply, its outputs, whether it
        ended in an error)."""
        self.client.allow_errors = True
        try:
            start = time.perf_counter()
            cell = await self._cell(source)
            seconds = time.perf_counter() - start
        finally:
            self.client.allow_errors = False
        text = _outputs_text(cell)
        return seconds, text, any(o.get("output_type") == "error" for o in cell.outputs)

    async def restart(self) -> None:
        """The notebook's Restart: the kernel (and what it started) replaced by a new one."""
        self._snapshot()
        await self.km.restart_kernel(now=False)
        await self.client.kc.wait_for_ready(timeout=180)
        self._kernel_pid = getattr(self.km.provisioner, "pid", None)

    async def stop(self, source: str) -> float:
        """Time a cell that stops the tool's processes; note what is still alive after it."""
        self._snapshot()
        start = time.perf_counter()
        await self._cell(source)
        self.times.stop_s = time.perf_counter() - start
        self.times.left_after_stop = _describe(_tree(self._kernel_pid or 0))
        return self.times.stop_s

    async def close(self) -> None:
        self._snapshot()
        try:
            if self.km.has_kernel:
                await asyncio.wait_for(self.km.shutdown_kernel(now=False), 60)
        except Exception:
            await self.km.shutdown_kernel(now=True)
        finally:
            if self.client.kc is not None:
                self.client.kc.stop_channels()
        procs = list(self._seen.values())
        _, alive = psutil.wait_procs(procs, timeout=3)
        self.times.left_after_shutdown = _describe(alive)
        for p in alive:  # by pid (psutil checks the creation time: never a reused pid)
            try:
                p.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(alive, timeout=3)
        shutil.rmtree(self.cwd, ignore_errors=True)
