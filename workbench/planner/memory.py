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

from workbench.planner.params import largest_unit, stage_params
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
    "stage_inflight",
    "state_bytes_per_param",
]

GRAD_BYTES = {"bf16": 2, "fp32": 4, "bf16+fp32": 6}

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


def _state(
    n: int, training: TrainingSpec, parallel: ParallelSpec, micro_batches: int
) -> tuple[int, int, int, int]:
    """(weights, grads, optimizer) bytes on the GPU and the bytes in host memory."""
    per = state_bytes_per_param(training)
    trainable = n if training.trainable == 1.0 else math.ceil(n * training.trainable)
    group, z = parallel.grad_group, parallel.zero
    # Reduce-scattering once per step means accumulating unsharded gradients until then.
    grads_sharded = z >= 2 and not (training.grad_sync == "per_step" and micro_batches > 1)
    w = _shard(n, group) if z >= 3 else n
    g = _shard(trainable, group) if grads_sharded else trainable
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
    flash_attention: bool = False,
    fused_swiglu: bool = False,
    cp: int = 1,
    fp8: bool = False,
) -> float:
    """Activation bytes one transformer layer keeps for backward (one micro-batch).

    With the defaults this is exactly sbh(34 + 5as/h); with TP t it is
    sbh(10 + 24/t + 5as/(ht)); with sequence parallel sbh(34/t + 5as/(ht)); selective
    recompute drops the as² terms; full recompute keeps only the layer input (2sbh).
    ``norm_stats`` is the number of fp32 per-token statistics each norm saves (LayerNorm 2:
    mean and rstd; RMSNorm 1); the paper ignores them (0). ``flash_attention`` stores no
    s x s tensor (an fp32 logsumexp per head and query instead), ``fused_swiglu`` keeps
    three SwiGLU tensors (gate, up, product) instead of four; ``cp`` splits the sequence
    (each rank keeps s/cp queries against all s keys). ``fp8`` saves the inputs of the
    linear layers (the two norm outputs, the attention projection's input and the second
    MLP matmul's input) as FP8, 1 byte, as Transformer Engine does for the weight
    gradient; the rest stays in ``dtype_bytes``.
    """
    d, m = dtype_bytes, (mask_bytes if dropout else 0)
    f = 4 * h if ffn is None else ffn
    kv = h if kv_hidden is None else kv_hidden
    s_kv = s
    s = s / cp
    sbh = s * b * h
    sp = tp if sequence_parallel else 1
    if recompute == "full":
        return d * sbh / sp
    # Kept whole on every TP rank unless sequence parallel shards it: the two norm inputs,
    # the two norm outputs (QKV and MLP inputs), the two dropout masks after the residual
    # branches, and the norms' statistics.
    lin = 1 if fp8 else d  # a linear layer's saved input
    replicated = (2 * d + 2 * lin + 2 * m) * sbh + 2 * norm_stats * _STAT_BYTES * s * b
    # Split by TP: Q and K (for QKᵀ), V, the attention-projection input, and the MLP
    # (GeLU: its input and output; SwiGLU: gate, up, silu(gate) and their product; the
    # last of each is the second matmul's input).
    mlp = (((2 if fused_swiglu else 3) if gated_mlp else 1) * d + lin) * s * b * f
    sharded = d * s * b * (h + kv) + d * s * b * kv + lin * sbh + mlp
    # Attention scores (as² per sample): softmax output, and with dropout its mask and
    # the dropped-out probabilities. FlashAttention keeps a logsumexp per head and query.
    if flash_attention:
        scores = _STAT_BYTES * a * s * b
    elif recompute == "selective":
        scores = 0.0
    else:
        scores = (2 * d + m if dropout else d) * a * s * s_kv * b
    return replicated / sp + (sharded + scores) / tp


def stage_inflight(parallel: ParallelSpec, micro_batches: int, stage: int) -> int:
    """Micro-batches whose activations pipeline stage ``stage`` holds at its peak.

    1F1B: min(p − stage, m); GPipe runs all forwards first: m; interleaved 1F1B
    (Megatron): 2(p − stage − 1) + (v − 1)p + 1 warm-up chunks of 1/v of the stage,
    ≈ p·(1 + (p−1)/(p·v)) micro-batches on stage 0 (rounded up).
    """
    p = parallel.pp
    if p == 1:
        return 1
    if parallel.schedule == "gpipe":
        return micro_batches
    if parallel.schedule == "interleaved":
        v = parallel.virtual_stages
        chunks = 2 * (p - stage - 1) + (v - 1) * p + 1
        return min(micro_batches, math.ceil(chunks / v))
    return min(p - stage, micro_batches)


def inflight_microbatches(parallel: ParallelSpec, micro_batches: int) -> int:
    """Micro-batches whose activations the first pipeline stage holds at its peak."""
    return stage_inflight(parallel, micro_batches, 0)


def model_layer_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    seq: int,
    *,
    recompute: str | None = None,
) -> float:
    """``layer_activation_bytes`` for this model and layout (``recompute`` overrides the
    training's: the step-time model uses the no-recompute count as memory traffic)."""
    d = training.dtype_bytes
    return layer_activation_bytes(
        s=seq,
        b=training.micro_batch,
        h=model.hidden,
        a=model.heads,
        tp=parallel.tp,
        sequence_parallel=parallel.sequence_parallel,
        recompute=training.recompute if recompute is None else recompute,
        dtype_bytes=d,
        mask_bytes=1 if hardware.kind == "gpu" else d,  # CPU dropout keeps its mask in the dtype
        dropout=training.dropout,
        ffn=model.ffn_size,
        kv_hidden=model.kv_hidden,
        gated_mlp=model.gated_mlp,
        norm_stats=2 if model.norm == "layernorm" else 1,
        flash_attention=training.flash_attention,
        fused_swiglu=training.fused_swiglu,
        cp=parallel.cp,
        fp8=training.fp8,
    )


def _edge_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    seq: int,
) -> tuple[float, float]:
    """(embedding, head) activation bytes of one micro-batch."""
    d, t = training.dtype_bytes, parallel.tp
    s, b = seq / parallel.cp, training.micro_batch
    mask = 1 if hardware.kind == "gpu" else d
    stats = 2 if model.norm == "layernorm" else 1
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
    return first, last


def stage_activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    seq: int,
    micro_batches: int,
) -> list[tuple[float, float]]:
    """(transformer layers, embedding + head) activation bytes of every pipeline stage."""
    per_layer = model_layer_bytes(model, training, parallel, hardware, seq)
    first, last = _edge_bytes(model, training, parallel, hardware, seq)
    stages = parallel.stage_layers(model.layers)
    p = len(stages)
    out = []
    for i, n in enumerate(stages):
        inflight = stage_inflight(parallel, micro_batches, i)
        edge = (first * inflight if i == 0 else 0.0) + (last if i == p - 1 else 0.0)
        out.append((per_layer * n * inflight, edge))
    return out


def activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    seq: int,
    micro_batches: int,
) -> tuple[float, float]:
    """(transformer layers, embedding + head) activation bytes on the stage holding most."""
    stages = stage_activation_bytes(
        model, training, parallel, hardware, seq=seq, micro_batches=micro_batches
    )
    return max(stages, key=lambda x: x[0] + x[1])


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
        }


def memory_breakdown(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    seq: int,
    micro_batches: int,
    activation_scale: tuple[float, float] = (1.0, 1.0),
) -> MemoryBreakdown:
    """Bytes per GPU on the most loaded pipeline stage (every stage is evaluated: the
    first holds the embedding and the most micro-batches, the last the head).

    ``activation_scale`` multiplies the (transformer layers, embedding + head) activation
    terms: the ratio of measured to formula bytes at a small scale (``wb.plan_from``)."""
    layout = parallel.stage_layers(model.layers)
    params = stage_params(model, parallel.tp, layout, vocab_parallel=parallel.vocab_parallel)
    layer_scale, edge_scale = activation_scale
    acts = [
        (layers * layer_scale, edge * edge_scale)
        for layers, edge in stage_activation_bytes(
            model, training, parallel, hardware, seq=seq, micro_batches=micro_batches
        )
    ]
    per = state_bytes_per_param(training)
    temporary = 0
    if parallel.zero >= 3 and parallel.grad_group > 1:
        # One unit (block or embedding) gathered in full, and its full gradient in the
        # compute dtype before the reduce-scatter (fp32 copies exist only as shards):
        # DeepSpeed's 4 bytes x largest layer for bf16.
        temporary += largest_unit(model, parallel.tp) * (per.weights + training.dtype_bytes)
    elif parallel.grad_group > 1:
        temporary += 2 * training.bucket_bytes  # gradient buckets in flight
    best: MemoryBreakdown | None = None
    for i, (n, (layers, head)) in enumerate(zip(params, acts, strict=True)):
        weights, grads, optimizer, host = _state(n, training, parallel, micro_batches)
        if training.offload_activations and layout[i]:
            # Two layers of one micro-batch stay (the one computing, the one in transit).
            held = layout[i] * stage_inflight(parallel, micro_batches, i)
            kept = min(layers, 2 * layers / held)
            host += math.ceil(layers - kept)
            layers = kept
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
        )
        if best is None or candidate.total > best.total:
            best = candidate
    assert best is not None  # at least one stage
    return best
