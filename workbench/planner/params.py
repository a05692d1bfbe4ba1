"""Parameter counts from transformer dimensions, and how TP/PP split them across ranks."""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.planner.specs import ModelSpec

__all__ = [
    "ParamCount",
    "count_params",
    "largest_unit",
    "matmul_params",
    "params_per_rank",
    "stage_params",
]


@dataclass(frozen=True, slots=True)
class ParamCount:
    """Parameters by place. ``layer_sharded`` is what Megatron TP splits (weight matrices
    and column-parallel biases); ``layer_replicated`` stays whole on every TP rank (norms,
    row-parallel biases)."""

    embedding: int
    positions: int
    layer_sharded: int
    layer_replicated: int
    layers: int
    final_norm: int
    head: int  # 0 when tied to the embedding

    @property
    def per_layer(self) -> int:
        return self.layer_sharded + self.layer_replicated

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.positions
            + self.layers * self.per_layer
            + self.final_norm
            + self.head
        )


def count_params(model: ModelSpec) -> ParamCount:
    h, kv, f, v = model.hidden, model.kv_hidden, model.ffn_size, model.vocab_size
    attn = 2 * h * h + 2 * h * kv  # q, o: h×h; k, v: h×kv
    mlp = (3 if model.gated_mlp else 2) * h * f
    sharded = attn + mlp
    norm = (2 if model.norm == "layernorm" else 1) * h
    replicated = 2 * norm
    if model.bias:
        sharded += h + 2 * kv + (2 * f if model.gated_mlp else f)  # column-parallel biases
        replicated += 2 * h  # attention-out and MLP-out (row-parallel) biases
    return ParamCount(
        embedding=v * h,
        positions=(model.seq or 0) * h if model.learned_positions else 0,
        layer_sharded=sharded,
        layer_replicated=replicated,
        layers=model.layers,
        final_norm=norm,
        head=0 if model.tied_embeddings else v * h,
    )


def stage_params(
    model: ModelSpec,
    tp: int = 1,
    stages: tuple[int, ...] | None = None,
    *,
    vocab_parallel: bool = True,
) -> tuple[int, ...]:
    """Parameters one rank of each pipeline stage holds (before ZeRO sharding).

    ``stages`` is the number of transformer layers per stage (default: one stage of all
    layers). Stage 0 holds the embedding (split by vocabulary over TP unless
    ``vocab_parallel`` is False) and positions, the last stage the final norm and the
    head; a tied head needs its own copy on the last stage when there are several stages.
    An explicit ``model.params`` scales the derived per-rank fraction, so with one stage
    and tp = 1 it is returned exactly.
    """
    layout = stages if stages is not None else (model.layers,)
    if tp == 1 and len(layout) == 1:
        return (model.n_params,)
    c = count_params(model)
    layer = c.layer_sharded // tp + c.layer_replicated
    vtp = tp if vocab_parallel else 1
    p = len(layout)
    out = []
    for i, n in enumerate(layout):
        rank = n * layer
        if i == 0:
            rank += c.embedding // vtp + c.positions
        if i == p - 1:
            head = c.head if p == 1 or c.head else c.embedding
            rank += c.final_norm + head // vtp
        out.append(rank if model.params is None else math.ceil(model.params * rank / c.total))
    return tuple(out)


def params_per_rank(
    model: ModelSpec,
    tp: int = 1,
    pp: int = 1,
    *,
    vocab_parallel: bool = True,
    stages: tuple[int, ...] | None = None,
) -> int:
    """Parameters held by the most loaded rank before ZeRO sharding (see ``stage_params``;
    ``pp`` balanced stages unless ``stages`` gives the layers per stage)."""
    if stages is None:
        base, extra = divmod(model.layers, pp)
        stages = tuple(base + (1 if i < extra else 0) for i in range(pp))
    return max(stage_params(model, tp, stages, vocab_parallel=vocab_parallel))


def matmul_params(model: ModelSpec) -> int:
    """Parameters that take part in a matmul per token: the blocks' weight matrices and
    the output head (a tied embedding counts once, as the head); the embedding lookup,
    positions and norms do not. This is the N of the papers' 6·N FLOPs per token."""
    c = count_params(model)
    non_matmul = (
        (c.embedding if c.head else 0) + c.positions + c.layers * c.layer_replicated + c.final_norm
    )
    if model.params is None:
        return c.total - non_matmul
    return max(1, model.params - math.ceil(model.params * non_matmul / c.total))


def largest_unit(model: ModelSpec, tp: int = 1) -> int:
    """Parameters of the largest unit ZeRO-3/FSDP gathers at once (a block, or the
    embedding/head when those are bigger, as for Llama-3's 128k vocabulary)."""
    c = count_params(model)
    unit = max(c.layer_sharded // tp + c.layer_replicated, c.embedding // tp, c.head // tp)
    if model.params is None:
        return unit
    return math.ceil(model.params * unit / c.total)
