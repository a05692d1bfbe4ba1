"""``Traced``: the memory and communication tracers on a hand-written training loop.

::

    with Traced(model, optimizer, recorder=rec) as t:
        for x, y in loader:
            with t.phase("forward"):
                loss = loss_fn(model(x), y)
            with t.phase("backward"):
                loss.backward()
            with t.phase("optimizer"):
                opt.step(); opt.zero_grad()
            t.step(loss=loss)

The whole block is one span (``name``); phases marked inside are spans of their own, each
closed with a memory sample, so the same figures and Perfetto export as the stepper's work
on the recorder's events. ``step(loss=...)`` emits the loss as a metric and advances the
step counter. Without a model only collectives and spans are recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from workbench.errors import WorkbenchError
from workbench.trace.events import Metric
from workbench.trace.recorder import Recorder

__all__ = ["Traced"]


def _inner(model: Any) -> Any:
    """The user's module under a DDP / pipeline wrapper (what owns the parameters)."""
    for attr in ("module", "stage_module"):
        inner = getattr(model, attr, None)
        if inner is not None and hasattr(inner, "parameters"):
            return inner
    return model


class Traced:
    """Attach tracers to the user's objects for the duration of a ``with`` block."""

    def __init__(
        self,
        model: Any | None = None,
        optimizer: Any | None = None,
        *,
        recorder: Recorder,
        name: str = "traced",
        comm: bool = True,
        per_module: bool = False,
        on_enter: Callable[[], None] | None = None,
        on_exit: Callable[[], None] | None = None,
        shared_comm: Any | None = None,
    ) -> None:
        if model is not None and not hasattr(model, "parameters"):
            raise WorkbenchError(
                f"traced(model=...) needs a torch.nn.Module, got {type(model).__name__}"
            )
        self.model = model
        self.optimizer = optimizer
        self.recorder = recorder
        self.name = name
        self.comm = comm
        self.per_module = per_module
        self._on_enter, self._on_exit = on_enter, on_exit
        # comm=False inside an enclosing traced block: its CommTracer records for both
        # (two stacked tracers would double the cost); DDP's hook is attached to it.
        self._shared_comm = shared_comm
        self.memory_tracer: Any | None = None
        self.comm_tracer: Any | None = None
        self._span: contextlib.AbstractContextManager[None] | None = None
        self._entered = False  # on_enter ran: on_exit is owed

    def __repr__(self) -> str:
        return (
            f"Traced(name={self.name!r}, step={self.recorder.step}, "
            f"events={len(self.recorder)}, active={self._span is not None})"
        )

    def __enter__(self) -> Traced:
        if self._span is not None:
            raise WorkbenchError("this traced block is already active; it cannot be re-entered")
        try:
            # This block's CommTracer starts before ``on_enter`` pauses the engine's cell
            # tracer (and stops after ``on_exit`` resumes it), so the dispatcher
            # interception stays installed throughout instead of being removed and
            # installed again twice per block.
            if self.comm:
                from workbench.trace.comm import CommTracer

                self.comm_tracer = CommTracer(self.recorder).start()
            if self._on_enter is not None:
                self._on_enter()
                self._entered = True
            if self.model is not None:
                from workbench.trace.memory import MemoryTracer

                self.memory_tracer = MemoryTracer(
                    _inner(self.model), self.optimizer, self.recorder, per_module=self.per_module
                )
                self.memory_tracer.start(sample="start")  # one parameter walk for both
            self._attach_ddp()
            self._span = self.recorder.phase_span(self.name)
            self._span.__enter__()
        except BaseException:
            self._stop()
            raise
        return self

    def _attach_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        tracer = self.comm_tracer if self.comm_tracer is not None else self._shared_comm
        if isinstance(self.model, DistributedDataParallel) and tracer is not None:
            tracer.attach_ddp(self.model)  # its buckets are recorded at the dispatcher

    def __exit__(self, *exc: object) -> None:
        try:
            if self._span is not None:
                self._span.__exit__(None, None, None)
            if self.memory_tracer is not None:
                self.memory_tracer.sample(label="end")
        finally:
            self._span = None
            self._stop()

    def _stop(self) -> None:
        memory, comm = self.memory_tracer, self.comm_tracer
        self.memory_tracer = self.comm_tracer = None
        entered, self._entered = self._entered, False
        try:
            if memory is not None:
                memory.stop()
        finally:
            try:
                if entered and self._on_exit is not None:
                    self._on_exit()
            finally:
                if comm is not None:
                    comm.stop()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark a phase (``forward``, ``backward``, ...): a span ending in a memory sample."""
        if not isinstance(name, str) or not name:
            raise WorkbenchError(f"phase name {name!r} is not valid; give a non-empty string")
        with self.recorder.phase_span(name):
            yield
            if self.memory_tracer is not None:
                self.memory_tracer.sample(label=name)

    def step(self, loss: Any | None = None) -> int:
        """End a training step: emit ``loss`` (a number or a 0-d tensor) and count the step."""
        if loss is not None:
            value = float(loss.detach()) if hasattr(loss, "detach") else float(loss)
            self.recorder.emit(
                Metric(
                    rank=self.recorder.rank,
                    step=self.recorder.step,
                    name="loss",
                    value=value,
                    t=self.recorder.now(),
                )
            )
        self.recorder.step += 1
        return self.recorder.step

    def sample(self, label: str = "") -> Any:
        """A memory sample now (None without a model)."""
        return self.memory_tracer.sample(label=label) if self.memory_tracer is not None else None
