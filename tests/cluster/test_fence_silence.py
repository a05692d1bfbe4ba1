"""The fence's decision (``workbench.engine.fencing``), without engines: an engine ends itself
only once its controller's pings stop for the whole bound, never while they arrive."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from workbench.cluster.hosts.fencing import FENCE_AFTER_S, REMOTE_PERIOD_MS, fence_after_s
from workbench.cluster.lifecycle.start_sequence import REMOTE_HEARTBEAT
from workbench.engine.fencing import Silence, watch

BOUND_S = 30.0  # generous: a loaded machine


def test_silence_expires_only_after_the_whole_bound() -> None:
    silence = Silence(after_s=30.0, last_ping=100.0)
    assert not silence.expired(129.9)
    silence.heard(129.9)  # a ping just in time restarts the count
    assert not silence.expired(159.0)
    assert silence.silent_for(159.0) == pytest.approx(29.1)
    assert silence.expired(159.9)


def test_the_bound_is_six_controller_windows_and_only_for_other_hosts() -> None:
    assert f"--HeartMonitor.period={REMOTE_PERIOD_MS}" in REMOTE_HEARTBEAT
    assert FENCE_AFTER_S == 30.0  # 6 x (10 missed pings x 500 ms)
    assert fence_after_s("local") == 0.0  # a local cluster's engines are never fenced
    assert {fence_after_s(x) for x in ("ssh", "mpi", "slurm")} == {FENCE_AFTER_S}


def _pinger(pub: zmq.Socket, until: threading.Event) -> None:
    while not until.is_set():
        pub.send(b"1.0")
        time.sleep(0.05)


def test_watch_keeps_quiet_while_pings_arrive_and_fences_when_they_stop() -> None:
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.linger = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    fenced = threading.Event()
    stop_pinging, stop_watching = threading.Event(), threading.Event()
    after_s = 1.0
    silence = Silence(after_s=after_s, last_ping=time.monotonic())
    watcher = threading.Thread(
        target=watch,
        args=(f"tcp://127.0.0.1:{port}", silence, fenced.set),
        kwargs={"stop": stop_watching},
        daemon=True,
    )
    pinger = threading.Thread(target=_pinger, args=(pub, stop_pinging), daemon=True)
    try:
        pinger.start()
        watcher.start()
        time.sleep(4 * after_s)  # four bounds of pings: never fenced
        assert not fenced.is_set()
        stop_pinging.set()  # the controller goes silent
        silenced = time.monotonic()
        assert fenced.wait(BOUND_S), "no fence after the pings stopped"
        assert time.monotonic() - silenced >= after_s * 0.9  # not before the bound
        watcher.join(BOUND_S)
        assert not watcher.is_alive()  # it returns once it fenced
    finally:
        stop_pinging.set()
        stop_watching.set()
        watcher.join(BOUND_S)
        pub.close(linger=0)
        context.term()


def test_pings_queued_while_the_thread_could_not_run_count_before_it_decides() -> None:
    # The main thread held the GIL past the bound just after the fence's poll timed out:
    # the thread wakes to a clock past the bound, with pings queued meanwhile. The clock
    # stands in for that: when first read, it publishes pings (queued, not yet read) and
    # jumps past the bound. A controller that pinged all along is not silence.
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.linger = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    fenced, stop = threading.Event(), threading.Event()
    start = time.monotonic()
    reads: list[float] = []

    def clock() -> float:
        if not reads:
            for _ in range(10):  # slow joiner: the subscription may still be on its way
                pub.send(b"1.0")
                time.sleep(0.05)
            time.sleep(0.3)  # queued on the SUB socket by zmq's I/O thread
        reads.append(time.monotonic())
        if len(reads) >= 6:
            stop.set()
        return start + 1000.0  # far past the bound

    silence = Silence(after_s=30.0, last_ping=start)
    watcher = threading.Thread(
        target=watch,
        args=(f"tcp://127.0.0.1:{port}", silence, fenced.set),
        kwargs={"stop": stop, "clock": clock},
        daemon=True,
    )
    try:
        time.sleep(0.3)  # the publisher has nothing to send yet: the first poll times out
        watcher.start()
        watcher.join(BOUND_S)
        assert not watcher.is_alive()
        assert not fenced.is_set()
    finally:
        stop.set()
        watcher.join(BOUND_S)
        pub.close(linger=0)
        context.term()
