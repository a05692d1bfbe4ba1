"""Pipeline stages of any sequential model, cut at split points given by module name.

``split_points=["blocks.2"]`` on a model whose children are ``emb, blocks (4), norm, head``
gives two stages: ``emb, blocks.0, blocks.1`` and ``blocks.2, blocks.3, norm, head``. The
model is seen as its ordered list of *units*: its children, with every container that holds
a split point opened into its own children. Each stage is a copy of the whole model in
which the units of other stages are replaced by ``nn.Identity`` (torchtitan's manual split,
with Identity instead of deletion so that a ``for block in self.blocks`` loop still runs and
the kept parameters keep their names).

This requires what any pipeline split requires of a model: its forward calls the units in
registration order, each taking the previous one's output. Parameters held directly by the
root module belong to no unit and are refused.
"""

from __future__ import annotations

import copy
import difflib
import itertools
from collections.abc import Sequence

from torch import nn

from workbench.errors import ParallelError

__all__ = ["default_split_points", "split_by_points", "stage_units", "units_for"]


def _children(module: nn.Module, prefix: str) -> list[str]:
    return [f"{prefix}.{n}" if prefix else n for n, _ in module.named_children()]


def units_for(model: nn.Module, split_points: Sequence[str]) -> list[str]:
    """The model's ordered units, with every container holding a split point opened."""
    units = _children(model, "")
    for point in split_points:
        while point not in units:
            parent = next((u for u in units if point.startswith(u + ".")), None)
            if parent is None:
                names = [n for n, _ in model.named_modules() if n]
                near = difflib.get_close_matches(point, names, n=5, cutoff=0.5)
                raise ParallelError(
                    f"pp split point {point!r} is not a module of {type(model).__name__}; "
                    f"nearest module names: {near or sorted(units)}"
                )
            i = units.index(parent)
            units[i : i + 1] = _children(model.get_submodule(parent), parent)
    return units


def default_split_points(model: nn.Module, pp: int) -> list[str]:
    """The model's own ``pp_split_points`` (if it defines them), else its largest list of
    blocks cut into ``pp`` equal runs."""
    own = getattr(model, "pp_split_points", None)
    if own is not None:
        return list(own(pp) if callable(own) else own)
    best, best_name = None, ""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList | nn.ModuleDict) and (
            best is None or len(module) > len(best)
        ):
            best, best_name = module, name
    if best is None or len(best) < pp:
        raise ParallelError(
            f"cannot choose pipeline split points for {type(model).__name__} with pp={pp}: "
            "it has no ModuleList/ModuleDict of at least pp blocks; pass pp_split=[...] "
            "(module names where stages 1..pp-1 begin)"
        )
    n = len(best)
    if n % pp:
        valid = [d for d in range(1, n + 1) if n % d == 0]
        raise ParallelError(
            f"pp={pp} does not divide the {n} blocks of {best_name!r}; choose pp from {valid} "
            "or pass pp_split=[...]"
        )
    keys = list(best.keys()) if isinstance(best, nn.ModuleDict) else [str(i) for i in range(n)]
    return [f"{best_name}.{keys[i * n // pp]}" for i in range(1, pp)]


def stage_units(model: nn.Module, split_points: Sequence[str], pp: int) -> list[list[str]]:
    """The units of each of the ``pp`` stages (checked: ordered, none empty)."""
    points = list(split_points)
    if len(points) != pp - 1:
        raise ParallelError(
            f"pp={pp} needs {pp - 1} split point(s) (where stages 1..{pp - 1} begin), "
            f"got {len(points)}: {points}"
        )
    direct = [n for n, _ in model.named_parameters(recurse=False)]
    if direct:
        raise ParallelError(
            f"cannot split {type(model).__name__} into pipeline stages: parameters {direct} "
            "belong to the root module, not to a submodule; move them into a submodule"
        )
    units = units_for(model, points)
    bounds = [0] + [units.index(p) for p in points] + [len(units)]
    for a, b in itertools.pairwise(bounds):
        if b <= a:
            raise ParallelError(
                f"pp split points {points} are not in forward order or leave a stage empty; "
                f"the model's units in order: {units}"
            )
    return [units[a:b] for a, b in itertools.pairwise(bounds)]


def split_by_points(
    model: nn.Module, split_points: Sequence[str], stage_index: int, pp: int
) -> nn.Module:
    """A copy of ``model`` that runs only stage ``stage_index``'s units."""
    stages = stage_units(model, split_points, pp)
    keep = set(stages[stage_index])
    stage = copy.deepcopy(model)
    for unit in (u for s in stages for u in s):
        if unit not in keep:
            parent_name, _, child = unit.rpartition(".")
            parent = stage.get_submodule(parent_name) if parent_name else stage
            if isinstance(parent, nn.ModuleList):
                parent[int(child)] = nn.Identity()
            else:
                setattr(parent, child, nn.Identity())
    return stage
