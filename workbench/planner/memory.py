"""Per-GPU memory: model state (weights, gradients, optimizer), activations, buffers.

Model state follows the bytes-per-parameter table in DESIGN.md and ZeRO's sharding
(stage 1 divides optimizer state over the data-parallel ranks, stage 2 also gradients,
stage 3 also weights). Activations follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), written term by term so the same code covers
the paper's setting (2-byte activations, 1-byte dropout masks, GeLU MLP of 4h) and the
runs the workbench measures (fp32, CPU masks, SwiGLU, grouped-query attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.planner.params import largest_unit, params_per_rank
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, TrainingSpec

__all__ = [
    "MemoryBreakdown",
    "StateBytes",
    "activation_bytes",
    "inflight_microbatches",
    "layer_activation_bytes",
    "memory_breakdown",
    "model_state_bytes",
    "state_bytes_per_param",
]

_ID_BYTES = 8  # int64 token ids (embedding input, loss targets)
_STAT_BYTES = 4  # norm statistics are fp32


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

    bf16-mixed: 2 w + 2 g (4 more with ``fp32_grads``) + 4 fp32 master + the optimizer's
    fp32 state; the master copy counts as optimizer state because ZeRO-1 shards it.
    """
    state = {"adam": 8, "adamw": 8, "sgd-momentum": 4, "sgd": 0}[training.optimizer]
    if training.precision == "fp32":
        return StateBytes(weights=4, grads=4, optimizer=state)
    return StateBytes(weights=2, grads=2 + (4 if training.fp32_grads else 0), optimizer=4 + state)


def _shard(count: int, parts: int) -> int:
    return -(-count // parts)  # ceil: uneven shards pad to the largest


def model_state_bytes(
    model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec
) -> tuple[int, int, int]:
    """(weights, grads, optimizer) bytes on the most loaded rank."""
    per = state_bytes_per_param(training)
    n = params_per_rank(model, parallel.tp, parallel.pp, vocab_parallel=parallel.vocab_parallel)
    trainable = n if training.trainable == 1.0 else math.ceil(n * training.trainable)
    dp, z = parallel.dp, parallel.zero
    w = _shard(n, dp) if z >= 3 else n
    g = _shard(trainable, dp) if z >= 2 else trainable
    o = _shard(trainable, dp) if z >= 1 else trainable
    return w * per.weights, g * per.grads, o * per.optimizer


def layer_activation_bytes(
    *,
    s: int,
    b: int,
    h: int,
    a: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    dtype_bytes: int = 2,
    mask_bytes: int = 1,
    dropout: bool = True,
    ffn: int | None = None,
    kv_hidden: int | None = None,
    gated_mlp: bool = False,
    norm_stats: int = 0,
) -> float:
    """Activation bytes one transformer layer keeps for backward (one micro-batch).

    With the defaults this is exactly sbh(34 + 5as/h); with TP t it is
    sbh(10 + 24/t + 5as/(ht)); with sequence parallel sbh(34/t + 5as/(ht)); selective
    recompute drops the as² terms; full recompute keeps only the layer input (2sbh).
    ``norm_stats`` is the number of fp32 per-token statistics each norm saves (LayerNorm 2:
    mean and rstd; RMSNorm 1); the paper ignores them (0).
    """
    d, m = dtype_bytes, (mask_bytes if dropout else 0)
    f = 4 * h if ffn is None else ffn
    kv = h if kv_hidden is None else kv_hidden
    sbh = s * b * h
    sp = tp if sequence_parallel else 1
    if recompute == "full":
        return d * sbh / sp
    # Kept whole on every TP rank unless sequence parallel shards it: the two norm inputs,
    # the two norm outputs (QKV and MLP inputs), the two dropout masks after the residual
    # branches, and the norms' statistics.
    replicated = (4 * d + 2 * m) * sbh + 2 * norm_stats * _STAT_BYTES * s * b
    # Split by TP: Q and K (for QKᵀ), V, the attention-projection input, and the MLP
    # (GeLU: its input and output; SwiGLU: gate, up, silu(gate) and their product).
    mlp = (4 if gated_mlp else 2) * d * s * b * f
    sharded = d * s * b * (h + kv) + d * s * b * kv + d * sbh + mlp
    # Attention scores (as² per sample): softmax output, and with dropout its mask and
    # the dropped-out probabilities.
    scores = 0.0 if recompute == "selective" else (2 * d + m if dropout else d) * a * s * s * b
    return replicated / sp + (sharded + scores) / tp


def inflight_microbatches(parallel: ParallelSpec, micro_batches: int) -> int:
    """Micro-batches whose activations the first pipeline stage holds at its peak.

    1F1B holds min(p, m); GPipe runs all forwards first and holds m; interleaved 1F1B
    holds about p·(1 + (p−1)/(p·v)) ≈ p warm-up micro-batch chunks (rounded up).
    """
    p = parallel.pp
    if p == 1:
        return 1
    if parallel.schedule == "gpipe":
        return micro_batches
    if parallel.schedule == "interleaved":
        v = parallel.virtual_stages
        return min(micro_batches, math.ceil(p * (1 + (p - 1) / (p * v))))
    return min(p, micro_batches)


def activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    seq: int,
    micro_batches: int,
) -> tuple[float, float]:
    """(transformer layers, embedding + head) activation bytes on the most loaded rank."""
    s, b, t, d = seq, training.micro_batch, parallel.tp, training.dtype_bytes
    mask = 1 if hardware.kind == "gpu" else d  # CPU dropout keeps its mask in the dtype
    stats = 2 if model.norm == "layernorm" else 1
    per_layer = layer_activation_bytes(
        s=s,
        b=b,
        h=model.hidden,
        a=model.heads,
        tp=t,
        sequence_parallel=parallel.sequence_parallel,
        recompute=training.recompute,
        dtype_bytes=d,
        mask_bytes=mask,
        dropout=training.dropout,
        ffn=model.ffn_size,
        kv_hidden=model.kv_hidden,
        gated_mlp=model.gated_mlp,
        norm_stats=stats,
    )
    layers_per_stage = math.ceil(model.layers / parallel.pp)
    inflight = inflight_microbatches(parallel, micro_batches)
    sp = t if parallel.sequence_parallel else 1
    sbh = s * b * model.hidden
    # Embedding: token ids (+ the embedding dropout mask when there is dropout).
    first = _ID_BYTES * s * b + (mask * sbh / sp if training.dropout else 0.0)
    # Head: final-norm input and stats, the output projection's input, the log-softmax
    # output (vocab-parallel under TP) and the loss targets.
    last = (
        2 * d * sbh / sp
        + stats * _STAT_BYTES * s * b
        + d * s * b * model.vocab_size / t
        + _ID_BYTES * s * b
    )
    if parallel.pp == 1:
        return per_layer * layers_per_stage, first + last
    first_stage = per_layer * layers_per_stage * inflight + first * inflight
    last_stage = per_layer * layers_per_stage + last
    if first_stage >= last_stage:
        return per_layer * layers_per_stage * inflight, first * inflight
    return per_layer * layers_per_stage, last


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
        }


def memory_breakdown(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    seq: int,
    micro_batches: int,
) -> MemoryBreakdown:
    weights, grads, optimizer = model_state_bytes(model, training, parallel)
    layers, head = activation_bytes(
        model, training, parallel, hardware, seq=seq, micro_batches=micro_batches
    )
    per = state_bytes_per_param(training)
    temporary = 0
    if parallel.zero >= 3 and parallel.dp > 1:
        # One unit (block or embedding) gathered in full, and its full gradient before
        # the reduce-scatter.
        temporary += largest_unit(model, parallel.tp) * (per.weights + per.grads)
    elif parallel.dp > 1:
        temporary += 2 * training.bucket_bytes  # gradient buckets in flight
    return MemoryBreakdown(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        activations=math.ceil(layers + head),
        temporary=temporary,
        capacity=hardware.usable,
        activations_layers=math.ceil(layers),
        activations_head=math.ceil(head),
    )
