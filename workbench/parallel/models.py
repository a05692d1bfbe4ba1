"""The two models every strategy runs: a residual MLP and a small decoder-only GPT.

Both are written so that each parallelism can be applied from the outside:

- separate ``wq``/``wk``/``wv`` projections (not one fused ``qkv``), so a column-wise TP split
  hands every rank whole heads; attention reads the local head count from the tensor shape;
- blocks live in a ``ModuleDict`` keyed "0", "1", ...: a pipeline stage deletes the blocks it
  does not own and the survivors keep their names, so state-dict keys stay those of the whole
  model (torchtitan's trick);
- the embedding / head ends may be ``None`` (a middle pipeline stage has neither);
- activation checkpointing is a per-block flag, so module paths (and TP plans) do not change.

Initial parameters depend only on ``seed``; dropout defaults to 0 so runs are deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from workbench.errors import ConfigError, choices_error
from workbench.parallel.cp import ContextShard, ring_attention
from workbench.parallel.ep import MoE

if TYPE_CHECKING:
    from workbench.planner import ModelSpec

__all__ = [
    "GPT",
    "MLP",
    "PRESETS",
    "GPTConfig",
    "MLPConfig",
    "ModelConfig",
    "build_model",
    "get_config",
    "loss_fn_for",
    "planner_model",
]


@dataclass(kw_only=True, frozen=True)
class MLPConfig:
    """Residual MLP for regression: ``inp -> n_layers x (x + fc2(gelu(fc1(x)))) -> out``."""

    d_in: int = 16
    dim: int = 32
    hidden: int = 64
    n_layers: int = 2
    d_out: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_in", "dim", "hidden", "n_layers", "d_out"):
            _positive(name, getattr(self, name))

    @property
    def kind(self) -> str:
        return "mlp"


@dataclass(kw_only=True, frozen=True)
class GPTConfig:
    """Decoder-only transformer with learned positions, pre-LayerNorm and a tied head."""

    vocab: int = 64
    seq_len: int = 16
    dim: int = 32
    n_heads: int = 4
    n_layers: int = 2
    mlp_ratio: int = 4
    dropout: float = 0.0
    tie_head: bool = True
    seed: int = 0
    # Mixture of experts (ep.py): 0 = dense feed-forward blocks; else each block's
    # feed-forward is ``n_experts`` experts of which every token takes ``top_k``.
    n_experts: int = 0
    top_k: int = 2

    def __post_init__(self) -> None:
        for name in ("vocab", "seq_len", "dim", "n_heads", "n_layers", "mlp_ratio", "top_k"):
            _positive(name, getattr(self, name))
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ConfigError(
                f"top_k={self.top_k} is not valid with n_experts={self.n_experts}; "
                f"choose 1..{self.n_experts}"
            )
        if self.dim % self.n_heads:
            raise ConfigError(
                f"dim={self.dim} is not divisible by n_heads={self.n_heads}; "
                f"choose n_heads among the divisors of dim: {_divisors(self.dim)}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout={self.dropout!r} must be in [0, 1)")

    @property
    def kind(self) -> str:
        return "gpt"

    @property
    def hidden(self) -> int:
        return self.dim * self.mlp_ratio


ModelConfig = MLPConfig | GPTConfig


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} is not valid; it must be an integer >= 1")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


PRESETS: dict[str, ModelConfig] = {
    "mlp-tiny": MLPConfig(),
    "mlp-small": MLPConfig(d_in=64, dim=256, hidden=1024, n_layers=4, d_out=8),
    "gpt-tiny": GPTConfig(),
    "gpt-small": GPTConfig(vocab=256, seq_len=64, dim=128, n_heads=4, n_layers=4),
    # gpt-tiny with 4 experts per block, top-2, dropless (ep.py)
    "moe-tiny": GPTConfig(n_experts=4, top_k=2),
}


def get_config(name: str, *, seed: int = 0) -> ModelConfig:
    """The preset called ``name`` with its seed replaced."""
    if name not in PRESETS:
        raise choices_error("model", name, sorted(PRESETS))
    return replace(PRESETS[name], seed=seed)


class _CheckpointMixin:
    """``checkpoint = True`` recomputes the block in backward (non-reentrant)."""

    checkpoint: bool = False

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint and torch.is_grad_enabled():
            return checkpoint(self._inner, x, use_reentrant=False)
        return self._inner(x)


class FeedForward(nn.Module):
    """``fc2(gelu(fc1(x)))``: the Megatron pair (fc1 column-parallel, fc2 row-parallel)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MLPBlock(_CheckpointMixin, nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.mlp = FeedForward(dim, hidden)

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class MLP(nn.Module):
    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.config = config
        self.inp: nn.Module | None = nn.Linear(config.d_in, config.dim)
        self.layers = nn.ModuleDict(
            {str(i): MLPBlock(config.dim, config.hidden) for i in range(config.n_layers)}
        )
        self.out: nn.Module | None = nn.Linear(config.dim, config.d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) if self.inp is not None else x
        for block in self.layers.values():
            h = block(h)
        return self.out(h) if self.out is not None else h


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.dropout = dropout
        # No q/k/v biases (as in LLaMA): the key bias has an exactly zero gradient (softmax
        # ignores a shift shared by all keys), and Adam would turn its rounding noise into
        # full-size steps that differ between otherwise equivalent runs.
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim)
        self.context: ContextShard | None = None  # context parallel: this rank's share

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1, not n_heads: under tensor parallelism each rank holds only its heads.
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.context is not None:  # this rank's queries against every rank's keys
            return self.wo(ring_attention(q, k, v, self.context).transpose(1, 2).reshape(b, s, -1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        probs = F.dropout(probs, self.dropout, self.training)
        y = (probs @ v).transpose(1, 2).reshape(b, s, -1)
        return self.wo(y)


class GPTBlock(_CheckpointMixin, nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.dim)
        self.attn = Attention(config.dim, config.n_heads, config.dropout)
        self.ln2 = nn.LayerNorm(config.dim)
        self.mlp: nn.Module = (
            MoE(config.dim, config.hidden, config.n_experts, config.top_k, FeedForward)
            if config.n_experts
            else FeedForward(config.dim, config.hidden)
        )
        self.dropout = config.dropout

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        x = x + F.dropout(self.attn(self.ln1(x)), self.dropout, self.training)
        return x + F.dropout(self.mlp(self.ln2(x)), self.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb: nn.Embedding | None = nn.Embedding(config.vocab, config.dim)
        self.pos_emb: nn.Embedding | None = nn.Embedding(config.seq_len, config.dim)
        self.layers = nn.ModuleDict({str(i): GPTBlock(config) for i in range(config.n_layers)})
        self.ln_f: nn.LayerNorm | None = nn.LayerNorm(config.dim)
        self.head: nn.Linear | None = nn.Linear(config.dim, config.vocab, bias=False)
        if config.tie_head:
            self.head.weight = self.tok_emb.weight
        self.context: ContextShard | None = None

    def use_context_parallel(self, shard: ContextShard) -> None:
        """Run on ``shard``'s part of the sequence: positions offset to it, attention
        around the ring (``workbench.parallel.cp``)."""
        self.context = shard
        for block in self.layers.values():
            block.attn.context = shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None and self.pos_emb is not None:
            start = self.context.offset(x.shape[1]) if self.context is not None else 0
            positions = torch.arange(start, start + x.shape[1], device=x.device)
            h = self.tok_emb(x) + self.pos_emb(positions)
        else:
            h = x
        for block in self.layers.values():
            h = block(h)
        if self.ln_f is not None:
            h = self.ln_f(h)
        return self.head(h) if self.head is not None else h


def build_model(config: ModelConfig) -> nn.Module:
    """The model for ``config``, initialised from ``config.seed`` only (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if isinstance(config, GPTConfig):
            model: nn.Module = GPT(config)
            _init_gpt(model)
        else:
            model = MLP(config)
    return model


def _init_gpt(model: nn.Module) -> None:
    # Small embeddings keep the tied head's initial logits near uniform.
    for name, p in model.named_parameters():
        if name.endswith("emb.weight"):
            nn.init.normal_(p, std=0.02)


def planner_model(name: str) -> ModelSpec:
    """The planner's description of preset ``name``: its exact parameter count and, for a
    GPT, the shape the activation and communication formulas need."""
    from workbench.planner import ModelSpec

    config = get_config(name)
    params = sum(p.numel() for p in build_model(config).parameters())  # tied counted once
    if isinstance(config, GPTConfig):
        return ModelSpec(
            name=name,
            params=params,
            layers=config.n_layers,
            hidden=config.dim,
            heads=config.n_heads,
            vocab=config.vocab,
            seq=config.seq_len,
            tied_embeddings=config.tie_head,
            learned_positions=True,
            experts=config.n_experts,
            top_k=config.top_k,
        )
    return ModelSpec(name=name, params=params)


def loss_fn_for(config: ModelConfig) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Mean loss over every element: cross-entropy over tokens (GPT), MSE (MLP)."""
    if isinstance(config, GPTConfig):

        def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
            )

        return lm_loss

    def mse_loss(pred: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(pred.float(), targets)

    return mse_loss
