"""On every rank at once: the cluster doctor's network probes over the existing group.

``probe_network`` runs the pairs one at a time (a barrier of every rank between two pairs,
so a pair never shares a link or a core with another) and then an all-reduce size sweep
in each group it is given, one group at a time. Only the pair's first rank keeps times:
latency is half a small ping-pong's round trip, bandwidth a large message one way (with a
one-element reply, whose one-way latency is taken off) and both ways at once
(``isend`` + ``irecv`` on both ranks). Each pair is warmed up first: NCCL builds a
communicator per pair on first use.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

__all__ = ["probe_network"]


def _device() -> Any:
    import torch

    from workbench.engine.state import engine_state

    assignment = engine_state().assignment or {}
    return torch.device(assignment.get("device", "cpu"))


def _synced(device: Any) -> None:
    import torch

    if device.type == "cuda":  # NCCL queues work on a stream: time what finished
        torch.cuda.synchronize(device)


def _exchange(peer: int, first: bool, message: Any, reply: Any, iters: int) -> list[float]:
    """``first`` sends ``message`` and waits for ``reply``; the peer the other way round.
    A small message both ways is a ping-pong; a large one with a small reply is one-way
    bandwidth (the reply says the whole message arrived)."""
    import torch.distributed as dist

    times = []
    for _ in range(iters):
        started = time.perf_counter()
        if first:
            dist.send(message, peer)
            dist.recv(reply, peer)
        else:
            dist.recv(message, peer)
            dist.send(reply, peer)
        _synced(message.device)
        times.append(time.perf_counter() - started)
    return times


def _both_ways(peer: int, big: Any, inbox: Any, iters: int) -> list[float]:
    import torch.distributed as dist

    times = []
    for _ in range(iters):
        started = time.perf_counter()
        works = [dist.isend(big, peer), dist.irecv(inbox, peer)]
        for work in works:
            work.wait()
        _synced(big.device)
        times.append(time.perf_counter() - started)
    return times


def _probe_pair(
    pair: Sequence[int], rank: int, iters: int, bandwidth_bytes: int, bandwidth_iters: int
) -> dict[str, Any] | None:
    import torch

    device = _device()
    first = rank == pair[0]
    peer = pair[1] if first else pair[0]
    small = torch.zeros(1, dtype=torch.float32, device=device)
    big = torch.zeros(max(1, bandwidth_bytes // 4), dtype=torch.float32, device=device)
    inbox = torch.empty_like(big)
    warm = max(2, iters // 10)
    _exchange(peer, first, small, small, warm)
    round_trips = _exchange(peer, first, small, small, iters)
    _exchange(peer, first, big, small, 1)
    one_way = _exchange(peer, first, big, small, bandwidth_iters)
    _both_ways(peer, big, inbox, 1)
    both = _both_ways(peer, big, inbox, bandwidth_iters)
    if not first:
        return None
    return {
        "pair": list(pair),
        "round_trip_s": round_trips,
        "one_way_s": one_way,
        "both_ways_s": both,
        "bytes": int(big.numel() * big.element_size()),
    }


def _sweep(group: Any, sizes: Sequence[int], iters: int) -> list[list[float]]:
    """(bytes, median seconds of one all-reduce) at each size, on this rank. A barrier
    before each timed call lines the ranks up, so a late rank's arrival is not counted as
    the collective's time (as ``parallel/planning/commbench.py``); the median keeps one call that a
    busy core delayed from moving the fit."""
    import statistics

    import torch
    import torch.distributed as dist

    device = _device()
    out = []
    for size in sizes:
        buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        dist.all_reduce(buf, group=group)  # warm-up
        times = []
        for _ in range(iters):
            dist.barrier(group=group)
            _synced(device)
            started = time.perf_counter()
            dist.all_reduce(buf, group=group)
            _synced(device)
            times.append(time.perf_counter() - started)
        out.append([float(buf.numel() * 4), statistics.median(times)])
    return out


def probe_network(
    pairs: Sequence[Sequence[int]],
    groups: dict[str, Sequence[int]],
    *,
    iters: int,
    bandwidth_bytes: int,
    bandwidth_iters: int,
    sweep_sizes: Sequence[int],
    sweep_iters: int,
) -> dict[str, Any]:
    """Runs on every rank of the group at once (every rank takes part in every barrier
    and creates every subgroup). Returns this rank's pair results and sweep times."""
    import torch.distributed as dist

    rank = dist.get_rank()
    results = []
    for pair in pairs:
        if rank in pair:
            found = _probe_pair(pair, rank, iters, bandwidth_bytes, bandwidth_iters)
            if found is not None:
                results.append(found)
        dist.barrier()  # the next pair starts once this one is done everywhere
    sweeps: dict[str, list[list[float]]] = {}
    for label, members in groups.items():
        world = len(members) == dist.get_world_size()
        # every rank creates every subgroup, in the same order, as new_group requires
        group = None if world else dist.new_group(list(members))
        if rank in members:
            sweeps[label] = _sweep(group, sweep_sizes, sweep_iters)
        dist.barrier()
        if group is not None and rank in members:  # others hold no handle to destroy
            dist.destroy_process_group(group)
    return {"rank": rank, "pairs": results, "sweeps": sweeps}
