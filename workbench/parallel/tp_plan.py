"""Tensor-parallel plans given as data, checked against the model before anything is split.

A plan maps module paths to a style, e.g. ``{"blocks.*.attn.qkv": "colwise",
"blocks.*.attn.proj": "rowwise"}``. A ``*`` matches one path element (as in
``parallelize_module``). Styles are the names Hugging Face uses in ``base_model_tp_plan``
(``colwise``, ``rowwise``, ``colwise_rep``, ``replicate``) or ``ParallelStyle`` objects.

``resolve_tp_plan`` turns the data into DTensor styles and fails early, with the nearest
module names, when a pattern matches nothing, and with the valid degrees when ``tp`` does not
divide the dimension a style splits (a linear's output features for ``colwise``, its input
features for ``rowwise``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from fnmatch import fnmatchcase

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from workbench.errors import ParallelError

__all__ = ["TP_STYLES", "hf_tp_plan", "matching_modules", "resolve_tp_plan", "split_dims"]

# style name -> what it does (the names Hugging Face's ``base_model_tp_plan`` uses).
TP_STYLES: dict[str, str] = {
    "colwise": "output features split, output stays sharded (pair with a rowwise after)",
    "rowwise": "input features split, partial outputs all-reduced (replicated output)",
    "colwise_rep": "output features split, output all-gathered (replicated)",
    "replicate": "left whole on every rank",
}


def _style(name: str) -> ParallelStyle | None:
    if name == "colwise":
        return ColwiseParallel()
    if name == "rowwise":
        return RowwiseParallel()
    if name == "colwise_rep":
        return ColwiseParallel(output_layouts=Replicate())
    return None  # replicate: nothing to do


def matching_modules(model: nn.Module, pattern: str) -> list[str]:
    """Names of ``model``'s modules that ``pattern`` matches (``*`` = one path element)."""
    atoms = pattern.split(".")
    out = []
    for name, _ in model.named_modules():
        parts = name.split(".") if name else []
        if len(parts) == len(atoms) and all(
            fnmatchcase(p, a) for p, a in zip(parts, atoms, strict=True)
        ):
            out.append(name)
    return out


def _nearest(model: nn.Module, pattern: str) -> list[str]:
    names = [n for n, _ in model.named_modules() if n]
    # Also offer the names with block indices generalised, the form plans are written in.
    generic = sorted({re.sub(r"(?<=\.)\d+(?=\.|$)", "*", n) for n in names})
    return difflib.get_close_matches(pattern, generic + names, n=5, cutoff=0.5)


def _split_size(module: nn.Module, side: str) -> tuple[str, int] | None:
    """The (name, size) of the weight dimension a colwise ("out") / rowwise ("in") split cuts."""
    names = {
        nn.Linear: ("out_features", "in_features"),
        nn.Embedding: ("embedding_dim", "num_embeddings"),
    }
    for cls, (out_name, in_name) in names.items():
        if isinstance(module, cls):
            name = out_name if side == "out" else in_name
            return name, int(getattr(module, name))
    return None


# Which dimension of which parameter a style splits (torch's ColwiseParallel /
# RowwiseParallel ``_partition_linear_fn`` / ``_partition_embedding_fn``): a column split
# shards a linear's weight and bias on dim 0 and an embedding's table on dim 1; a row
# split shards a linear's weight on dim 1 (its bias stays whole, added once after the sum)
# and an embedding's table on dim 0.
_SPLIT_DIMS: dict[tuple[type, str], dict[str, int]] = {
    (nn.Linear, "colwise"): {"weight": 0, "bias": 0},
    (nn.Linear, "rowwise"): {"weight": 1},
    (nn.Embedding, "colwise"): {"weight": 1},
    (nn.Embedding, "rowwise"): {"weight": 0},
}


def split_dims(module: nn.Module, style: str | ParallelStyle) -> dict[str, int]:
    """Parameter name -> the dimension ``style`` splits over the TP ranks, for ``module``
    (empty: every parameter stays whole, as ``replicate``, ``PrepareModuleInput`` and
    ``SequenceParallel`` leave them)."""
    resolved = _style(style) if isinstance(style, str) else style
    if isinstance(resolved, ColwiseParallel):
        side = "colwise"
    elif isinstance(resolved, RowwiseParallel):
        side = "rowwise"
    else:
        return {}
    for cls in (nn.Linear, nn.Embedding):
        if isinstance(module, cls):
            return _SPLIT_DIMS[(cls, side)]
    raise ParallelError(
        f"a {side} style on a {type(module).__name__} is not modelled; colwise/rowwise split "
        "nn.Linear and nn.Embedding modules only"
    )


def resolve_tp_plan(
    model: nn.Module, plan: Mapping[str, str | ParallelStyle], tp: int
) -> dict[str, ParallelStyle]:
    """Check ``plan`` against ``model`` for degree ``tp``; the plan as DTensor styles."""
    if not isinstance(plan, Mapping) or not plan:
        raise ParallelError(
            f"tp_plan={plan!r} is not valid; give a non-empty dict of module path -> style, "
            f"e.g. {{'blocks.*.mlp.fc1': 'colwise', 'blocks.*.mlp.fc2': 'rowwise'}}; "
            f"styles: {sorted(TP_STYLES)}"
        )
    out: dict[str, ParallelStyle] = {}
    for pattern, style in plan.items():
        if not isinstance(pattern, str) or not pattern:
            raise ParallelError(f"tp_plan key {pattern!r} is not a module path")
        if isinstance(style, str) and style not in TP_STYLES:
            raise ParallelError(
                f"tp_plan[{pattern!r}] = {style!r} is not a known style; choose from "
                f"{sorted(TP_STYLES)} or pass a torch ParallelStyle"
            )
        if not isinstance(style, str | ParallelStyle):
            raise ParallelError(
                f"tp_plan[{pattern!r}] = {style!r} is not valid; give a style name "
                f"({sorted(TP_STYLES)}) or a torch ParallelStyle"
            )
        found = matching_modules(model, pattern)
        if not found:
            near = _nearest(model, pattern)
            hint = f"nearest module names: {near}" if near else "no similar module names"
            raise ParallelError(
                f"tp_plan names {pattern!r}, which matches no module of "
                f"{type(model).__name__}; {hint}"
            )
        resolved = _style(style) if isinstance(style, str) else style
        if resolved is None:
            continue
        side = "out" if isinstance(resolved, ColwiseParallel) else "in"
        if isinstance(resolved, ColwiseParallel | RowwiseParallel):
            for name in found:
                module = model.get_submodule(name)
                sized = _split_size(module, side)
                if sized is None:
                    raise ParallelError(
                        f"tp_plan[{pattern!r}] splits {name!r}, a {type(module).__name__}; "
                        "colwise/rowwise split nn.Linear and nn.Embedding modules only"
                    )
                what, size = sized
                if size % tp:
                    valid = [d for d in range(1, size + 1) if size % d == 0 and d <= 64]
                    raise ParallelError(
                        f"tp={tp} does not divide {name}.{what}={size} (tp_plan "
                        f"{pattern!r}: {style if isinstance(style, str) else 'style'}); "
                        f"valid tp for this layer: {valid}"
                    )
        out[pattern] = resolved
    return out


def hf_tp_plan(model: nn.Module) -> dict[str, str]:
    """A Hugging Face model's own TP plan (``config.base_model_tp_plan``, prefixed with the
    base model's attribute name), reduced to the styles above; empty when it has none."""
    config = getattr(model, "config", None)
    base_plan = getattr(config, "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    has_base = bool(prefix) and isinstance(getattr(model, prefix, None), nn.Module)
    plan: dict[str, str] = {}
    for key, style in dict(base_plan).items():
        if style not in TP_STYLES:
            continue  # e.g. sequence-parallel norms, gather: not expressed here
        plan[f"{prefix}.{key}" if has_base else key] = style
    return plan
