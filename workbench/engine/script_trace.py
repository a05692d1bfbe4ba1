"""On the engines: a traced script run (``%wb run --trace``), memory included where it can be.

The run is one span of this rank's ``wb.traced`` recorder with its collectives recorded
(``traced.begin_cell``). A script keeps its model and optimizer to itself, but a
distributed script hands its model to ``DistributedDataParallel`` (the seed's third
migration change): while the script runs, DDP's constructor is wrapped so the model it
wraps gets a ``MemoryTracer`` at once (parameters; activations from then on) and DDP's
buckets are labelled as the stepper's are; every optimizer step of an optimizer over that
model's parameters (torch's global step hook) takes a memory sample, with gradients and
optimizer state, and counts a step. A script without DDP is traced for collectives only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["traced_script"]


class _ScriptMemory:
    """The memory tracer of the one DDP model a script builds first."""

    def __init__(self, recorder: Any, comm: Any | None) -> None:
        self.recorder = recorder
        self.comm = comm
        self.tracer: Any | None = None
        self.params: set[int] = set()

    def on_ddp(self, ddp_model: Any) -> None:
        from workbench.trace.memory import MemoryTracer

        if self.comm is not None:
            self.comm.attach_ddp(ddp_model)
        if self.tracer is None:  # the first model is the one followed
            self.params = {id(p) for p in ddp_model.module.parameters()}
            self.tracer = MemoryTracer(ddp_model.module, None, self.recorder)
            self.tracer.start(sample="start")

    def after_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self.tracer is None:
            return
        mine = any(id(p) in self.params for g in optimizer.param_groups for p in g["params"])
        if not mine:
            return
        if self.tracer.optimizer is not optimizer:
            self.tracer.set_optimizer(optimizer)
        self.tracer.sample(label="optimizer")
        self.recorder.step += 1

    def stop(self) -> None:
        if self.tracer is not None:
            self.tracer.sample(label="end")
            self.tracer.stop()
            self.tracer = None


@contextmanager
def traced_script(label: str) -> Iterator[None]:
    """The script's run as one traced span, its DDP model's memory sampled per step."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from workbench.engine import traced

    traced.begin_cell(label)
    cell = traced.current_cell()
    memory = _ScriptMemory(traced.trace_recorder(), getattr(cell, "comm_tracer", None))
    original = DistributedDataParallel.__init__

    def init(ddp_self: Any, *args: Any, **kwargs: Any) -> None:
        original(ddp_self, *args, **kwargs)
        memory.on_ddp(ddp_self)

    DistributedDataParallel.__init__ = init  # type: ignore[method-assign]
    handle = register_optimizer_step_post_hook(memory.after_step)
    try:
        yield
    finally:
        DistributedDataParallel.__init__ = original  # type: ignore[method-assign]
        handle.remove()
        try:
            memory.stop()
        finally:
            traced.end_cell()
