"""Which rank ``%wb debug`` opens, and how a rank's pdb text is split into what it printed
and its prompt (issue 45); the rest is driven through a real kernel in
``tests/magics/test_debug_magics.py``."""

from __future__ import annotations

import pytest

from workbench.cluster.dispatch.debug_inbox import _split_prompt, choose_failed_rank
from workbench.errors import ClusterError

FAILED = {0: ("RuntimeError: peer closed", 20.5), 1: None, 2: ("ValueError: bad batch", 20.1)}


def test_the_default_is_the_rank_that_failed_first_not_the_lowest() -> None:
    assert choose_failed_rank(FAILED, None) == 2


def test_a_tie_goes_to_the_lowest_rank() -> None:
    assert choose_failed_rank({0: None, 1: ("E: x", 5.0), 3: ("E: y", 5.0)}, None) == 1


def test_a_named_rank_that_failed_is_taken() -> None:
    assert choose_failed_rank(FAILED, 0) == 0


def test_a_named_rank_that_did_not_fail_names_those_that_did() -> None:
    with pytest.raises(ClusterError) as caught:
        choose_failed_rank(FAILED, 1)
    message = str(caught.value)
    assert "rank 1's last cell did not fail" in message
    assert "rank 0 (RuntimeError: peer closed), rank 2 (ValueError: bad batch)" in message


def test_no_failure_anywhere_is_one_clear_error() -> None:
    with pytest.raises(ClusterError, match="no rank has a failed cell to debug"):
        choose_failed_rank({0: None, 1: None}, None)


WHERE = "> f.py(3)<module>()\n-> y += 1\n"


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        (WHERE + "[rank 1] (Pdb) ", (WHERE, "[rank 1] (Pdb) ")),
        ("[rank 0] (Pdb) ", ("", "[rank 0] (Pdb) ")),
    ],
)
def test_the_prompt_is_the_text_after_the_last_newline(text: str, parts: tuple[str, str]) -> None:
    assert _split_prompt(text) == parts


class _Person:
    """A prompter that types ``c`` and remembers which rank it was asked for."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def why_not(self) -> str | None:
        return None

    def ask(self, rank: int, output: str, prompt: str) -> str:
        self.asked.append(rank)
        return "c"

    def show(self, rank: int, output: str) -> None:
        """Nothing to show."""


def test_the_rank_holding_the_prompt_keeps_it_until_it_runs_on() -> None:
    """Rank 1 was asked first; rank 0's prompt, though lower, waits until rank 1 runs on,
    even when it arrives before rank 1's next one. Engines are two DEALER sockets here."""
    import time
    from types import SimpleNamespace

    import zmq
    from jupyter_client.session import Session

    from workbench.cluster.dispatch.debug_inbox import DebugInbox
    from workbench.engine.rank_debug import RANK_FIELD, REQUEST_TYPE

    key = b"cluster-key"
    inbox = DebugInbox(SimpleNamespace(session=Session(key=key)))
    engine = Session(key=key, packer="json", unpacker="json")
    sockets = {}
    for rank in (0, 1):
        sockets[rank] = zmq.Context.instance().socket(zmq.DEALER)
        sockets[rank].linger = 0
        sockets[rank].connect(inbox.address())

    def send(rank: int, kind: str) -> None:
        header = engine.msg_header(REQUEST_TYPE)
        header[RANK_FIELD] = rank
        engine.send(sockets[rank], REQUEST_TYPE, {"kind": kind, "text": ""}, header=header)
        time.sleep(0.05)  # (loopback: delivered well within this)

    person = _Person()
    try:
        with inbox.attended(person):
            send(1, "prompt")
            inbox.poll()
            send(0, "prompt")  # rank 1's next prompt is still on its way
            inbox.poll()
            assert person.asked == [1]
            send(1, "prompt")
            inbox.poll()
            send(1, "resume")  # rank 1 runs on: rank 0 is asked now
            inbox.poll()
            assert person.asked == [1, 1, 0]
    finally:
        for socket in sockets.values():
            socket.close()
        inbox.close()
