"""What a dispatcher-level collective is: its name, its size in bytes and its group.

``torch.distributed`` calls (``dist.all_reduce`` ...), DDP's built-in reducer and FSDP2 reach
the dispatcher as ``c10d::*`` ops that return a ``Work``; DTensor and functional collectives
reach it as ``_c10d_functional::*`` ops that return a tensor completed by a later
``wait_tensor``. The tables follow ``torch/distributed/_tools/fake_collectives.py`` and
``torch/distributed/tensor/debug/_comm_mode.py`` of the installed torch.

Sizes follow nccl-tests: all-reduce/broadcast/reduce/send/recv count the tensor,
all-gather the gathered output, reduce-scatter and all-to-all the input, so that
``CommEvent.algbw``/``busbw`` mean what they mean there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

__all__ = [
    "OpInfo",
    "group_size",
    "lookup",
    "op_bytes",
    "overloads",
    "tensor_bytes",
    "tensor_leaves",
]


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """The tensors in a collective's (nested) argument, in order: what ``tree_leaves``
    yields that is a tensor. A collective's arguments are tensors, lists / tuples of them
    (nested for all_gather), a process group and scalars, so those are walked here at a
    fraction of pytree's cost (read twice per traced collective); any other container
    falls back to pytree."""
    out: list[torch.Tensor] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, torch.Tensor):
            out.append(node)
        elif isinstance(node, list | tuple):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            out.extend(t for t in tree_leaves(node) if isinstance(t, torch.Tensor))
    return out


def tensor_bytes(tree: Any) -> int:
    """Sum of ``numel * element_size`` over the tensors in a (nested) argument."""
    return sum(t.numel() * t.element_size() for t in tensor_leaves(tree))


@dataclass(frozen=True, slots=True)
class OpInfo:
    """How to read one collective op overload.

    ``size_arg``: index of the argument whose tensors are the nccl-tests size; -1: the
    gathered output (input times group size); -2: no payload (barrier).
    ``group_arg``: index of the process group (a boxed ``ProcessGroup`` for c10d ops, a
    group name for functional ops). ``functional``: completes at ``wait_tensor`` rather
    than through a ``Work``.
    """

    name: str
    size_arg: int
    group_arg: int
    functional: bool


def _table() -> dict[Any, OpInfo]:
    entries: list[tuple[str, str, str, int, int]] = [
        # namespace, op, workbench name, size arg, group arg
        ("c10d", "allreduce_", "all_reduce", 0, 1),
        ("c10d", "allreduce_coalesced_", "all_reduce", 0, 1),
        ("c10d", "broadcast_", "broadcast", 0, 1),
        ("c10d", "reduce_", "reduce", 0, 1),
        ("c10d", "send", "send", 0, 1),
        ("c10d", "recv_", "recv", 0, 1),
        ("c10d", "recv_any_source_", "recv", 0, 1),
        ("c10d", "barrier", "barrier", -2, 1),
        ("c10d", "allgather_", "all_gather", 0, 2),
        ("c10d", "_allgather_base_", "all_gather", 0, 2),
        ("c10d", "allgather_coalesced_", "all_gather", 0, 2),
        ("c10d", "allgather_into_tensor_coalesced_", "all_gather", 0, 2),
        ("c10d", "reduce_scatter_", "reduce_scatter", 1, 2),
        ("c10d", "_reduce_scatter_base_", "reduce_scatter", 1, 2),
        ("c10d", "reduce_scatter_tensor_coalesced_", "reduce_scatter", 1, 2),
        ("c10d", "gather_", "gather", 1, 2),
        ("c10d", "scatter_", "scatter", 0, 2),
        ("c10d", "alltoall_", "all_to_all", 1, 2),
        ("c10d", "alltoall_base_", "all_to_all", 1, 2),
        ("_c10d_functional", "all_reduce", "all_reduce", 0, 2),
        ("_c10d_functional", "all_reduce_", "all_reduce", 0, 2),
        ("_c10d_functional", "all_reduce_coalesced", "all_reduce", 0, 2),
        ("_c10d_functional", "all_reduce_coalesced_", "all_reduce", 0, 2),
        ("_c10d_functional", "broadcast", "broadcast", 0, 2),
        ("_c10d_functional", "broadcast_", "broadcast", 0, 2),
        ("_c10d_functional", "all_gather_into_tensor", "all_gather", -1, 2),
        ("_c10d_functional", "all_gather_into_tensor_coalesced", "all_gather", -1, 2),
        ("_c10d_functional", "all_gather_into_tensor_out", "all_gather", -1, 2),
        ("_c10d_functional", "reduce_scatter_tensor", "reduce_scatter", 0, 3),
        ("_c10d_functional", "reduce_scatter_tensor_coalesced", "reduce_scatter", 0, 3),
        ("_c10d_functional", "all_to_all_single", "all_to_all", 0, 3),
        ("_c10d_functional_autograd", "all_gather_into_tensor", "all_gather", -1, 2),
        ("_c10d_functional_autograd", "reduce_scatter_tensor", "reduce_scatter", 0, 3),
        ("_c10d_functional_autograd", "all_to_all_single", "all_to_all", 0, 3),
        ("_dtensor", "shard_dim_alltoall", "all_to_all", 0, 3),
    ]
    table: dict[Any, OpInfo] = {}
    for namespace, op, name, size_arg, group_arg in entries:
        try:
            packet = getattr(getattr(torch.ops, namespace), op)
        except (AttributeError, RuntimeError):  # op absent from this torch build
            continue
        table[packet] = OpInfo(name, size_arg, group_arg, functional=namespace != "c10d")
    return table


_TABLE: dict[Any, OpInfo] | None = None


def lookup(func: torch._ops.OpOverload) -> OpInfo | None:
    """The collective described by ``func``, or None for any other op."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _table()
    return _TABLE.get(func._overloadpacket)


def overloads() -> dict[Any, OpInfo]:
    """Every overload of every collective, for a single dict lookup per dispatched op."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _table()
    table: dict[Any, OpInfo] = {}
    for packet, info in _TABLE.items():
        for name in packet.overloads():
            table[getattr(packet, name)] = info
    return table


def op_bytes(info: OpInfo, args: tuple[Any, ...], group_size: int) -> int:
    """Size of the collective in bytes, known at issue time (see the module docstring)."""
    if info.size_arg == -2:
        return 0  # barrier: its tensor argument is a placeholder, nothing is sent
    if info.size_arg == -1:  # gathered output: every rank's input
        return tensor_bytes(args[0]) * group_size if args else 0
    return tensor_bytes(args[info.size_arg]) if info.size_arg < len(args) else 0


def group_size(info: OpInfo, args: tuple[Any, ...], default: Callable[[], int]) -> int:
    """Size of the group the op runs on; ``default()`` when it cannot be read."""
    from torch._C._distributed_c10d import ProcessGroup, _resolve_process_group

    try:
        group = args[info.group_arg]
        if info.functional:
            pg = _resolve_process_group(group)
        else:
            pg = group if isinstance(group, ProcessGroup) else ProcessGroup.unbox(group)
        return int(pg.size())
    except (IndexError, RuntimeError, TypeError, ValueError, AttributeError):
        return default()
