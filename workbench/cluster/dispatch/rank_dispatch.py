"""Running code on the ranks: functions, cell source, waiting, failures, status.

``RankDispatch`` talks to running engines for a ``Cluster``, which holds one: it sends work
to the chosen ranks concurrently, waits with early exit when an engine dies and a hang
report when time runs out, and turns remote failures into ``RankError`` / ``EngineDied``.
It owns what that needs per engine (views, the direct cell pool) and the ranks it left
blocked (``stuck``); the engines and their state are the ``EngineSet``'s.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import ipyparallel as ipp

from workbench import validate
from workbench.cluster.dispatch import autopsy, fail_wait, hang
from workbench.cluster.dispatch.cell_routes import CellRoutes, DebugAddresses, live_watch, send_cell
from workbench.cluster.dispatch.debug_inbox import DebugInbox, Prompter, choose_failed_rank
from workbench.cluster.dispatch.health import status_rows
from workbench.cluster.dispatch.live_output import LiveWatch, OnOutput
from workbench.cluster.dispatch.results import (
    ABORTED,
    CellResult,
    failure_of,
    format_remote,
    reply_metadata,
)
from workbench.cluster.dispatch.stuck import INTERRUPT_GRACE_S, POLL_S, StuckRanks
from workbench.cluster.lifecycle.engines import EngineSet
from workbench.cluster.lifecycle.signals import signal_rank
from workbench.cluster.loop import run_anywhere
from workbench.cluster.processes import FROZEN, local_state
from workbench.cluster.ranks import RankAssignment
from workbench.cluster.state import LIVE, ClusterState, StateLink
from workbench.cluster.world import World
from workbench.errors import ClusterError, CollectiveTimeout, EngineDied, RankError

__all__ = ["RankDispatch"]

log = logging.getLogger("workbench.cluster")

# After a death, a survivor busy in Python code this long is marked stuck (recover() frees it)
_DEATH_GRACE_S = 0.5
# ... one the hang report saw in a collective only this long (were its status stale).
_BLOCKED_GRACE_S = 0.2
# While waiting, how often the controller (and, for local engines, their processes) are
# checked: without a controller no reply and no death notice would ever arrive.
_HEALTH_S = 0.25


# Message ids of past requests an ipyparallel client keeps (``Client.history``): enough for
# ``client.wait()`` on recent ones; the workbench never looks further back.
CLIENT_HISTORY = 1000


def bound_client_history(client: Any, views: Iterable[Any] = ()) -> None:
    """Keep the client's per-request memory bounded over a long run (a stepper sends one
    request per rank per step). ``Client.history`` and each view's ``history`` gain one msg
    id per request and ipyparallel never trims them (a view kept for the run, as ``views``
    are, holds ~100 bytes a step of its engine's ids); its ``results``, ``metadata`` and
    futures are dropped when a request resolves, so the histories are what is left to trim
    (amortised: at twice the bound)."""
    for owner in (client, *views):
        history = getattr(owner, "history", None)
        if isinstance(history, list) and len(history) > 2 * CLIENT_HISTORY:
            del history[:-CLIENT_HISTORY]


class RankDispatch:
    """Sends work to the ranks of ``engines``; ``world`` reads the cluster's ``World`` (a
    recovery makes a new one there), ``state`` its state."""

    def __init__(self, engines: EngineSet, world: Callable[[], World], state: StateLink) -> None:
        self.engines = engines
        self.world = world  # the cluster's: read here, never written
        self.state = state  # the cluster's: read here, deaths reported back (never written)
        self.views: dict[int, Any] = {}  # engine id -> its DirectView (see view)
        self.cells = CellRoutes(engines, world)  # the pool of cells straight to local engines
        self.stuck = StuckRanks()
        self.debug_inbox: DebugInbox | None = None  # opened by the first debuggable call

    @property
    def ranks(self) -> tuple[RankAssignment, ...]:
        """The cluster's ranks now (one read of its world)."""
        return self.world().ranks

    def forget(self) -> None:
        """The engines stopped: drop views, blocked ranks and the cell sockets."""
        self.stuck.forget()
        self.views = {}
        self.cells.forget()
        inbox, self.debug_inbox = self.debug_inbox, None
        if inbox is not None:
            inbox.close()

    def _inbox(self) -> DebugInbox:
        """The kernel's debug socket (``debug_inbox.py``), signing with the cluster's key."""
        client = self.engines.client_unchecked()
        if self.debug_inbox is None or self.debug_inbox.client is not client:
            if self.debug_inbox is not None:
                self.debug_inbox.close()
            self.debug_inbox = DebugInbox(client)
        return self.debug_inbox

    def _debug_addresses(self) -> DebugAddresses:
        inbox = self._inbox()
        return DebugAddresses(inbox.address(), inbox.address(self.engines.controller_address))

    def _targets(
        self, ranks: int | Sequence[int] | None, *, blocked_ok: bool = False
    ) -> list[RankAssignment]:
        self.state.check()  # (it read the state: once per call is enough)
        world = self.ranks  # one world for the whole choice
        if not world or self.state.last() not in LIVE:
            raise ClusterError("the cluster is not running; start it first (%wb start)")
        size = len(world)
        wanted = list(range(size)) if ranks is None else validate.rank_list(ranks, size)
        self.ensure_alive(None if ranks is None else wanted)
        if not blocked_ok:
            self.stuck.ensure_free(wanted, self.engines.run_dir)
        return [world[r] for r in sorted(set(wanted))]

    def view(self, engine_id: int) -> Any:
        """The engine's DirectView, made once per client (making one costs ~0.2 ms, as
        much as sending the request; a cell sends one per rank). Call after ``_targets``.

        An engine can leave the controller between the liveness check and this call (a
        kill just before a step): that is ``EngineDied`` naming the rank, like any death,
        not ipyparallel's "No such engine"."""
        client = self.engines.client_unchecked()
        view = self.views.get(engine_id)
        if view is None or view.client is not client:
            try:
                view = self.views[engine_id] = client[engine_id]
            except IndexError:
                self.ensure_alive()  # raises EngineDied for every rank already gone
                lost = [r.rank for r in self.ranks if r.engine_id == engine_id]
                self.state.degrade()
                raise self._lost_error(lost) from None
        return view

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        ranks: int | Sequence[int] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on the chosen ranks; results in rank order.

        A failure on any rank raises ``RankError`` with every failing rank's traceback; an
        engine that died raises ``EngineDied``; ``timeout`` raises ``CollectiveTimeout``.
        """
        validate.seconds("timeout", timeout, none_means="no limit")  # before any work is sent
        targets = self._targets(ranks)
        futures = [self.view(r.engine_id).apply_async(fn, *args, **kwargs) for r in targets]
        return self.collect(targets, futures, timeout)

    def run_each(
        self,
        fn: Callable[..., Any],
        args_by_rank: Mapping[int, Sequence[Any]],
        timeout: float | None = None,
        fail_together: bool = True,
    ) -> dict[int, Any]:
        """Call ``fn(*args_by_rank[r])`` on each rank ``r`` named, concurrently; results by
        rank. Failures, deaths and ``timeout`` as for ``run``; with ``fail_together`` a call
        whose rank raised while others still run does not wait for them (they may wait in a
        collective for it): see ``wait_unless_a_rank_failed``."""
        validate.seconds("timeout", timeout, none_means="no limit")  # before any work is sent
        validate.boolean("fail_together", fail_together)
        args = validate.args_by_rank(args_by_rank, len(self.ranks))
        targets = self._targets(sorted(args))
        futures = [self.view(r.engine_id).apply_async(fn, *args[r.rank]) for r in targets]
        if fail_together:
            self.wait_unless_a_rank_failed(targets, futures, timeout)
        results = self.collect(targets, futures, timeout)
        return {r.rank: result for r, result in zip(targets, results, strict=True)}

    def wait_unless_a_rank_failed(
        self, targets: list[RankAssignment], futures: list[Any], timeout: float | None
    ) -> None:
        """Return when every rank finished (or at ``timeout``: ``collect`` reports it), or
        raise ``RankError`` soon after one rank failed while others still run: those wait
        in a collective for the failed rank (a gloo collective cannot be interrupted), so
        they are marked stuck for ``recover()`` instead of being waited for until the
        process-group timeout. The failed rank has written its error to the store and
        dropped its group (``fail_together`` on the engines); a peer that this frees
        finishes within ``fail_wait.PEER_GRACE_S`` and names it."""

        def any_dead() -> bool:
            return any(self._dead(t, f) for t, f in zip(targets, futures, strict=True))

        if not fail_wait.wait_for_a_failure(futures, timeout, any_dead):
            return
        failures, waiting = fail_wait.failures_and_waiting(targets, futures)
        if not failures:  # an engine died meanwhile: collect() reports it
            return
        notice = time.monotonic() + fail_wait.death_notice_s(failures)
        while time.monotonic() < notice:
            if any(self._dead(t, f) for t, f in zip(targets, futures, strict=True)):
                return  # collect() reports EngineDied
            time.sleep(0.05)
        self._mark_stuck(targets, futures)
        raise fail_wait.failed_together(failures, waiting)

    def ensure_alive(self, ranks: Sequence[int] | None = None) -> None:
        """Raise ``EngineDied`` (before sending any work) when the engine of one of
        ``ranks`` (default: all) already died."""
        client = self.engines.client
        if client is None:
            return
        ids = set(client.ids)
        world = self.ranks
        chosen = world if ranks is None else [world[r] for r in ranks]
        dead = sorted(r.rank for r in chosen if r.engine_id not in ids or self._frozen(r))
        if dead:
            self.state.degrade()
            raise self._lost_error(dead)

    @staticmethod
    def _frozen(r: RankAssignment) -> bool:
        """A local engine stopped (SIGSTOP, a debugger) cannot answer; remote ones unread."""
        return local_state(r.host, r.pid) in FROZEN

    def _lost(self, r: RankAssignment, future: Any) -> bool:
        """The engine of ``r`` died or cannot answer any more. A request that has its
        reply was answered: only a pending one looks at the process state (a psutil read)."""
        if self._dead_engine(future, r.engine_id):
            return True
        return not future.ready() and self._frozen(r)

    def _dead(self, r: RankAssignment, future: Any) -> bool:
        return self._dead_engine(future, r.engine_id)

    def _dead_engine(self, future: Any, engine_id: int) -> bool:
        """True when the engine behind ``future`` died (ipyparallel reports it as a
        RemoteError named EngineError, or the engine left the client's ids)."""
        client = self.engines.client
        if client is not None and engine_id not in client.ids:
            return True
        if not future.ready():
            return False
        try:
            future.get(0)
        except ipp.error.EngineError:
            return True
        except ipp.error.RemoteError as exc:
            return exc.ename == "EngineError"
        except Exception:
            return False
        return False

    def _nothing_to_wait(
        self, targets: list[Any], futures: list[Any], pending: list[int], seen: fail_wait.Seen
    ) -> bool:
        """After a death: each rank without a reply is dead (a direct cell's never comes) or
        was ``seen`` in a collective since, which it fails out of (``_ensure_free`` waits)."""
        for i in pending:
            if i not in seen.ranks:
                seen.look(i, hang.read_status(self.engines.run_dir, targets[i].rank))
        return all(
            i in seen.ranks or self._dead_engine(futures[i], targets[i].engine_id) for i in pending
        )

    def _wait_all(
        self,
        targets: list[RankAssignment],
        futures: list[Any],
        timeout: float | None,
        live: LiveWatch | None = None,
        debug: DebugInbox | None = None,
    ) -> None:
        """Wait for every rank; returns early (within ``_DEATH_GRACE_S``) once an engine
        died; raises ``CollectiveTimeout`` with the hang report at ``timeout`` (``debug``:
        ranks' pdb prompts are answered meanwhile, a person's time there not counted)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        death_deadline: float | None = None
        seen = fail_wait.Seen()  # after a death: survivors seen waiting in a collective
        next_health = time.monotonic() + _HEALTH_S
        client = self.engines.client  # a stop (or restart) from another thread replaces it
        try:
            while True:
                if self.engines.client is not client or self.state.last() in (
                    ClusterState.STOPPING,
                    ClusterState.STOPPED,
                ):
                    raise hang.stopped_while_waiting([r.rank for r in targets])
                pending = [i for i, f in enumerate(futures) if not f.ready()]
                if not pending:
                    return
                now = time.monotonic()
                health = now >= next_health
                if health:
                    next_health = now + _HEALTH_S
                    self.state.check()
                # A death shows in the client's bookkeeping, checked every poll; a stopped
                # process only in its state, read on the health cadence: reading it for
                # every rank at every poll put ~1 ms on a 10 ms cell's round trip.
                lost = self._lost if health else self._dead
                if death_deadline is None and any(
                    lost(r, f) for r, f in zip(targets, futures, strict=True)
                ):
                    death_deadline = now + _DEATH_GRACE_S
                if death_deadline is not None and (
                    now >= death_deadline or self._nothing_to_wait(targets, futures, pending, seen)
                ):
                    return  # collect() reports the death; the rest are marked stuck
                if deadline is not None and now >= deadline:
                    break
                deadline = self._meanwhile(live, debug, deadline)
                futures[pending[0]].wait(POLL_S if debug is None else debug.wait_s(POLL_S))
        except KeyboardInterrupt:
            self._give_up(targets, futures)
            raise
        if any(self._lost(r, f) for r, f in zip(targets, futures, strict=True)):
            return
        self._timed_out(targets, futures, timeout)

    def _timed_out(
        self, targets: list[RankAssignment], futures: list[Any], timeout: float | None
    ) -> None:
        """Raise ``CollectiveTimeout`` with the autopsy and the hang report, after giving
        up on the ranks still busy (``_give_up``)."""
        pending_ranks = [r.rank for r, f in zip(targets, futures, strict=True) if not f.ready()]
        done = [r.rank for r in targets if r.rank not in pending_ranks]
        # The report first: it shows where the ranks were when time ran out (the autopsy
        # asks every rank for its stack and flight recorder, ~0.5 s at most).
        found = autopsy.take(
            self.engines.client_unchecked(),
            targets,
            pending_ranks,
            self.engines.run_dir,
            world_size=len(self.ranks),
        )
        message, report = hang.hang_report(self.engines.run_dir, pending_ranks, done, timeout)
        blocked = self._give_up(targets, futures, in_collective=set(report.get("waiting", ())))
        message += hang.after_interrupt([r for r in pending_ranks if r not in blocked], blocked)
        raise CollectiveTimeout(found.message(message), report=report, autopsy=found)

    @staticmethod
    def _meanwhile(
        live: LiveWatch | None, debug: DebugInbox | None, deadline: float | None
    ) -> float | None:
        """While the ranks run: hand on their output, answer their pdb prompts (the time
        a person spends at one moves ``deadline`` later)."""
        if live is not None:
            live.poll()
        return deadline if debug is None else debug.poll(deadline)

    def _give_up(
        self, targets: list[RankAssignment], futures: list[Any], in_collective: Iterable[int] = ()
    ) -> list[int]:
        """Interrupt the ranks still busy (ends Python code at once), wait a moment, and
        mark those still busy as stuck (e.g. blocked in a collective). Returns them. Ranks
        ``in_collective`` (seen waiting in one by the hang report) get ``_BLOCKED_GRACE_S``."""
        busy = [r.rank for r, f in zip(targets, futures, strict=True) if not f.ready()]
        if not busy:
            return []
        self.interrupt(busy)
        start = time.monotonic()
        while True:
            left = [r.rank for r, f in zip(targets, futures, strict=True) if not f.ready()]
            waited = time.monotonic() - start
            if not left or waited >= INTERRUPT_GRACE_S:
                break
            if waited >= _BLOCKED_GRACE_S and set(in_collective).issuperset(left):
                break
            time.sleep(POLL_S)
        self._mark_stuck(targets, futures)
        blocked = [r.rank for r, f in zip(targets, futures, strict=True) if not f.ready()]
        self.stuck.given_up.update(blocked)
        return blocked

    def _mark_stuck(self, targets: list[RankAssignment], futures: list[Any]) -> None:
        if self.stuck.mark(targets, futures):
            self.state.degrade()

    def collect(
        self, targets: list[RankAssignment], futures: list[Any], timeout: float | None
    ) -> list[Any]:
        """Wait for per-rank futures (from ``client[eid].apply_async``) and gather results."""
        self._wait_all(targets, futures, timeout)
        bound_client_history(getattr(self.engines, "client", None), self.views.values())
        results: list[Any] = []
        failures: dict[int, str] = {}
        dead: list[int] = []
        for r, future in zip(targets, futures, strict=True):
            if self._lost(r, future):
                dead.append(r.rank)
                continue
            if not future.ready():  # still blocked after a peer died
                continue
            try:
                results.append(future.get(0))
            except ipp.error.RemoteError as exc:
                failures[r.rank] = format_remote(exc)
            except ipp.error.TaskAborted:
                failures[r.rank] = ABORTED
        if dead:
            self._mark_stuck(targets, futures)
            self.state.degrade()
            raise self._lost_error(dead)
        if failures:
            raise RankError.from_failures(failures)
        return results

    def _lost_error(self, lost: list[int]) -> EngineDied:
        e = self.engines  # under Slurm, a node out of service is lost too (slurm_nodes.py)
        error = hang.lost_engines_error(self.ranks, lost, e.run_dir, e.client, e.config.launcher)
        cause = autopsy.explain_death(e.run_dir, len(self.ranks), lost)
        if cause is not None:  # a collective the ranks disagreed on: gloo aborted the engine
            error.args = (f"{cause} (gloo aborted the engine on this mismatch): {error}",)
        return error

    def execute(
        self,
        code: str,
        *,
        ranks: int | Sequence[int] | None = None,
        timeout: float | None = None,
        direct: bool = True,
        on_output: OnOutput | None = None,
        on_prompt: Prompter | None = None,
    ) -> list[CellResult]:
        """Run cell source in each chosen rank's namespace; per-rank outputs in rank order.
        ``on_output([(rank, "stdout" | "stderr", text), ...])`` gets output as printed.
        ``on_prompt`` answers a rank's ``breakpoint()`` (``debug_inbox.Prompter``; the
        notebook's stdin for ``%%wb``); without it ``breakpoint()`` raises on the rank.

        Failures are returned in the results (``CellResult.ename``), not raised, so the caller
        can show every rank's output before failing; a dead engine raises ``EngineDied``.
        An engine on this machine's network takes the cell on its own loopback socket, one
        hop instead of two through the controller (``engine/direct_cells.py``); with
        ``direct=False``, or for engines elsewhere, it goes through the controller.
        """
        validate.seconds("timeout", timeout, none_means="no limit")  # before any work is sent
        targets = self._targets(ranks)
        cells = self.cells.opened(targets, self.view, self.collect, timeout) if direct else None
        debug = None if on_prompt is None else self._debug_addresses()
        futures = send_cell(
            cells, self.view, code, targets, live=on_output is not None, debug=debug
        )
        live = live_watch(cells, targets, futures, on_output)
        if on_prompt is None:
            self._wait_all(targets, futures, timeout, live)
        else:
            inbox = self._inbox()
            with inbox.attended(on_prompt):
                self._wait_all(targets, futures, timeout, live, inbox)
        for r, future in zip(targets, futures, strict=True):
            # A reply can arrive before the engine's last stdout/display messages.
            if future.ready() and not self._lost(r, future):
                future.wait_for_output(5)
        out: list[CellResult] = []
        dead: list[int] = []
        for r, future in zip(targets, futures, strict=True):
            lost = self._lost(r, future)
            # (not lost, not ready: still blocked after a peer died)
            failure = failure_of(future) if not lost and future.ready() else None
            out.append(CellResult.of_reply(r.rank, r.engine_id, reply_metadata(future), failure))
            if lost:
                dead.append(r.rank)
        if dead:
            self._mark_stuck(targets, futures)
            self.state.degrade()
            raise self._lost_error(dead)
        return out

    def debug(self, rank: int | None = None, *, on_prompt: Prompter) -> str:
        """Post-mortem: pdb on ``rank`` (default: the rank whose last cell failed first) at
        the failing frame of its last failed cell or script, its prompts answered by
        ``on_prompt``; returns when the person types ``q`` or ``c``."""
        from workbench.engine.rank_debug import failed_cell, post_mortem

        size = len(self.ranks)
        if rank is not None and (
            isinstance(rank, bool) or not isinstance(rank, int) or rank not in range(size)
        ):
            raise validate.invalid("rank", rank, "not a rank of this cluster", f"0..{size - 1}")
        targets = self._targets(None)
        failed = self.collect(
            targets, [self.view(r.engine_id).apply_async(failed_cell) for r in targets], 60.0
        )
        by_rank = {r.rank: f for r, f in zip(targets, failed, strict=True)}
        chosen = self.ranks[choose_failed_rank(by_rank, rank)]
        inbox = self._inbox()
        address = inbox.address(self.engines.controller_address)
        future = self.view(chosen.engine_id).apply_async(post_mortem, address)
        with inbox.attended(on_prompt):
            self._wait_all([chosen], [future], None, debug=inbox)
        return str(self.collect([chosen], [future], None)[0])

    def interrupt(self, ranks: Sequence[int] | None = None) -> None:
        """Send SIGINT to the engines of ``ranks`` (default: all) to stop running code."""
        if self.engines.ipp is None and self.engines.adopted is None:  # not ours to signal
            return
        targets = self._targets(ranks, blocked_ok=True)
        for r in targets:  # on the engine's own host (signals.py)
            run_anywhere(signal_rank(self.engines.client_unchecked(), r, signal.SIGINT))

    def stacks(self, ranks: int | Sequence[int] | None = None) -> dict[int, str]:
        """Each chosen rank's Python stack now (the main thread's, innermost last, cell code
        as ``cell line N``; other threads folded to one line), read by its engine's control
        thread while the cell goes on: nothing is interrupted (``cluster/dispatch/autopsy.py``)."""
        targets = self._targets(ranks, blocked_ok=True)
        return autopsy.stacks(self.engines.client_unchecked(), targets)

    def status(self) -> list[dict[str, Any]]:
        """One row per rank: rank, engine id, host, pid, device, backend, state."""
        self.state.check()  # the queue query below would wait forever for a dead hub
        busy = self.cells.busy()
        return status_rows(self.ranks, self.engines.client, busy)
