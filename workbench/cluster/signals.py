"""Signalling an engine on its own host.

Every ipyparallel engine has a nanny: a small process beside it, on the same host, that
relays control messages and can signal the engine (``Client.send_signal``). That path
works for local and remote engines alike. A local ``os.kill`` is used only as a fallback
for an engine in this very PID namespace (``hosts.pid_space``); a remote pid is never
signalled here, where it may name an unrelated process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from workbench.cluster.hosts import local_pid_space
from workbench.cluster.ranks import RankAssignment

__all__ = ["signal_rank", "signal_rank_sync"]

log = logging.getLogger("workbench.cluster")

_REPLY_S = 5.0


def _via_nanny(client: Any, rank: RankAssignment, sig: signal.Signals) -> Any:
    return client.send_signal(int(sig), targets=[rank.engine_id], block=False)


def _check(replies: Any) -> None:
    for msg in replies or []:
        content = msg.get("content", {}) if isinstance(msg, dict) else {}
        if content.get("status", "ok") != "ok":
            raise RuntimeError(f"{content.get('ename')}: {content.get('evalue')}")


def _local_fallback(rank: RankAssignment, sig: signal.Signals, why: object) -> bool:
    if rank.pid_space != local_pid_space():
        log.debug("could not signal rank %s on %s: %s", rank.rank, rank.host, why)
        return False
    try:
        os.kill(rank.pid, sig)
    except OSError:
        return False
    return True


async def signal_rank(
    client: Any, rank: RankAssignment, sig: signal.Signals, timeout: float = _REPLY_S
) -> bool:
    """Send ``sig`` to ``rank``'s engine on its host; True when it was delivered."""
    try:
        future = _via_nanny(client, rank, sig)
        _check(await asyncio.wait_for(asyncio.wrap_future(future), timeout))
    except Exception as exc:  # engine (and nanny) gone, or no reply in time
        return _local_fallback(rank, sig, exc)
    return True


def signal_rank_sync(
    client: Any, rank: RankAssignment, sig: signal.Signals, timeout: float = _REPLY_S
) -> bool:
    """``signal_rank`` for synchronous callers (``Cluster.interrupt``)."""
    try:
        _check(_via_nanny(client, rank, sig).result(timeout))
    except Exception as exc:
        return _local_fallback(rank, sig, exc)
    return True
