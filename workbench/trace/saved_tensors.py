"""The saved-tensor bookkeeping behind ``MemoryTracer``'s activation bytes.

Autograd stores, instead of each tensor it saves for backward, a small handle made here
(``Saved``: a tuple built in C); freeing the handle queues its storage's uncounting on the
shared counts (``LiveSaved``), which every reader drains first. Kept apart from the tracer
so a handle reaches the counts directly without keeping the model or the recorder alive.

A handle holds its tensor without the tensor's graph (``graph_free``): the pack hook gets
the saved tensor with its ``grad_fn``, and when an op saves its own output (softmax, exp,
tanh) that ``grad_fn`` is the node that owns the handle: node -> handle -> tensor -> node,
a cycle through C++ that Python's gc cannot see. Autograd itself saves such an output
without its graph and reattaches the graph on unpack, also when hooks are installed, so
holding the alias is lossless, and a graph dropped without backward (torch pipelining's
metadata-inference forward, an evaluation with grad on) is freed the moment its last
reference goes, as it would be untraced.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from workbench.trace.storage import StorageKey

__all__ = [
    "LiveSaved",
    "Saved",
    "SavedMany",
    "graph_free",
    "is_parameter",
    "pack_key",
    "unpack",
]


def is_parameter(t: torch.Tensor) -> bool:
    """``isinstance(t, nn.Parameter)``, whose metaclass check runs Python code, skipped for
    the two exact types every saved tensor has in practice."""
    kind = type(t)
    if kind is torch.nn.Parameter:
        return True
    return kind is not torch.Tensor and isinstance(t, torch.nn.Parameter)


def graph_free(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a handle may hold it: without its ``grad_fn`` (see the module docstring).
    ``detach`` keeps the storage and the version counter; a tensor that does not require
    grad has no graph to drop, and skips the ~0.5 us of a new tensor object."""
    return t.detach() if t.requires_grad else t


class LiveSaved:
    """The saved-tensor counts, shared by the pack hook and the handles autograd holds.

    Kept apart from the tracer so a handle can reach the counts directly (no weak
    reference to dereference per release) without keeping the model or the recorder
    alive: a graph that outlives its tracer holds only this.

    A freed handle only appends its key to ``released`` (``list.append`` is atomic: no
    lock, no dictionary work per release, ~150 of them in a backward); ``drain`` applies
    them, and everything that reads the counts drains first (the pack hook before it
    counts, a sample, ``activation_bytes``), so every figure is what eager uncounting
    would give.
    """

    __slots__ = (
        "bytes",
        "lock",
        "param_keys",
        "released",
        "storages",
        "window_high",
        "window_high_ns",
    )

    def __init__(self) -> None:
        self.lock = threading.RLock()  # pack runs on autograd threads
        self.storages: dict[Any, list[int]] = {}  # pack key -> [handle count, nbytes]
        self.bytes = 0  # of the storages above
        self.released: list[Any] = []  # pack keys of freed handles, not yet uncounted
        # High-water mark since the last sample, and when (time.time_ns) it was reached.
        self.window_high = 0
        self.window_high_ns = 0
        # The parameter storages' pack keys (see ``pack_key``): never activations.
        self.param_keys: frozenset[Any] = frozenset()

    def drain(self) -> None:
        """Uncount the handles freed since the last drain (call with ``lock`` held)."""
        released = self.released
        n = len(released)
        if not n:
            return
        # A handle freed meanwhile (another thread, or a collection triggered here) appends
        # past ``n``: it stays for the next drain.
        keys = released[:n]
        del released[:n]
        storages = self.storages
        freed = 0
        for key in keys:
            entry = storages.get(key)
            if entry is not None:
                entry[0] -= 1
                if not entry[0]:
                    del storages[key]
                    freed += entry[1]
        self.bytes -= freed


def pack_key(key: StorageKey) -> Any:
    """The key the pack hook uses for a storage: the bare data pointer on the CPU (an int
    hashes and compares fastest, and ``get_device()`` is cheaper than ``is_cpu``), the
    full (device type, index, pointer) elsewhere: an int never equals a tuple."""
    return key[2] if key[0] == "cpu" else key


class Saved(tuple):  # type: ignore[type-arg]
    """What autograd stores instead of a saved tensor while the tracer counts it:
    ``(graph_free(tensor), pack key, LiveSaved)``. A tuple, built in C: one is made for every saved
    tensor. Its ``__del__`` (autograd freed the handle) queues the storage's uncounting
    (see ``LiveSaved``)."""

    __slots__ = ()

    def __del__(self) -> None:
        self[2].released.append(self[1])


class SavedMany(tuple):  # type: ignore[type-arg]
    """``Saved`` for a tensor subclass (a DTensor) whose memory is in several storages:
    ``(graph_free(tensor), pack keys, LiveSaved)``."""

    __slots__ = ()

    def __del__(self) -> None:
        self[2].released.extend(self[1])


def unpack(packed: Any) -> torch.Tensor:
    # A tensor is never a tuple: a tuple is one of our handles.
    return packed[0] if isinstance(packed, tuple) else packed
