"""A rank blocked in a collective with a silent peer is freed through its control thread
(``engine/host_loss.py``), long before the group's timeout: the peer here is alive but
never sends, as a host that went down whole sends nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from workbench.cluster import Cluster
from workbench.cluster.hosts.host_loss import sever_stuck

pytestmark = pytest.mark.engines

GROUP_TIMEOUT_S = 600  # what freeing it without help would take


def _wait_for_rank_0() -> None:
    import torch
    import torch.distributed as dist

    dist.recv(torch.zeros(1), src=0)  # rank 0 never sends


@pytest.fixture
def two_ranks() -> Iterator[Cluster]:
    cluster = Cluster(n=2, backend="gloo", init_timeout=GROUP_TIMEOUT_S)
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


def test_a_rank_blocked_on_a_silent_peer_is_freed_at_once(two_ranks: Cluster) -> None:
    cluster = two_ranks
    eid = cluster.ranks[1].engine_id
    blocked = cluster.client[eid].apply_async(_wait_for_rank_0)
    time.sleep(2.0)
    assert not blocked.ready()  # really blocked on the silent peer
    asked = time.monotonic()
    sever_stuck(cluster.client, [eid])
    blocked.wait(60)  # a bound far below the group's timeout, generous for a busy machine
    assert blocked.ready(), "the blocked rank was not freed"
    with pytest.raises(Exception, match="(?i)connection|closed|reset|peer"):
        blocked.get(0)
    assert time.monotonic() - asked < GROUP_TIMEOUT_S / 2
    report = cluster.recover_sync()  # the group is re-created; both ranks work again
    assert "no engine needed replacing" in str(report)
    assert cluster.run(lambda: 1) == [1, 1]
