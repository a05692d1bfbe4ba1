"""The kernel's end of a rank's pdb (``workbench.engine.rank_debug``): where the ranks'
prompts arrive and the person's lines are sent back.

One ROUTER socket, opened the first time a cell or ``%wb debug`` asks for it, bound to
127.0.0.1, and also to the controller's own address when engines run on other hosts (the
cluster's interface: where those engines already reach the controller); no other
listening socket. Anything that can connect may send anything, so every message is checked
as the direct cell path's are: signed with the cluster's key (replays refused by the
session), JSON only, of ``REQUEST_TYPE``.

The inbox answers only while a call waits for the ranks with a ``Prompter`` (``attended``):
the dispatcher's wait loop calls ``poll``. Several ranks at a prompt: one prompt at a time,
the lowest rank first; the rank answered keeps the prompt until it runs on (``c``, ``n``).
``poll`` moves the wait's deadline by the time spent waiting for the person, so that a
cell's timeout does not run out while a rank waits at a prompt.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import zmq

from workbench.cluster.dispatch.live_inbox import signed_messages
from workbench.engine.rank_debug import ANSWER_TYPE, RANK_FIELD, REQUEST_TYPE
from workbench.engine.wire import json_session
from workbench.errors import ClusterError

__all__ = ["DebugInbox", "Prompter", "choose_failed_rank"]

# While a rank runs a pdb command, the dispatcher looks for its next prompt this often (its
# usual 20 ms made each command take ~22 ms prompt to prompt: benchmarks/debug_bench.py).
_TALKING_POLL_S = 0.001


class Prompter(Protocol):
    """Who answers a rank's pdb: the notebook's stdin (``magics/debug_cmds.py``)."""

    def why_not(self) -> str | None:
        """None when a person can type answers now; else why not (no stdin)."""

    def ask(self, rank: int, output: str, prompt: str) -> str | None:
        """Show ``output``, ask ``prompt``; the line typed (None: no one can type)."""

    def show(self, rank: int, output: str) -> None:
        """Show what a rank's pdb printed as it let the rank run on."""


class DebugInbox:
    """The kernel's debug socket and the prompts waiting on it."""

    def __init__(self, client: Any) -> None:
        self.client = client  # whose session key signs the messages (the cluster's)
        self.session = json_session(client.session)  # JSON only, both ways
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.linger = 0
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.remote_address: str | None = None  # bound on the controller's address too
        self.prompter: Prompter | None = None
        self._waiting: dict[int, tuple[list[bytes], dict[str, Any]]] = {}  # rank -> prompt
        # The rank that holds the prompt: answered, and not yet run on (``resume``); no
        # other rank is asked meanwhile, whichever prompt arrives first.
        self._current: int | None = None

    def address(self, controller_ip: str | None = None) -> str:
        """Where engines connect: 127.0.0.1, or ``controller_ip`` (engines elsewhere)."""
        if controller_ip is None or controller_ip.startswith("127."):
            return f"tcp://127.0.0.1:{self.port}"
        if self.remote_address is None:
            port = self.socket.bind_to_random_port(f"tcp://{controller_ip}")
            self.remote_address = f"tcp://{controller_ip}:{port}"
        return self.remote_address

    @contextmanager
    def attended(self, prompter: Prompter | None) -> Iterator[None]:
        """While this holds, prompts are answered by ``prompter`` (None: refused)."""
        self.prompter = prompter
        try:
            yield
        finally:
            self.poll()  # a last ``resume``'s output, refusals of late ``open``s
            self.prompter = None
            self._waiting.clear()
            self._current = None

    def poll(self, deadline: float | None = None) -> float | None:
        """Read what arrived; answer one prompt: the rank holding the prompt's (waiting for
        it if it is on its way), else the lowest waiting rank's. Returns ``deadline`` (a
        ``time.monotonic()`` value, or None: none) moved later by the seconds spent
        waiting for the person."""
        if self.socket.closed:
            return deadline
        # Read only when something arrived: a receive that finds nothing raises (zmq.Again),
        # ~25 us, and the dispatcher polls several times per cell.
        if self.socket.get(zmq.EVENTS) & zmq.POLLIN:
            for msg in signed_messages(self.socket, self.session):
                self._take(msg)
        if not self._waiting or self.prompter is None:
            return deadline
        if self._current is not None and self._current not in self._waiting:
            return deadline  # its next prompt is on its way
        rank = min(self._waiting) if self._current is None else self._current
        idents, msg = self._waiting.pop(rank)
        started = time.monotonic()
        line = self.prompter.ask(rank, *_split_prompt(str(msg["content"].get("text", ""))))
        spent = time.monotonic() - started
        if line is None:
            self._answer(idents, msg, {"refused": "no one can type at the prompt (no stdin)"})
        else:
            self._answer(idents, msg, {"line": line})
            self._current = rank
        return None if deadline is None else deadline + spent

    def wait_s(self, idle_s: float) -> float:
        """How long the dispatcher may wait before the next ``poll``: short while a rank
        runs a pdb command (its next prompt follows in a millisecond or so), else ``idle_s``."""
        return _TALKING_POLL_S if self._current is not None else idle_s

    def _take(self, msg: dict[str, Any]) -> None:
        header, content = msg["header"], msg["content"]
        rank = header.get(RANK_FIELD)
        if header.get("msg_type") != REQUEST_TYPE or not isinstance(content, dict):
            return
        if not isinstance(rank, int) or isinstance(rank, bool):
            return
        kind, text = content.get("kind"), content.get("text", "")
        if not isinstance(text, str):
            return
        idents = msg["idents"]
        if kind == "open":
            why = "no cell waits for this rank" if self.prompter is None else None
            why = why or (self.prompter.why_not() if self.prompter is not None else None)
            self._answer(idents, msg, {"refused": why} if why else {})
        elif kind == "prompt":
            self._waiting[rank] = (idents, msg)
        elif kind == "resume":
            if rank == self._current:  # it runs on: the next waiting rank may be asked
                self._current = None
            if text and self.prompter is not None:
                self.prompter.show(rank, text)

    def _answer(self, idents: list[bytes], msg: dict[str, Any], content: dict[str, Any]) -> None:
        self.session.send(self.socket, ANSWER_TYPE, content, parent=msg, ident=idents)

    def close(self) -> None:
        self.socket.close(linger=0)


def _split_prompt(text: str) -> tuple[str, str]:
    """(what pdb printed, its prompt): the prompt is the text after the last newline."""
    head, _, prompt = text.rpartition("\n")
    return (head + "\n" if head else ""), prompt


def choose_failed_rank(failed: dict[int, tuple[str, float] | None], rank: int | None) -> int:
    """The rank ``%wb debug`` opens: ``rank`` if its last cell failed, else (None) the
    rank whose failed cell ended first (a peer that failed because of it, in a collective,
    ends later; ties: the lowest rank); one clear error when there is none. ``failed``:
    each rank's (error, when its cell ended) or None (``rank_debug.failed_cell``)."""
    found = {r: f for r, f in failed.items() if f is not None}
    ranks = sorted(found)
    listed = ", ".join(f"rank {r} ({found[r][0]})" for r in ranks)
    if rank is None:
        if not ranks:
            raise ClusterError(
                "no rank has a failed cell to debug: %wb debug opens pdb where the last "
                "%%wb cell or %wb run script failed, and the frame is kept only until the "
                "next cell runs on that rank"
            )
        return min(ranks, key=lambda r: (found[r][1], r))
    if rank not in ranks:
        raise ClusterError(
            f"rank {rank}'s last cell did not fail, so there is no frame to debug; "
            + (f"failed: {listed}" if ranks else "no rank's last cell failed")
        )
    return rank
