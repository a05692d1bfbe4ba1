"""The engine-side step machine: one training step, whole or phase by phase.

Phases, in order: ``data`` (next batch, to device), ``forward``, ``backward``, ``sync``,
``optimizer``. Each runs inside ``recorder.phase_span`` (a ``PhaseSpan``) and ends with a
memory sample; the loss is emitted as ``Metric(name="loss")`` after the optimizer.

Where the communication happens, per strategy (phases are always all present, so every
rank and every strategy shows the same five columns; a phase with nothing to do is an
empty span, not a missing one):

- dp, ``overlap=False``: backward computes local gradients only; ``sync`` all-reduces them.
- dp, ``overlap=True`` and zero1: DDP all-reduces gradient buckets *during* backward;
  ``sync`` holds no gradient traffic.
- zero2 / fsdp: parameters are all-gathered in forward (and again in backward for fsdp),
  gradients reduce-scattered during backward; ``sync`` holds no gradient traffic.
- tp / megatron: all-reduces of activations inside forward and backward.
- pp: the schedule interleaves forward and backward of the micro-batches. Phase by phase,
  each of this rank's schedule actions is a phase of its own (``forward[mb=i]``,
  ``backward[mb=i]``, ``backward_input`` / ``backward_weight`` for zero-bubble schedules,
  ``,stage=s`` with several stages per rank; ``idle`` where this rank has none left), in
  the order its schedule runs them, so ranks stand at different actions (``pp_stepping``)
  and a memory sample follows each action. A whole step (``run_step`` from a step boundary)
  runs the schedule in ``forward`` (nested spans per action, as the bubble is measured) with
  ``backward`` empty. ``sync`` sums the tied embedding/head gradient of the end stages.

With ``grad_accum = k > 1`` the forward/backward pair repeats k times as
``forward[mb=i]``, ``backward[mb=i]``; DDP and FSDP communicate only on the last one.

Every strategy's ``sync`` also averages the loss over the ranks that hold different parts
of the batch (a 4-byte all-reduce), so the reported loss is the global batch's loss on
every rank, comparable with a single-device run.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workbench.errors import ConfigError, ParallelError
from workbench.parallel.collectives import all_reduce
from workbench.parallel.dp import DeferredSyncDDP
from workbench.parallel.ep import ExpertParallel
from workbench.parallel.options import autocast
from workbench.parallel.pp import PipelineModule
from workbench.parallel.pp_stepping import IDLE, is_action
from workbench.trace.comm import labelled
from workbench.trace.events import PHASES, Metric
from workbench.trace.recorder import Recorder

__all__ = ["PHASES", "TrainStep"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# Steps whose sample indices are kept: enough to check a resize skipped and repeated no
# sample, without growing by a list a step over a 100k-step run.
_SAMPLE_IDS_KEPT = 1000


class TrainStep:
    """Holds model, optimizer, data iterator, recorder and tracers; runs steps by phase."""

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        batches: Iterator[tuple[torch.Tensor, ...]],
        loss_fn: LossFn,
        device: torch.device | str = "cpu",
        recorder: Recorder | None = None,
        grad_accum: int = 1,
        precision: str = "fp32",
        loss_group: dist.ProcessGroup | None = None,
        loss_reduce: str = "mean",
        memory_tracer: Any | None = None,
        comm_tracer: Any | None = None,
        strategy: str = "single",
        loader: Any | None = None,
        loss_mean_group: dist.ProcessGroup | None = None,
    ) -> None:
        if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
            raise ConfigError(f"grad_accum={grad_accum!r} is not valid; it must be an integer >= 1")
        if loss_reduce not in ("mean", "sum", "none"):
            raise ConfigError(
                f"loss_reduce={loss_reduce!r} is not valid; choose 'mean', 'sum' or 'none'"
            )
        self.model = model
        self.optimizer = optimizer
        self.batches = batches
        self.loss_fn = loss_fn
        self.device = torch.device(device)
        self.recorder = recorder if recorder is not None else Recorder(_global_rank())
        self.grad_accum = grad_accum
        self.precision = precision
        self.loss_group = loss_group
        self.loss_reduce = loss_reduce
        # Then averaged over this group: the data-parallel replicas of a pipeline.
        self.loss_mean_group = loss_mean_group
        self.memory_tracer = memory_tracer
        self.comm_tracer = comm_tracer
        self.strategy = strategy
        # The DataLoader behind ``batches`` (when known), so a checkpoint can restore the
        # data position; ``data_position`` counts the batches taken so far.
        self.loader = loader
        self.data_position = 0
        self.sample_ids: dict[int, list[int]] = {}  # step -> the dataset indices it took
        self.spec: Any | None = None  # the RunSpec, when built by build_train_step
        self.last_loss: float | None = None
        # Every step's loss (NaN before a restored step), 8 bytes a step: the recorder lets
        # its events go once the client pulled them, and the equivalence check needs them all.
        self.losses: array[float] = array("d")
        self._step = 0
        self._cursor = 0
        self._plan = self._phase_plan()
        self._micro: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._loss: torch.Tensor | None = None
        self._loss_sum = torch.zeros((), device=self.device)

    def __repr__(self) -> str:
        return (
            f"TrainStep(strategy={self.strategy!r}, step={self._step}, phase={self.phase!r}, "
            f"last_loss={self.last_loss})"
        )

    @property
    def pipeline(self) -> PipelineModule | None:
        return self.model if isinstance(self.model, PipelineModule) else None

    @property
    def step(self) -> int:
        """Number of completed optimizer steps (the index of the step in progress)."""
        return self._step

    @property
    def phase(self) -> str:
        """The phase that ``run_phase`` will run next."""
        return self._plan[self._cursor]

    @property
    def phases(self) -> list[str]:
        """This machine's phase sequence for one step."""
        return list(self._plan)

    def _phase_plan(self) -> list[str]:
        if isinstance(self.model, PipelineModule):
            return ["data", *self.model.padded_order(), "sync", "optimizer"]
        if self.grad_accum == 1:
            return list(PHASES)
        pairs = [f"{p}[mb={i}]" for i in range(self.grad_accum) for p in ("forward", "backward")]
        return ["data", *pairs, "sync", "optimizer"]

    # -- driving -------------------------------------------------------------------------

    def run_phase(self) -> str:
        """Run the next phase; returns its name."""
        name = self._plan[self._cursor]
        if self.pipeline is not None and is_action(name):
            self._pipeline_action(name)
        else:
            self._run_span(name)
        self._cursor = (self._cursor + 1) % len(self._plan)
        return name

    def _run_span(self, name: str) -> None:
        with self.recorder.phase_span(name, step=self._step):
            self._dispatch(name)
            if self.memory_tracer is not None:
                self.memory_tracer.sample(label=name)
        if name == "optimizer":
            self._emit_loss()
            self._step += 1
            self.recorder.step = self._step

    def run_step(self) -> float:
        """Run the rest of the current step (all of it when at a step boundary); the loss."""
        pipe = self.pipeline
        if pipe is not None and self._cursor == 0:
            for name in PHASES:  # the whole schedule in ``forward``, not gated
                self._run_span(name)
        else:
            if pipe is not None and is_action(self._plan[self._cursor]):
                self._cursor = self._plan.index("sync")  # the schedule finishes there
            while True:
                if self.run_phase() == "optimizer":
                    break
        if self.last_loss is None:  # pragma: no cover - set by the optimizer phase
            raise RuntimeError("step finished without a loss")
        return self.last_loss

    @property
    def at_step_boundary(self) -> bool:
        """True between steps (the next phase is ``data``): where checkpoints are taken."""
        return self._cursor == 0

    def restore_position(self, *, step: int, data_position: int, last_loss: float | None) -> None:
        """Continue as if ``step`` steps had run and ``data_position`` batches were taken
        (after loading model and optimizer state from a checkpoint)."""
        from workbench.parallel.data import batches

        if self.loader is None:
            raise ConfigError(
                "this TrainStep was made without its loader (loader=None), so its data "
                "position cannot be restored; build it with build_train_step or pass loader="
            )
        # A source that is not a DataLoader (the user's data callable) resumes itself.
        resume = getattr(self.loader, "resume", None)
        if callable(resume):
            self.batches = resume(data_position)
        else:
            self.batches = batches(self.loader, start=data_position)
        self.data_position = data_position
        self._step = step
        self.recorder.step = step
        del self.losses[step:]
        self.losses.extend([math.nan] * (step - len(self.losses)))
        self._close_schedule()
        self._cursor = 0
        self._micro = []
        self._loss = None
        self.last_loss = last_loss

    def close(self) -> None:
        """Stop the tracers (idempotent)."""
        self._close_schedule()
        for tracer in (self.memory_tracer, self.comm_tracer):
            if tracer is not None:
                tracer.stop()
        self.memory_tracer = self.comm_tracer = None

    def __enter__(self) -> TrainStep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- phases --------------------------------------------------------------------------

    def _dispatch(self, name: str) -> None:
        base, _, rest = name.partition("[mb=")
        index = int(rest.rstrip("]")) if rest else 0
        if base == "data":
            self._data()
        elif base == "forward":
            self._forward(index)
        elif base == "backward":
            self._backward(index)
        elif base == "sync":
            self._sync()
        else:
            self._optimizer_step()

    def _data(self) -> None:
        batch = next(self.batches)
        x, y = batch[:2]
        if len(batch) > 2:  # the built-in data sets carry each sample's index: proof that a
            # resized run skips and repeats no sample (``sample_ids``)
            self.sample_ids[self._step] = batch[2].tolist()
            self.sample_ids.pop(self._step - _SAMPLE_IDS_KEPT, None)  # bounded on long runs
        self.data_position += 1
        x, y = x.to(self.device), y.to(self.device)
        if self.pipeline is not None:
            self._micro = [(x, y)]  # the schedule cuts micro-batches itself
        else:
            self._micro = list(zip(x.chunk(self.grad_accum), y.chunk(self.grad_accum), strict=True))
        self._loss_sum = torch.zeros((), device=self.device)

    def _forward(self, index: int) -> None:
        pipe = self.pipeline
        if pipe is not None:
            x, y = self._micro[0]
            with autocast(self.precision, self.device):
                losses = pipe.run(x, y)
            if losses:
                self._set_pipeline_loss(losses)
            return
        last = index == self.grad_accum - 1
        self._set_gradient_sync(last)
        x, y = self._micro[index]
        with autocast(self.precision, self.device):
            out = self.model(x)
        loss = self.loss_fn(out, y)
        self._loss = loss / self.grad_accum
        self._loss_sum = self._loss_sum + loss.detach().float() / self.grad_accum

    def _pipeline_action(self, name: str) -> None:
        """One of this rank's schedule actions (or ``idle``): the schedule starts on its
        gate's thread at the first, and each lets exactly one action through."""
        pipe = self.pipeline
        assert pipe is not None
        if not pipe.gate.active:
            x, y = self._micro[0]
            tracer = self.memory_tracer
            sample = None if tracer is None else (lambda label: tracer.sample(label=label))

            def run() -> list[torch.Tensor]:
                hooks = tracer.on_this_thread() if tracer is not None else nullcontext()
                with hooks, autocast(self.precision, self.device):
                    return pipe.run(x, y)

            pipe.gate.start(run, after=sample)
        if name != IDLE:
            ran = pipe.gate.advance()
            if ran != name:  # the plan is the schedule's own order: a change in torch
                raise ParallelError(
                    f"pipeline rank expected to run {name!r} next but its schedule ran "
                    f"{ran!r}; stepping follows {type(pipe.schedule).__name__}'s order"
                )

    def _close_schedule(self) -> None:
        pipe = self.pipeline
        if pipe is not None:
            pipe.gate.close()

    def _set_gradient_sync(self, last: bool) -> None:
        """With accumulation, communicate only in the last micro-batch's backward."""
        if isinstance(self.model, DeferredSyncDDP):
            return  # never syncs in backward
        if isinstance(self.model, DistributedDataParallel):
            self.model.require_backward_grad_sync = last  # what no_sync() toggles
        elif hasattr(self.model, "set_requires_gradient_sync"):  # FSDP2
            self.model.set_requires_gradient_sync(last)

    def _set_pipeline_loss(self, losses: list[torch.Tensor]) -> None:
        self._loss_sum = torch.stack([loss.detach().float() for loss in losses]).mean()

    def _backward(self, index: int) -> None:
        if self.pipeline is not None or self._loss is None:
            return  # pipeline: backward ran inside the schedule (see the module docstring)
        self._loss.backward()
        self._loss = None

    def _sync(self) -> None:
        if isinstance(self.model, DeferredSyncDDP | ExpertParallel):
            self.model.sync()
        pipe = self.pipeline
        if pipe is not None:
            if pipe.gate.active:  # stepped action by action: the schedule ends here
                losses = pipe.gate.finish()
                if losses:
                    self._set_pipeline_loss(losses)
            pipe.sync_tied()
            pipe.sync_dp()
        if self.loss_reduce != "none" and self.loss_group is not None:
            # Reporting, not training traffic: kept apart from the data-parallel bytes the
            # planner predicts (the tracer records it with source "metrics").
            with labelled("metrics"):
                all_reduce(self._loss_sum, self.loss_group, average=self.loss_reduce == "mean")
                if self.loss_mean_group is not None:
                    all_reduce(self._loss_sum, self.loss_mean_group, average=True)

    def _optimizer_step(self) -> None:
        self.optimizer.step()
        # Gradients freed here, so memory samples show them appear in backward and go.
        self.optimizer.zero_grad(set_to_none=True)
        self.last_loss = float(self._loss_sum)

    def _emit_loss(self) -> None:
        if self.last_loss is not None:
            del self.losses[self._step :]
            self.losses.extend([math.nan] * (self._step - len(self.losses)))
            self.losses.append(self.last_loss)
            self.recorder.emit(
                Metric(
                    rank=self.recorder.rank,
                    step=self._step,
                    name="loss",
                    value=self.last_loss,
                    t=self.recorder.now(),
                )
            )


def _global_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
