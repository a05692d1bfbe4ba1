"""The byte counts a memory sample reuses between samples, each with how it knows it is stale.

A traced step takes about five memory samples; counting every parameter storage and every
optimizer-state storage at each of them cost more than the rest of the tracer together.
Both change far less often than they are sampled, so each is counted again only when it
may have changed, and the figures stay exact:

* ``ParameterCache``: the parameters change when a module's parameter is replaced (FSDP2
  swaps sharded and unsharded parameters at every unshard / reshard, a user assigns a new
  ``nn.Parameter``) or a parameter's storage is reallocated (``param.data = ...``,
  ``.to()``, a storage resized to zero and back). Each sample walks the modules' own
  parameter dicts (far cheaper than ``model.parameters()``) into a signature of
  (identity, data pointer) per parameter; the storages are counted again only when the
  signature differs. A reallocation always changes the data pointer: the new buffer is
  allocated while the old one is still alive, and a freed one reads 0.
* ``OptimizerCache``: optimizer state changes in ``step()`` (lazily created at the first
  one, updated in place after) and ``load_state_dict()`` (a new state dict). torch's
  process-wide step hooks count the steps of each optimizer. After a step the state's
  signature (each entry's length, identity and data pointer of each state tensor) is
  compared with the one counted, and the state counted again only if it differs; it is
  always counted while a step runs (a sample from inside a closure), when the state dict
  is another or has grown, and at every sample for an optimizer whose ``step`` torch does
  not hook or whose state holds more than dicts of plain tensors.

One cache per model / optimizer is shared by every tracer (a loop traced block by block
does not count again per block); both hold their object weakly.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from workbench.trace.saved_tensors import pack_key
from workbench.trace.storage import (
    StorageKey,
    local_tensors,
    optimizer_bytes_split,
    storage_entry,
)

__all__ = [
    "OptimizerCache",
    "ParameterCache",
    "optimizer_cache",
    "parameter_cache",
    "parameters_of",
]

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_MODULE_WALK = (torch.nn.Module.parameters, torch.nn.Module.named_parameters)


def parameters_of(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of ``model`` and its submodules, each once: what ``model.parameters()``
    yields (in another order), read straight from the modules' parameter dicts, several
    times faster than through its nested generators."""
    if (type(model).parameters, type(model).named_parameters) != _MODULE_WALK:
        return list(model.parameters())  # a root that defines its own parameter view
    # Breadth first over a list that grows while it is read, then one pass over the
    # parameter dicts: the fewest Python operations per module (the tracer walks at every
    # sample, when the model's objects are no longer in the CPU caches).
    modules: list[Any] = [model]
    for module in modules:
        if module is None:  # a submodule slot registered as None
            continue
        children = module._modules
        if children:
            modules.extend(children.values())
    if None in modules:
        modules = [m for m in modules if m is not None]
    params = [p for m in modules for p in m._parameters.values() if p is not None]
    if len(set(map(id, params))) != len(params):  # shared submodules or tied weights
        params = list({id(p): p for p in params}.values())
    return params


_PLAIN_TYPES = frozenset(_PLAIN)
_DATA_PTR = torch.Tensor.data_ptr


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _signature(params: list[torch.nn.Parameter]) -> list[int]:
    """(identity, requires_grad, data pointer of each storage-owning tensor) of every
    parameter: the identities, the flags (a parameter frozen or unfrozen between samples
    moves its bytes between categories), then the pointers (built by ``map`` at C speed
    when every parameter is a plain tensor, the common case)."""
    out = list(map(id, params))
    out.extend(map(_REQUIRES_GRAD, params))
    if set(map(type, params)) <= _PLAIN_TYPES:
        out.extend(map(_DATA_PTR, params))
        return out
    for p in params:
        if type(p) in _PLAIN_TYPES:
            out.append(p.data_ptr())
        else:  # a DTensor: its local shard owns the memory
            out.extend(t.data_ptr() for t in local_tensors(p))
    return out


class ParameterCache:
    """The model's parameter storages: their keys, their bytes and the device.

    ``bytes`` are the trainable parameters' storages, ``frozen`` those of parameters that
    do not require grad (a LoRA model's base weights). A storage holding both (FSDP2's
    all-gather output while a unit is unsharded) counts its frozen parameters' own bytes
    as frozen and the rest, padding included, as trainable.

    Holds the model weakly: one cache per model is shared by every tracer on it (see
    ``parameter_cache``), so a loop traced block by block does not count them per block.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = weakref.ref(model)
        self.keys: frozenset[StorageKey] = frozenset()
        # ``keys`` as the memory tracer's pack hook keys them (a CPU storage by its bare
        # data pointer, see ``saved_tensors.pack_key``).
        self.pack_keys: frozenset[Any] = frozenset()
        self.bytes = 0
        self.frozen = 0
        self.device: torch.device | None = None
        self.recounts = 0  # how many times the storages were counted (for tests)
        self._signature: list[int] | None = None

    def __repr__(self) -> str:
        return (
            f"ParameterCache(bytes={self.bytes}, frozen={self.frozen}, storages={len(self.keys)})"
        )

    @property
    def model(self) -> torch.nn.Module:
        model = self._model()
        if model is None:
            raise ReferenceError("the model of this parameter cache no longer exists")
        return model

    def refresh(self) -> list[torch.nn.Parameter]:
        """The current parameters; ``keys`` / ``bytes`` / ``device`` describe them after."""
        params = parameters_of(self.model)
        signature = _signature(params)
        if signature != self._signature:
            self._count(params)
            self._signature = signature
        return params

    def _count(self, params: list[torch.nn.Parameter]) -> None:
        sizes: dict[StorageKey, int] = {}
        frozen: dict[StorageKey, int] = {}  # storage -> bytes of frozen parameters in it
        trainable: set[StorageKey] = set()  # storages holding a trainable parameter
        device: torch.device | None = None
        for p in params:
            for t in local_tensors(p):
                if device is None:
                    device = t.device
                found = storage_entry(t)
                if found is None:
                    continue
                sizes.setdefault(found[0], found[1])
                if p.requires_grad:
                    trainable.add(found[0])
                else:
                    frozen[found[0]] = frozen.get(found[0], 0) + t.numel() * t.element_size()
        # A storage of frozen parameters alone is frozen whole (its padding too).
        held = {k: sizes[k] if k not in trainable else min(v, sizes[k]) for k, v in frozen.items()}
        self.frozen = sum(held.values())
        self.keys, self.device = frozenset(sizes), device
        self.bytes = sum(sizes.values()) - self.frozen
        self.pack_keys = frozenset(map(pack_key, sizes))
        self.recounts += 1


_CACHES: weakref.WeakKeyDictionary[torch.nn.Module, ParameterCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def parameter_cache(model: torch.nn.Module) -> ParameterCache:
    """The one ``ParameterCache`` of ``model`` (made on first use, gone with the model)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(model)
        if cache is None:
            cache = _CACHES[model] = ParameterCache(model)
        return cache


def _local_optimizer(optimizer: Any) -> Any:
    """The optimizer that holds the state (ZeroRedundancyOptimizer: its local one)."""
    inner = getattr(optimizer, "optim", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def _hooked(optimizer: Any) -> bool:
    """Does torch run step hooks for this optimizer's ``step``?"""
    return (
        isinstance(optimizer, torch.optim.Optimizer)
        and bool(getattr(type(optimizer).step, "hooked", False))
        and "step" not in vars(optimizer)  # a step patched onto the instance skips them
    )


# optimizer -> [steps begun, steps ended], for the optimizers a cache watches. Counted by
# torch's process-wide step hooks (installed once, on first use): nothing is attached to
# the user's optimizer, and a step taken between two traced blocks is seen too.
_STEPS: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()
_STEP_HOOKS: list[Any] = []


def _step_begun(optimizer: Any, *_: Any) -> None:
    entry = _STEPS.get(optimizer)
    if entry is not None:
        entry[0] += 1


def _step_ended(optimizer: Any, *_: Any) -> None:
    entry = _STEPS.get(optimizer)
    if entry is not None:
        entry[1] += 1


def _step_counts(optimizer: Any) -> list[int]:
    """The live [begun, ended] step counts of ``optimizer`` (counting from now on)."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    with _CACHES_LOCK:
        if not _STEP_HOOKS:
            _STEP_HOOKS.append(register_optimizer_step_pre_hook(_step_begun))
            _STEP_HOOKS.append(register_optimizer_step_post_hook(_step_ended))
        entry = _STEPS.get(optimizer)
        if entry is None:
            entry = _STEPS[optimizer] = [0, 0]
        return entry


def _weak(obj: Any) -> Callable[[], Any]:
    """A weak reference to ``obj``, or a strong one where it cannot be weak (__slots__)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _state_signature(state: Any) -> list[int] | None:
    """Each state entry's length, then the identity and the data pointer of every state
    tensor (built by ``map`` at C speed); None where the state holds anything but dicts of
    plain tensors (a step then always counts again). The same storage of the same tensor
    has the same bytes, and a reallocation changes the pointer (see ``ParameterCache``)."""
    if not isinstance(state, dict):
        return None
    entries = list(state.values())
    if not all(type(entry) is dict for entry in entries):
        return None
    values = [value for entry in entries for value in entry.values()]
    if not set(map(type, values)) <= _PLAIN_TYPES:
        return None
    signature = list(map(len, entries))
    signature.extend(map(id, values))
    signature.extend(map(_DATA_PTR, values))
    return signature


class OptimizerCache:
    """(state bytes, step-counter bytes) of an optimizer.

    Counted again after a ``step()`` that changed the state's signature (an entry grew, a
    state tensor was replaced or reallocated), while a step runs, when the state dict is
    replaced (``load_state_dict``) or grows, and at every call for an optimizer whose
    ``step`` torch does not hook. Holds the optimizer weakly; one per optimizer is shared
    (``optimizer_cache``).
    """

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = _weak(optimizer)
        self.recounts = 0  # how many times the state was counted (for tests)
        self._value: tuple[int, int] | None = None
        # (local optimizer, its state dict, that dict's length, steps ended) when counted
        self._guard: tuple[int, int, int, int] | None = None
        self._local: Callable[[], Any] = lambda: None  # whose step counts _steps are
        self._steps: list[int] | None = None
        self._signature: list[int] | None = None  # _state_signature when counted

    def __repr__(self) -> str:
        return f"OptimizerCache(value={self._value}, recounts={self.recounts})"

    def get(self) -> tuple[int, int]:
        optimizer = self._optimizer()
        if optimizer is None:
            return 0, 0
        local = _local_optimizer(optimizer)
        state = getattr(local, "state", None)
        if not _hooked(local):  # (asked every time: a step may be patched on later)
            begun, ended = 1, 0  # as if always inside a step: never reused
        else:
            if self._local() is not local:
                self._steps = _step_counts(local)
                self._local = _weak(local)
            begun, ended = self._steps  # type: ignore[misc]
        guard = (id(local), id(state), len(state) if state is not None else 0, ended)
        if self._value is not None and begun == ended and guard == self._guard:
            return self._value
        # A step ended since the count (or the state dict changed, or one runs now): an
        # optimizer that updates its state in place (every torch optimizer after its first
        # step) leaves the signature as it was, which costs a fraction of a count to check.
        signature = _state_signature(state) if begun == ended else None
        if (
            self._value is None
            or signature is None
            or signature != self._signature
            or guard[:3] != (self._guard or ())[:3]
        ):
            self._value = optimizer_bytes_split(optimizer)
            self.recounts += 1
        self._guard, self._signature = guard, signature
        return self._value


_OPTIMIZERS: weakref.WeakKeyDictionary[Any, OptimizerCache] = weakref.WeakKeyDictionary()


def optimizer_cache(optimizer: Any | None) -> OptimizerCache | None:
    """The one ``OptimizerCache`` of ``optimizer`` (None for None)."""
    if optimizer is None:
        return None
    try:
        with _CACHES_LOCK:
            cache = _OPTIMIZERS.get(optimizer)
            if cache is None:
                cache = _OPTIMIZERS[optimizer] = OptimizerCache(optimizer)
            return cache
    except TypeError:  # cannot be weakly referenced (or hashed): a cache of its own
        return OptimizerCache(optimizer)
