"""Parameter counts from transformer dimensions, and how TP/PP split them across ranks."""

from __future__ import annotations

import math

# The count itself is the model's (ModelSpec.n_params uses it); kept importable from here.
from workbench.planner.model_spec import ModelSpec, ParamCount, count_params

__all__ = [
    "ParamCount",
    "count_params",
    "largest_unit",
    "matmul_params",
    "params_per_rank",
    "stage_params",
]


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
