"""A training step for the user's own model, data, loss and optimizer.

``UserRun`` holds the factories (plain callables, already unpickled on this rank) and the
``Layout``; ``build_user_train_step`` makes the same ``TrainStep`` the built-in models get,
so phases, memory by category, collectives and figures work unchanged:

- ``model()`` is called on every rank under the same seed, so every rank (and the
  single-device reference) starts from identical parameters; then ``parallelize`` applies
  the layout one dimension at a time.
- ``data`` is a map-style ``Dataset`` (or a callable returning one): it is sharded over the
  data-parallel ranks with ``DistributedSampler``, the global batch ``batch_size`` split
  evenly, so the union of the ranks' batches at step i is the single-device batch at step
  i. Or a callable ``data(dp_rank, dp_size)`` returning an iterable of this rank's batches.
  Each batch is ``(inputs, targets, ...)``.
- ``loss(output, targets)`` returns a scalar mean loss.
- ``optimizer(params)`` returns a ``torch.optim.Optimizer`` (default: AdamW, lr 1e-3). With
  ``zero=1`` it is rebuilt as a ``ZeroRedundancyOptimizer`` of the same class and defaults.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from workbench.errors import ConfigError, ParallelError
from workbench.parallel.build import _default_device, full_state_dict, pipeline_stage
from workbench.parallel.data import batches, make_loader
from workbench.parallel.dims import ParallelDims
from workbench.parallel.fsdp import zero_optimizer
from workbench.parallel.options import check_precision, compute_dtype
from workbench.parallel.parallelize import Layout, check_zero_optimizer, parallelize
from workbench.parallel.pp import PipelineModule
from workbench.parallel.seeding import rank_seed, seed_everything
from workbench.parallel.step import TrainStep
from workbench.parallel.user_checkpointing import apply_user_checkpointing, describe
from workbench.parallel.user_options import UserOptions, int_at_least
from workbench.trace.recorder import Recorder

__all__ = [
    "UserRun",
    "build_user_model",
    "build_user_train_step",
    "shard_indices",
    "user_reference",
]


@dataclass(kw_only=True, frozen=True)
class UserRun(UserOptions):
    """One run of the user's model: the factories (plain callables, unpickled on this
    rank), the layout, and the options it shares with the client's ``UserSpec``."""

    model: Callable[[], nn.Module]
    data: Any
    loss: Callable[[Any, Any], torch.Tensor]
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None
    layout: Layout = field(default_factory=Layout)
    strategy: str = "custom"  # the preset name the layout came from, for display

    def __post_init__(self) -> None:
        for name in ("model", "loss"):
            if not callable(getattr(self, name)):
                raise ConfigError(
                    f"{name}={getattr(self, name)!r} is not valid; it must be a callable"
                )
        if self.optimizer is not None and not callable(self.optimizer):
            raise ConfigError(
                f"optimizer={self.optimizer!r} is not valid; give a callable params -> "
                "torch.optim.Optimizer, e.g. lambda p: torch.optim.AdamW(p, lr=1e-3)"
            )
        if not (isinstance(self.data, Dataset) or callable(self.data)):
            raise ConfigError(
                f"data={type(self.data).__name__} is not valid; give a torch Dataset, a "
                "callable returning one, or a callable (dp_rank, dp_size) -> batches"
            )
        if not isinstance(self.layout, Layout):
            raise ConfigError(f"layout={self.layout!r} is not valid; give a Layout")
        super().__post_init__()  # the shared options, checked as before: last

    def checkpoint_fields(self) -> dict[str, Any]:
        """What a checkpoint's ``meta.json`` records of this run (JSON; the factories by
        name: they are code, not data, and never stored)."""
        layout = self.layout
        plan = None
        if layout.tp_plan is not None:
            plan = {
                k: v if isinstance(v, str) else type(v).__name__ for k, v in layout.tp_plan.items()
            }
        return {
            "model": _label(self.model),
            "optimizer": _label(self.optimizer) if self.optimizer is not None else None,
            "layout": {
                "dp": layout.dp,
                "tp": layout.tp,
                "pp": layout.pp,
                "zero": layout.zero,
                "overlap": layout.overlap,
                "tp_plan": plan,
                "pp_split": list(layout.pp_split) if layout.pp_split is not None else None,
            },
            "strategy": self.strategy,
            "batch_size": self.batch_size,
            "grad_accum": self.grad_accum,
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "stages_per_rank": self.stages_per_rank,
            "precision": self.precision,
            "checkpointing": describe(self.checkpointing),
            "seed": self.seed,
        }


def _label(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)


class _Replay:
    """The user's data callable as a source a checkpoint can resume: its data position is
    restored by calling the callable again and skipping the batches already taken, so it
    must give the same batches each time it is called (as a seeded generator does)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    def resume(self, start: int) -> Iterator[Any]:
        return itertools.islice(_checked_batches(iter(self.make())), start, None)


def build_user_model(run: UserRun) -> nn.Module:
    """``run.model()`` under ``run.seed`` (global RNG restored afterwards), checked, with
    ``run.checkpointing``'s blocks recomputed in backward."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(run.seed)
        model = run.model()
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"the model factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    if not any(True for _ in model.parameters()):
        raise ConfigError(f"the model factory's {type(model).__name__} has no parameters")
    apply_user_checkpointing(model, run.checkpointing)  # before sharding: paths unchanged
    return model


def _make_optimizer(run: UserRun, model: nn.Module, dims: ParallelDims) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if run.optimizer is None:
        optimizer: Any = torch.optim.AdamW(params, lr=1e-3)
    else:
        optimizer = run.optimizer(params)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(
            f"the optimizer factory returned {type(optimizer).__name__}, not a "
            "torch.optim.Optimizer"
        )
    if run.layout.zero == 1 and dims.dp > 1:
        check_zero_optimizer(optimizer)
        cls = type(optimizer)
        accepted = set(inspect.signature(cls.__init__).parameters)
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        return zero_optimizer(params, cls, dims.submesh("dp"), **defaults)
    return optimizer


def _data_source(run: UserRun, dims: ParallelDims, dp_rank: int) -> tuple[Any, Any]:
    """(batches iterator, the DataLoader when the data is a sharded Dataset)."""
    data = run.data
    make: Callable[[], Any] | None = None
    if not isinstance(data, Dataset):
        try:
            wants_rank = len(inspect.signature(data).parameters) >= 2
        except (TypeError, ValueError):
            wants_rank = False
        source = data

        def make() -> Any:
            return source(dp_rank, dims.dp) if wants_rank else source()

        data = make()
    if isinstance(data, Dataset):
        if not hasattr(data, "__len__"):
            raise ConfigError(
                f"data={type(data).__name__} has no len(); DistributedSampler shards "
                "map-style datasets only: give a callable (dp_rank, dp_size) -> batches"
            )
        per_rank = run.batch_size // dims.dp
        if len(data) < run.batch_size:  # type: ignore[arg-type]
            raise ConfigError(
                f"the dataset has {len(data)} samples, fewer than one global batch "  # type: ignore[arg-type]
                f"(batch_size={run.batch_size})"
            )
        loader = make_loader(
            data, per_rank, num_replicas=dims.dp, rank=dp_rank, seed=run.seed, shuffle=True
        )
        return batches(loader), loader
    if isinstance(data, Iterable):
        return _checked_batches(iter(data)), _Replay(make) if make is not None else None
    raise ConfigError(
        f"the data callable returned {type(data).__name__}; it must return a Dataset or an "
        "iterable of (inputs, targets) batches"
    )


def _checked_batches(source: Iterator[Any]) -> Iterator[Any]:
    count = 0
    for batch in source:
        if not isinstance(batch, tuple | list) or len(batch) < 2:
            raise ConfigError(
                f"batch {count} from the data callable is {type(batch).__name__}; each batch "
                "must be a tuple (inputs, targets, ...)"
            )
        count += 1
        yield batch
    raise ConfigError(f"the data callable's batches ran out after {count} batch(es)")


def build_user_train_step(
    run: UserRun,
    *,
    recorder: Recorder | None = None,
    device: torch.device | str | None = None,
    world_size: int | None = None,
) -> TrainStep:
    """A ``TrainStep`` for ``run`` on this rank (call on every rank of the process group).

    ``world_size=1`` builds the single-device reference even inside a process group, as
    does ``strategy='single'`` (one device on whichever rank builds it).
    """
    if world_size is None and run.strategy == "single":
        world_size = 1
    world, dev = _placement(world_size, device)
    distributed = world > 1
    check_precision(run.precision, dev)
    layout = run.layout if distributed else Layout(dp=1)
    dims = layout.dims(world)
    dims.device_type = dev.type
    run.check_batch(dims)
    rank = dist.get_rank() if distributed else 0
    recorder = recorder if recorder is not None else Recorder(rank)

    model = build_user_model(run).to(dev)
    fsdp_dtype = compute_dtype(run.precision) if run.precision != "fp32" else None
    wrapped = parallelize(
        model,
        layout,
        dims,
        loss_fn=run.loss,
        **run.pipeline_options(),
        recorder=recorder,
        param_dtype=fsdp_dtype,
    )
    optimizer = _make_optimizer(run, wrapped.model, dims)
    dp_rank = dims.mesh.get_local_rank("dp") if dims.dp > 1 else 0
    source, loader = _data_source(run, dims, dp_rank)
    memory, comm = _tracers(run, wrapped.model, optimizer, recorder) if run.trace else (None, None)
    step = TrainStep(
        model=wrapped.model,
        optimizer=optimizer,
        batches=source,
        loss_fn=run.loss,
        device=dev,
        recorder=recorder,
        grad_accum=run.grad_accum,
        precision="fp32" if layout.zero >= 2 and dims.dp > 1 else run.precision,
        loss_group=wrapped.loss_group,
        loss_reduce=wrapped.loss_reduce,
        memory_tracer=memory,
        comm_tracer=comm,
        strategy="single" if not distributed else f"user:{run.strategy}",
        loader=loader,
        loss_mean_group=wrapped.loss_mean_group,
    )
    step.spec = run
    seed_everything(rank_seed(run.seed, stage=pipeline_stage(dims)))  # what the run draws
    return step


def _placement(
    world_size: int | None, device: torch.device | str | None
) -> tuple[int, torch.device]:
    """The world this run spans (the process group's unless given) and this rank's device:
    the one given, else the rank's default when distributed, else the CPU (the
    single-device reference runs where a plain script would)."""
    world = (
        world_size
        if world_size is not None
        else (dist.get_world_size() if dist.is_initialized() else 1)
    )
    dev = (
        torch.device(device)
        if device is not None
        else (_default_device() if world > 1 else torch.device("cpu"))
    )
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return world, dev


def _tracers(
    run: UserRun, model: nn.Module, optimizer: torch.optim.Optimizer, recorder: Recorder
) -> tuple[Any, Any]:
    from workbench.trace.comm import CommTracer
    from workbench.trace.memory import MemoryTracer

    ddp = model.stage_module if isinstance(model, PipelineModule) else model
    inner = ddp.module if isinstance(ddp, DistributedDataParallel) else ddp
    memory = MemoryTracer(inner, optimizer, recorder, per_module=run.per_module).start()
    comm = CommTracer(recorder).start()
    if isinstance(ddp, DistributedDataParallel) and ddp.require_backward_grad_sync:
        comm.attach_ddp(ddp)  # a pipeline stage's DDP buckets too
    return memory, comm


def user_reference(
    run: UserRun, steps: int, *, device: torch.device | str | None = None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final parameters of the plain single-device run on the same global
    batches (no accumulation, no checkpointing, no tracing), to compare a parallel run
    against."""
    int_at_least("steps", steps, 0)
    single = replace(run, grad_accum=1, checkpointing=False, trace=False)
    step = build_user_train_step(single, device=device, world_size=1)
    losses = [step.run_step() for _ in range(steps)]
    params = full_state_dict(step)
    if params is None:  # pragma: no cover - single always returns
        raise ParallelError("single-device run returned no parameters")
    return losses, params


def shard_indices(train_step: TrainStep, epoch: int = 0) -> dict[str, Any]:
    """Which dataset indices this rank's sampler deals it in ``epoch`` (sharding check)."""
    loader = train_step.loader
    sampler = getattr(loader, "sampler", None)
    if sampler is None or not hasattr(sampler, "set_epoch"):
        return {"sharded": False, "indices": [], "replicas": 1, "rank": 0, "n": 0}
    previous = sampler.epoch
    sampler.set_epoch(epoch)
    indices = list(sampler)
    sampler.set_epoch(previous)  # the running epoch's order is read when it starts: restore
    return {
        "sharded": True,
        "indices": indices,
        "replicas": sampler.num_replicas,
        "rank": sampler.rank,
        "n": len(sampler.dataset),
    }
