"""Running code on the ranks: functions, cell source, waiting, failures, status.

``RankDispatch`` is the part of ``Cluster`` that talks to running engines: it sends work to
the chosen ranks concurrently, waits with early exit when an engine dies and a hang report
when time runs out, and turns remote failures into ``RankError`` / ``EngineDied``.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ipyparallel as ipp

from workbench import validate
from workbench.cluster.cell_routes import live_watch, send_cell
from workbench.cluster.direct_channel import DirectCells
from workbench.cluster.hang import (
    after_interrupt,
    describe_rank,
    hang_report,
    lost_engines_error,
    read_status,
    stopped_while_waiting,
)
from workbench.cluster.health import status_rows
from workbench.cluster.live_output import LiveWatch, OnOutput
from workbench.cluster.processes import FROZEN, local_state
from workbench.cluster.ranks import RankAssignment
from workbench.cluster.results import ABORTED, CellResult, format_remote, reply_metadata
from workbench.cluster.signals import signal_rank_sync
from workbench.errors import (
    ClusterError,
    CollectiveTimeout,
    EngineDied,
    RankError,
)

__all__ = ["RankDispatch"]

log = logging.getLogger("workbench.cluster")

# After a death, a survivor busy in Python code this long is marked stuck (recover() frees it)
_DEATH_GRACE_S = 0.5
# After an interrupt, engines in Python code stop at once; one blocked in a collective
# does not (signals run between bytecodes) and is left for recover().
_INTERRUPT_GRACE_S = 2.0
# ... one the hang report saw in a collective only this long (were its status stale).
_BLOCKED_GRACE_S = 0.2
_POLL_S = 0.02
# While waiting, how often the controller (and, for local engines, their processes) are
# checked: without a controller no reply and no death notice would ever arrive.
_HEALTH_S = 0.25


class RankDispatch:
    """Mixed into ``Cluster``; uses its ``ranks``, ``client``, ``state``, ``run_dir``,
    ``_ipp``, ``_stuck``, ``_given_up`` and ``check_controller``."""

    ranks: list[RankAssignment]
    run_dir: str | None
    _client: Any
    _ipp: Any
    _stuck: dict[int, Any]
    _given_up: set[int]
    _state: str
    _views: dict[int, Any]  # engine id -> its DirectView (see _view)
    _direct: DirectCells | None  # cells straight to local engines (direct_channel.py)
    _direct_port_futures: dict[int, Any]  # engine id -> its port, asked at registration

    def check_controller(self) -> None:  # implemented by Cluster
        raise NotImplementedError

    def _targets(
        self, ranks: int | Sequence[int] | None, *, blocked_ok: bool = False
    ) -> list[RankAssignment]:
        self.check_controller()  # (it read the state: once per call is enough)
        if not self.ranks or self._state not in ("running", "degraded"):
            raise ClusterError("the cluster is not running; start it first (%wb start)")
        size = self.world_size
        wanted = list(range(size)) if ranks is None else validate.rank_list(ranks, size)
        self.ensure_alive(None if ranks is None else wanted)
        if not blocked_ok:
            self._ensure_free(wanted)
        return [self.ranks[r] for r in sorted(set(wanted))]

    def view(self, engine_id: int) -> Any:
        """The engine's DirectView, made once per client (making one costs ~0.2 ms, as
        much as sending the request; a cell sends one per rank). Call after ``_targets``.

        An engine can leave the controller between the liveness check and this call (a
        kill just before a step): that is ``EngineDied`` naming the rank, like any death,
        not ipyparallel's "No such engine"."""
        client = self._client
        view = self._views.get(engine_id)
        if view is None or view.client is not client:
            try:
                view = self._views[engine_id] = client[engine_id]
            except IndexError:
                self.ensure_alive()  # raises EngineDied for every rank already gone
                lost = [r.rank for r in self.ranks if r.engine_id == engine_id]
                self.state = "degraded"
                raise self._lost_error(lost) from None
        return view

    def _ensure_free(self, ranks: Sequence[int]) -> None:
        """Raise at once when a rank is still blocked by an earlier cell that timed out or
        was interrupted, or waits in a collective that cannot finish: new work would only
        queue behind it (and be dropped by the engine when that cell finally fails). A rank
        merely still busy after a peer died is waited for, as before: it fails out of its
        next collective and is free a moment later."""
        wanted = set(ranks)
        suspects = [r for r in sorted(wanted) if r in self._stuck]
        if not suspects:
            return
        if any(r not in self._given_up for r in suspects):
            # a survivor of a peer's death fails out of its collective a moment later
            end = time.monotonic() + _INTERRUPT_GRACE_S
            while time.monotonic() < end and not all(self._stuck[r].ready() for r in suspects):
                time.sleep(_POLL_S)
        self._stuck = {r: f for r, f in self._stuck.items() if not f.ready()}
        self._given_up &= set(self._stuck)
        statuses = {r: read_status(self.run_dir, r) for r in suspects if r in self._stuck}
        blocked = [
            r
            for r, status in statuses.items()
            if r in self._given_up or (status is not None and status.get("in_flight"))
        ]
        if blocked:
            where = "; ".join(f"rank {r}: {describe_rank(statuses[r])}" for r in blocked)
            raise ClusterError(
                f"ranks {blocked} are still blocked by an earlier cell (it timed out, was "
                f"interrupted or lost a peer: {where}); free them with `%wb restart` "
                "(cluster.recover_sync()), which keeps their engines when it can"
            )

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

    def ensure_alive(self, ranks: Sequence[int] | None = None) -> None:
        """Raise ``EngineDied`` (before sending any work) when the engine of one of
        ``ranks`` (default: all) already died."""
        client = self._client
        if client is None:
            return
        ids = set(client.ids)
        chosen = self.ranks if ranks is None else [self.ranks[r] for r in ranks]
        dead = sorted(r.rank for r in chosen if r.engine_id not in ids or self._frozen(r))
        if dead:
            self.state = "degraded"
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

    def _dead_rank(self, r: RankAssignment, future: Any) -> bool:
        return self._dead_engine(future, r.engine_id)

    def _dead_engine(self, future: Any, engine_id: int) -> bool:
        """True when the engine behind ``future`` died (ipyparallel reports it as a
        RemoteError named EngineError, or the engine left the client's ids)."""
        client = self._client
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
        self, targets: list[Any], futures: list[Any], pending: list[int], seen: set[int]
    ) -> bool:
        """After a death: each rank without a reply is dead (a direct cell's never comes) or
        was ``seen`` in a collective since, which it fails out of (``_ensure_free`` waits)."""
        for i in pending:
            status = None if i in seen else read_status(self.run_dir, targets[i].rank)
            if (status or {}).get("in_flight"):
                seen.add(i)
        return all(i in seen or self._dead_rank(targets[i], futures[i]) for i in pending)

    def _wait_all(
        self,
        targets: list[RankAssignment],
        futures: list[Any],
        timeout: float | None,
        live: LiveWatch | None = None,
    ) -> None:
        """Wait for every rank; returns early (within ``_DEATH_GRACE_S``) once an engine
        died; raises ``CollectiveTimeout`` with the hang report at ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        death_deadline: float | None = None
        seen: set[int] = set()  # after a death: survivors seen waiting in a collective
        next_health = time.monotonic() + _HEALTH_S
        client = self._client  # a stop (or restart) from another thread replaces it
        try:
            while True:
                if self._client is not client or self._state in ("stopping", "stopped"):
                    raise stopped_while_waiting([r.rank for r in targets])
                pending = [i for i, f in enumerate(futures) if not f.ready()]
                if not pending:
                    return
                now = time.monotonic()
                health = now >= next_health
                if health:
                    next_health = now + _HEALTH_S
                    self.check_controller()
                # A death shows in the client's bookkeeping, checked every poll; a stopped
                # process only in its state, read on the health cadence: reading it for
                # every rank at every poll put ~1 ms on a 10 ms cell's round trip.
                lost = self._lost if health else self._dead_rank
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
                if live is not None:
                    live.poll()
                futures[pending[0]].wait(_POLL_S)
        except KeyboardInterrupt:
            self._give_up(targets, futures)
            raise
        if any(self._lost(r, f) for r, f in zip(targets, futures, strict=True)):
            return
        pending_ranks = [r.rank for r, f in zip(targets, futures, strict=True) if not f.ready()]
        done = [r.rank for r in targets if r.rank not in pending_ranks]
        # The report first: it shows where the ranks were when time ran out.
        message, report = hang_report(self.run_dir, pending_ranks, done, timeout)
        blocked = self._give_up(targets, futures, in_collective=set(report.get("waiting", ())))
        message += after_interrupt([r for r in pending_ranks if r not in blocked], blocked)
        raise CollectiveTimeout(message, report=report)

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
            if not left or waited >= _INTERRUPT_GRACE_S:
                break
            if waited >= _BLOCKED_GRACE_S and set(in_collective).issuperset(left):
                break
            time.sleep(_POLL_S)
        self._mark_stuck(targets, futures)
        blocked = [r.rank for r, f in zip(targets, futures, strict=True) if not f.ready()]
        self._given_up.update(blocked)
        return blocked

    def _mark_stuck(self, targets: list[RankAssignment], futures: list[Any]) -> None:
        for r, f in zip(targets, futures, strict=True):
            if not f.ready():
                self._stuck[r.rank] = f
        if self._stuck:
            self.state = "degraded"

    def collect(
        self, targets: list[RankAssignment], futures: list[Any], timeout: float | None
    ) -> list[Any]:
        """Wait for per-rank futures (from ``client[eid].apply_async``) and gather results."""
        self._wait_all(targets, futures, timeout)
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
            self.state = "degraded"
            raise self._lost_error(dead)
        if failures:
            raise RankError.from_failures(failures)
        return results

    def _lost_error(self, lost: list[int]) -> EngineDied:
        return lost_engines_error(self.ranks, lost, self.run_dir, self._client)

    def execute(
        self,
        code: str,
        *,
        ranks: int | Sequence[int] | None = None,
        timeout: float | None = None,
        direct: bool = True,
        on_output: OnOutput | None = None,
    ) -> list[CellResult]:
        """Run cell source in each chosen rank's namespace; per-rank outputs in rank order.
        ``on_output([(rank, "stdout" | "stderr", text), ...])`` gets output as printed.

        Failures are returned in the results (``CellResult.ename``), not raised, so the caller
        can show every rank's output before failing; a dead engine raises ``EngineDied``.
        An engine on this machine's network takes the cell on its own loopback socket, one
        hop instead of two through the controller (``engine/direct_cells.py``); with
        ``direct=False``, or for engines elsewhere, it goes through the controller.
        """
        validate.seconds("timeout", timeout, none_means="no limit")  # before any work is sent
        targets = self._targets(ranks)
        futures = send_cell(self, code, targets, timeout, direct, live=on_output is not None)
        live = live_watch(self, targets, futures, on_output)
        self._wait_all(targets, futures, timeout, live)
        for r, future in zip(targets, futures, strict=True):
            # A reply can arrive before the engine's last stdout/display messages.
            if future.ready() and not self._lost(r, future):
                future.wait_for_output(5)
        out: list[CellResult] = []
        dead: list[int] = []
        for r, future in zip(targets, futures, strict=True):
            result = CellResult.of_reply(r.rank, r.engine_id, reply_metadata(future))
            if self._lost(r, future):
                dead.append(r.rank)
                out.append(result)
                continue
            if not future.ready():  # still blocked after a peer died
                out.append(result)
                continue
            try:
                future.get(0)
            except ipp.error.RemoteError as exc:
                result.ename, result.evalue = exc.ename, str(exc.evalue)
                result.traceback = format_remote(exc)
            except ipp.error.CompositeError as exc:
                ename, evalue, tb, _ = exc.elist[0]
                result.ename, result.evalue, result.traceback = ename, str(evalue), tb
            except ipp.error.TaskAborted:
                result.ename, result.evalue, result.traceback = "TaskAborted", ABORTED, ABORTED
            out.append(result)
        if dead:
            self._mark_stuck(targets, futures)
            self.state = "degraded"
            raise self._lost_error(dead)
        return out

    def interrupt(self, ranks: Sequence[int] | None = None) -> None:
        """Send SIGINT to the engines of ``ranks`` (default: all) to stop running code."""
        if self._ipp is None:
            return
        targets = self._targets(ranks, blocked_ok=True)
        for r in targets:  # on the engine's own host (signals.py)
            signal_rank_sync(self.client, r, signal.SIGINT)

    def status(self) -> list[dict[str, Any]]:
        """One row per rank: rank, engine id, host, pid, device, backend, state."""
        self.check_controller()  # the queue query below would wait forever for a dead hub
        busy = set() if self._direct is None else self._direct.busy()
        return status_rows(self.ranks, self._client, busy)
