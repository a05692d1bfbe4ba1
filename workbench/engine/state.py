"""Per-rank workbench state on an engine: one ``EngineState`` per engine process.

One engine process is one rank, so this is per-rank state; it is the only workbench state
an engine keeps (the user's variables live in the shell's namespace, ``user_namespace``).
The kernel never reads it by name: it calls ``workbench.engine`` functions on the engines
(``apply`` of functions pickled by reference, or code strings that import them), and those
read and change it through ``engine_state()``.

Two lifetimes, both here:

- **of one process group** (``join_group`` replaces them at every ``setup_rank``): the rank's
  assignment and clock, its training run and autosave settings, the trace recorder and the
  traced cell, the rendezvous store and probe, the store a failed group left;
- **of the process** (kept across groups, as a recovered or re-formed group reuses the
  engine): the status thread and the cell tracer, the fence thread, the direct cell socket,
  the fd capture, the debugger, what user code runs now, the connections the engine had
  before its first group.

The objects of the second kind belong to the module that makes them (``hang``,
``direct_cells``, ...), which imports this one; their fields are typed by the small
protocols below, so this module imports none of theirs (no import circle).

Process constants stay in their modules: the C library handle (``cell_fds``), torch's own
``init_process_group`` before the guard replaced it (``group_guard``), the machine's pid
space (``hosts``). They are facts of the process, the same for whatever rank it serves.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from workbench.errors import ClusterError

if TYPE_CHECKING:
    from workbench.parallel.step import TrainStep
    from workbench.parallel.user_model import UserRun
    from workbench.trace.clock import Clock
    from workbench.trace.comm import CommTracer
    from workbench.trace.recorder import Recorder
    from workbench.trace.traced import Traced

__all__ = [
    "CellCapture",
    "CellServer",
    "EngineConnections",
    "EngineDebugger",
    "EngineState",
    "engine_state",
    "user_namespace",
]


class CellServer(Protocol):
    """The engine's direct cell socket (``direct_cells.DirectCellServer``)."""

    port: int


class CellCapture(Protocol):
    """The capture of fds 1 and 2 around each cell (``cell_fds.FdCapture``)."""

    def begin_cell(self) -> None: ...

    def end_cell(self) -> None: ...


class EngineDebugger(Protocol):
    """The engine's pdb through the kernel (``rank_debug.EngineDebug``)."""

    installed: bool

    def stop_here(self, frame: Any) -> None: ...


@dataclass(slots=True)
class EngineConnections:
    """What this engine had before its first process group: never cut (``group_sockets``)."""

    inodes: set[int] = field(default_factory=set)
    remotes: set[tuple[str, int]] = field(default_factory=set)
    listening: set[int] = field(default_factory=set)  # ports; what they accept is kept


@dataclass(slots=True)
class EngineState:
    """This engine's workbench state (see the module's docstring for the two lifetimes)."""

    # --- of one process group: replaced by join_group ---
    assignment: dict[str, Any] | None = None  # this rank's RankAssignment, as a dict
    clock: Clock | None = None  # the kernel's clock, as the group was formed
    run: TrainStep | UserRun | None = None  # the training run (run_slot)
    autosave: dict[str, Any] | None = None  # {"root", "every", "keep_last", "key"}
    trace_recorder: Recorder | None = None  # wb.traced / %wb trace on (traced)
    trace_cell: Traced | None = None  # the traced span of the cell running now
    trace_policy: dict[str, Any] | None = None  # the last wb.traced(record=...)
    pending_store: Any = None  # rank 0's TCPStore, from open_store until setup_rank
    failed_store: Any = None  # the store a failed group left, for peers to read who failed
    rendezvous_probe: socket.socket | None = None  # rank 0's listening probe

    # --- of the process: kept across groups ---
    status_thread: threading.Thread | None = None  # hang's status-file thread
    cell_recorder: Recorder | None = None  # hang's recorder of cells' collectives
    cell_tracer: CommTracer | None = None  # its tracer, while cells are traced
    fence_thread: threading.Thread | None = None  # fence: ends a partitioned engine
    cell_server: CellServer | None = None  # direct_cells: the loopback cell socket
    fd_capture: CellCapture | None = None  # cell_fds: C-level output joins the cell's
    debugger: EngineDebugger | None = None  # rank_debug: made on first use
    in_cell: bool = False  # a cell runs now (group_guard follows the shell's events)
    scripts: int = 0  # script runs now (nested: a script's cell can run a script)
    before_first_group: EngineConnections | None = None  # group_sockets
    plain_namespace: dict[str, Any] = field(default_factory=dict)  # no IPython shell

    def join_group(self, assignment: dict[str, Any], clock: Clock) -> None:
        """A new process group's rank: what the last group held is let go."""
        self.assignment, self.clock = dict(assignment), clock
        self.run = self.autosave = None
        self.trace_recorder = self.trace_cell = self.trace_policy = None
        self.pending_store = self.failed_store = self.rendezvous_probe = None

    @property
    def rank(self) -> int:
        """This engine's rank in its group; -1 before it joined one."""
        return int((self.assignment or {}).get("rank", -1))

    # the training run (run_slot)
    def current_run(self) -> TrainStep | UserRun:
        """The run; a clear error when there is none (a restart or a recovery closed it:
        the session rebuilds it)."""
        if self.run is None:
            raise ClusterError(
                "no training run on this rank (the cluster was restarted or recovered since "
                "it was built); the stepper rebuilds it on its next call, or call "
                "session.build()"
            )
        return self.run

    def install_run(self, run: TrainStep | UserRun, autosave: dict[str, Any] | None) -> None:
        self.run, self.autosave = run, dict(autosave) if autosave else None

    def take_run(self) -> TrainStep | UserRun | None:
        run, self.run = self.run, None
        return run

    # the traced cell (traced)
    def trace_into(self, recorder: Recorder) -> None:
        self.trace_recorder = recorder

    def begin_trace_cell(self, block: Traced) -> None:
        self.trace_cell = block

    def take_trace_cell(self) -> Traced | None:
        block, self.trace_cell = self.trace_cell, None
        return block

    def keep_trace_policy(self, policy: dict[str, Any]) -> None:
        self.trace_policy = policy

    def take_trace_policy(self) -> dict[str, Any] | None:
        policy, self.trace_policy = self.trace_policy, None
        return policy

    # the rendezvous (process_group, rendezvous_probe, fail_together)
    def keep_pending_store(self, store: Any) -> None:
        self.pending_store = store

    def take_pending_store(self) -> Any:
        store, self.pending_store = self.pending_store, None
        return store

    def keep_failed_store(self, store: Any) -> None:
        self.failed_store = store

    def open_probe(self, probe: socket.socket) -> None:
        self.rendezvous_probe = probe

    def take_probe(self) -> socket.socket | None:
        probe, self.rendezvous_probe = self.rendezvous_probe, None
        return probe

    # the cell tracer and status thread (hang)
    def start_status_thread(self, thread: threading.Thread) -> None:
        self.status_thread = thread

    def stop_status_thread(self) -> threading.Thread | None:
        thread, self.status_thread = self.status_thread, None
        return thread

    def record_cells(self, recorder: Recorder) -> None:
        self.cell_recorder = recorder

    def trace_cells(self, tracer: CommTracer | None) -> None:
        self.cell_tracer = tracer

    # what user code runs now (group_guard)
    def cell_begins(self) -> None:
        self.in_cell = True

    def cell_ends(self) -> None:
        self.in_cell = False

    def script_begins(self) -> None:
        self.scripts += 1

    def script_ends(self) -> None:
        self.scripts -= 1

    @property
    def user_code(self) -> bool:
        """A ``%%wb`` cell or a script runs on this engine now."""
        return self.in_cell or self.scripts > 0

    # the objects of the process, one each (their modules make them)
    def start_fence(self, thread: threading.Thread) -> None:
        self.fence_thread = thread

    def serve_cells(self, server: CellServer) -> None:
        self.cell_server = server

    def capture_fds(self, capture: CellCapture) -> None:
        self.fd_capture = capture

    def debug_with(self, debugger: EngineDebugger) -> None:
        self.debugger = debugger

    def remember_connections(self, connections: EngineConnections) -> None:
        """The first group's record only: later groups keep it."""
        if self.before_first_group is None:
            self.before_first_group = connections


_STATE = EngineState()  # the one per process: an engine process serves one rank


def engine_state() -> EngineState:
    """This engine's workbench state."""
    return _STATE


def user_namespace() -> dict[str, Any]:
    """The engine's interactive namespace (where ``%%wb`` cells run)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:  # plain process (tests, torchrun): the state's own namespace
        return _STATE.plain_namespace
    return shell.user_ns  # type: ignore[no-any-return]
