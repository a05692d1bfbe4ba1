"""Activation bytes: per transformer layer (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", term by term), at the embedding and the head,
and per pipeline stage with the micro-batches each stage holds at its peak.

Written term by term so the same code covers the paper's setting (2-byte activations,
1-byte dropout masks, GeLU MLP of 4h) and the runs the workbench measures (fp32, CPU masks,
SwiGLU, grouped-query attention, a TP plan that leaves attention whole).
"""

from __future__ import annotations

import math

from workbench.planner.placement import Placement
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, TrainingSpec

__all__ = [
    "activation_bytes",
    "chunk_inflight",
    "inflight_microbatches",
    "layer_activation_bytes",
    "model_layer_bytes",
    "moe_bytes",
    "ring_attention_bytes",
    "stage_activation_bytes",
    "stage_inflight",
    "stage_layout",
]

_ID_BYTES = 8  # int64 token ids (embedding input, loss targets)
_STAT_BYTES = 4  # norm statistics are fp32


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
    attn_tp: int | None = None,  # default: tp
    mlp_tp: int | None = None,
    cp_rank: int | None = None,
    experts: int = 0,
    top_k: int = 2,
    ep: int = 1,
) -> float:
    """Activation bytes one transformer layer keeps for backward (one micro-batch).

    With the defaults this is exactly sbh(34 + 5as/h); with TP t it is
    sbh(10 + 24/t + 5as/(ht)); with sequence parallel sbh(34/t + 5as/(ht)); selective
    recompute drops the as² terms; full recompute keeps only the layer input (2sbh).
    ``norm_stats``: fp32 per-token statistics per norm (LayerNorm 2, RMSNorm 1; the paper
    0). ``flash_attention``: no s x s tensor (an fp32 logsumexp per head and query);
    ``fused_swiglu``: three SwiGLU tensors, not four; ``cp`` splits the sequence (s/cp
    queries per rank against all s keys). ``fp8`` saves the linear layers'
    inputs (norm outputs, attention projection and second MLP matmul inputs) in 1 byte,
    as Transformer Engine does. ``attn_tp`` / ``mlp_tp``: each part's split (1: whole).
    ``cp_rank``: this rank's place in the context-parallel ring (default the last, which
    holds the most; see ``ring_attention_bytes``), used when ``cp > 1`` without FlashAttention.
    ``experts`` > 0: the MLP is a mixture of experts, ``top_k`` per token, split over ``ep``
    ranks (``moe_bytes``).
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
    per_token = (((2 if fused_swiglu else 3) if gated_mlp else 1) * d + lin) * f
    if experts:
        mlp = moe_bytes(s * b, h=h, d=d, lin=lin, mlp=per_token, experts=experts, k=top_k, ep=ep)
    else:
        mlp = per_token * s * b
    attn = d * s * b * (h + kv) + d * s * b * kv + lin * sbh
    if flash_attention:
        scores = _STAT_BYTES * a * s * b  # a logsumexp per head and query
    elif cp > 1:  # the ring's blocks replace Q, K, V and the scores (no dropout in the ring)
        attn = ring_attention_bytes(s=s, b=b, h=h, a=a, kv=kv, d=d, cp=cp, cp_rank=cp_rank)
        attn += lin * sbh
        scores = 0.0
    else:  # as² per sample
        scores = _score_bytes(d, m, recompute, dropout) * a * s * s_kv * b
    at, mt = (tp if attn_tp is None else attn_tp), (tp if mlp_tp is None else mlp_tp)
    return replicated / sp + (attn + scores) / at + mlp / mt


def ring_attention_bytes(
    *, s: float, b: int, h: int, a: int, kv: int, d: int, cp: int, cp_rank: int | None
) -> float:
    """What ring attention (``parallel/cp.py``) keeps for backward on ring position
    ``cp_rank`` (default ``cp - 1``), ``s`` the local sequence: rank r attends to the
    n = r + 1 blocks of keys that are not in its future, and for each keeps the key/value
    block it received (2·s·b·kv), the reshaped copy of its queries the block's matmul saves
    (s·b·h), the block's exponentiated scores (a·s²·b) and 3 per-query statistics (max,
    sum and its rescale: a·s·b each); once, the combined output the normalisation divides
    (s·b·h) and the final denominator (a·s·b). Each in the dtype. Measured on gpt-tiny:
    within 1% (cp=2, both ranks)."""
    n = cp if cp_rank is None else min(cp_rank, cp - 1) + 1
    per_block = d * (s * b * (2 * kv + h) + a * s * s * b + 3 * a * s * b)
    return n * per_block + d * (s * b * h + a * s * b)


def moe_bytes(
    tokens: float, *, h: int, d: int, lin: int, mlp: float, experts: int, k: int, ep: int
) -> float:
    """What a dropless top-k mixture of experts (``parallel/ep.py``) keeps for backward, for
    ``tokens`` tokens on this rank: every token's expert rows (k per token; under expert
    parallel the rows a rank's experts receive, k per token on average over the ranks), each
    with its copy of the token (the experts' input) and the expert MLP's own (``mlp`` per
    row, as a dense MLP per token); the router's probabilities (one per expert), the top-k
    indices and weights, their sum and the renormalised weights, the sort order; for the
    combine the rows' indices, their weights and two copies of the expert outputs; under
    expert parallel (``ep`` > 1) also the regrouping index and the rows received before it.
    The input's norm output is the dense count's. Measured with hooks on moe-tiny: exact
    without expert parallel; with it, off by the routing's skew between ranks (k per token
    is the mean)."""
    rows = tokens * k
    routing = tokens * (experts * d + k * _ID_BYTES + d + k * d + k * _ID_BYTES)
    combine = rows * (_ID_BYTES + d + 2 * h * d)
    exchange = rows * (_ID_BYTES + lin * h) if ep > 1 else 0.0
    return rows * (mlp + lin * h) + routing + combine + exchange


def _score_bytes(dtype_bytes: int, mask_bytes: int, recompute: str, dropout: bool) -> int:
    """Bytes per s x s attention-score element a layer keeps without FlashAttention: the
    softmax output, with dropout its mask and the dropped-out probabilities; none under
    selective recompute, which recomputes them."""
    if recompute == "selective":
        return 0
    return 2 * dtype_bytes + mask_bytes if dropout else dtype_bytes


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


def chunk_inflight(
    chunks: tuple[int, ...], pp: int, stage: int, micro_batches: int
) -> tuple[int, int, int]:
    """Interleaved 1F1B (Megatron) on ``stage`` with virtual chunks of ``chunks`` blocks:
    (block x micro-batch activations held at the peak, forwards of its first chunk held,
    of its last chunk). The peak holds the warm-up's 2(p − stage − 1) + (v − 1)p forwards
    and the steady state's one more, taken in Megatron's order (p micro-batches through
    chunk 0, then through chunk 1, ...), so a chunk with no block (Llama 3's
    embedding-only and head-only chunks) adds none."""
    v = len(chunks)
    warm = min(micro_batches * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
    order = [(n // pp) % v for n in range(warm)]
    return sum(chunks[c] for c in order), order.count(0), order.count(v - 1)


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
    placement: Placement | None = None,
    cp_rank: int | None = None,
) -> float:
    """``layer_activation_bytes`` for this model and layout (``recompute`` overrides the
    training's: the step-time model uses the no-recompute count as memory traffic; a
    ``placement`` says which parts of a block its TP plan splits)."""
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
        attn_tp=placement.attn_tp if placement is not None else None,
        mlp_tp=placement.mlp_tp if placement is not None else None,
        cp_rank=cp_rank,
        experts=model.experts,
        top_k=model.top_k,
        ep=parallel.ep,
    )


def _edge_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    seq: int,
    placement: Placement | None = None,
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
    # output (split by vocabulary when the head is) and the loss targets.
    vt = placement.vocab_tp if placement is not None else t if parallel.vocab_parallel else 1
    last = (
        2 * d * sbh / sp
        + stats * _STAT_BYTES * s * b
        + d * s * b * model.vocab_size / vt
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
    placement: Placement | None = None,
    cp_rank: int | None = None,
) -> list[tuple[float, float]]:
    """(transformer layers, embedding + head) activation bytes of every pipeline stage
    (``cp_rank``: the rank's place in the context-parallel ring; default the busiest)."""
    per_layer = model_layer_bytes(
        model, training, parallel, hardware, seq, placement=placement, cp_rank=cp_rank
    )
    first, last = _edge_bytes(model, training, parallel, hardware, seq, placement)
    stages = stage_layout(model, parallel, placement)
    p = len(stages)
    out = []
    interleaved = parallel.schedule == "interleaved" and placement is not None
    chunks = placement.chunks if interleaved and placement is not None else None
    for i, n in enumerate(stages):
        if chunks is not None:
            held, firsts, lasts = chunk_inflight(chunks[i], p, i, micro_batches)
        else:
            inflight = stage_inflight(parallel, micro_batches, i)
            held, firsts, lasts = n * inflight, inflight, inflight
        # The head's activations too are held per micro-batch in flight (GPipe keeps all
        # m on the last stage; 1F1B one).
        edge = (first * firsts if i == 0 else 0.0) + (last * lasts if i == p - 1 else 0.0)
        out.append((per_layer * held, edge))
    return out


def stage_layout(
    model: ModelSpec, parallel: ParallelSpec, placement: Placement | None = None
) -> tuple[int, ...]:
    """Transformer layers per pipeline stage: the placement's (as built), else the
    layout's balanced or first/last-stage split of the model's layers."""
    return placement.layers if placement is not None else parallel.stage_layers(model.layers)


def activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    seq: int,
    micro_batches: int,
    placement: Placement | None = None,
) -> tuple[float, float]:
    """(transformer layers, embedding + head) activation bytes on the stage holding most."""
    stages = stage_activation_bytes(
        model, training, parallel, hardware, seq=seq, micro_batches=micro_batches,
        placement=placement,
    )  # fmt: skip
    return max(stages, key=lambda x: x[0] + x[1])
