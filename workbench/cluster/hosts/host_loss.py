"""A lost host told from a dead process, while a call waits on its ranks.

A host that goes down whole (powered off, its cable pulled) sends nothing more: no TCP
reset, no nanny's "engine exited". The controller notices its engines only when they miss
their heartbeats (``start_sequence.REMOTE_HEARTBEAT``: ~5 s across hosts), and a survivor
blocked in a collective with them waits on, so the call waiting for the ranks returns once
the controller dropped an engine (``session/rank_failures.py``, ``dispatch._wait_all``).
Then each non-local host that holds a dead rank is probed (``elastic.probe_host``: its
sshd port, ``PROBE_TIMEOUT_S`` at most for a silent host): a host that answers has a dead
process (the per-engine path, ``EngineDied``); one that does not is lost once every engine
it held is gone from the controller, which happens within the same heartbeat window
(waited for, ``HOST_SILENCE_S`` at most). Under ``launcher="slurm"`` the probe is
``slurm_nodes.host_answers``: a host whose sshd answers is lost too when Slurm has its
node DOWN, drained, failing or not responding (asked only then, with a timeout). The bed
measured 8-11 s from the host going down to ``HostLost`` (tests/multinode/test_host_loss.py,
test_spare_host.py). Recovery then frees the survivors through their engines' control
thread (``sever_stuck``), not at the process group's timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from workbench.cluster.lifecycle.elastic import probe_host
from workbench.cluster.processes import is_local
from workbench.cluster.ranks import RankAssignment
from workbench.engine import host_loss as engine_host_loss
from workbench.errors import EngineDied, HostLost

__all__ = ["HOST_SILENCE_S", "host_lost", "mpi_job_ended", "sever_stuck"]

log = logging.getLogger("workbench.cluster")

# An unreachable host's other engines miss the same heartbeats as the first one found dead;
# the controller drops them within a period or two of it (500 ms each across hosts).
HOST_SILENCE_S = 6.0


def mpi_job_ended(lost: list[int]) -> EngineDied:
    """What a rank's death is under ``launcher="mpi"``: one ``mpiexec`` holds every engine
    and ends the whole job when one rank exits, so every engine leaves the controller at
    once, on every host. That is neither a lost host (the hosts are fine; probing them
    proves nothing either way) nor something a replacement or a shrink can mend: nothing
    can join a job that ended."""
    first = f"rank {lost[0]}" if len(lost) == 1 else f"ranks {lost}"
    return EngineDied(
        f"{first} died, and mpiexec then ended the whole MPI job (launcher='mpi' runs "
        "every engine in one mpiexec job, which ends every rank when one exits): no "
        "engine is left on any host, and nothing can be added to a job that ended. "
        "Restart the whole job with `%wb restart --full` (cluster.restart_sync()) and "
        "load the last checkpoint.",
        ranks=lost,
    )


def host_lost(
    ranks: list[RankAssignment],
    lost: Collection[int],
    client: Any,
    probe: Callable[[str], bool] | None = None,
    wait_s: float = HOST_SILENCE_S,
) -> HostLost | None:
    """``HostLost`` for the first remote host holding one of ``lost`` that does not answer
    ``probe`` and whose engines have all left ``client``'s controller; else None."""
    if client is None:
        return None
    probe = probe or probe_host  # looked up per call: a test stands in for the network
    hosts = sorted({ranks[r].host for r in lost if not is_local(ranks[r].host)})
    for host in hosts:
        if probe(host):
            continue  # the host answers: a dead process, replaceable where it ran
        on_host = [r for r in ranks if r.host == host]
        deadline = time.monotonic() + wait_s
        while _registered(client, on_host) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _registered(client, on_host):
            return HostLost.of(host, [r.rank for r in on_host])
    return None


def _registered(client: Any, ranks: list[RankAssignment]) -> bool:
    ids = set(client.ids)
    return any(r.engine_id in ids for r in ranks)


def sever_stuck(client: Any, engine_ids: list[int]) -> None:
    """Ask each engine's control thread to cut its group's connections now
    (``engine/host_loss.py``): a rank blocked in a collective with a silent host fails
    out of it at once instead of at the group's timeout. The replies are not waited for:
    the caller waits for the blocked requests themselves to come back."""
    if not engine_ids:
        return
    try:
        client._send_control_request(
            targets=engine_ids, msg_type=engine_host_loss.REQUEST, content={}, block=False
        )
    except Exception as exc:  # an engine that left meanwhile: the caller's wait decides
        log.debug("asking %s to cut their group connections failed: %r", engine_ids, exc)
