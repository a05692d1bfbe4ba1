"""Signalling an engine on its own host.

An engine in this very PID namespace (``hosts.pid_space``) is signalled here, by pid: at
once, and a local cluster's engines have no nanny (engine_watch.py). Any other engine is
signalled through its ipyparallel nanny, a small process beside it on its own host that
relays control messages (``Client.send_signal``); a remote pid is never signalled here,
where it may name an unrelated process. Synchronous callers (``dispatch.interrupt``) run
``signal_rank`` through ``loop.run_anywhere``: one implementation, no hand-written twin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from workbench.cluster.ranks import RankAssignment
from workbench.engine.hosts import local_pid_space

__all__ = ["signal_rank"]

log = logging.getLogger("workbench.cluster")

_REPLY_S = 5.0


def _via_nanny(client: Any, rank: RankAssignment, sig: signal.Signals) -> Any:
    return client.send_signal(int(sig), targets=[rank.engine_id], block=False)


def _check(replies: Any) -> None:
    for msg in replies or []:
        content = msg.get("content", {}) if isinstance(msg, dict) else {}
        if content.get("status", "ok") != "ok":
            raise RuntimeError(f"{content.get('ename')}: {content.get('evalue')}")


def _by_pid(rank: RankAssignment, sig: signal.Signals) -> bool | None:
    """Signal a rank of this PID namespace by pid: True when delivered, False when the
    process is gone; None for another host's rank (or one not ours to signal)."""
    if rank.pid_space != local_pid_space():
        return None
    try:
        os.kill(rank.pid, sig)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's engine of an external cluster: its nanny may
        return None
    return True


async def signal_rank(
    client: Any, rank: RankAssignment, sig: signal.Signals, timeout: float = _REPLY_S
) -> bool:
    """Send ``sig`` to ``rank``'s engine on its host; True when it was delivered."""
    here = _by_pid(rank, sig)
    if here is not None:
        return here
    try:
        future = _via_nanny(client, rank, sig)
        _check(await asyncio.wait_for(asyncio.wrap_future(future), timeout))
    except Exception as exc:  # engine (and nanny) gone, or no reply in time
        log.debug("could not signal rank %s on %s: %s", rank.rank, rank.host, exc)
        return False
    return True
