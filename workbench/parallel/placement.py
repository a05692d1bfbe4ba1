"""The planner's ``Placement`` of a model under a ``Layout``: what each rank holds as built.

``module_placement(model, layout, world_size)`` runs the checks and the splits that
``parallelize`` runs, on a copy of the model (the meta device is enough: nothing is
allocated): ``check_layout`` resolves the TP plan and the pipeline split points, each
stage is cut by ``split_stage`` / ``split_by_points`` exactly as a pipeline rank cuts it
(the first stage keeps the embedding, the last the final norm and the head, a tied head
its own copy), and the plan, narrowed to the modules a stage kept, says which parameter
is split on which dimension (``tp_plan.split_dims``). Each parameter becomes a planner
``Piece`` (elements on one TP rank, its first dimension), so the planner's weights,
gradients and optimizer state are those the tracer counts, FSDP's padding and ZeRO-1's
whole-parameter partition included.

``megatron=True`` is the hand-written teaching view: its split is ``megatron_plan`` (fc1
column-wise, fc2 row-wise, attention whole), resolved and checked the same way.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torch import nn

from workbench.parallel.ep import MoE
from workbench.parallel.megatron import megatron_plan
from workbench.parallel.parallelize import Layout, check_layout, fsdp_blocks
from workbench.parallel.pp import split_stage
from workbench.parallel.pp_split import split_by_points
from workbench.parallel.tp_plan import matching_modules, resolve_tp_plan, split_dims
from workbench.planner.placement import Piece, Placement

__all__ = ["module_placement"]

# Words in a module path that mark a block's attention and its MLP (activations only:
# each part of a block is divided by the TP degree when its plan splits it).
_ATTENTION = ("attn", "attention")
_MLP = ("mlp", "ffn", "ff", "feed_forward", "feedforward")


def module_placement(
    model: nn.Module, layout: Layout, world_size: int, *, megatron: bool = False
) -> Placement:
    """The parameters each pipeline stage's ranks hold when ``layout`` is applied to
    ``model`` on ``world_size`` ranks (``megatron``: the Megatron teaching view)."""
    dims = layout.dims(world_size)
    if megatron:
        checked: dict[str, Any] = {
            "tp_plan": resolve_tp_plan(model, megatron_plan(model), dims.tp),
            "pp_split": None,
        }
    else:
        checked = check_layout(model, layout, dims)
    plan: Mapping[str, Any] | None = checked["tp_plan"] if dims.tp > 1 else None
    stages = _stages(_one_expert_share(model, dims.ep), dims.pp, checked["pp_split"])
    pieces, layers, split = [], [], set()
    for stage in stages:
        names = _split_modules(stage, plan)
        split |= names.keys()
        pieces.append(_pieces(stage, names, dims.tp))
        layers.append(sum(1 for b in _blocks(stage) if any(True for _ in b.parameters())))
    attn_tp, mlp_tp = _part_degrees([n for n, _ in model.named_modules()], split, dims.tp)
    vocab = any(
        isinstance(model.get_submodule(n), nn.Embedding) or _is_head(model, n) for n in split
    )
    return Placement(
        stages=tuple(pieces),
        layers=tuple(layers),
        attn_tp=attn_tp,
        mlp_tp=mlp_tp,
        vocab_tp=dims.tp if vocab else 1,
        source=f"{type(model).__name__} as built: {layout.describe(world_size)}"
        + (" (Megatron view)" if megatron else ""),
    )


def _one_expert_share(model: nn.Module, ep: int) -> nn.Module:
    """Expert parallel: a copy holding rank 0's experts (every rank holds as many)."""
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    if ep == 1 or not moes:
        return model
    share = copy.deepcopy(model)
    for m in share.modules():
        if isinstance(m, MoE):
            m.keep_experts(range(len(m.router.weight) // ep))
    return share


def _stages(model: nn.Module, pp: int, points: list[str] | None) -> list[nn.Module]:
    """Every pipeline stage's module, cut as ``parallelize`` cuts it."""
    if pp == 1:
        return [model]
    if points is not None:
        return [split_by_points(model, points, i, pp) for i in range(pp)]
    return [split_stage(model, i, pp) for i in range(pp)]


def _split_modules(stage: nn.Module, plan: Mapping[str, Any] | None) -> dict[str, Any]:
    """Module name -> style, for the plan's patterns narrowed to this stage's modules
    (what ``parallelize`` hands ``apply_tp`` for a stage)."""
    if plan is None:
        return {}
    return {n: style for pat, style in plan.items() for n in matching_modules(stage, pat)}


def _pieces(stage: nn.Module, styles: dict[str, Any], tp: int) -> tuple[Piece, ...]:
    """One ``Piece`` per distinct parameter (a tied one once, under its first module)."""
    seen: set[int] = set()
    out = []
    for name, module in stage.named_modules():
        dims = split_dims(module, styles[name]) if name in styles else {}
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            shape = list(p.shape)
            if pname in dims and shape:
                shape[dims[pname]] //= tp
            numel = 1
            for size in shape:
                numel *= size
            out.append(Piece(numel=numel, rows=shape[0] if shape else 1, trainable=p.requires_grad))
    return tuple(out)


def _blocks(stage: nn.Module) -> list[nn.Module]:
    layers = getattr(stage, "layers", None)
    return list(layers.values()) if isinstance(layers, nn.ModuleDict) else fsdp_blocks(stage)


def _part_degrees(names: list[str], split: set[str], tp: int) -> tuple[int, int]:
    """(attention, MLP) TP degrees: 1 for a part whose modules (named by ``_ATTENTION`` /
    ``_MLP`` words) the plan leaves whole, else ``tp`` (a part the names do not show is
    taken as split with the rest)."""
    if tp == 1 or not split:
        return 1, 1

    def degree(words: tuple[str, ...]) -> int:
        part = [n for n in names if any(_marks(e, words) for e in n.split("."))]
        return tp if not part or any(n in split for n in part) else 1

    return degree(_ATTENTION), degree(_MLP)


def _marks(element: str, words: tuple[str, ...]) -> bool:
    e = element.lower()
    return e in words or any(len(w) > 3 and w in e for w in words)


def _is_head(model: nn.Module, name: str) -> bool:
    """A split linear that maps to the vocabulary (the output head)."""
    module = model.get_submodule(name)
    embed = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return (
        isinstance(module, nn.Linear)
        and embed is not None
        and module.out_features == embed.num_embeddings
    )
