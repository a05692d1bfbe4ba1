"""Arithmetic of the cluster doctor's network measurement (no torch, no processes).

Which pairs of ranks to measure, the groups an all-reduce sweep runs in, statistics of a
pair's times, nccl-tests' bus bandwidth, slow links (below 0.75x the median, NVRx's
straggler threshold) and the measured intra- and inter-host links as a ``HardwareSpec``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from workbench.planner.calibrate import LinkFit, fit_alpha_beta, hardware_from_fit
from workbench.planner.specs import HardwareSpec, LinkSpec

__all__ = [
    "SLOW_SHARE",
    "PairMeasure",
    "all_reduce_busbw",
    "choose_pairs",
    "fit_ends",
    "fit_groups",
    "measured_hardware",
    "percentile",
    "slow_pairs",
    "sweep_groups",
]

SLOW_SHARE = 0.75  # a pair below this share of the median bandwidth is flagged
INTER = "inter-host"
WORLD = "world"


def choose_pairs(
    hosts: Sequence[str], all_pairs_up_to: int = 16
) -> tuple[list[tuple[int, int]], str]:
    """Pairs of ranks to measure (``hosts[r]`` is rank r's host) and how they were chosen:
    every pair up to ``all_pairs_up_to`` ranks; beyond, the first rank of every pair of
    hosts plus the first two ranks inside each host."""
    n = len(hosts)
    if n <= all_pairs_up_to:
        return [(a, b) for a in range(n) for b in range(a + 1, n)], "every pair of ranks"
    members = _members(hosts)
    firsts = [ranks[0] for ranks in members.values()]
    pairs = [(a, b) for i, a in enumerate(firsts) for b in firsts[i + 1 :]]
    pairs += [(ranks[0], ranks[1]) for ranks in members.values() if len(ranks) > 1]
    return sorted(pairs), "every pair of hosts, and one pair inside each host"


def _members(hosts: Sequence[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        out.setdefault(host, []).append(rank)
    return out


def sweep_groups(hosts: Sequence[str]) -> dict[str, list[int]]:
    """The all-reduce sweep's groups: each host with two or more ranks (``intra <host>``),
    the first rank of every host (``inter-host``) and the world, without repeating a group
    (one host: the world is its intra-host group)."""
    members = _members(hosts)
    groups = {f"intra {h}": r for h, r in members.items() if len(r) > 1}
    if len(members) > 1:
        groups[INTER] = [r[0] for r in members.values()]
        groups[WORLD] = list(range(len(hosts)))
    return groups


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in [0, 1]) of ``values``."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))
    return ordered[index]


def all_reduce_busbw(n: int, size: float, seconds: float) -> float:
    """nccl-tests' bus bandwidth of one all-reduce, bytes/s: algbw x 2(n-1)/n."""
    return size / seconds * 2.0 * (n - 1) / n


@dataclass(frozen=True, slots=True)
class PairMeasure:
    """One pair's link: latency (s) median and p99, bandwidth (bytes/s) one way and both
    ways at once (the sum of the two directions)."""

    a: int
    b: int
    same_host: bool
    latency: float
    latency_p99: float
    one_way: float
    both_ways: float

    @classmethod
    def from_times(
        cls, a: int, b: int, same_host: bool, times: Mapping[str, object]
    ) -> PairMeasure:
        half = [t / 2 for t in _floats(times["round_trip_s"])]
        size = float(times["bytes"])  # type: ignore[arg-type]
        latency = statistics.median(half)
        # the reply that ends a one-way message is itself one latency
        one_way = [max(t - latency, 1e-9) for t in _floats(times["one_way_s"])]
        both = _floats(times["both_ways_s"])
        return cls(
            a=a,
            b=b,
            same_host=same_host,
            latency=latency,
            latency_p99=percentile(half, 0.99),
            one_way=size / statistics.median(one_way),
            both_ways=2 * size / statistics.median(both),
        )


def _floats(values: object) -> list[float]:
    return [float(v) for v in values]  # type: ignore[attr-defined]


def slow_pairs(pairs: Sequence[PairMeasure]) -> list[PairMeasure]:
    """Pairs whose one-way bandwidth is below ``SLOW_SHARE`` x the median pair's."""
    if len(pairs) < 2:
        return []
    median = statistics.median(p.one_way for p in pairs)
    return [p for p in pairs if p.one_way < SLOW_SHARE * median]


def fit_ends(rows: Sequence[Sequence[float]], n: int) -> LinkFit:
    """α and B of an all-reduce over ``n`` ranks from the line through the smallest and the
    largest size's times, so the latency is the small messages' and the bandwidth the
    large ones'. A least-squares fit weighted for relative error (``fit_alpha_beta``) lets
    the many small sizes set the slope too: on a link that passes a short burst at full
    speed (a token-bucket shaper, a NIC's buffers) it overstated the bandwidth of the
    bed's 300 Mbit/s link three- to fourfold, and the planner then underestimated a
    gradient all-reduce as much. ``rms_rel_error`` still says how far the middle sizes are off."""
    pts = sorted((int(s), float(t)) for s, t in rows)
    base = fit_alpha_beta(pts, n=n, op="all_reduce")  # checks the samples, as elsewhere
    (s0, t0), (s1, t1) = pts[0], pts[-1]
    slope = (t1 - t0) / (s1 - s0)
    if not slope > 0:
        return base  # times do not grow from end to end: keep the least-squares line
    intercept = max(t0 - slope * s0, 0.0)
    ca, cb = 2.0 * (n - 1), 2.0 * (n - 1) / n  # all-reduce: t = ca α + cb S / B
    rel = [(intercept + slope * s - t) / t for s, t in pts]
    return replace(
        base,
        latency=intercept / ca,
        bandwidth=cb / slope,
        rms_rel_error=(sum(r * r for r in rel) / len(rel)) ** 0.5,
    )


def fit_groups(
    sweeps: Mapping[str, Sequence[Sequence[float]]], sizes: Mapping[str, int]
) -> dict[str, LinkFit]:
    """α and B of each group's all-reduce sweep ((bytes, seconds) rows; ``sizes[label]`` is
    the group's rank count), each from its smallest and largest sizes (``fit_ends``)."""
    return {label: fit_ends(rows, sizes[label]) for label, rows in sweeps.items()}


def measured_hardware(
    fits: Mapping[str, LinkFit],
    *,
    ranks_per_node: int,
    base: HardwareSpec | None = None,
    name: str = "measured",
) -> HardwareSpec:
    """``base`` (or a CPU profile of this host, as ``hardware_from_fit`` makes) with the
    measured links: intra from the intra-host groups' fits (the slowest, which limits a
    ring), inter from the inter-host group's; one host has no inter-host link to measure,
    so there inter = intra, as ``hardware_from_fit`` does."""
    intra = [f for label, f in fits.items() if label.startswith("intra ")]
    inter = fits.get(INTER)
    if not intra and inter is None:
        raise ValueError("no all-reduce sweep to fit: measure a group of two or more ranks")
    # the slowest host limits a ring that crosses every host
    intra_fit = min(intra, key=lambda f: f.bandwidth) if intra else inter
    inter_fit = inter if inter is not None else intra_fit
    if intra_fit is None or inter_fit is None:  # unreachable: one of the two exists
        raise ValueError("no link fitted")
    intra_link = LinkSpec(
        name="measured intra-host",
        bandwidth=intra_fit.bandwidth,
        latency=intra_fit.latency,
        source="cluster.doctor('net'): all-reduce sweep inside a host",
    )
    inter_link = LinkSpec(
        name="measured inter-host" if inter is not None else "measured (one host)",
        bandwidth=inter_fit.bandwidth,
        latency=inter_fit.latency,
        source="cluster.doctor('net'): all-reduce sweep across hosts"
        if inter is not None
        else "one host: no inter-host link to measure; the intra-host one is used",
    )
    start = base or hardware_from_fit(intra_fit, name=name, processes_per_node=ranks_per_node)
    return start.with_(
        name=name if base is None else f"{base.name} (measured links)",
        gpus_per_node=ranks_per_node,
        intra=intra_link,
        inter=inter_link,
    )
