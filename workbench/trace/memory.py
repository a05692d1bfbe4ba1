"""Per-rank memory by category: parameters, gradients, optimizer state, activations.

Parameters, gradients and optimizer state are exact storage sums (see ``storage``).
Activations are the tensors autograd saves for backward, seen through
``torch.autograd.graph.saved_tensors_hooks``: the pack hook counts each distinct storage
once (parameters excluded) and hands autograd a small handle; when backward (or dropping
the graph) frees the handle, its storage is uncounted. So ``activation_bytes`` rises
during forward and falls back as backward frees the graph, exactly as the memory does.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import replace
from typing import Any

import torch

from workbench.errors import WorkbenchError
from workbench.trace.events import MemorySample
from workbench.trace.memory_cache import optimizer_cache, parameter_cache
from workbench.trace.recorder import Recorder
from workbench.trace.storage import (
    StorageKey,
    local_tensors,
    process_rss,
    storage_bytes,
    storage_key,
)

__all__ = ["MemoryTracer"]

_CATEGORIES = ("params", "grads", "optimizer", "activations", "other", "allocator")


def _is_parameter(t: torch.Tensor) -> bool:
    """``isinstance(t, nn.Parameter)``, whose metaclass check runs Python code, skipped for
    the two exact types every saved tensor has in practice."""
    kind = type(t)
    if kind is torch.nn.Parameter:
        return True
    return kind is not torch.Tensor and isinstance(t, torch.nn.Parameter)


class _Saved(tuple):  # type: ignore[type-arg]
    """What autograd stores instead of a saved tensor while the tracer counts it:
    ``(tensor, storage keys, weakref to the tracer)``. A tuple, built in C: one is made for
    every saved tensor. The tracer is held weakly: handles must not keep it alive."""

    __slots__ = ()

    def __del__(self) -> None:
        tracer = self[2]()
        if tracer is None:
            return
        # Uncount the storages (the handle's last reference is gone: autograd freed it).
        with tracer._lock:
            live = tracer._live
            for key in self[1]:
                entry = live.get(key)
                if entry is None:
                    continue
                entry[0] -= 1
                if entry[0] == 0:
                    del live[key]
                    tracer._live_bytes -= entry[1]


class MemoryTracer:
    """Samples memory by category on one rank and emits ``MemorySample`` events.

    ``start()`` installs the saved-tensor hooks (and, with ``per_module=True``, a forward
    hook on every module so the activation curve grows layer by layer). The hooks stay
    installed until ``stop()``, across separate calls on the same thread, because
    saved-tensor hooks are thread-local: start, run and stop on one thread.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        recorder: Recorder,
        *,
        per_module: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.recorder = recorder
        self.per_module = per_module
        self._lock = threading.RLock()  # pack runs on autograd threads, release in __del__
        self._live: dict[StorageKey, list[int]] = {}  # key -> [handle count, nbytes]
        self._live_bytes = 0
        self._high: dict[int, int] = {}  # step -> high-water mark of live activation bytes
        # High-water mark since the last sample and when it was reached: a peak inside a
        # phase (a pipeline schedule runs every micro-batch inside one phase) becomes a
        # sample of its own instead of falling between two boundary samples.
        self._window_high = 0
        self._window_high_t = 0
        self._last_activations = 0
        self._peaks: dict[int, MemorySample] = {}
        # Parameter and optimizer-state bytes, counted again only when they may have
        # changed (see memory_cache); the pack hook reads the parameter keys.
        self._params = parameter_cache(model)
        self._optimizer = optimizer_cache(optimizer)
        self._param_keys: frozenset[StorageKey] = frozenset()
        self._hooks_ctx: torch.autograd.graph.saved_tensors_hooks | None = None
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._self_ref = weakref.ref(self)
        self._thread: int | None = None

    def __repr__(self) -> str:
        return (
            f"MemoryTracer(active={self.active}, per_module={self.per_module}, "
            f"activation_bytes={self._live_bytes})"
        )

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._hooks_ctx is not None

    def start(self) -> MemoryTracer:
        if self._hooks_ctx is not None:
            return self
        self._refresh_param_keys()
        # Runs before every forward so parameters re-materialised between steps (e.g. by
        # FSDP) are still recognised and excluded from activations.
        self._handles.append(self.model.register_forward_pre_hook(self._before_forward))
        if self.per_module:
            for name, module in self.model.named_modules():
                label = name or type(module).__name__
                self._handles.append(module.register_forward_hook(self._module_hook(label)))
        ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        ctx.__enter__()
        self._hooks_ctx = ctx
        self._thread = threading.get_ident()
        return self

    def stop(self) -> None:
        if self._hooks_ctx is not None and threading.get_ident() != self._thread:
            raise WorkbenchError(
                "MemoryTracer.stop() was called on another thread than start(); saved-tensor "
                "hooks are per thread: stop the tracer on the thread that started it"
            )
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        ctx, self._hooks_ctx = self._hooks_ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def __enter__(self) -> MemoryTracer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        self.optimizer = optimizer
        self._optimizer = optimizer_cache(optimizer)

    # -- measuring ---------------------------------------------------------------------

    @property
    def activation_bytes(self) -> int:
        """Bytes of distinct storages currently saved for backward (parameters excluded)."""
        return self._live_bytes

    def allocator_bytes(self) -> int:
        """torch.cuda.memory_allocated for a model on CUDA, else the process RSS."""
        self._params.refresh()
        return self._allocator_bytes()

    def _allocator_bytes(self) -> int:
        device = self._params.device  # as of the last refresh
        if device is not None and device.type == "cuda":
            return int(torch.cuda.memory_allocated(device))
        return process_rss()

    def sample(self, label: str = "") -> MemorySample:
        """Measure now, tag with the recorder's rank/step/phase, emit and return."""
        rec = self.recorder
        # One walk over the parameters per sample (FSDP swaps unsharded ones in and out, so
        # the list is not kept between samples); their storages are counted again only when
        # it differs from the last one. Gradients change every step: always counted.
        params = self._refresh_param_keys()
        optimizer, counters = self._optimizer.get() if self._optimizer is not None else (0, 0)
        sample = MemorySample(
            rank=rec.rank,
            step=rec.step,
            phase=rec.phase,
            t=rec.now(),
            params=self._params.bytes,
            grads=storage_bytes([p.grad for p in params if p.grad is not None]),
            optimizer=optimizer,
            activations=self._live_bytes,
            other=counters,
            allocator=self._allocator_bytes(),
            label=label,
        )
        with self._lock:
            high, high_t = self._window_high, self._window_high_t
            self._window_high, self._window_high_t = self._live_bytes, sample.t
            previous, self._last_activations = self._last_activations, self._live_bytes
        if high > max(previous, sample.activations):
            # The activation peak between the previous sample and now, at the time it was
            # reached (the other categories as measured now).
            peak = replace(sample, t=min(high_t, sample.t), activations=high, label="peak")
            self._update_peak(peak)
            rec.emit(peak)
        self._update_peak(sample)
        rec.emit(sample)
        return sample

    def peak(self, step: int | None = None) -> MemorySample | None:
        """Per-category maximum over the samples of ``step`` (default: the current step).

        ``activations`` also includes the high-water mark seen by the pack hook between
        samples, so a peak inside a phase is not missed. Each category peaks on its own,
        so ``total`` is an upper bound of the true simultaneous peak.
        """
        step = self.recorder.step if step is None else step
        with self._lock:
            peak = self._peaks.get(step)
            high = self._high.get(step, 0)
        if peak is None:
            return None
        return replace(peak, activations=max(peak.activations, high))

    # -- internals ---------------------------------------------------------------------

    def _before_forward(self, _module: torch.nn.Module, _args: Any) -> None:
        self._refresh_param_keys()  # returns nothing: a pre-hook's result replaces the input

    def _refresh_param_keys(self) -> list[torch.nn.Parameter]:
        params = self._params.refresh()
        self._param_keys = self._params.keys
        return params

    def _update_peak(self, s: MemorySample) -> None:
        with self._lock:
            old = self._peaks.get(s.step)
            if old is None:
                self._peaks[s.step] = replace(s, phase="", label="peak")
                return
            values = {c: max(getattr(old, c), getattr(s, c)) for c in _CATEGORIES}
            self._peaks[s.step] = replace(old, t=s.t, **values)

    def _module_hook(self, label: str) -> Any:
        def hook(_module: torch.nn.Module, _args: Any, _output: Any) -> None:
            self.sample(label=label)

        return hook

    @staticmethod
    def _is_parameter(t: torch.Tensor) -> bool:
        return _is_parameter(t) or (t._base is not None and _is_parameter(t._base))

    def _pack(self, t: torch.Tensor) -> Any:
        # Runs for every tensor autograd saves: plain tensors take a short path.
        kind = type(t)
        if kind is torch.Tensor:
            base = t._base
            if base is not None and _is_parameter(base):
                return t
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr == 0:
                return t
            key = ("cpu" if t.is_cpu else t.device.type, t.get_device(), ptr)
            if key in self._param_keys:
                return t
            keys: tuple[StorageKey, ...] = (key,)
            sizes: tuple[int, ...] = (storage.nbytes(),)
        elif kind is torch.nn.Parameter:
            return t
        else:
            if self._is_parameter(t):
                return t
            found = [
                (key, inner.untyped_storage().nbytes())
                for inner in local_tensors(t)
                if (key := storage_key(inner)) is not None and key not in self._param_keys
            ]
            if not found:
                return t
            keys = tuple(k for k, _ in found)
            sizes = tuple(n for _, n in found)
        step = self.recorder.step
        with self._lock:
            live = self._live
            for key, size in zip(keys, sizes, strict=True):
                entry = live.get(key)
                if entry is None:
                    live[key] = [1, size]
                    self._live_bytes += size
                else:
                    entry[0] += 1
            live_bytes = self._live_bytes
            if live_bytes > self._high.get(step, 0):
                self._high[step] = live_bytes
            if live_bytes > self._window_high:
                self._window_high = live_bytes
                self._window_high_t = self.recorder.now()
        return _Saved((t, keys, self._self_ref))

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed[0] if type(packed) is _Saved else packed
