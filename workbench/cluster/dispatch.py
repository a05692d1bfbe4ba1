"""Running code on the ranks: functions, cell source, waiting, failures, status.

``RankDispatch`` is the part of ``Cluster`` that talks to running engines: it sends work to
the chosen ranks concurrently, waits with early exit when an engine dies and a hang report
when time runs out, and turns remote failures into ``RankError`` / ``EngineDied``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipyparallel as ipp

from workbench import validate
from workbench.cluster.hang import describe_rank, hang_report, read_status
from workbench.cluster.ranks import RankAssignment
from workbench.cluster.results import CellResult, format_remote
from workbench.cluster.signals import signal_rank_sync
from workbench.errors import ClusterError, CollectiveTimeout, ConfigError, EngineDied, RankError

__all__ = ["RankDispatch"]

log = logging.getLogger("workbench.cluster")

# After an engine died, survivors' collectives fail at once ("connection reset"); any rank
# still busy this long afterwards is marked stuck (recover() frees it) instead of waited for,
# so the death is reported within a second.
_DEATH_GRACE_S = 0.5
# After an interrupt, engines in Python code stop at once; one blocked in a collective
# does not (signals run between bytecodes) and is left for recover().
_INTERRUPT_GRACE_S = 2.0
_POLL_S = 0.02


class RankDispatch:
    """Mixed into ``Cluster``; uses its ``ranks``, ``client``, ``state``, ``run_dir``,
    ``_ipp`` and ``_stuck``."""

    def _targets(self, ranks: int | Sequence[int] | None) -> list[RankAssignment]:
        if not self.ranks or self.state not in ("running", "degraded"):
            raise ClusterError("the cluster is not running; start it first (%wb start)")
        if ranks is None:
            self.ensure_alive()
            return list(self.ranks)
        wanted = [ranks] if isinstance(ranks, int) else list(ranks)
        valid = range(self.world_size)
        bad = [r for r in wanted if isinstance(r, bool) or not isinstance(r, int) or r not in valid]
        if bad or not wanted:
            raise ConfigError(
                f"ranks={wanted!r} is not valid; choose from 0..{self.world_size - 1}"
            )
        self.ensure_alive(wanted)
        return [self.ranks[r] for r in sorted(set(wanted))]

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
        client = self.client
        futures = [client[r.engine_id].apply_async(fn, *args, **kwargs) for r in targets]
        return self.collect(targets, futures, timeout)

    async def run_async(
        self,
        fn: Callable[..., Any],
        *args: Any,
        ranks: int | Sequence[int] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        return await asyncio.to_thread(self.run, fn, *args, ranks=ranks, timeout=timeout, **kwargs)

    def ensure_alive(self, ranks: Sequence[int] | None = None) -> None:
        """Raise ``EngineDied`` (before sending any work) when the engine of one of
        ``ranks`` (default: all) already died."""
        client = self._client
        if client is None:
            return
        ids = set(client.ids)
        chosen = self.ranks if ranks is None else [self.ranks[r] for r in ranks]
        dead = sorted(r.rank for r in chosen if r.engine_id not in ids)
        if dead:
            self.state = "degraded"
            raise EngineDied(self._describe_dead(dead), ranks=dead)

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

    def _wait_all(
        self, targets: list[RankAssignment], futures: list[Any], timeout: float | None
    ) -> None:
        """Wait for every rank; returns early (within ``_DEATH_GRACE_S``) once an engine
        died; raises ``CollectiveTimeout`` with the hang report at ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        death_deadline: float | None = None
        try:
            while True:
                pending = [i for i, f in enumerate(futures) if not f.ready()]
                if not pending:
                    return
                now = time.monotonic()
                if death_deadline is None and any(
                    self._dead_engine(f, r.engine_id) for r, f in zip(targets, futures, strict=True)
                ):
                    death_deadline = now + _DEATH_GRACE_S
                if death_deadline is not None and now >= death_deadline:
                    return  # collect() reports the death; the rest are marked stuck
                if deadline is not None and now >= deadline:
                    break
                futures[pending[0]].wait(_POLL_S)
        except KeyboardInterrupt:
            busy = [r.rank for r, f in zip(targets, futures, strict=True) if not f.ready()]
            self.interrupt(busy)
            end = time.monotonic() + _INTERRUPT_GRACE_S
            while time.monotonic() < end and not all(f.ready() for f in futures):
                time.sleep(_POLL_S)
            self._mark_stuck(targets, futures)
            raise
        if any(self._dead_engine(f, r.engine_id) for r, f in zip(targets, futures, strict=True)):
            return
        pending_ranks = [r.rank for r, f in zip(targets, futures, strict=True) if not f.ready()]
        done = [r.rank for r in targets if r.rank not in pending_ranks]
        message, report = hang_report(self.run_dir, pending_ranks, done, timeout)
        if "waiting" in report:  # blocked in a collective: only recover() frees them
            self._mark_stuck(targets, futures)
        raise CollectiveTimeout(message, report=report)

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
            if self._dead_engine(future, r.engine_id):
                dead.append(r.rank)
                continue
            if not future.ready():  # still blocked after a peer died
                continue
            try:
                results.append(future.get(0))
            except ipp.error.RemoteError as exc:
                failures[r.rank] = format_remote(exc)
        if dead:
            self._mark_stuck(targets, futures)
            self.state = "degraded"
            raise EngineDied(self._describe_dead(dead), ranks=dead)
        if failures:
            raise RankError.from_failures(failures)
        return results

    def _describe_dead(self, dead: list[int]) -> str:
        parts = [
            f"rank {r} (engine {self.ranks[r].engine_id} on {self.ranks[r].host}, "
            f"pid {self.ranks[r].pid}; last seen {describe_rank(read_status(self.run_dir, r))})"
            for r in dead
        ]
        return (
            f"engine died: {', '.join(parts)}; the process group is broken on every rank. "
            "Recover with `%wb restart` (cluster.recover_sync()): it replaces only the dead "
            "engine(s) and re-creates the process group."
        )

    def execute(
        self,
        code: str,
        *,
        ranks: int | Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> list[CellResult]:
        """Run cell source in each chosen rank's namespace; per-rank outputs in rank order.

        Failures are returned in the results (``CellResult.ename``), not raised, so the caller
        can show every rank's output before failing; a dead engine raises ``EngineDied``.
        """
        validate.seconds("timeout", timeout, none_means="no limit")  # before any work is sent
        targets = self._targets(ranks)
        client = self.client
        futures = [client[r.engine_id].execute(code, silent=False, block=False) for r in targets]
        self._wait_all(targets, futures, timeout)
        for r, future in zip(targets, futures, strict=True):
            # A reply can arrive before the engine's last stdout/display messages.
            if future.ready() and not self._dead_engine(future, r.engine_id):
                future.wait_for_output(5)
        out: list[CellResult] = []
        dead: list[int] = []
        for r, future in zip(targets, futures, strict=True):
            md = future.metadata[0] if isinstance(future.metadata, list) else future.metadata
            result = CellResult(
                rank=r.rank,
                engine_id=r.engine_id,
                stdout=md.get("stdout", ""),
                stderr=md.get("stderr", ""),
                outputs=list(md.get("outputs", [])),
                execute_result=md.get("execute_result"),
            )
            if self._dead_engine(future, r.engine_id):
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
            out.append(result)
        if dead:
            self._mark_stuck(targets, futures)
            self.state = "degraded"
            raise EngineDied(self._describe_dead(dead), ranks=dead)
        return out

    def interrupt(self, ranks: Sequence[int] | None = None) -> None:
        """Send SIGINT to the engines of ``ranks`` (default: all) to stop running code."""
        if self._ipp is None:
            return
        targets = self._targets(ranks)
        for r in targets:  # through the engine's nanny, on the engine's own host
            signal_rank_sync(self.client, r, signal.SIGINT)

    def status(self) -> list[dict[str, Any]]:
        """One row per rank: rank, engine id, host, pid, device, backend, state."""
        rows = []
        alive: set[int] = set()
        queues: dict[int, Any] = {}
        if self._client is not None:
            alive = set(self._client.ids)
            try:
                queues = self._client.queue_status(verbose=False)
            except Exception:
                queues = {}
        for r in self.ranks:
            if r.engine_id not in alive:
                state = "dead"
            else:
                q = queues.get(r.engine_id, {}) if isinstance(queues, dict) else {}
                busy = isinstance(q, dict) and (q.get("queue", 0) or q.get("tasks", 0))
                state = "busy" if busy else "idle"
            rows.append(
                {
                    "rank": r.rank,
                    "engine": r.engine_id,
                    "host": r.host,
                    "pid": r.pid,
                    "device": r.device,
                    "backend": r.backend,
                    "state": state,
                }
            )
        return rows
