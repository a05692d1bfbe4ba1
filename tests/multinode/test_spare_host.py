"""A spare host takes a lost host's ranks, on the bed grown to 3 nodes: ``wb.Cluster(n=4,
launcher="ssh", hosts=["wbmn1", "wbmn2"], spare_hosts=["wbmn3"])``, a data-parallel run
with checkpoints, and rank 0's host (the rendezvous) taken down whole mid-step. The
step raises ``HostLost`` naming it and ranks 0-1; ``session.recover()`` starts those
ranks on wbmn3 with LOCAL_RANK / GROUP_RANK / MASTER_ADDR recomputed (the rendezvous moves
to wbmn3, rank 0's new host), rolls back to the last checkpoint and the loss curve and
samples equal the uninterrupted run's (computed first in the same driver run)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import HOSTS, TOL, nothing_left, ok
from tests.multinode.test_host_loss import CUT_AFTER_S, DETECT_S, _wait_for

pytestmark = [pytest.mark.engines, pytest.mark.slow]
Report = dict[str, Any]


@contextlib.contextmanager
def lost_onto_spare(
    bed: Bed,
    launcher: str,
    spare_hosts: str | None = None,
    take_down: Callable[[str], float] | None = None,
) -> Iterator[Report]:
    """The driver's ``spare`` scenario on HOSTS plus a third node (the spare, named in
    ``spare_hosts`` unless given: ``"any"`` under Slurm), rank 0's host taken down whole
    mid-step (or by ``take_down``); the driver's report, with when the host went down and
    the nodes' addresses."""
    spare = bed.add_node()
    home = bed.home
    proc, out = bed.spawn_driver(
        {
            "scenario": "spare",
            "launcher": launcher,
            "hosts": HOSTS,
            "n": 4,
            "spare_hosts": spare_hosts or [spare.name],
        }
    )
    try:
        _wait_for(proc, home / "take_down.ready", out, 900)
        victim = (home / "take_down.ready").read_text()  # rank 0's host
        (home / "take_down.done").write_text("")
        time.sleep(CUT_AFTER_S)
        cut = (take_down or bed.take_down)(victim)
        proc.wait(900)
        assert out.exists(), f"the driver wrote no report:\n{out.with_suffix('.log').read_text()}"
        report: Report = json.loads(out.read_text())
        report.update(cut_at=cut, ips={n.name: n.ip for n in bed.nodes})
        if bed.node(victim).unshare_pid:  # out of service but up: rebooted, as a whole
            bed.take_down(victim)
        bed.bring_up(victim)  # after the driver's stop: that stop met a lost host
        yield report
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        for node in bed.nodes:
            if node.unshare_pid == 0:
                bed.bring_up(node.name)
        bed.remove_node(spare.name)  # the other tests' bed has two nodes
        for name in ("take_down.ready", "take_down.done"):
            (home / name).unlink(missing_ok=True)
        for path in (out, out.with_suffix(".log")):
            path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def run(bed: Bed) -> Iterator[Report]:
    with lost_onto_spare(bed, "ssh") as report:
        yield report


def _other(run: dict[str, Any]) -> str:
    return next(h for h in HOSTS if h != run["victim"])


def test_rank_0s_host_lost_is_host_lost_naming_it(run: dict[str, Any]) -> None:
    lost, victim = ok(run)["lost"], run["victim"]
    assert run["hosts_before"] == [victim] * 2 + [_other(run)] * 2
    assert lost.get("host") == victim and lost["ranks"] == [0, 1], lost["error"]
    detect_s = lost["raised_at"] - run["cut_at"]
    print(f"HostLost {detect_s:.1f} s after {victim} went down")
    assert 0 < detect_s < DETECT_S, detect_s


def test_its_ranks_start_on_the_spare_with_a_new_rendezvous(run: dict[str, Any]) -> None:
    ok(run)
    print(f"ranks 0-1 onto the spare and roll back: {run['recover_s']:.1f} s")
    assert "rank 0: engine" in run["recover_report"] and "rank 1: engine" in run["recover_report"]
    assert "to the checkpoint of step 3" in run["recover_report"], run["recover_report"]
    assert run["hosts_after"] == ["wbmn3", "wbmn3"] + [_other(run)] * 2
    master = run["ips"]["wbmn3"]  # rank 0's new host holds the rendezvous
    for rank, env in enumerate(run["env_after"]):
        assert env["hostname"] == run["hosts_after"][rank]
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "4")
        assert (env["LOCAL_RANK"], env["GROUP_RANK"]) == (str(rank % 2), str(rank // 2))
        assert env["MASTER_ADDR"] == master


def test_the_resumed_curve_equals_the_uninterrupted_run(run: dict[str, Any]) -> None:
    losses, expected = ok(run)["losses"], run["expected"]
    assert len(losses) == len(expected) == 9
    assert max(abs(a - b) for a, b in zip(losses, expected, strict=True)) <= TOL
    assert run["ids"] == run["expected_ids"]
    taken = [i for step in sorted(run["ids"], key=int) for i in run["ids"][step]]
    assert len(taken) == len(set(taken)) == 9 * 8


def test_nothing_is_left_on_any_node_after_stop(bed: Bed, run: dict[str, Any]) -> None:
    nothing_left(bed, ok(run))
