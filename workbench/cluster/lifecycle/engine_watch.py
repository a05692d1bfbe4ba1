"""A local cluster's engine deaths, told to the controller by the kernel itself.

ipyparallel gives every engine a nanny: one more Python interpreter per engine that
watches it and, when it exits, tells the controller at once (an ``unregistration_request``;
the heartbeat alone would take seconds), and that relays signals to it. Starting one costs
~0.5 s of CPU per engine, and the engine waits for its nanny while it registers: on a
small machine that is on a start's critical path. A local cluster's engines run on this
host, in this PID namespace, so the kernel does both jobs without them: it watches each
engine's pid here (a pidfd, woken the instant the process exits; no polling where Linux
has pidfds) and sends the controller the nanny's own message, and it signals engines by
pid (signals.py). What follows a death is unchanged: the controller drops the engine, the
client fails its pending requests with ``EngineError``, and the dispatch names the rank.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
from typing import Any

import psutil
import zmq
from ipyparallel.util import connect

from workbench.cluster.processes import running

__all__ = ["EngineWatch"]

log = logging.getLogger("workbench.cluster")

# Where pidfds are missing (not Linux, or a kernel before 5.3): how often pids are polled.
_POLL_S = 0.05


class EngineWatch:
    """Watches local engine processes; reports each one's exit to the controller.

    ``session`` signs the message as the client's own requests are signed; ``url`` is the
    controller's registration address (where the nanny would send it)."""

    def __init__(self, session: Any, url: str, curve: dict[str, bytes] | None = None) -> None:
        self._session = session
        self._url = url
        self._curve = {k: v for k, v in (curve or {}).items() if v}
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._added: list[tuple[int, psutil.Process, int | None]] = []
        self._polled: dict[int, psutil.Process] = {}  # engine id -> process, no pidfd
        self.reported: list[int] = []  # engine ids whose exit was reported, in order
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(
            target=self._run, name="workbench-engine-watch", daemon=True
        )
        self._thread.start()

    @classmethod
    def for_client(cls, client: Any) -> EngineWatch:
        """A watch that reports to ``client``'s controller, signed with its session."""
        curve = {
            "curve_serverkey": getattr(client, "curve_serverkey", b""),
            "curve_publickey": getattr(client, "curve_publickey", b""),
            "curve_secretkey": getattr(client, "curve_secretkey", b""),
        }
        return cls(client.session, client._config["registration"], curve)

    def watch(self, engine_id: int, pid: int) -> None:
        """Report engine ``engine_id`` when process ``pid`` (on this host) exits."""
        try:
            proc = psutil.Process(pid)
        except psutil.Error:  # already gone
            self._report(engine_id)
            return
        fd: int | None = None
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfds here: polled instead
            fd = None
        with self._lock:
            if self._closed:
                if fd is not None:
                    os.close(fd)
                return
            self._added.append((engine_id, proc, fd))
            os.write(self._wake_w, b"w")  # under the lock: the thread closes it once closed

    def close(self) -> None:
        """Stop watching (a stop is on its way: its engines' exits are not news)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.write(self._wake_w, b"q")
        self._thread.join(timeout=5)
        self._ctx.destroy(linger=0)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._closed:
                timeout = _POLL_S if self._polled else None
                for key, _ in selector.select(timeout):
                    if key.data is None:
                        os.read(self._wake_r, 4096)
                        continue
                    selector.unregister(key.fd)
                    os.close(key.fd)
                    self._report(key.data)
                self._take_added(selector)
                for engine_id, proc in list(self._polled.items()):
                    if not running(proc):
                        del self._polled[engine_id]
                        self._report(engine_id)
        except Exception:  # a broken watch must not take the kernel with it
            log.debug("engine watch failed", exc_info=True)
        finally:
            for key in list(selector.get_map().values()):
                if key.data is not None:
                    os.close(key.fd)
            selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _take_added(self, selector: selectors.BaseSelector) -> None:
        with self._lock:
            added, self._added = self._added, []
        for engine_id, proc, fd in added:
            if fd is None:
                self._polled[engine_id] = proc
            else:
                selector.register(fd, selectors.EVENT_READ, engine_id)

    def _report(self, engine_id: int) -> None:
        """The nanny's message: the controller unregisters the engine and tells clients."""
        if self._closed:
            return
        self.reported.append(engine_id)
        sock = self._ctx.socket(zmq.DEALER)
        sock.linger = 1000  # long enough to deliver, never a hang at exit
        try:
            connect(sock, self._url, **self._curve)
            self._session.send(sock, "unregistration_request", content={"id": engine_id})
        except Exception:  # the controller may be going away too
            log.debug("reporting engine %s's exit failed", engine_id, exc_info=True)
        finally:
            sock.close()
