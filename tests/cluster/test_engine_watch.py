"""The kernel reports a local engine's death to the controller itself (engine_watch.py): a
local cluster's engines have no ipyparallel nanny, so without the watch the controller would
hear of a death only after 5 s of missed heartbeats."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import zmq
from jupyter_client.session import Session

from tests.processes import BOUND_S
from workbench.cluster import Cluster
from workbench.cluster.launch.fork import ForkEngineSetLauncher
from workbench.cluster.lifecycle import signals
from workbench.cluster.lifecycle.engine_watch import EngineWatch
from workbench.cluster.lifecycle.start_sequence import make_ipp_cluster
from workbench.cluster.loop import run_anywhere
from workbench.cluster.ranks import RankAssignment
from workbench.engine.hosts import local_pid_space

pytestmark = pytest.mark.engines


class _Hub:
    """A stand-in for the controller's registration socket: reads signed messages."""

    def __init__(self, key: bytes) -> None:
        self.session = Session(key=key)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.url = f"tcp://127.0.0.1:{port}"

    def receive(self, timeout_s: float) -> dict[str, object] | None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        _idents, msg = self.session.recv(self.sock, mode=0)
        return msg

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polled"])
def test_a_watched_process_exit_sends_the_nannys_message(
    pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not pidfd:  # a platform without pidfds: the pid is polled instead
        monkeypatch.delattr("os.pidfd_open", raising=False)
    hub = _Hub(b"secret")
    watch = EngineWatch(Session(key=b"secret"), hub.url)
    proc, other = _sleeper(), _sleeper()
    try:
        watch.watch(3, proc.pid)
        watch.watch(4, other.pid)
        assert hub.receive(0.3) is None  # nothing while both run
        proc.kill()
        msg = hub.receive(BOUND_S)
        assert msg is not None, "no report of the exit"
        assert msg["header"]["msg_type"] == "unregistration_request"  # type: ignore[index]
        assert msg["content"] == {"id": 3}
        assert watch.reported == [3]
        watch.close()
        other.kill()  # a closed watch reports nothing: the stop's own exits are not news
        assert hub.receive(0.5) is None
    finally:
        watch.close()
        for p in (proc, other):
            p.kill()
            p.wait(10)
        hub.close()


def test_an_already_gone_process_is_reported_at_once() -> None:
    hub = _Hub(b"k")
    watch = EngineWatch(Session(key=b"k"), hub.url)
    proc = _sleeper()
    proc.kill()
    proc.wait(10)
    try:
        watch.watch(7, proc.pid)
        msg = hub.receive(BOUND_S)
        assert msg is not None and msg["content"] == {"id": 7}
    finally:
        watch.close()
        hub.close()


def test_local_engines_start_without_a_nanny_and_ranks_here_are_signalled_by_pid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = make_ipp_cluster(Cluster(n=2).engines).config
    assert "--IPEngine.enable_nanny=False" in ForkEngineSetLauncher(config=config).engine_args
    proc = _sleeper()
    try:
        rank = RankAssignment(
            rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
            num_nodes=1, host="h", engine_id=0, pid=proc.pid, pid_space=local_pid_space(),
            master_addr="127.0.0.1", master_port=0, backend="gloo", device="cpu", threads=1,
        )  # fmt: skip

        asked: list[object] = []

        class NoNanny:  # a local engine has none: the signal must not go this way
            def send_signal(self, *args: object, **kwargs: object) -> None:
                asked.append(args)
                raise RuntimeError("no nanny")

        assert run_anywhere(signals.signal_rank(NoNanny(), rank, signal.SIGTERM))
        deadline = time.monotonic() + BOUND_S
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.returncode == -signal.SIGTERM
        assert not run_anywhere(signals.signal_rank(NoNanny(), rank, signal.SIGTERM))  # gone now
        assert asked == []
    finally:
        proc.kill()
        proc.wait(10)
