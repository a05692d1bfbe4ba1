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

Multi-stage schedules (``pp_schedules``: interleaved 1F1B, zero bubble, ZB-V, DualPipeV)
cut the model into ``pp * stages_per_rank`` stages and give each rank several, in a loop or
a V; this rank's stages are then one ``PipelineModule`` whose ``stage_module`` is a view of
all their parameters under the whole model's names (``_StageUnion``). In a V, rank 0
holds both the first and the last stage, so the tied weight's two copies are summed locally.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage

from workbench.errors import ConfigError, ParallelError, choices_error
from workbench.parallel.collectives import all_reduce
from workbench.parallel.dp import average_gradients
from workbench.parallel.pp_schedules import (
    SCHEDULES,
    SINGLE_STAGE,
    V_SHAPE,
    check_schedule,
    stage_indices,
)
from workbench.parallel.pp_stepping import IDLE, ActionGate, action_name, action_order

__all__ = ["SCHEDULES", "PipelineModule", "apply_pp", "split_stage"]

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
        stage_modules: list[nn.Module],
        stages: list[PipelineStage],
        schedule: Any,
        *,
        group: dist.ProcessGroup,
        tied_group: dist.ProcessGroup | None,
        dp_group: dist.ProcessGroup | None = None,
        ties_head: bool = False,
        gate: ActionGate | None = None,
        orders: dict[int, list[str]] | None = None,
        index: int = 0,
    ) -> None:
        super().__init__()
        # Stepping the schedule one action at a time (pp_stepping): the gate the stages'
        # actions wait at, and this rank's actions in the order they run (every pipeline
        # rank's count too: a rank with fewer is idle until the longest is done).
        self.gate = gate if gate is not None else ActionGate()
        orders = orders or {}
        self.order = list(orders.get(index, []))
        self.longest = max((len(o) for o in orders.values()), default=0)
        # Replicas of this stage (pp x dp without FSDP): gradients averaged in sync_dp().
        self.dp_group = dp_group
        self.stage_modules = list(stage_modules)  # this rank's stages, in stage order
        # One module for everything that reads "this rank's parameters" (optimizer,
        # tracers, full_state_dict): the stage itself, or a view of all its stages.
        self.stage_module = (
            stage_modules[0] if len(stage_modules) == 1 else _StageUnion(stage_modules)
        )
        self.stages = list(stages)
        self.stage = stages[0]
        self.schedule = schedule
        self.group = group
        self.tied_group = tied_group
        self.ties_head = ties_head  # the model ties its head to its embedding
        self.microbatch_losses: list[torch.Tensor] = []

    @property
    def is_first(self) -> bool:
        return any(s.is_first for s in self.stages)

    @property
    def is_last(self) -> bool:
        return any(s.is_last for s in self.stages)

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

    def padded_order(self) -> list[str]:
        """This rank's actions, then ``idle`` until the rank with the most is done."""
        return self.order + [IDLE] * (self.longest - len(self.order))

    def tied_parameters(self) -> list[nn.Parameter]:
        """The copies of the tied embedding/head weight this rank's stages hold (the first
        stage's embedding, the last stage's head; both on rank 0 in a V)."""
        if not self.ties_head:
            return []
        found = []
        for module in self.stage_modules:
            for name in ("tok_emb", "head"):
                part = getattr(module, name, None)
                if part is not None:
                    found.append(part.weight)
        return found

    def sync_tied(self) -> None:
        """Sum the tied weight's gradient between the first and the last stage."""
        grads = [p.grad for p in self.tied_parameters() if p.grad is not None]
        if not grads:
            return
        total = grads[0].clone()
        for g in grads[1:]:  # both ends on this rank (a V): sum here
            total += g
        if self.tied_group is not None:
            all_reduce(total, self.tied_group)
        for g in grads:
            g.copy_(total)

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
    stages_per_rank: int | None = None,
    recorder: Any | None = None,
    stage_modules: list[nn.Module] | None = None,
    dp_group: dist.ProcessGroup | None = None,
) -> PipelineModule:
    """Cut ``model`` into ``stages_per_rank`` stages per rank of the 1-D ``mesh`` and build
    the schedule.

    With a ``recorder``, every action of the schedule is a phase span inside the step's
    phases: ``forward[mb=i]``, ``backward[mb=i]`` (a full backward), ``backward_input[mb=i]``
    and ``backward_weight[mb=i]`` (B and W of the zero-bubble schedules), with ``,stage=s``
    added when a rank holds several stages. ``stage_modules``: this rank's stages when
    already cut (``pp_split.split_by_points``), in ``pp_schedules.stage_indices`` order.
    ``dp_group``: the stages' data-parallel replicas, whose gradients ``sync_dp`` averages.
    """
    if schedule not in SCHEDULES:
        raise choices_error("schedule", schedule, list(SCHEDULES))
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ConfigError(f"microbatches={microbatches!r} is not valid; it must be an integer >= 1")
    group = mesh.get_group()
    pp = dist.get_world_size(group)
    index = dist.get_rank(group)
    v = check_schedule(schedule, stages_per_rank, microbatches, pp)
    num_stages = pp * v
    indices = stage_indices(schedule, index, pp, v)
    if stage_modules is None:
        stage_modules = [split_stage(model, i, num_stages) for i in indices]
    device, gate = next(model.parameters()).device, ActionGate()
    marks = {"gate": gate, "recorder": recorder, "several": v > 1}
    stages: list[PipelineStage] = [
        _ActionStage(m, i, num_stages, device, group=group, **marks)
        for m, i in zip(stage_modules, indices, strict=True)
    ]
    if schedule in SINGLE_STAGE:
        sched = SCHEDULES[schedule](stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    else:
        sched = SCHEDULES[schedule](stages, n_microbatches=microbatches, loss_fn=loss_fn)
    ties = bool(getattr(getattr(model, "config", None), "tie_head", False))
    last_on_first = schedule in V_SHAPE  # the V brings the last stage back to rank 0
    tied_group = None if last_on_first else _tied_group(model, mesh, index, pp)
    return PipelineModule(
        stage_modules,
        stages,
        sched,
        group=group,
        tied_group=tied_group,
        dp_group=dp_group,
        ties_head=ties and num_stages > 1,
        gate=gate,
        orders=action_order(sched, schedule in SINGLE_STAGE, v > 1),
        index=index,
    )


class _StageUnion(nn.Module):
    """Several stages' parameters under the whole model's names (``layers.0`` from the
    first stage, ``layers.3`` and ``head`` from the last, ...). Not run: each stage runs
    through its own ``PipelineStage``; this is what the optimizer, the tracers and
    ``full_state_dict`` read. The stages' submodules are shared, never copied or changed."""

    def __init__(self, stages: list[nn.Module]) -> None:
        super().__init__()
        for stage in stages:
            _union_into(self, stage)

    def forward(self, *args: Any) -> Any:
        raise ParallelError("a pipeline rank's stages run through their schedule, not here")


def _union_into(target: nn.Module, source: nn.Module) -> None:
    for name, child in source.named_children():
        if child is None or not any(True for _ in child.parameters()):
            continue
        mine = target._modules.get(name)
        if mine is None:
            target.add_module(name, child)
            continue
        if not isinstance(mine, _Container):  # seen in an earlier stage: merge both
            merged = _Container()
            _union_into(merged, mine)
            target._modules[name] = merged
            mine = merged
        _union_into(mine, child)


class _Container(nn.Module):
    """A plain holder of submodules found under the same name in several stages."""


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


class _ActionStage(PipelineStage):
    """A stage whose per-chunk F, B and W each wait at ``gate`` when the schedule is stepped
    action by action (``pp_stepping``) and, with a ``recorder``, emit a span named for its
    action. A subclass rather than methods set on a built stage: the stage owns its calls."""

    def __init__(
        self, *args: Any, gate: ActionGate, recorder: Any | None, several: bool, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self._gate, self._recorder, self._several = gate, recorder, several

    def _action(self, kind: str, chunk_id: int, run: Callable[[], Any]) -> Any:
        name = action_name(kind, chunk_id, self.stage_index, self._several)
        self._gate.enter(name)
        try:
            if self._recorder is None:
                out = run()
                self._gate.sample(name)
                return out
            with self._recorder.phase_span(name):
                out = run()
                self._gate.sample(name)  # inside the span: the sample is the action's
                return out
        finally:
            # After the span has restored the recorder's phase: the engine's thread, woken
            # here, goes on to its next phase and sets its own.
            self._gate.leave(name)

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kw: Any) -> Any:
        parent = super().forward_one_chunk
        return self._action("forward", fwd_chunk_id, lambda: parent(fwd_chunk_id, *args, **kw))

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kw: Any) -> Any:
        kind = "backward" if kw.get("full_backward", True) else "backward_input"
        parent = super().backward_one_chunk
        return self._action(kind, bwd_chunk_id, lambda: parent(bwd_chunk_id, *args, **kw))

    def backward_weight_one_chunk(self, bwd_chunk_id: int, *args: Any, **kw: Any) -> Any:
        parent = super().backward_weight_one_chunk
        return self._action(
            "backward_weight", bwd_chunk_id, lambda: parent(bwd_chunk_id, *args, **kw)
        )
