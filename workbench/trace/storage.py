"""Exact, storage-deduplicated byte counts of tensors, parameters, gradients, optimizer state.

Memory belongs to storages, not tensors: tied weights, views and DTensor shards that alias
one storage must count once, and a DTensor must count only its local shard. Every helper
here therefore unwraps tensor subclasses to the plain tensors that own memory and sums
``untyped_storage().nbytes()`` over distinct storages.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections.abc import Iterable, Iterator

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

__all__ = [
    "StorageKey",
    "device_type",
    "gradient_bytes",
    "gradient_bytes_of",
    "local_tensors",
    "optimizer_bytes",
    "optimizer_bytes_split",
    "optimizer_counter_bytes",
    "optimizer_state_tensors",
    "parameter_bytes",
    "process_rss",
    "storage_bytes",
    "storage_entry",
    "storage_key",
]

# (device type, device index, data pointer): two live storages never share all three.
StorageKey = tuple[str, int, int]


# Tensors of exactly these types own their memory; anything else may be a wrapper subclass
# (DTensor) whose memory lives in inner tensors. Checked first because it is the common case
# and the memory tracer counts every parameter at every sample.
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def local_tensors(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors that own ``t``'s memory (a DTensor yields its local shard)."""
    if type(t) not in _PLAIN and is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        for name in attrs:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):  # DTensor also lists its device mesh
                yield from local_tensors(inner)
    else:
        yield t


def device_type(t: torch.Tensor) -> str:
    """``t.device.type``, without building a device object for the common CPU case (that
    costs about a microsecond per tensor, and the memory tracer asks for every tensor
    autograd saves and every parameter at every sample)."""
    return "cpu" if t.is_cpu else t.device.type


def storage_entry(t: torch.Tensor) -> tuple[StorageKey, int] | None:
    """(identity, bytes) of a plain tensor's storage, or None when it owns no real memory."""
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
        return None
    ptr = storage.data_ptr()
    if ptr == 0:  # meta tensors, freed (resized-to-zero) storages, empty tensors
        return None
    return (device_type(t), t.get_device(), ptr), storage.nbytes()


def storage_key(t: torch.Tensor) -> StorageKey | None:
    """Identity of a plain tensor's storage, or None when it owns no real memory."""
    found = storage_entry(t)
    return None if found is None else found[0]


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (subclasses unwrapped).

    A plain CPU tensor (the common case: the memory tracer counts every gradient at each
    sample and the optimizer state after each step) takes a short path: its storage is
    keyed by the bare data pointer, without building a (device, index, pointer) key; a
    CPU storage reached through a subclass is keyed the same way, so the two never count
    one storage twice (an int never equals the tuple key of a storage elsewhere).
    """
    seen: set[object] = set()
    total = 0
    plain = _PLAIN
    for tensor in tensors:
        if type(tensor) in plain and tensor.get_device() < 0:
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
                continue
            ptr = storage.data_ptr()
            if ptr and ptr not in seen:
                seen.add(ptr)
                total += storage.nbytes()
            continue
        for t in local_tensors(tensor):
            found = storage_entry(t)
            if found is None:
                continue
            key: object = found[0][2] if found[0][0] == "cpu" else found[0]
            if key not in seen:
                seen.add(key)
                total += found[1]
    return total


def gradient_bytes_of(params: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind the ``.grad`` of ``params``."""
    return storage_bytes(p.grad for p in params if p.grad is not None)


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes held by ``model``'s parameters on this rank (tied/shared storages once)."""
    return storage_bytes(model.parameters())


def gradient_bytes(model: torch.nn.Module) -> int:
    """Bytes held by the ``.grad`` of ``model``'s parameters on this rank."""
    return storage_bytes(p.grad for p in model.parameters() if p.grad is not None)


# Per-parameter bookkeeping scalars kept in optimizer state next to the real state.
_COUNTER_KEYS = frozenset({"step"})


def _state_tensors(
    optimizer: torch.optim.Optimizer | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(state tensors, step-counter tensors) of ``optimizer``, in one walk."""
    if optimizer is None:
        return [], []
    # ZeroRedundancyOptimizer keeps the real state in the wrapped local optimizer.
    inner = getattr(optimizer, "optim", None)
    if isinstance(inner, torch.optim.Optimizer):
        optimizer = inner
    state_tensors: list[torch.Tensor] = []
    counters: list[torch.Tensor] = []
    for state in optimizer.state.values():
        items = state.items() if isinstance(state, dict) else [("", state)]
        for key, value in items:
            out = counters if key in _COUNTER_KEYS else state_tensors
            if isinstance(value, torch.Tensor):  # the common case, without a tree walk
                out.append(value)
            else:
                out.extend(leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor))
    return state_tensors, counters


def optimizer_bytes_split(optimizer: torch.optim.Optimizer | None) -> tuple[int, int]:
    """(``optimizer_bytes``, ``optimizer_counter_bytes``) from one walk over the state."""
    state_tensors, counters = _state_tensors(optimizer)
    return storage_bytes(state_tensors), storage_bytes(counters)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The optimizer's per-parameter state tensors (AdamW: exp_avg, exp_avg_sq; SGD: the
    momentum buffer), ZeRO: the local optimizer's. Step counters are not included."""
    return _state_tensors(optimizer)[0]


def optimizer_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the optimizer state: what "8 bytes per parameter for Adam" counts."""
    return storage_bytes(optimizer_state_tensors(optimizer))


def optimizer_counter_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the optimizer's per-parameter step counters (recorded as ``other``)."""
    return storage_bytes(_state_tensors(optimizer)[1])


# /proc/self/statm, kept open: the memory tracer reads it at every sample, and a read at
# offset 0 of an open /proc file is fresh each time. Keyed by pid: after a fork the inherited
# descriptor would still describe the parent.
_STATM: dict[int, int] = {}
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _statm_fd() -> int:
    pid = os.getpid()
    fd = _STATM.get(pid)
    if fd is None:
        for stale in _STATM.values():  # the parent's, inherited through a fork
            with contextlib.suppress(OSError):
                os.close(stale)
        _STATM.clear()
        fd = _STATM[pid] = os.open("/proc/self/statm", os.O_RDONLY)
    return fd


def process_rss() -> int:
    """Resident set size of this process in bytes (current on Linux, peak elsewhere)."""
    try:
        resident_pages = int(os.pread(_statm_fd(), 128, 0).split()[1])
        return resident_pages * _PAGE_SIZE
    except (OSError, ValueError, IndexError, AttributeError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
