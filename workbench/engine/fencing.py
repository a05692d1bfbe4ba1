"""Self-fencing: an engine that has not heard its controller for ``after_s`` ends itself.

Why: a host whose link is cut (a network partition, a switch port gone) keeps its
processes running. The kernel cannot reach them to stop them: the run goes on without them
(``HostLost``, then a shrink or a spare), and they would otherwise stay there holding
memory and GPUs until someone logs in, or come back with the link into a group re-formed
without them. So the cut-off side empties itself.

How it knows: the controller's heartbeat (ipyparallel's ``HeartMonitor``) publishes a ping
to every engine each period. ipyparallel's own engine-side check of it
(``IPEngine.max_heartbeat_misses``) runs on the engine's main event loop, so it never runs
while a cell (or a collective with the lost peers) blocks the main thread, and it only
stops that loop, leaving the nanny behind. Here a daemon thread holds a second
subscription to the same pings (zmq ``SUB``, its own context, polling with the GIL
released): a rank busy for hours in a cell still hears every ping, while a cut link or a
dead or frozen controller means no ping at all. After ``after_s`` without one, the thread
SIGKILLs the engine's children (ipyparallel's nanny, in a session of its own) and then the
engine's process group (the engine leads it: the ssh launcher starts it under ``setsid``),
or only the engine where it leads none.

Started by the kernel for engines on other hosts only (``cluster/hosts/fencing.py``); local
engines never run it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.engine.state import engine_state

__all__ = [
    "THREAD_NAME",
    "Silence",
    "end_engine",
    "heartbeat_url",
    "running",
    "start",
    "watch",
]

THREAD_NAME = "workbench-fence"
_POLL_MS = 250  # how often the thread looks at the clock when no ping comes


@dataclass(slots=True)
class Silence:
    """How long the controller has been silent, on a clock the caller gives (testable)."""

    after_s: float
    last_ping: float

    def heard(self, now: float) -> None:
        self.last_ping = now

    def silent_for(self, now: float) -> float:
        return now - self.last_ping

    def expired(self, now: float) -> bool:
        """True once no ping came for ``after_s`` seconds: the engine is to end itself."""
        return self.silent_for(now) >= self.after_s


def heartbeat_url() -> tuple[str, dict[str, bytes]] | None:
    """The controller's ping address as this engine reaches it, and its CurveZMQ keys;
    None outside an engine or where the engine tunnels through ssh (a second tunnel would
    be needed: not fenced)."""
    try:
        from ipyparallel.engine.app import IPEngine
        from ipyparallel.util import disambiguate_url
    except ImportError:
        return None
    if not IPEngine.initialized():
        return None
    app = IPEngine.instance()
    info = getattr(app, "connection_info", None) or {}
    if "hb_ping" not in info or getattr(app, "sshserver", ""):
        return None
    url = disambiguate_url(f"{info['interface']}:{info['hb_ping']}", app.location)
    keys: dict[str, bytes] = {}
    if app.curve_serverkey:
        keys = {
            "serverkey": app.curve_serverkey,
            "secretkey": app.curve_secretkey,
            "publickey": app.curve_publickey,
        }
    return url, keys


def end_engine() -> None:
    """SIGKILL this engine's children (its nanny), then its process group when it leads
    one, else itself. Nothing is flushed or finalised: the run it was part of is gone."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            continue
    pid = os.getpid()
    if os.getpgid(0) == pid:
        os.killpg(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


def watch(
    url: str,
    silence: Silence,
    on_expiry: Callable[[], None],
    keys: dict[str, bytes] | None = None,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Listen to the controller's pings at ``url`` until ``silence`` expires (then call
    ``on_expiry`` and return) or ``stop`` is set."""
    import zmq

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.linger = 0
    if keys:
        sub.curve_serverkey = keys["serverkey"]
        sub.curve_secretkey = keys["secretkey"]
        sub.curve_publickey = keys["publickey"]
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(url)
    try:
        while stop is None or not stop.is_set():
            if sub.poll(_POLL_MS):
                _read_queued(sub)
                silence.heard(clock())
                continue
            now = clock()
            # The poll timed out, but this thread may have woken long after (the main
            # thread held the GIL in one C call past the bound): what queued meanwhile is
            # read before deciding, so a live controller is never taken for silence.
            if sub.poll(0):
                _read_queued(sub)
                silence.heard(now)
            elif silence.expired(now):
                on_expiry()
                return
    finally:
        sub.close(linger=0)
        context.term()


def _read_queued(sub: Any) -> None:
    """Every ping queued on ``sub`` (only the latest counts)."""
    while sub.poll(0):
        sub.recv_multipart()


def start(after_s: float, on_expiry: Callable[[], None] = end_engine) -> bool:
    """On an engine: start the fence thread (once per process). False where it cannot
    watch (not an engine, ssh-tunnelled) or ``after_s`` is not positive."""
    if _fencing():
        return True
    if after_s <= 0:
        return False
    found = heartbeat_url()
    if found is None:
        return False
    url, keys = found
    silence = Silence(after_s=after_s, last_ping=time.monotonic())
    thread = threading.Thread(
        target=watch,
        args=(url, silence, on_expiry, keys),
        name=THREAD_NAME,
        daemon=True,
    )
    thread.start()
    engine_state().start_fence(thread)
    return True


def _fencing() -> bool:
    thread = engine_state().fence_thread
    return thread is not None and thread.is_alive()


def running() -> dict[str, Any]:
    """Whether this engine's fence thread runs (for tests and the doctor)."""
    return {"pid": os.getpid(), "fencing": _fencing()}
