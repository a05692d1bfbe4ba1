"""Each rank's output while a cell runs (``Cluster.execute(on_output=...)``), on both cell
paths, and C-level output (fds 1/2) in a cell's results."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.cluster.dispatch.results import CellResult
from workbench.errors import CollectiveTimeout

pytestmark = pytest.mark.engines

PATHS = [pytest.param(True, id="direct"), pytest.param(False, id="controller")]
# The first line, from Python or straight to fd 1 as C code writes it.
FIRST = {
    "python": "print('first', rank, flush=True)",
    "fd": "import os\nos.write(1, f'first {rank}\\n'.encode())",
}


def _waiting_cell(first: str, marker: Path) -> str:
    """Print a first line, then wait (at most a minute) for ``marker``: the test creates it
    only once it saw both ranks' first line, so the cell ends early only if output streamed."""
    return (
        f"{first}\nimport os, time\nend = time.monotonic() + 60\n"
        f"while not os.path.exists({str(marker)!r}) and time.monotonic() < end:\n"
        "    time.sleep(0.02)\n"
        f"print('marker seen' if os.path.exists({str(marker)!r}) else 'no marker')"
    )


class Collector:
    """An ``on_output`` that records what arrived and creates ``marker`` once each rank's
    first line arrived."""

    def __init__(self, marker: Path | None = None) -> None:
        self.marker = marker
        self.calls: list[list[tuple[int, str, str]]] = []
        self.text: dict[tuple[int, str], str] = {}

    def __call__(self, chunks: list[tuple[int, str, str]]) -> None:
        self.calls.append(chunks)
        for rank, name, text in chunks:
            self.text[(rank, name)] = self.text.get((rank, name), "") + text
        if self.marker is not None and all(
            f"first {r}\n" in self.text.get((r, "stdout"), "") for r in (0, 1)
        ):
            self.marker.touch()


@pytest.mark.parametrize("direct", PATHS)
@pytest.mark.parametrize("source", list(FIRST))
def test_each_ranks_output_arrives_while_the_cell_runs(
    cluster: Cluster, tmp_path: Path, direct: bool, source: str
) -> None:
    marker = tmp_path / "seen"
    live = Collector(marker)
    results = cluster.execute(
        _waiting_cell(FIRST[source], marker), direct=direct, on_output=live, timeout=120
    )
    assert [r.stdout for r in results] == ["first 0\nmarker seen\n", "first 1\nmarker seen\n"]
    assert all(live.text[(r, "stdout")].startswith(f"first {r}\n") for r in (0, 1))
    assert all(len(call) <= 4 for call in live.calls)  # one batch per poll: 2 ranks x 2 streams


def _comparable(results: list[CellResult]) -> list[CellResult]:
    for result in results:
        if result.execute_result is not None:
            result.execute_result.pop("execution_count")
        if result.traceback is not None:
            result.traceback = re.sub(r"In\[\d+\]", "In[n]", result.traceback)
    return results


@pytest.mark.parametrize("direct", PATHS)
def test_results_are_the_same_whether_or_not_they_streamed(cluster: Cluster, direct: bool) -> None:
    cell = (
        "import sys, time\nfrom IPython.display import HTML, display\n"
        "for i in range(3):\n    print('step', i, rank, flush=True)\n    time.sleep(0.15)\n"
        "print('warn', rank, file=sys.stderr)\ndisplay(HTML(f'<b>{rank}</b>'))\nrank * 10"
    )
    live = Collector()
    streamed = cluster.execute(cell, direct=direct, on_output=live)
    plain = cluster.execute(cell, direct=direct)
    assert _comparable(streamed) == _comparable(plain)
    assert live.calls  # it did stream
    for r in (0, 1):  # what streamed is what the results hold (so far as it got)
        assert streamed[r].stdout.startswith(live.text[(r, "stdout")])


@pytest.mark.parametrize("direct", PATHS)
def test_c_level_output_joins_the_cells_output(cluster: Cluster, direct: bool) -> None:
    cell = (
        "import ctypes, os\nlibc = ctypes.CDLL(None)\n"
        "os.write(1, b'fd1 %d\\n' % rank)\nos.write(2, b'fd2 %d\\n' % rank)\n"
        "libc.printf(b'printf %d\\n', rank)\nlibc.fflush(None)\n"
        "libc.printf(b'unflushed %d\\n', rank)"  # C's buffer: flushed when the cell ends
    )
    results = cluster.execute(cell, direct=direct)
    assert [r.stdout for r in results] == [f"fd1 {r}\nprintf {r}\nunflushed {r}\n" for r in (0, 1)]
    assert [r.stderr for r in results] == ["fd2 0\n", "fd2 1\n"]
    # Between cells C output goes to the engine's log as before, not into the next cell.
    cluster.execute("import os\nos.write(1, b'between\\n')", ranks=[0], direct=direct)
    assert cluster.execute("print('next')", ranks=[0], direct=direct)[0].stdout == "next\n"


def test_a_cells_late_output_never_shows_in_a_later_cell(cluster: Cluster) -> None:
    # Rank 0 prints non-stop until the timeout interrupts it; what it sent meanwhile is
    # matched to its own request, never to the next cell's.
    chatty = "import time\nwhile True:\n    print('old', rank, flush=True)\n    time.sleep(0.005)"
    old = Collector()
    with pytest.raises(CollectiveTimeout):
        cluster.execute(chatty, ranks=[0], timeout=1.5, on_output=old)
    assert "old 0" in old.text[(0, "stdout")]
    new = Collector()
    cluster.execute("import time\ntime.sleep(0.5)\nprint('new', rank)", on_output=new)
    seen = "".join(text for call in new.calls for _, _, text in call)
    assert "old" not in seen


def test_without_on_output_nothing_streams(cluster: Cluster, tmp_path: Path) -> None:
    # A script's execute is unchanged: the engines are not asked for progress messages.
    cell = "import time\nprint('x', flush=True)\ntime.sleep(0.4)"
    cluster.execute(cell)
    pending: Any = cluster.dispatch.cells.pool
    assert pending is not None
    requests = []
    original = type(pending).send

    def spy(self: Any, engine_id: int, code: str, *, live: bool = False, **more: Any) -> Any:
        requests.append(live)
        return original(self, engine_id, code, live=live, **more)

    type(pending).send = spy  # type: ignore[method-assign]
    try:
        cluster.execute(cell)
        cluster.execute(cell, on_output=Collector())
    finally:
        type(pending).send = original  # type: ignore[method-assign]
    assert requests == [False, False, True, True]


class _Pending:
    def __init__(self, engine_id: int) -> None:
        self.engine_id = engine_id
        self.live: list[tuple[str, str]] = []

    def add_live(self, name: str, text: str) -> None:
        self.live.append((name, text))


def test_the_inbox_takes_only_signed_output_of_a_pending_request_from_its_engine() -> None:
    import time

    import zmq
    from jupyter_client.session import Session

    from workbench.cluster.dispatch.live_inbox import LiveInbox
    from workbench.engine.live_output import OUTPUT_TYPE
    from workbench.engine.wire import json_session

    key = b"cluster-key"
    cluster_session = Session(key=key)
    engine = json_session(cluster_session)
    request = engine.msg("wb_cell_request", {"code": "1"})
    pending = _Pending(engine_id=3)
    inbox = LiveInbox(
        zmq.Context.instance(),
        json_session(cluster_session),
        lambda msg_id: pending if msg_id == request["header"]["msg_id"] else None,
    )
    assert inbox.socket.getsockopt_string(zmq.LAST_ENDPOINT).startswith("tcp://127.0.0.1:")
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.linger = 0
    push.connect(f"tcp://127.0.0.1:{inbox.port}")

    def send(session: Session, parent: dict[str, Any], engine_id: int, text: str) -> None:
        header = session.msg_header(OUTPUT_TYPE)
        header["wb_engine_id"] = engine_id
        content = {"name": "stdout", "text": text}
        session.send(push, OUTPUT_TYPE, content, parent=parent, header=header)

    try:
        send(json_session(Session(key=b"another-key")), request, 3, "forged")
        send(engine, engine.msg("wb_cell_request", {"code": "2"}), 3, "a cell given up")
        send(engine, request, 4, "another engine's claim")
        push.send_multipart([b"not", b"a message"])
        send(engine, request, 3, "ours")
        end = time.monotonic() + 30
        while not pending.live and time.monotonic() < end:
            inbox.drain()
            time.sleep(0.01)
    finally:
        push.close()
        inbox.close()
    assert pending.live == [("stdout", "ours")]
