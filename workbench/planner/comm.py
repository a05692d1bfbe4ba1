"""Collective cost model (nccl-tests' ring formulas) and which link a group uses.

all-reduce:                 t = 2(n−1)·α + 2(n−1)/n · S/B
all-gather/reduce-scatter:  t = (n−1)·α + (n−1)/n · S/B
point-to-point:             t = α + S/B
S is the full buffer in bytes (for all-gather the gathered output, for reduce-scatter the
input), B the per-GPU link bandwidth, α the per-step latency.
"""

from __future__ import annotations

from workbench.errors import choices_error
from workbench.planner.specs import HardwareSpec, LinkSpec

__all__ = [
    "COLLECTIVES",
    "all_gather_time",
    "all_reduce_time",
    "collective_time",
    "group_link",
    "p2p_time",
    "reduce_scatter_time",
    "spans_nodes",
]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")


def all_reduce_time(size: float, n: int, link: LinkSpec) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * link.latency + 2 * (n - 1) / n * size / link.bandwidth


def all_gather_time(size: float, n: int, link: LinkSpec) -> float:
    if n <= 1:
        return 0.0
    return (n - 1) * link.latency + (n - 1) / n * size / link.bandwidth


reduce_scatter_time = all_gather_time


def all_to_all_time(size: float, n: int, link: LinkSpec) -> float:
    """Each of ``n`` ranks sends (n−1)/n of its ``size``-byte buffer, one peer per step."""
    return all_gather_time(size, n, link)


def p2p_time(size: float, link: LinkSpec) -> float:
    return link.latency + size / link.bandwidth


def collective_time(op: str, size: float, n: int, link: LinkSpec) -> float:
    if op == "all_reduce":
        return all_reduce_time(size, n, link)
    if op in ("all_gather", "reduce_scatter"):
        return all_gather_time(size, n, link)
    if op == "p2p":
        return p2p_time(size, link)
    raise choices_error("op", op, COLLECTIVES)


def spans_nodes(size: int, stride: int, gpus_per_node: int) -> bool:
    """Whether a group of ``size`` ranks spaced ``stride`` apart crosses a node boundary
    (ranks are packed node by node, and groups start on node-aligned ranks)."""
    return size > 1 and stride * (size - 1) + 1 > gpus_per_node


def group_link(hardware: HardwareSpec, size: int, stride: int = 1) -> LinkSpec:
    """The link a ring over this group is limited by: inter-node if it spans nodes."""
    return hardware.inter if spans_nodes(size, stride, hardware.gpus_per_node) else hardware.intra
