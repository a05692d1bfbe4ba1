"""The planner's description of the user's own model, counted on the meta device.

``user_model_spec(make_model)`` builds the model under ``torch.device("meta")`` (no memory,
no weights: a 70B model counts in a second) and gives the planner its exact parameter
count, tied weights counted once. The dimensions the activation and communication formulas
need (layers, hidden, heads, vocab, MLP width) are read from the model where it says them:
a Hugging Face ``config``, else the largest ``ModuleList`` (the repeated blocks), the first
``nn.Embedding`` and an attention module's ``num_heads`` / ``n_heads`` / ``head_dim``.
``ShapeInfo.sources`` says where each number came from; a dimension that cannot be read
leaves the shape to the planner's assumption from the parameter count, which its plan
notes say.

``planner_optimizer`` / ``planner_precision`` translate the user's optimizer and the
workbench's precision names into the planner's vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.errors import ConfigError
from workbench.parallel.parallelize import fsdp_blocks

__all__ = [
    "ShapeInfo",
    "count_parameters",
    "meta_model",
    "planner_optimizer",
    "planner_precision",
    "read_shape",
    "user_model_spec",
]

# Attribute names that carry the head count / head size on attention modules.
_HEAD_ATTRS = ("num_heads", "n_heads", "n_head", "num_attention_heads", "heads")
_HF = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "ffn": "intermediate_size",
    "vocab": "vocab_size",
}


def meta_model(model: nn.Module | Callable[[], Any], *, seed: int = 0) -> nn.Module:
    """``model`` itself when it is a module, else ``model()`` built on the meta device."""
    if isinstance(model, nn.Module):
        return model
    if not callable(model):
        raise ConfigError(
            f"model={model!r} is not valid; give a torch.nn.Module or a factory "
            "returning one (e.g. make_model)"
        )
    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            built = model()
    except Exception as exc:
        raise ConfigError(
            f"the model factory {getattr(model, '__name__', model)!r} could not be built on "
            f"the meta device ({type(exc).__name__}: {exc}); pass the built module instead "
            "(e.g. plan_from(make_model()))"
        ) from exc
    if not isinstance(built, nn.Module):
        raise ConfigError(
            f"the model factory returned {type(built).__name__}, not a torch.nn.Module"
        )
    return built


def count_parameters(module: nn.Module, *, trainable_only: bool = False) -> int:
    """Elements of ``module``'s parameters; a parameter shared by two modules counts once
    (``parameters()`` de-duplicates), as the tracer's storage count does."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


@dataclass(frozen=True, slots=True)
class ShapeInfo:
    """What was read from the model, and where each value came from."""

    params: int
    trainable: int
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    vocab: int | None = None
    gated_mlp: bool = False
    tied_embeddings: bool = False
    norm: str = "layernorm"
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Layers, hidden and heads are all known (and heads divides hidden)."""
        return (
            self.layers is not None
            and self.hidden is not None
            and self.heads is not None
            and self.hidden % self.heads == 0
        )


def _first(module: nn.Module, kind: type[nn.Module]) -> Any:
    return next((m for m in module.modules() if isinstance(m, kind)), None)


def _heads(module: nn.Module, hidden: int | None) -> tuple[int | None, str]:
    for name, sub in module.named_modules():
        for attr in _HEAD_ATTRS:
            value = getattr(sub, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, f"{name or type(module).__name__}.{attr}"
        head_dim = getattr(sub, "head_dim", None)
        if isinstance(head_dim, int) and head_dim > 0 and hidden and hidden % head_dim == 0:
            return hidden // head_dim, f"hidden / {name}.head_dim"
    return None, ""


def _mlp(block: nn.Module, hidden: int) -> tuple[int | None, bool]:
    """(MLP width, gated) of one block: the widest Linear reading ``hidden``; gated when
    two or more Linears read ``hidden`` into that width (SwiGLU's gate and up)."""
    widths = [
        m.out_features
        for m in block.modules()
        if isinstance(m, nn.Linear) and m.in_features == hidden and m.out_features > hidden
    ]
    if not widths:
        return None, False
    ffn = max(widths)
    return ffn, widths.count(ffn) >= 2


def _tied(module: nn.Module) -> bool:
    embed = _first(module, nn.Embedding)
    if embed is None:
        return False
    return any(isinstance(m, nn.Linear) and m.weight is embed.weight for m in module.modules())


def read_shape(module: nn.Module) -> ShapeInfo:
    """The parameter count and the transformer dimensions ``module`` states (see module
    docstring); values it does not state stay None."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    config = getattr(module, "config", None)
    for key, attr in _HF.items():
        value = getattr(config, attr, None) if config is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            values[key], sources[key] = value, f"config.{attr}"
    if "layers" not in values:
        blocks = fsdp_blocks(module)
        if blocks:
            values["layers"], sources["layers"] = len(blocks), "largest ModuleList"
    embed = _first(module, nn.Embedding)
    if embed is not None:
        for key, value in (("vocab", embed.num_embeddings), ("hidden", embed.embedding_dim)):
            if key not in values:
                values[key], sources[key] = value, f"nn.Embedding {key}"
    if "heads" not in values:
        heads, where = _heads(module, values.get("hidden"))
        if heads is not None:
            values["heads"], sources["heads"] = heads, where
    blocks = fsdp_blocks(module)
    gated = False
    if blocks and values.get("hidden"):
        ffn, gated = _mlp(blocks[0], values["hidden"])
        if ffn is not None and "ffn" not in values:
            values["ffn"], sources["ffn"] = ffn, "widest Linear of a block"
    rms = any("rmsnorm" in type(m).__name__.lower() for m in module.modules())
    return ShapeInfo(
        params=count_parameters(module),
        trainable=count_parameters(module, trainable_only=True),
        gated_mlp=gated,
        tied_embeddings=_tied(module),
        norm="rmsnorm" if rms else "layernorm",
        sources=sources,
        **values,
    )


def user_model_spec(
    model: nn.Module | Callable[[], Any],
    *,
    name: str | None = None,
    seq: int | None = None,
    seed: int = 0,
    **dims: Any,
) -> Any:
    """A planner ``ModelSpec`` of the user's model: its exact parameter count (counted on
    the meta device when ``model`` is a factory) and the dimensions read from it.
    ``dims`` (layers=, hidden=, heads=, kv_heads=, ffn=, vocab=) override what was read."""
    from workbench.planner import ModelSpec

    module = meta_model(model, seed=seed)
    shape = read_shape(module)
    known = {
        k: getattr(shape, k)
        for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
        if getattr(shape, k) is not None
    }
    unknown = sorted(set(dims) - {"layers", "hidden", "heads", "kv_heads", "ffn", "vocab"})
    if unknown:
        raise ConfigError(
            f"unknown model dimension(s) {unknown}; valid: layers, hidden, heads, kv_heads, "
            "ffn, vocab"
        )
    known.update({k: v for k, v in dims.items() if v is not None})
    if not all(k in known for k in ("layers", "hidden", "heads")) or (
        known["hidden"] % known["heads"]
    ):
        # The planner assumes a GPT-like shape from the parameter count (its notes say so).
        known = {k: v for k, v in known.items() if k in ("vocab",)}
    if (
        known.get("kv_heads") is not None
        and "heads" in known
        and (known["heads"] % known["kv_heads"])
    ):
        known.pop("kv_heads")
    label = name or getattr(model, "__name__", None) or type(module).__name__
    return ModelSpec(
        name=str(label),
        params=shape.params,
        seq=seq,
        gated_mlp=shape.gated_mlp,
        tied_embeddings=shape.tied_embeddings,
        norm=shape.norm,
        **known,
    )


def planner_optimizer(optimizer: torch.optim.Optimizer) -> str:
    """The planner's name for ``optimizer`` (ZeRO-1's wrapper: the wrapped class)."""
    inner = getattr(optimizer, "optim", None)
    if isinstance(inner, torch.optim.Optimizer):
        optimizer = inner
    cls = type(optimizer).__name__
    if cls in ("Adam", "AdamW"):
        return cls.lower()
    if cls == "SGD":
        momentum = float(optimizer.defaults.get("momentum", 0.0) or 0.0)
        return "sgd-momentum" if momentum > 0 else "sgd"
    raise ConfigError(
        f"the planner models Adam, AdamW and SGD (with or without momentum); "
        f"{cls} is not one of them: give optimizer= one of those to plan or compare"
    )


def planner_precision(precision: str) -> str:
    """The workbench's run precision (fp32 | bf16) in the planner's words."""
    from workbench.vocab import RUN_PRECISIONS, planner_name

    if precision not in RUN_PRECISIONS:
        raise ConfigError(
            f"precision={precision!r} is not valid; choose from {list(RUN_PRECISIONS)}"
        )
    return planner_name("precision", precision)
