"""The model a plan is for: a decoder-only transformer by its dimensions, its size, or both."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ConfigError, choices_error
from workbench.planner.spec_checks import check_int, check_opt_int, replace_spec

__all__ = ["NORMS", "ModelSpec", "ParamCount", "assumed_shape", "count_params"]

NORMS = ("layernorm", "rmsnorm")


def assumed_shape(n_params: float) -> tuple[int, int, int]:
    """(layers, hidden, heads) for a model known only by its size.

    GPT-3-family models keep hidden/layers close to 128 (6.7B: 4096/32, 13B: 5120/40,
    175B: 12288/96) and 12·L·h² parameters in the blocks, so L ≈ (N / (12·128²))^(1/3).
    Hidden is rounded to a multiple of 128 and heads use a head size of 128.
    """
    layers = max(1, round((n_params / (12 * 128 * 128)) ** (1 / 3)))
    hidden = max(128, round(math.sqrt(n_params / (12 * layers)) / 128) * 128)
    return layers, hidden, hidden // 128


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelSpec:
    """A decoder-only transformer, by its dimensions, its parameter count, or both.

    ``params`` (when given) is the exact parameter count used for model state; the
    dimensions drive activations, TP/PP sharding and per-layer communication. A model given
    only by ``params`` gets an assumed GPT-3-like shape (``shape_assumed`` is True).
    """

    name: str = "custom"
    params: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None  # grouped-query attention; None means heads
    ffn: int | None = None  # MLP inner size; None means 4·hidden
    vocab: int | None = None
    seq: int | None = None  # default training sequence length (and learned positions)
    gated_mlp: bool = False  # SwiGLU: gate, up and down projections
    tied_embeddings: bool = False
    bias: bool = False
    norm: str = "layernorm"
    learned_positions: bool = False
    published_params: int | None = None
    # Mixture of experts: every block's MLP is ``experts`` experts (each of ``ffn``) of
    # which each token takes ``top_k``; 0 experts: a dense MLP.
    experts: int = 0
    top_k: int = 2
    shape_assumed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.params is not None:
            if isinstance(self.params, float) and self.params.is_integer():
                object.__setattr__(self, "params", int(self.params))
            check_int("params", self.params)
        dims = ("layers", "hidden", "heads")
        for name in (*dims, "kv_heads", "ffn", "vocab", "seq", "published_params"):
            check_opt_int(name, getattr(self, name))
        check_int("experts", self.experts, minimum=0)
        check_int("top_k", self.top_k, maximum=max(self.experts, 1) if self.experts else None)
        if self.norm not in NORMS:
            raise choices_error("norm", self.norm, NORMS)
        missing = [d for d in dims if getattr(self, d) is None]
        if missing and len(missing) < len(dims):
            raise ConfigError(
                f"model dimensions {', '.join(missing)} are missing; give all of "
                "layers, hidden and heads, or none of them and params=<count>"
            )
        if missing:
            if self.params is None:
                raise ConfigError(
                    "a model needs params=<count> or layers, hidden and heads (and vocab)"
                )
            layers, hidden, heads = assumed_shape(self.params)
            object.__setattr__(self, "layers", layers)
            object.__setattr__(self, "hidden", hidden)
            object.__setattr__(self, "heads", heads)
            object.__setattr__(self, "shape_assumed", True)
        if self.hidden % self.heads:
            raise ConfigError(
                f"hidden={self.hidden} is not divisible by heads={self.heads}; "
                f"valid head counts divide {self.hidden}"
            )
        kv = self.kv_heads
        if kv is not None and (kv > self.heads or self.heads % kv):
            raise ConfigError(
                f"kv_heads={kv} is not valid; it must divide heads={self.heads} "
                f"(valid: {[d for d in range(1, self.heads + 1) if self.heads % d == 0]})"
            )
        if self.params is None and self.vocab is None:
            raise ConfigError("a model given by its dimensions needs vocab=<size>")

    # -- derived sizes -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V): kv_heads · head_dim."""
        return (self.kv_heads or self.heads) * self.head_dim

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def vocab_size(self) -> int:
        return self.vocab if self.vocab is not None else 50257

    @property
    def n_params(self) -> int:
        """The parameter count: ``params`` when given, else derived from the dimensions."""
        if self.params is not None:
            return self.params
        return count_params(self).total

    def with_(self, **changes: Any) -> ModelSpec:
        if self.shape_assumed and not {"layers", "hidden", "heads"} & set(changes):
            # Re-derive the assumed shape from the (possibly new) parameter count.
            changes = {"layers": None, "hidden": None, "heads": None, **changes}
        return replace_spec(self, **changes)


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
