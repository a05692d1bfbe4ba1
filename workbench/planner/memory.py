"""Per-GPU memory: model state (weights, gradients, optimizer), activations, buffers.

Model state follows the bytes-per-parameter table in DESIGN.md and ZeRO's sharding
(stage 1 divides optimizer state over the data-parallel ranks, stage 2 also gradients,
stage 3 also weights). Activations follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), in ``activations``. With a ``Placement``
(the parameters each stage holds as built) model state is counted parameter by parameter,
FSDP's padding and ZeRO-1's whole-parameter partition included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.errors import ConfigError
from workbench.planner.activations import (
    activation_bytes,
    inflight_microbatches,
    layer_activation_bytes,
    model_layer_bytes,
    stage_activation_bytes,
    stage_inflight,
    stage_layout,
)
from workbench.planner.params import largest_unit, stage_params
from workbench.planner.placement import Placement, zero1_shares
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, TrainingSpec

__all__ = [
    "GRAD_BYTES",
    "MemoryBreakdown",
    "StateBytes",
    "activation_bytes",
    "inflight_microbatches",
    "layer_activation_bytes",
    "memory_breakdown",
    "model_layer_bytes",
    "model_state_bytes",
    "rank_position",
    "stage_activation_bytes",
    "stage_inflight",
    "stage_layout",
    "state_bytes_per_param",
]

GRAD_BYTES = {"bf16": 2, "fp32": 4, "bf16+fp32": 6}


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter (weights for all, grads/optimizer for trainable ones)."""

    weights: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer


def state_bytes_per_param(training: TrainingSpec) -> StateBytes:
    """fp32: 4 w + 4 g + optimizer (adam 8, sgd-momentum 4, sgd 0).

    bf16-mixed: 2 w + gradients (bf16 2; fp32 4, Megatron's main_grad and DeepSpeed
    ZeRO-3's 18-byte accounting; both 6, with ``fp32_grads``) + 4 fp32 master + the
    optimizer's fp32 state; the master copy counts as optimizer state because ZeRO-1
    shards it.
    """
    state = {"adam": 8, "adamw": 8, "sgd-momentum": 4, "sgd": 0}[training.optimizer]
    if training.precision == "fp32":
        return StateBytes(weights=4, grads=4, optimizer=state)
    return StateBytes(weights=2, grads=GRAD_BYTES[training.grad_dtype], optimizer=4 + state)


def _shard(count: int, parts: int) -> int:
    return -(-count // parts)  # ceil: uneven shards pad to the largest


# ZeRO-Offload keeps fp32 gradients in host memory beside the master copy and the
# optimizer state (DeepSpeed's 16 = 4 grads + 4 params + 8 Adam bytes per parameter).
_HOST_GRAD_BYTES = 4


def _grads_sharded(training: TrainingSpec, parallel: ParallelSpec, micro_batches: int) -> bool:
    # Reduce-scattering once per step means accumulating unsharded gradients until then.
    return parallel.zero >= 2 and not (training.grad_sync == "per_step" and micro_batches > 1)


def _state(
    n: int,
    training: TrainingSpec,
    parallel: ParallelSpec,
    micro_batches: int,
    *,
    placement: Placement | None = None,
    stage: int = 0,
    dp_rank: int = 0,
) -> tuple[int, int, int, int]:
    """(weights, grads, optimizer) bytes on the GPU and the bytes in host memory; from the
    placement's pieces when there is one (stage ``stage``, data-parallel rank ``dp_rank``),
    else from ``n`` parameters."""
    per = state_bytes_per_param(training)
    group, z = parallel.grad_group, parallel.zero
    sharded = _grads_sharded(training, parallel, micro_batches)
    if placement is not None:
        w, g, o = placement.state_elements(stage, group, z, sharded, dp_rank)
        # A placement that marks frozen pieces already counts only the trainable ones.
        if training.trainable != 1.0 and placement.trainable(stage) == placement.params(stage):
            g, o = math.ceil(g * training.trainable), math.ceil(o * training.trainable)
    else:
        trainable = n if training.trainable == 1.0 else math.ceil(n * training.trainable)
        w = _shard(n, group) if z >= 3 else n
        g = _shard(trainable, group) if sharded else trainable
        o = _shard(trainable, group) if z >= 1 else trainable
    # FP8: Transformer Engine keeps an FP8 copy of each weight beside the bf16 one.
    weights = w * (per.weights + (1 if training.fp8 else 0))
    if training.offload_optimizer:  # streamed out per bucket: nothing stays on the GPU
        return weights, 0, 0, o * (_HOST_GRAD_BYTES + per.optimizer)
    return weights, g * per.grads, o * per.optimizer, 0


def model_state_bytes(
    model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec, micro_batches: int = 1
) -> tuple[int, int, int]:
    """(weights, grads, optimizer) GPU bytes on the rank with the most parameters."""
    stages = parallel.stage_layers(model.layers)
    n = max(stage_params(model, parallel.tp, stages, vocab_parallel=parallel.vocab_parallel))
    return _state(n, training, parallel, micro_batches)[:3]


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes per GPU by category, and whether they fit in ``capacity`` (usable bytes)."""

    weights: int
    grads: int
    optimizer: int
    activations: int
    temporary: int
    capacity: int
    activations_layers: int = 0
    activations_head: int = 0
    stage: int = 0  # the pipeline stage these bytes belong to (the most loaded one)
    host: int = 0  # bytes this GPU's rank keeps in host memory (offloaded state/activations)
    # The part of ``weights`` whose parameters are frozen (no gradient, no optimizer state):
    # a LoRA model's base weights, from the placement's flags or ``trainable`` < 1.
    frozen: int = 0

    @property
    def model_state(self) -> int:
        return self.weights + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.model_state + self.activations + self.temporary

    @property
    def headroom(self) -> int:
        """Usable bytes left (negative: short by that much)."""
        return self.capacity - self.total

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_dict(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "temporary": self.temporary,
            "total": self.total,
            "capacity": self.capacity,
            "headroom": self.headroom,
            "stage": self.stage,
            "host": self.host,
            "frozen": self.frozen,
        }


def rank_position(parallel: ParallelSpec, rank: int) -> tuple[int, int]:
    """(pipeline stage, data-parallel index) of global ``rank``: ranks are laid out TP
    innermost, then data (and context) parallel, then pipeline (the workbench's mesh order
    pp, dp, tp, and Megatron's)."""
    world = parallel.world
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ConfigError(f"rank={rank!r} is not valid; choose a rank in 0..{world - 1}")
    per_stage = world // parallel.pp
    return rank // per_stage, (rank % per_stage) // parallel.tp


def _ring_position(parallel: ParallelSpec, rank: int | None) -> int | None:
    """A rank's place in its context-parallel ring (cp inside dp: mesh order pp, dp, cp,
    tp): ring attention keeps more the later its tokens are. Without a rank, None: the
    last position, the busiest."""
    return None if rank is None else rank_position(parallel, rank)[1] % parallel.cp


def memory_breakdown(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    seq: int,
    micro_batches: int,
    activation_scale: tuple[float, float] = (1.0, 1.0),
    placement: Placement | None = None,
    rank: int | None = None,
) -> MemoryBreakdown:
    """Bytes per GPU on the most loaded pipeline stage (every stage is evaluated: the
    first holds the embedding and the most micro-batches, the last the head), or on
    global ``rank`` when given.

    ``activation_scale`` multiplies the (transformer layers, embedding + head) activation
    terms: the ratio of measured to formula bytes at a small scale (``wb.plan_from``).
    ``placement``: each stage's parameters as built, not counts from the dimensions."""
    layout = stage_layout(model, parallel, placement)
    params = _stage_params(model, parallel, layout, placement)
    cp_rank = _ring_position(parallel, rank)
    acts = [
        (layers * activation_scale[0], edge * activation_scale[1])
        for layers, edge in stage_activation_bytes(
            model, training, parallel, hardware, seq=seq, micro_batches=micro_batches,
            placement=placement, cp_rank=cp_rank,
        )
    ]  # fmt: skip
    temporary = _temporary(model, training, parallel)
    where = [rank_position(parallel, rank)] if rank is not None else None
    if where is None:
        where = [(i, _busiest_dp_rank(placement, parallel, i)) for i in range(len(layout))]
    best: MemoryBreakdown | None = None
    for i, dp_rank in where:
        weights, grads, optimizer, host = _state(
            params[i], training, parallel, micro_batches,
            placement=placement, stage=i, dp_rank=dp_rank,
        )  # fmt: skip
        layers, head = acts[i]
        if training.offload_activations and layout[i]:
            layers, offloaded = _offloaded(layers, layout[i], parallel, micro_batches, i)
            host += offloaded
        candidate = MemoryBreakdown(
            weights=weights,
            grads=grads,
            optimizer=optimizer,
            host=host,
            activations=math.ceil(layers + head),
            temporary=temporary,
            capacity=hardware.usable,
            activations_layers=math.ceil(layers),
            activations_head=math.ceil(head),
            stage=i,
            frozen=_frozen_weights(params[i], training, parallel, placement, i),
        )
        if best is None or candidate.total > best.total:
            best = candidate
    assert best is not None  # at least one stage
    return best


def _frozen_weights(
    n: int, training: TrainingSpec, parallel: ParallelSpec, placement: Placement | None, stage: int
) -> int:
    """Bytes of frozen weights on one rank of ``stage``, sharded as ``_state`` shards weights."""
    group, z = parallel.grad_group, parallel.zero
    if placement is not None and placement.trainable(stage) != placement.params(stage):
        elements = placement.frozen_elements(stage, group, z)
    else:  # from the count: ``n`` is the stage's parameters (the placement's, given one)
        frozen = n - (n if training.trainable == 1.0 else math.ceil(n * training.trainable))
        elements = _shard(frozen, group) if z >= 3 else frozen
    return elements * (state_bytes_per_param(training).weights + (1 if training.fp8 else 0))


def _stage_params(
    model: ModelSpec, parallel: ParallelSpec, layout: tuple[int, ...], placement: Placement | None
) -> tuple[int, ...]:
    if placement is not None:
        return tuple(placement.params(i) for i in range(placement.pp))
    return stage_params(model, parallel.tp, layout, vocab_parallel=parallel.vocab_parallel)


def _offloaded(
    layers: float, n: int, parallel: ParallelSpec, micro_batches: int, stage: int
) -> tuple[float, int]:
    """(layer activation bytes kept on the GPU, bytes offloaded to the host): two layers
    of one micro-batch stay (the one computing, the one in transit)."""
    held = n * stage_inflight(parallel, micro_batches, stage)
    kept = min(layers, 2 * layers / held)
    return kept, math.ceil(layers - kept)


def _temporary(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> int:
    per = state_bytes_per_param(training)
    if parallel.zero >= 3 and parallel.grad_group > 1:
        # One unit (block or embedding) gathered in full, and its full gradient in the
        # compute dtype before the reduce-scatter (fp32 copies exist only as shards):
        # DeepSpeed's 4 bytes x largest layer for bf16.
        return largest_unit(model, parallel.tp) * (per.weights + training.dtype_bytes)
    if parallel.grad_group > 1:
        return 2 * training.bucket_bytes  # gradient buckets in flight
    return 0


def _busiest_dp_rank(placement: Placement | None, parallel: ParallelSpec, stage: int) -> int:
    """The data-parallel rank of ``stage`` with the most optimizer state: ZeRO-1 places
    whole parameters, so its shares differ; every other stage is even (index 0)."""
    if placement is None or parallel.zero != 1 or parallel.grad_group == 1:
        return 0
    if not placement.zero1_whole:
        return 0
    shares = zero1_shares(placement.stages[stage], parallel.grad_group)
    return shares.index(max(shares))
