"""A host cut off while its processes keep running, on the 2-node bed: ``wb.Cluster(n=4,
launcher="ssh", hosts=["wbmn1", "wbmn2"])``, a data-parallel run with ``elastic=True``, and
the link of wbmn2 (the last ranks' host) cut during a step, its engines and sshd left
running (a network partition, not a power-off). The step raises ``HostLost``; the run
shrinks to the 2 ranks on wbmn1. With the link still cut, nobody can reach wbmn2: its
engines must end themselves (``workbench.engine.fencing``: no controller heartbeat for 30 s).
Then the link comes back; the rank table and the controller count only wbmn1's engines,
the last steps run on them, and the 9 losses and samples equal the uninterrupted 4-rank
run's. Nothing is left on any node after stop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import (
    HOSTS,
    nothing_left,
    ok,
    other_host,
    same_curve_and_samples,
    told_host_lost,
)
from tests.multinode.test_host_loss import (
    CUT_AFTER_S,
    DETECT_S,
    _clean_up,
    _report,
    _wait_for,
)
from workbench.cluster.hosts.fencing import FENCE_AFTER_S

pytestmark = [pytest.mark.engines, pytest.mark.slow]

# The behaviour: the cut-off engines end themselves while nobody can reach them. The fence
# fires 30 s after the last heartbeat; the bound leaves room for a loaded 2-core machine.
FENCED_S = FENCE_AFTER_S + 90.0


def _engines(bed: Bed, host: str) -> list[str]:
    """The ipyparallel processes (engines, nannies) running on ``host``, seen there."""
    return [p for p in bed.node_processes(bed.node(host)) if "ipyparallel" in p]


def _until_fenced(bed: Bed, victim: str, cut: float) -> dict[str, Any]:
    at_cut = _engines(bed, victim)  # still running: a partition, not a power-off
    while (left := _engines(bed, victim)) and time.monotonic() - cut < FENCED_S:
        time.sleep(0.25)
    return {
        "at_cut": at_cut,
        "left": left,
        "fenced_s": time.monotonic() - cut,
        "node_after": bed.node_processes(bed.node(victim)),
    }


@pytest.fixture(scope="module")
def run(bed: Bed) -> Iterator[dict[str, Any]]:
    proc, out = bed.spawn_driver(
        {"scenario": "partition", "launcher": "ssh", "hosts": HOSTS, "n": 4}
    )
    home = bed.home
    try:
        _wait_for(proc, home / "take_down.ready", out, 900)  # the scenario's name for it
        victim = (home / "take_down.ready").read_text()
        node_init = bed.node(victim).unshare_pid
        (home / "take_down.done").write_text("")
        time.sleep(CUT_AFTER_S)
        cut = bed.cut_link(victim)
        fence = _until_fenced(bed, victim, cut)
        _wait_for(proc, home / "plug_in.ready", out, 600)
        bed.bring_up(victim)  # the link only: the node and its sshd never stopped
        fence["same_node"] = bed.node(victim).unshare_pid == node_init
        fence["after_plug_in"] = _engines(bed, victim)
        (home / "plug_in.done").write_text("")
        yield _report(proc, out, cut_at=cut, fence=fence)
    finally:
        _clean_up(bed, proc, out, ["take_down", "plug_in"])


def test_a_cut_link_is_host_lost_before_the_group_timeout(run: dict[str, Any]) -> None:
    told_host_lost(run, DETECT_S, "was cut off")


def test_the_cut_off_engines_end_themselves_while_the_link_is_cut(run: dict[str, Any]) -> None:
    fence = ok(run)["fence"]
    assert len(fence["at_cut"]) >= 2, fence  # the engines ran on after the cut
    print(f"{run['victim']}'s engines fenced {fence['fenced_s']:.1f} s after the cut")
    print(f"left on {run['victim']} meanwhile: {fence['node_after']}")
    assert fence["left"] == [], f"still there {fence['fenced_s']:.1f} s after the cut"
    assert fence["same_node"]  # nobody restarted the node: they ended by themselves


def test_the_run_shrinks_and_the_host_back_does_not_rejoin(run: dict[str, Any]) -> None:
    ok(run)
    assert "shrunk from 4 to 2 ranks" in run["shrink_report"], run["shrink_report"]
    assert "global batch 8 kept" in run["shrink_report"]
    assert run["hosts_shrunk"] == run["hosts_after"] == [other_host(run)] * 2
    # with the host back, the controller counts only the group's engines
    assert run["engines_after"] == sorted(run["rank_engines_after"])
    same_curve_and_samples(run)


def test_nothing_is_left_on_any_node_after_stop(bed: Bed, run: dict[str, Any]) -> None:
    nothing_left(bed, ok(run))
