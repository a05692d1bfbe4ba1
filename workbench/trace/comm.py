"""Every collective of one rank, with its bytes and its issue-to-completion time.

One hook point, so nothing is counted twice:

* Every collective - ``torch.distributed`` calls, DDP's gradient buckets, DTensor
  redistributions, FSDP2 gathers, functional collectives - is seen at the dispatcher
  (see ``intercept``: a kernel at the ``BackendSelect`` key of the collective ops only,
  so other ops cost nothing). The source (dtensor, fsdp, pipeline, ddp, zero,
  workbench, user) is read from the Python call stack at issue time, unless the issuing
  code names it with ``labelled(source)`` (the loss average is ``metrics``: reporting,
  not training traffic).
* DDP's reducer all-reduces its gradient buckets from C++, inside backward (DDP's default
  comm hook, or a built-in C++ one): a floating-point ``all_reduce`` issued with no Python
  frame between it and the autograd engine is one of those buckets (``source=
  "ddp-bucket"``). Recording them here, not through a Python comm hook, leaves DDP on its
  C++ path (no Python call per bucket) and leaves the model's one comm hook to the user.

Completion: a ``c10d`` op returns a ``Work``; its future's callback marks completion (on
gloo the callback runs before ``Work.wait()`` returns). A functional op completes when its
output is waited on (``wait_tensor``). On CUDA the duration comes from CUDA events: one
recorded on the issuing stream before the op, one after completion on a stream ordered
after the collective; the event is emitted once the GPU has passed the second event
(checked at every collective, at every phase boundary, and by ``flush()``).

While a collective is in flight it is registered with ``recorder.begin_flight`` so a hang
report can say which rank waits in which collective.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from workbench.errors import WorkbenchError
from workbench.trace.c10d_ops import OpInfo, group_size, op_bytes, tensor_leaves
from workbench.trace.comm_source import issuer as _source
from workbench.trace.comm_source import labelled
from workbench.trace.events import CommEvent, Event, PhaseSpan
from workbench.trace.intercept import add_listener, remove_listener
from workbench.trace.recorder import Recorder
from workbench.trace.storage import StorageKey, storage_key

__all__ = ["CommTracer", "labelled"]


class _Flight:
    """A collective between issue and completion."""

    __slots__ = (
        "bytes",
        "cuda_end",
        "cuda_start",
        "done",
        "group_size",
        "keys",
        "op",
        "phase",
        "source",
        "start",
        "step",
        "token",
    )

    def __init__(self, op: str, nbytes: int, group_size: int, source: str) -> None:
        self.op = op
        self.bytes = nbytes
        self.group_size = group_size
        self.source = source
        self.step = 0
        self.phase = ""
        self.start = 0
        self.token = -1
        self.cuda_start: Any = None
        self.cuda_end: Any = None
        self.keys: tuple[StorageKey, ...] = ()
        self.done = False

    def issue(self, step: int, phase: str, start: int, cuda_start: Any) -> None:
        """Issued at ``start`` (ns) in ``step``/``phase``; ``cuda_start`` is its stream's
        start event (None on CPU)."""
        self.step, self.phase, self.start, self.cuda_start = step, phase, start, cuda_start

    def open_as(self, token: int) -> None:
        """The recorder's token for it while in flight (``Recorder.begin_flight``)."""
        self.token = token

    def finish(self) -> bool:
        """Mark it complete; False when it already was (completion can be seen twice)."""
        if self.done:
            return False
        self.done = True
        return True

    def record_cuda_end(self) -> None:
        """Its end on the GPU stream: the duration is read from the two events later."""
        self.cuda_end = torch.cuda.Event(enable_timing=True)
        self.cuda_end.record()

    def wait_on(self, keys: tuple[StorageKey, ...]) -> None:
        """The output storages whose ``wait`` completes it (functional collectives)."""
        self.keys = keys


class CommTracer:
    """Records every collective of this rank as a ``CommEvent`` on ``recorder``.

    ``start()`` installs the process-wide interception (it stays until ``stop()``, across
    separate calls and on every thread); ``attach_ddp(model)`` adds DDP's buckets.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.errors: list[str] = []  # tracing failures never break training; kept here
        self._active = False
        self._lock = threading.Lock()
        self._waiting: dict[StorageKey, _Flight] = {}  # functional ops, by output storage
        self._cuda: list[_Flight] = []  # completed on the host, GPU time not yet known
        # flight -> (its c10d op's future, the future of our completion callback on it)
        # until that callback has run: the callback removes its own entry (a future holds
        # its collective's tensors, so an entry kept past completion would keep them; the
        # cell tracer, which sees no phase boundary, kept every one). See _settle.
        self._callbacks: dict[_Flight, tuple[Any, Any]] = {}
        self._unsubscribe: Any = None
        self._attached: list[weakref.ref[Any]] = []  # the DDP models attached

    def __repr__(self) -> str:
        return (
            f"CommTracer(active={self.active}, "
            f"ddp_models={sum(ref() is not None for ref in self._attached)}, "
            f"in_flight={len(self.recorder.in_flight)})"
        )

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> CommTracer:
        if self._active:
            return self
        self._active = True
        self._unsubscribe = self.recorder.subscribe(self._on_event)
        add_listener(self)
        return self

    def stop(self) -> None:
        if not self._active:
            return
        remove_listener(self)
        self._active = False
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        # Functional collectives never waited on while tracing end here.
        with self._lock:
            unwaited = list({id(f): f for f in self._waiting.values()}.values())
            self._waiting.clear()
        for flight in unwaited:
            self._complete(flight)
        self._settle()
        self.flush()

    def __enter__(self) -> CommTracer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def flush(self) -> None:
        """Wait for the GPU to pass every recorded completion event and emit those events
        (CUDA only; on CPU events are emitted at completion)."""
        self._poll_cuda(wait=True)

    # -- DDP ---------------------------------------------------------------------------

    def attach_ddp(self, ddp_model: torch.nn.parallel.DistributedDataParallel) -> None:
        """Say that ``ddp_model`` is traced by this tracer.

        Its gradient buckets are recorded at the dispatcher (``source="ddp-bucket"``)
        whenever a tracer is active, attached or not: nothing is registered on the model,
        so the user's own comm hook still can be (one that issues its all-reduces from
        Python is recorded as what it is, like any other collective).
        """
        if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
            raise WorkbenchError(
                f"attach_ddp needs a DistributedDataParallel model, got "
                f"{type(ddp_model).__name__}; wrap it with DistributedDataParallel first"
            )
        if not any(ref() is ddp_model for ref in self._attached):
            self._attached.append(weakref.ref(ddp_model))

    # -- internals ---------------------------------------------------------------------

    def _begin(self, flight: _Flight, cuda: bool) -> None:
        rec = self.recorder
        step, phase = rec.step, rec.phase
        cuda_start = None
        if cuda:
            cuda_start = torch.cuda.Event(enable_timing=True)
            cuda_start.record()
        flight.issue(step, phase, rec.now(), cuda_start)
        flight.open_as(
            rec.begin_flight(
                op=flight.op,
                bytes=flight.bytes,
                group_size=flight.group_size,
                source=flight.source,
                start=flight.start,
            )
        )

    def _complete(self, flight: _Flight) -> None:
        """Host-side completion; on CUDA records the end event and defers the emit."""
        if not flight.finish():
            return
        try:
            end = self.recorder.now()
            if flight.cuda_start is not None:
                flight.record_cuda_end()
                with self._lock:
                    self._cuda.append(flight)
                return
            self._emit(flight, end)
        except Exception as exc:  # never let tracing fail a collective
            self.errors.append(f"{flight.op}: {exc!r}")
            self.recorder.end_flight(flight.token)

    def _emit(self, flight: _Flight, end: int) -> None:
        self.recorder.end_flight(flight.token)
        self.recorder.emit(
            CommEvent(
                rank=self.recorder.rank,
                step=flight.step,
                op=flight.op,
                bytes=flight.bytes,
                group_size=flight.group_size,
                start=flight.start,
                end=max(end, flight.start),
                source=flight.source,
                phase=flight.phase,
            )
        )

    def _poll_cuda(self, wait: bool = False) -> None:
        if not self._cuda:
            return
        with self._lock:
            pending, self._cuda = self._cuda, []
        keep: list[_Flight] = []
        for flight in pending:
            if wait:
                flight.cuda_end.synchronize()
            elif not flight.cuda_end.query():
                keep.append(flight)
                continue
            elapsed_ms = flight.cuda_start.elapsed_time(flight.cuda_end)
            self._emit(flight, flight.start + int(elapsed_ms * 1e6))
        if keep:
            with self._lock:
                self._cuda[:0] = keep

    def _on_event(self, event: Event) -> None:
        if isinstance(event, PhaseSpan):
            self._settle()
            self._poll_cuda()

    def _settle(self) -> None:
        """Let the completion callbacks of the collectives that have completed run.

        A future releases its waiters before it runs its callbacks, so DDP's backward
        (which waits on its buckets' futures) can return before our callback recorded the
        bucket. At every phase boundary and at ``stop()``, the callback of each completed
        collective is waited for (``wait`` releases the GIL it needs); collectives still in
        flight are left to complete on their own.
        """
        if not self._callbacks:
            return
        with self._lock:
            pending = list(self._callbacks.items())
        for flight, (future, callback) in pending:
            if not callback.done() and future.done():
                callback.wait()
            if callback.done():  # added after its callback ran (one that raised before
                # marking the flight done): nothing else would remove it
                with self._lock:
                    self._callbacks.pop(flight, None)

    def _on_collective(self, info: OpInfo, call: Callable[[], Any], args: tuple) -> Any:
        """Called by the interception for one collective: time it, issue it, await it.

        A failure of the tracing itself is kept in ``errors``; the collective still runs.
        """
        try:
            self._poll_cuda()
            default_size = dist.get_world_size if dist.is_initialized() else (lambda: 1)
            size = group_size(info, args, default_size)
            leaves = _leaves(args)
            first = leaves[0] if leaves else None
            bucket = (
                info.name == "all_reduce"
                and not info.functional
                and first is not None
                and first.is_floating_point()
            )
            flight = _Flight(info.name, op_bytes(info, args, size), size, _source(bucket))
            self._begin(flight, cuda=first is not None and first.is_cuda)
        except Exception as exc:
            self.errors.append(f"{info.name}: {exc!r}")
            return call()
        try:
            out = call()
        except BaseException:
            self.recorder.end_flight(flight.token)
            raise
        try:
            if info.functional:
                self._await_tensor(flight, out)
            else:
                self._await_work(flight, out)
        except Exception as exc:
            self.errors.append(f"{info.name}: {exc!r}")
            self.recorder.end_flight(flight.token)
        return out

    def _await_tensor(self, flight: _Flight, out: Any) -> None:
        keys = tuple(
            k
            for t in _leaves(out)
            if isinstance(t, torch.Tensor) and (k := storage_key(t)) is not None
        )
        if not keys:
            self._complete(flight)
            return
        flight.wait_on(keys)
        with self._lock:
            for key in keys:
                self._waiting[key] = flight

    def _on_wait(self, tensor: Any) -> None:
        if not self._waiting or not isinstance(tensor, torch.Tensor):
            return
        key = storage_key(tensor)
        with self._lock:
            flight = self._waiting.pop(key, None) if key is not None else None
            if flight is not None:
                for other in flight.keys:
                    self._waiting.pop(other, None)
        if flight is not None:
            self._complete(flight)

    def _await_work(self, flight: _Flight, out: Any) -> None:
        from torch._C._distributed_c10d import Work

        boxed = out[-1] if isinstance(out, tuple | list) else out
        try:
            work = boxed if isinstance(boxed, Work) else Work.unbox(boxed)
            future = work.get_future()
        except (RuntimeError, TypeError, AttributeError):
            # Backends without futures: completion unknown, the event ends at issue.
            self._complete(flight)
            return

        def done(fut: Any) -> None:
            try:
                try:
                    fut.value()
                except Exception:  # the collective failed: say so before it ends
                    self.recorder.fail_flight(flight.token)
                self._complete(flight)
            finally:
                with self._lock:
                    self._callbacks.pop(flight, None)

        callback = future.then(done)  # runs ``done`` at once if the op already completed
        with self._lock:
            if not flight.done:  # else ``done`` has run (and found nothing to remove)
                self._callbacks[flight] = (future, callback)


def _leaves(tree: Any) -> list[Any]:
    return tensor_leaves(tree)
