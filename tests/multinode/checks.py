"""Assertions shared by the launcher tests on the bed (one driver report each)."""

from __future__ import annotations

from typing import Any

from tests.multinode.bed import Bed

HOSTS = ["wbmn1", "wbmn2"]
TOL = 1e-5


def ok(report: dict[str, Any]) -> dict[str, Any]:
    assert report.get("error") is None, f"{report['error']}\n{report.get('traceback', '')}"
    return report


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= TOL for x, y in zip(a, b, strict=True))


def two_by_two(bed: Bed, report: dict[str, Any]) -> None:
    """4 ranks, 2 per node, torchrun's variables right, rendezvous on rank 0's node."""
    ranks, env = ok(report)["ranks"], report["env"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(r["host"], []).append(r["local_rank"])
    assert sorted(by_host) == HOSTS  # two engines on each node
    assert all(v == [0, 1] for v in by_host.values())
    assert not any(r["local_pid"] for r in ranks)  # remote pids are known as remote
    ips = {n.name: n.ip for n in bed.nodes}
    master = ips[ranks[0]["host"]]  # rank 0's node address, reachable from the other node
    for r, e in zip(ranks, env, strict=True):
        assert e["hostname"] == r["host"]
        assert (e["RANK"], e["WORLD_SIZE"]) == (str(r["rank"]), "4")
        assert (e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == (str(r["local_rank"]), "2")
        assert e["GROUP_RANK"] == str(r["node_rank"])
        assert e["MASTER_ADDR"] == master
        assert e["GLOO_SOCKET_IFNAME"] == "eth0"  # the interface that joins the nodes
    assert report["all_reduce"] == [10.0] * 4


def other_host(run: dict[str, Any]) -> str:
    """The host a lost-host scenario kept (``run["victim"]`` is the one it lost)."""
    return next(h for h in HOSTS if h != run["victim"])


def told_host_lost(run: dict[str, Any], bound_s: float, how: str) -> None:
    """The last ranks' host lost mid-step: ``HostLost`` names it and its ranks, sooner than
    ``bound_s`` after the cut (the time printed: ``how`` the host went)."""
    lost, victim = ok(run)["lost"], run["victim"]
    assert run["hosts_before"] == [other_host(run)] * 2 + [victim] * 2
    assert lost["error"] is not None and lost.get("host") == victim, lost["error"]
    assert lost["ranks"] == [2, 3]
    detect_s = lost["raised_at"] - run["cut_at"]
    print(f"HostLost {detect_s:.1f} s after {victim} {how}")
    assert 0 < detect_s < bound_s, detect_s


def same_curve_and_samples(run: dict[str, Any], steps: int = 9, batch: int = 8) -> None:
    """The interrupted run's losses and samples equal the uninterrupted run's, step by step:
    no sample skipped or repeated."""
    losses, expected = run["losses"], run["expected"]
    assert len(losses) == len(expected) == steps
    assert max(abs(a - b) for a, b in zip(losses, expected, strict=True)) <= TOL
    assert run["ids"] == run["expected_ids"]  # every step took the uninterrupted samples
    taken = [i for step in sorted(run["ids"], key=int) for i in run["ids"][step]]
    assert len(taken) == len(set(taken)) == steps * batch  # none skipped or repeated


def trained_like_single_device(report: dict[str, Any]) -> None:
    ok(report)
    assert close(report["ddp"], report["single_device"]), (report["ddp"], report["single_device"])
    assert report["ddp"][0] != report["ddp"][-1]  # it trained


def nothing_left(bed: Bed, report: dict[str, Any]) -> None:
    assert report["left"] == [], report["left"]  # nothing of this user, 20 s after stop
    for node in bed.nodes:
        assert bed.node_processes(node) == []
        tmp = bed.node_exec(node, ["ls", "/tmp"]).stdout.split()
        assert not [d for d in tmp if d.startswith("wb-")], tmp


def replaced_only_the_dead_engine(run: dict[str, Any]) -> None:
    """One remote engine killed mid-step: ``EngineDied`` names its rank and host, recovery
    replaces only it, on its host, local ranks stay right, the loss curve is unchanged."""
    fault = ok(run)["fault"]
    victim = fault["victim"]
    assert fault["ranks"] == [victim]
    assert f"rank {victim} (engine" in fault["error"] and fault["victim_host"] in fault["error"]
    assert f"rank {victim}: engine" in fault["report"]  # the dead engine was replaced
    assert "to the checkpoint of step 3" in fault["report"], fault["report"]  # a real load
    before = {r["rank"]: r for r in fault["ranks_before"]}
    after = {r["rank"]: r for r in fault["ranks_after"]}
    for rank, r in after.items():  # every rank, replaced or not, stays on its host
        assert r["host"] == before[rank]["host"]
        assert (r["local_rank"], r["node_rank"]) == (
            before[rank]["local_rank"],
            before[rank]["node_rank"],
        )
        assert not r["local_pid"]
    assert after[victim]["engine"] != before[victim]["engine"]
    # Only the dead engine is replaced. A survivor left blocked in the all-reduce (its
    # neighbour failed out of the collective, but DDP keeps that neighbour's gloo group and
    # connections alive) is freed by recovery cutting those connections, not replaced.
    replaced = [r for r in after if after[r]["engine"] != before[r]["engine"]]
    assert set(replaced) == {victim}, (replaced, fault["report"])
    assert "were stuck" not in fault["report"], fault["report"]
    env = fault["env_after"]
    assert [e["hostname"] for e in env] == [after[r]["host"] for r in sorted(after)]
    assert [e["LOCAL_RANK"] for e in env] == [str(after[r]["local_rank"]) for r in sorted(after)]
    # the curve after recovery equals the uninterrupted run's
    assert close(fault["losses"], run["ddp"]), (fault["losses"], run["ddp"])


def failed_load_leaves_nothing(bed: Bed, launcher: str) -> None:
    """Recovery whose checkpoint load fails: the load's error, and nothing left on any node
    after stop (a failed load once left an engine and a defunct child on a node)."""
    report = bed.drive({"scenario": "failed_load", "launcher": launcher, "hosts": HOSTS, "n": 4})
    ok(report)
    assert report["died"], "the engine was to die mid-step"
    assert report["recover_error"] is not None
    assert "CheckpointError" in report["recover_error"], report["recover_error"]
    assert "rng/rank-00000.pt" in report["recover_error"], report["recover_error"]
    nothing_left(bed, report)
