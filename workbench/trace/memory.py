"""Per-rank memory by category: parameters (trainable, and frozen weights apart),
gradients, optimizer state, activations.

Parameters, gradients and optimizer state are exact storage sums (see ``storage``).
Activations are the tensors autograd saves for backward, seen through
``torch.autograd.graph.saved_tensors_hooks``: the pack hook counts each distinct storage
once (parameters excluded) and hands autograd a small handle; when backward (or dropping
the graph) frees the handle, its storage is uncounted. So ``activation_bytes`` rises
during forward and falls back as backward frees the graph, exactly as the memory does.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from workbench.errors import WorkbenchError
from workbench.trace.events import MemorySample
from workbench.trace.memory_cache import optimizer_cache, parameter_cache
from workbench.trace.recorder import Recorder
from workbench.trace.saved_tensors import (
    LiveSaved,
    Saved,
    SavedMany,
    graph_free,
    is_parameter,
    pack_key,
    unpack,
)
from workbench.trace.storage import gradient_bytes_of, local_tensors, process_rss, storage_key

# Steps whose per-category maxima ``peak()`` can still give.
_PEAKS_KEPT = 64

__all__ = ["MemoryTracer"]

_CATEGORIES = ("params", "grads", "optimizer", "activations", "other", "allocator", "frozen")


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
        self._live = LiveSaved()
        self._high: dict[int, int] = {}  # step -> high-water mark of live activation bytes
        # The high-water mark since the last sample (``LiveSaved.window_high``) becomes a
        # sample of its own when it is above both samples around it: a peak inside a phase
        # (a pipeline schedule runs every micro-batch inside one phase) is not missed.
        self._last_activations = 0
        # step -> [t, then the per-category maxima in _CATEGORIES order]; ``peak`` builds
        # the MemorySample (a dataclasses.replace per sample cost more than the sample).
        self._peaks: dict[int, list[Any]] = {}
        self._peak_rank: dict[int, int] = {}  # step -> rank of its first sample
        # Parameter and optimizer-state bytes, counted again only when they may have
        # changed (see memory_cache); the pack hook reads the parameter keys.
        self._params = parameter_cache(model)
        self._optimizer = optimizer_cache(optimizer)
        self._hooks_ctx: torch.autograd.graph.saved_tensors_hooks | None = None
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._thread: int | None = None

    def __repr__(self) -> str:
        return (
            f"MemoryTracer(active={self.active}, per_module={self.per_module}, "
            f"activation_bytes={self.activation_bytes})"
        )

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._hooks_ctx is not None

    def start(self, sample: str | None = None) -> MemoryTracer:
        """Install the hooks; with ``sample``, also take a sample so labelled at once,
        sharing this boundary's one walk over the parameters."""
        if self._hooks_ctx is not None:
            return self
        params = self._refresh_param_keys()
        # Runs before every forward so parameters re-materialised between steps (e.g. by
        # FSDP) are still recognised and excluded from activations.
        self._handles.append(self.model.register_forward_pre_hook(self._before_forward))
        if self.per_module:
            for name, module in self.model.named_modules():
                label = name or type(module).__name__
                self._handles.append(module.register_forward_hook(self._module_hook(label)))
        ctx = torch.autograd.graph.saved_tensors_hooks(self._make_pack(), unpack)
        ctx.__enter__()
        self._hooks_ctx = ctx
        self._thread = threading.get_ident()
        if sample is not None:
            self._sample(sample, params)
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

    @contextlib.contextmanager
    def on_this_thread(self) -> Iterator[None]:
        """The tracer's saved-tensor hooks on the calling thread too, while the block runs
        (hooks are per thread): for training work handed to another thread, a pipeline
        schedule stepped action by action (``parallel.pp_stepping``)."""
        if self._hooks_ctx is None:
            yield
            return
        with torch.autograd.graph.saved_tensors_hooks(self._make_pack(), unpack):
            yield

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
        live = self._live
        with live.lock:
            live.drain()
            return live.bytes

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
        # One walk over the parameters per sample (FSDP swaps unsharded ones in and out, so
        # the list is not kept between samples); their storages are counted again only when
        # it differs from the last one. Gradients change every step: always counted.
        return self._sample(label, self._refresh_param_keys())

    def _sample(self, label: str, params: list[torch.nn.Parameter]) -> MemorySample:
        """``sample`` with the parameters just walked (by the caller, at this boundary)."""
        rec = self.recorder
        optimizer, counters = self._optimizer.get() if self._optimizer is not None else (0, 0)
        activations = self.activation_bytes
        sample = MemorySample(
            rank=rec.rank,
            step=rec.step,
            phase=rec.phase,
            t=rec.now(),
            params=self._params.bytes,
            frozen=self._params.frozen,
            grads=gradient_bytes_of(params),
            optimizer=optimizer,
            activations=activations,
            other=counters,
            allocator=self._allocator_bytes(),
            label=label,
        )
        live = self._live
        with live.lock:
            live.drain()
            high, high_ns = live.window_high, live.window_high_ns
            live.window_high, live.window_high_ns = live.bytes, time.time_ns()
            previous, self._last_activations = self._last_activations, live.bytes
        if high > max(previous, sample.activations):
            # The activation peak between the previous sample and now, at the time it was
            # reached (the other categories as measured now).
            high_t = high_ns + rec.clock.offset_ns
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
        with self._live.lock:
            values = self._peaks.get(step)
            values = None if values is None else list(values)
            high = self._high.get(step, 0)
            rank = self._peak_rank.get(step, 0)
        if values is None:
            return None
        t, *maxima = values
        peak = dict(zip(_CATEGORIES, maxima, strict=True))
        peak["activations"] = max(peak["activations"], high)
        return MemorySample(rank=rank, step=step, phase="", t=t, label="peak", **peak)

    # -- internals ---------------------------------------------------------------------

    def _before_forward(self, _module: torch.nn.Module, _args: Any) -> None:
        self._refresh_param_keys()  # returns nothing: a pre-hook's result replaces the input

    def _refresh_param_keys(self) -> list[torch.nn.Parameter]:
        params = self._params.refresh()
        self._live.param_keys = self._params.pack_keys
        return params

    def _update_peak(self, s: MemorySample) -> None:
        values = (s.params, s.grads, s.optimizer, s.activations, s.other, s.allocator, s.frozen)
        with self._live.lock:
            old = self._peaks.get(s.step)
            if old is None:
                self._peaks[s.step] = [s.t, *values]
                self._peak_rank[s.step] = s.rank
                # ``peak()`` is asked about the step in progress: older steps' maxima go
                # (the client summarises every step), so a long run does not grow them.
                for table in (self._peaks, self._peak_rank, self._high):
                    table.pop(s.step - _PEAKS_KEPT, None)
                return
            old[0] = s.t
            for i, value in enumerate(values, 1):
                if value > old[i]:
                    old[i] = value

    def _module_hook(self, label: str) -> Any:
        def hook(_module: torch.nn.Module, _args: Any, _output: Any) -> None:
            self.sample(label=label)

        return hook

    @staticmethod
    def _is_parameter(t: torch.Tensor) -> bool:
        return is_parameter(t) or (t._base is not None and is_parameter(t._base))

    def _make_pack(self) -> Any:
        """The pack hook: runs for every tensor autograd saves, so everything it reads is
        bound to a local here and a storage seen before costs one dict lookup (the lock is
        taken by hand: a ``with`` costs twice as much, ~110 times per step)."""
        live = self._live
        storages, lock = live.storages, live.lock
        acquire, release = lock.acquire, lock.release
        high, recorder = self._high, self.recorder
        plain, parameter, saved, alias = torch.Tensor, torch.nn.Parameter, Saved, graph_free
        time_ns = time.time_ns
        released, drain = live.released, live.drain

        def count(key: Any, nbytes: int) -> None:  # a storage not seen before; lock held
            storages[key] = [1, nbytes]
            total = live.bytes = live.bytes + nbytes
            if total > live.window_high:
                live.window_high, live.window_high_ns = total, time_ns()
            step = recorder.step
            if total > high.get(step, 0):
                high[step] = total

        def pack(t: torch.Tensor) -> Any:
            kind = type(t)
            if kind is plain:
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if not ptr:  # meta, empty or freed: no memory, but still a graph
                    return alias(t)
                index = t.get_device()
                key = ptr if index < 0 else (t.device.type, index, ptr)
                # A parameter's storage (a weight's transpose): as autograd would keep it;
                # such a view's grad_fn leads to the parameter, never back to the saver.
                if key in live.param_keys:
                    return t
                acquire()
                try:
                    if released:  # freed handles first: a freed address may be reused
                        drain()
                    entry = storages.get(key)
                    if entry is not None:
                        entry[0] += 1
                    else:
                        base = t._base  # a view of a parameter of another model
                        if base is not None and is_parameter(base):
                            return t
                        count(key, storage.nbytes())
                finally:
                    release()
                # graph_free(t), inlined: the handle must not hold t's grad_fn (a cycle
                # when an op saves its own output; see saved_tensors.py).
                return saved((t.detach() if t.requires_grad else t, key, live))
            if kind is parameter:
                return t
            return self._pack_subclass(t, count)

        return pack

    def _pack_subclass(self, t: torch.Tensor, count: Any) -> Any:
        """The pack hook for a tensor subclass (a DTensor: its local shards' storages)."""
        if self._is_parameter(t):
            return t
        live = self._live
        found = [
            (key, inner.untyped_storage().nbytes())
            for inner in local_tensors(t)
            if (entry := storage_key(inner)) is not None
            and (key := pack_key(entry)) not in live.param_keys
        ]
        if not found:
            return graph_free(t)
        with live.lock:
            live.drain()
            for key, nbytes in found:
                entry = live.storages.get(key)
                if entry is None:
                    count(key, nbytes)
                else:
                    entry[0] += 1
        return SavedMany((graph_free(t), tuple(key for key, _ in found), live))
