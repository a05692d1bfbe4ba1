"""Pipeline parallelism with ``torch.distributed.pipelining``.

The model is cut into ``pp`` stages of consecutive blocks (torchtitan's manual split: copy
the whole model, delete what this stage does not own; the survivors keep their names). The
first stage keeps the input end (embeddings / input layer), the last the output end (final
LayerNorm, head). A schedule (GPipe: all forwards, then all backwards; 1F1B: alternate
once the pipe is full) pushes ``microbatches`` slices of the batch through the stages,
with activations sent point to point. Gradients are averaged over micro-batches by the
schedule (``scale_grads``).

A GPT's head is tied to its token embedding, but the two now live on different stages:
each keeps a copy and, after backward, the two copies' gradients are summed between the
first and last stage (``sync_tied``, what Megatron does with its embedding group), so both
copies take identical optimizer steps and stay equal.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from workbench.errors import ConfigError, ParallelError, choices_error
from workbench.parallel.collectives import all_reduce
from workbench.parallel.dp import average_gradients

__all__ = ["SCHEDULES", "PipelineModule", "apply_pp", "split_stage"]

SCHEDULES: dict[str, type] = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}

_INPUT_END = ("inp", "tok_emb", "pos_emb")
_OUTPUT_END = ("out", "ln_f", "head")


def split_stage(model: nn.Module, stage_index: int, num_stages: int) -> nn.Module:
    """A copy of ``model`` holding only stage ``stage_index``'s blocks and ends."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleDict):
        raise ParallelError(
            f"cannot split {type(model).__name__} into pipeline stages: it needs a "
            "'layers' ModuleDict of blocks (workbench.parallel.models.MLP and GPT have one)"
        )
    n = len(layers)
    if num_stages > n or n % num_stages:
        valid = [d for d in range(1, n + 1) if n % d == 0]
        raise ParallelError(f"pp={num_stages} does not divide n_layers={n}; choose pp from {valid}")
    per = n // num_stages
    keep = {str(i) for i in range(stage_index * per, (stage_index + 1) * per)}
    stage = copy.deepcopy(model)
    for name in list(stage.layers.keys()):
        if name not in keep:
            del stage.layers[name]
    if stage_index > 0:
        for name in _INPUT_END:
            if hasattr(stage, name):
                setattr(stage, name, None)
    if stage_index < num_stages - 1:
        for name in _OUTPUT_END:
            if hasattr(stage, name):
                setattr(stage, name, None)
    return stage


class PipelineModule(nn.Module):
    """This rank's stage plus its schedule. ``parameters()`` are the stage's only.

    Run a whole forward+backward with ``run(inputs, targets)``; ``forward`` is not used
    because a pipeline does not have a per-rank forward that returns the model output.
    """

    def __init__(
        self,
        stage_module: nn.Module,
        stage: PipelineStage,
        schedule: Any,
        *,
        group: dist.ProcessGroup,
        tied_group: dist.ProcessGroup | None,
        dp_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        # Replicas of this stage (pp x dp without FSDP): gradients averaged in sync_dp().
        self.dp_group = dp_group
        self.stage_module = stage_module
        self.stage = stage
        self.schedule = schedule
        self.group = group
        self.tied_group = tied_group
        self.microbatch_losses: list[torch.Tensor] = []

    @property
    def is_first(self) -> bool:
        return bool(self.stage.is_first)

    @property
    def is_last(self) -> bool:
        return bool(self.stage.is_last)

    def forward(self, *args: Any) -> Any:
        raise ParallelError(
            "a PipelineModule runs through its schedule: call .run(inputs, targets)"
        )

    def run(self, inputs: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
        """Forward and backward of every micro-batch; per-micro-batch losses on the last stage."""
        losses: list[torch.Tensor] = []
        if self.is_first and self.is_last:
            self.schedule.step(inputs, target=targets, losses=losses)
        elif self.is_first:
            self.schedule.step(inputs)
        elif self.is_last:
            self.schedule.step(target=targets, losses=losses)
        else:
            self.schedule.step()
        self.microbatch_losses = losses
        return losses

    def tied_parameter(self) -> nn.Parameter | None:
        """The copy of the tied embedding/head weight this stage holds (first or last stage)."""
        if self.tied_group is None:
            return None
        emb = getattr(self.stage_module, "tok_emb", None)
        head = getattr(self.stage_module, "head", None)
        if emb is not None:
            return emb.weight
        return head.weight if head is not None else None

    def sync_tied(self) -> None:
        """Sum the tied weight's gradient between the first and the last stage."""
        p = self.tied_parameter()
        if p is not None and p.grad is not None:
            all_reduce(p.grad, self.tied_group)

    def sync_dp(self) -> None:
        """Average the stage's gradients over its data-parallel replicas (the sync phase).

        Not DDP: its reducer is built for one backward per forward and fails on a
        schedule's several micro-batch backwards; one flat all-reduce after them is exact.
        """
        if self.dp_group is not None:
            average_gradients(self.stage_module.parameters(), self.dp_group)


def apply_pp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    microbatches: int = 2,
    schedule: str = "gpipe",
    recorder: Any | None = None,
    stage_module: nn.Module | None = None,
    dp_group: dist.ProcessGroup | None = None,
) -> PipelineModule:
    """Cut ``model`` into one stage per rank of the 1-D ``mesh`` and build the schedule.

    With a ``recorder``, every micro-batch's forward and backward is marked as a phase span
    ``forward[mb=i]`` / ``backward[mb=i]`` inside the step's phases. ``stage_module``:
    this rank's stage when already cut (``pp_split.split_by_points``) instead of by blocks.
    ``dp_group``: the stage's data-parallel replicas, whose gradients ``sync_dp`` averages.
    """
    if schedule not in SCHEDULES:
        raise choices_error("schedule", schedule, sorted(SCHEDULES))
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ConfigError(f"microbatches={microbatches!r} is not valid; it must be an integer >= 1")
    group = mesh.get_group()
    num_stages = dist.get_world_size(group)
    index = dist.get_rank(group)
    if stage_module is None:
        stage_module = split_stage(model, index, num_stages)
    device = next(model.parameters()).device
    stage = PipelineStage(stage_module, index, num_stages, device, group=group)
    if recorder is not None:
        _mark_microbatches(stage, recorder)
    sched = SCHEDULES[schedule](stage, n_microbatches=microbatches, loss_fn=loss_fn)
    tied_group = _tied_group(model, mesh, index, num_stages)
    return PipelineModule(
        stage_module, stage, sched, group=group, tied_group=tied_group, dp_group=dp_group
    )


def _tied_group(
    model: nn.Module, mesh: DeviceMesh, index: int, num_stages: int
) -> dist.ProcessGroup | None:
    tied = getattr(getattr(model, "config", None), "tie_head", False)
    if not tied or num_stages == 1:
        return None
    ranks = mesh.mesh.flatten().tolist()
    if num_stages > 2 and dist.get_world_size() != num_stages:
        # new_group below is collective over the whole world; with several pipelines
        # (pp x dp / tp) each would ask for a different group at the same call.
        raise ParallelError(
            f"a model with a tied embedding/head (config.tie_head) and pp={num_stages} > 2 "
            f"cannot be combined with dp or tp (world_size={dist.get_world_size()}); use "
            "pp=2, pp alone, or an untied head"
        )
    # new_group is collective over the default group: every rank creates it, members use it.
    group = mesh.get_group() if num_stages == 2 else dist.new_group([ranks[0], ranks[-1]])
    return group if index in (0, num_stages - 1) else None


def _mark_microbatches(stage: PipelineStage, recorder: Any) -> None:
    """Wrap the stage's per-chunk forward/backward so each emits a micro-batch span."""
    for method, phase in (("forward_one_chunk", "forward"), ("backward_one_chunk", "backward")):
        original = getattr(stage, method)

        @functools.wraps(original)
        def wrapped(
            chunk_id: int, *args: Any, _o: Any = original, _p: str = phase, **kw: Any
        ) -> Any:
            with recorder.phase_span(f"{_p}[mb={chunk_id}]"):
                return _o(chunk_id, *args, **kw)

        setattr(stage, method, wrapped)
