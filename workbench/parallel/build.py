"""From a ``RunSpec`` to a ready ``TrainStep``, the single-device reference, full parameters.

``build_train_step`` uses the already-initialised default process group (none for
``strategy='single'``): gloo on CPU, or NCCL with ``cuda:LOCAL_RANK``. Every rank builds the
same full model from the seed, then the strategy shards or wraps it, so all strategies start
from identical parameters and the single-device run is a true reference.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from workbench.errors import ConfigError, ParallelError
from workbench.parallel.collectives import gather_objects
from workbench.parallel.cp import ContextShard, shard_sequence
from workbench.parallel.data import batches, make_dataset, make_loader
from workbench.parallel.dims import ParallelDims
from workbench.parallel.ep import ExpertParallel
from workbench.parallel.fsdp import zero_optimizer
from workbench.parallel.megatron import (
    ColumnParallelLinear,
    apply_megatron,
    megatron_full_state_dict,
)
from workbench.parallel.models import build_model, get_config, loss_fn_for
from workbench.parallel.options import apply_checkpointing, check_precision, compute_dtype
from workbench.parallel.parallelize import layout_for, parallelize
from workbench.parallel.pp import PipelineModule
from workbench.parallel.run_spec import RunSpec
from workbench.parallel.seeding import rank_seed, seed_everything
from workbench.parallel.step import TrainStep
from workbench.trace.recorder import Recorder

__all__ = [
    "SAMPLES_PER_EPOCH_IN_BATCHES",
    "build_train_step",
    "full_state_dict",
    "pipeline_stage",
    "reference_losses_and_params",
]

# The synthetic data set holds this many global batches: an epoch is that many steps.
SAMPLES_PER_EPOCH_IN_BATCHES = 32

# Strategies whose bf16 comes from FSDP's MixedPrecisionPolicy rather than autocast.
_POLICY_PRECISION = ("zero2", "fsdp", "dp_tp")


def _default_device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def build_train_step(
    spec: RunSpec,
    *,
    recorder: Recorder | None = None,
    device: torch.device | str | None = None,
) -> TrainStep:
    """A ``TrainStep`` for ``spec`` on this rank (call on every rank of the process group)."""
    distributed = spec.strategy != "single"
    dev = _resolve_device(spec, distributed, device)
    world = dist.get_world_size() if distributed else 1
    dims = spec.dims(world)
    dims.device_type = dev.type
    config = get_config(spec.model, seed=spec.seed)
    dims.validate_for(config)
    spec.check_batch(dims)
    rank = dist.get_rank() if distributed else 0
    recorder = recorder if recorder is not None else Recorder(rank)

    model = build_model(config)
    if spec.checkpointing:
        apply_checkpointing(model)
    model = model.to(dev)
    loss_fn = loss_fn_for(config)
    model, loss_group, loss_reduce = _apply_strategy(spec, model, dims, loss_fn, recorder)
    optimizer = _make_optimizer(spec, model, dims)

    dp_rank = dims.mesh.get_local_rank("dp") if dims.dp > 1 else 0
    dataset = make_dataset(config, spec.batch_size * SAMPLES_PER_EPOCH_IN_BATCHES, seed=spec.seed)
    # each sample's index travels with it (TrainStep.sample_ids; the step takes x, y only)
    dataset = TensorDataset(*dataset.tensors, torch.arange(len(dataset)))
    loader = make_loader(
        dataset, spec.batch_size // dims.dp, num_replicas=dims.dp, rank=dp_rank, seed=spec.seed
    )
    memory_tracer, comm_tracer = (
        _make_tracers(spec, model, optimizer, recorder) if spec.trace else (None, None)
    )
    source = batches(loader)
    if dims.cp > 1:  # this rank's share of each sequence (cp.py)
        source = shard_sequence(source, ContextShard.of(dims.submesh("cp").get_group()))
    step = TrainStep(
        model=model,
        optimizer=optimizer,
        batches=source,
        loss_fn=loss_fn,
        device=dev,
        recorder=recorder,
        grad_accum=spec.grad_accum,
        # FSDP casts through its MixedPrecisionPolicy; autocast on top would be redundant.
        precision="fp32" if spec.strategy in _POLICY_PRECISION else spec.precision,
        loss_group=loss_group,
        loss_reduce=loss_reduce,
        memory_tracer=memory_tracer,
        comm_tracer=comm_tracer,
        strategy=spec.strategy,
        loader=loader,
    )
    step.spec = spec
    seed_everything(rank_seed(spec.seed, stage=pipeline_stage(dims)))  # what the run draws
    return step


def pipeline_stage(dims: ParallelDims) -> int:
    """This rank's pipeline stage (0 without a pipeline): stages draw distinct streams."""
    return dims.mesh.get_local_rank("pp") if dims.pp > 1 else 0


def _resolve_device(
    spec: RunSpec, distributed: bool, device: torch.device | str | None
) -> torch.device:
    """The device this rank trains on (a process group is required for a distributed
    strategy; a single-device run stays on the CPU unless told otherwise)."""
    if distributed and not dist.is_initialized():
        raise ParallelError(
            f"strategy={spec.strategy!r} needs an initialised process group "
            "(torch.distributed.init_process_group, torchrun or %wb start); "
            "use strategy='single' without one"
        )
    dev = torch.device(device) if device is not None else _default_device()
    if not distributed and device is None:
        dev = torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    check_precision(spec.precision, dev)
    return dev


def _apply_strategy(
    spec: RunSpec, model: nn.Module, dims: ParallelDims, loss_fn: Any, recorder: Recorder
) -> tuple[nn.Module, dist.ProcessGroup | None, str]:
    """The wrapped model, the group the loss is reduced over for reporting, and how."""
    # Presets are shorthands for dimensions (``layout_for``), applied one dimension at a
    # time by ``parallelize``; only the hand-written Megatron view has its own branch.
    if spec.strategy == "megatron":
        return apply_megatron(model, dims.mesh.get_group()), None, "none"
    layout = layout_for(spec.strategy, dims.world_size, overlap=spec.overlap)
    done = parallelize(
        model,
        layout,
        dims,
        loss_fn=loss_fn,
        microbatches=spec.microbatches,
        schedule=spec.schedule,
        stages_per_rank=spec.stages_per_rank,
        recorder=recorder,
        param_dtype=_fsdp_dtype(spec),
    )
    return done.model, done.loss_group, done.loss_reduce


def _fsdp_dtype(spec: RunSpec) -> torch.dtype | None:
    return compute_dtype(spec.precision) if spec.precision != "fp32" else None


def _make_optimizer(spec: RunSpec, model: nn.Module, dims: ParallelDims) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if spec.optimizer == "sgd":
        cls: type[torch.optim.Optimizer] = torch.optim.SGD
        kwargs: dict[str, Any] = {"lr": spec.learning_rate, "momentum": 0.9}
    else:
        cls, kwargs = torch.optim.AdamW, {"lr": spec.learning_rate}
    if spec.strategy == "zero1":
        return zero_optimizer(params, cls, dims.mesh, **kwargs)
    return cls(params, **kwargs)


def _make_tracers(
    spec: RunSpec, model: nn.Module, optimizer: torch.optim.Optimizer, recorder: Recorder
) -> tuple[Any, Any]:
    from workbench.trace.comm import CommTracer
    from workbench.trace.memory import MemoryTracer

    inner = _inner_module(model)
    memory = MemoryTracer(inner, optimizer, recorder, per_module=spec.per_module)
    comm = CommTracer(recorder)
    memory.start()
    comm.start()
    if isinstance(model, DistributedDataParallel) and model.require_backward_grad_sync:
        comm.attach_ddp(model)  # overlapped DDP: its buckets, recorded at the dispatcher
    return memory, comm


def _inner_module(model: nn.Module) -> nn.Module:
    if isinstance(model, DistributedDataParallel | ExpertParallel):
        return model.module
    if isinstance(model, PipelineModule):
        return model.stage_module
    return model


def reference_losses_and_params(
    spec: RunSpec, steps: int, *, device: torch.device | str | None = None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final parameters of the single-device run on the same global batches.

    No accumulation, no checkpointing, no tracing: the plain run every strategy must match.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigError(f"steps={steps!r} is not valid; it must be an integer >= 0")
    single = replace(spec, strategy="single", grad_accum=1, checkpointing=False, trace=False)
    train_step = build_train_step(single, device=device)
    losses = [train_step.run_step() for _ in range(steps)]
    params = full_state_dict(train_step)
    if params is None:  # pragma: no cover - single always returns
        raise RuntimeError("single-device run returned no parameters")
    return losses, params


def full_state_dict(train_step: TrainStep) -> dict[str, torch.Tensor] | None:
    """Full (unsharded) parameters by their single-model names, on CPU.

    Collective for distributed strategies (call on every rank): the dict on global rank 0,
    None elsewhere. For ``single`` every process gets its own. A tied weight appears once,
    under its first name (``tok_emb.weight``).
    """
    model = train_step.model
    if train_step.strategy == "single":
        return _named_full(model)
    if isinstance(model, ExpertParallel):  # each rank holds its own experts
        parts = gather_objects(_named_full(model.module), dst=0)
        return None if parts is None else dict(sorted(_merged(parts).items(), key=_key_order))
    if isinstance(model, PipelineModule):
        local = _named_full(_inner_module(model.stage_module))  # a stage may be in DDP
        parts = gather_objects(local, dst=0)
        if parts is None:
            return None
        merged: dict[str, torch.Tensor] = {}
        for part in parts:
            merged.update(part)
        if model.ties_head or model.tied_group is not None or _tied(model.stage_module):
            merged.pop("head.weight", None)  # the last stage's copy of tok_emb.weight
        return dict(sorted(merged.items(), key=lambda kv: _order(kv[0])))
    if any(isinstance(m, ColumnParallelLinear) for m in model.modules()):
        full = {k: v.cpu() for k, v in megatron_full_state_dict(model).items()}
    else:
        full = _named_full(_inner_module(model))
    return full if dist.get_rank() == 0 else None


def _merged(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return merged


def _key_order(item: tuple[str, torch.Tensor]) -> tuple[int, str]:
    return _order(item[0])


def _tied(module: nn.Module) -> bool:
    return bool(getattr(getattr(module, "config", None), "tie_head", False))


def _named_full(module: nn.Module) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():  # de-duplicates tied parameters
        value = p.detach()
        if isinstance(value, DTensor):
            value = value.full_tensor()  # collective: every rank takes part
        out[name] = value.cpu().clone()
    return out


def _order(name: str) -> tuple[int, str]:
    """Input end first, blocks by index, output end last (stable, human order)."""
    head = name.split(".")[0]
    if head == "layers":
        return (1, f"{int(name.split('.')[1]):06d}{name}")
    return (2 if head in ("out", "ln_f", "head") else 0, name)
