"""DDP's gradient buckets, recorded: the averaging all-reduce comm hook ``CommTracer`` attaches.

DDP's reducer all-reduces its buckets below the dispatcher, so they are seen through a comm
hook instead: DDP's default semantics (divide by the group size, then sum-all-reduce),
with each bucket recorded as a ``CommEvent`` of source ``ddp-bucket`` by the tracer that
attached last. DDP takes one comm hook per model, for good, while the tracer behind it
changes (a loop traced block by block starts a new tracer each time), so the hook reads
its tracer from a ``HookState`` kept per model; a stopped tracer unhooks itself from it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch.distributed as dist

from workbench.trace.comm import _Flight, labelled
from workbench.trace.intercept import looking_away

__all__ = ["HookState", "hook_state"]


class HookState:
    """The comm hook's state on one DDP model: which tracer records its buckets now."""

    __slots__ = ("group", "tracer")

    def __init__(self, group: Any) -> None:
        self.group = group
        self.tracer: Any | None = None  # a CommTracer, or None: buckets not recorded

    def __repr__(self) -> str:
        return f"HookState(tracer={self.tracer!r})"


# DDP model -> the state its comm hook reads (weak: the model's lifetime is the user's).
_HOOKS: weakref.WeakKeyDictionary[Any, HookState] = weakref.WeakKeyDictionary()


def hook_state(ddp_model: Any) -> HookState:
    """The hook state of ``ddp_model``, registering the comm hook the first time (a
    RuntimeError from DDP if the user registered a comm hook of their own)."""
    state = _HOOKS.get(ddp_model)
    if state is None:
        state = HookState(ddp_model.process_group)
        ddp_model.register_comm_hook(state, _traced_allreduce_hook)
        _HOOKS[ddp_model] = state
    return state


# No annotations on purpose: DDP compares ``bucket``/return annotations with its own
# types, and postponed (string) annotations would fail that check.
def _traced_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP's default semantics (divide by the group size, then sum-all-reduce), recorded."""
    tracer = state.tracer
    group = state.group if state.group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    size = group.size()
    buffer.div_(size)
    if tracer is None or not tracer.active:
        with labelled("ddp"):  # seen by whichever tracer listens at the dispatcher, if any
            work = dist.all_reduce(buffer, group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
    flight = _Flight("all_reduce", buffer.numel() * buffer.element_size(), size, "ddp-bucket")
    tracer._begin(flight, cuda=buffer.is_cuda)
    with looking_away():
        work = dist.all_reduce(buffer, group=group, async_op=True)

    def done(fut):  # type: ignore[no-untyped-def]
        tracer._complete(flight)
        return fut.value()[0]

    return work.get_future().then(done)
