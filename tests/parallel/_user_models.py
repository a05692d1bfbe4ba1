"""A model, data set, loss and optimizers written the way a user writes them (not presets).

``TinyLM`` is a small pre-norm decoder: ``embed -> blocks (ModuleList) -> norm -> head``,
separate q/k/v projections, attention that reads the local head count from the tensor
shape (so a column-wise split hands each rank whole heads). Nothing in it knows about the
workbench.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

VOCAB, SEQ, DIM, HEADS, BLOCKS = 32, 8, 16, 2, 2

TP_PLAN = {
    "blocks.*.attn.q": "colwise",
    "blocks.*.attn.k": "colwise",
    "blocks.*.attn.v": "colwise",
    "blocks.*.attn.o": "rowwise",
    "blocks.*.ff.up": "colwise",
    "blocks.*.ff.down": "rowwise",
}


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tok(x) + self.pos[: x.shape[1]]


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.q = nn.Linear(DIM, DIM, bias=False)
        self.k = nn.Linear(DIM, DIM, bias=False)
        self.v = nn.Linear(DIM, DIM, bias=False)
        self.o = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (
            proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q, self.k, self.v)
        )
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(DIM), SelfAttention()
        self.ln2, self.ff = nn.LayerNorm(DIM), FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ff(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, blocks: int = BLOCKS) -> None:
        super().__init__()
        self.embed = Embed()
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class CopyShift(Dataset):
    """Random token windows; the target is each token's successor modulo the vocabulary."""

    def __init__(self, n: int = 128, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], (self.x[i] + 1) % VOCAB


def make_model() -> nn.Module:
    return TinyLM()


def make_data() -> Dataset:
    return CopyShift()


def lm_loss(logits: Any, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def adamw(params: Any) -> torch.optim.Optimizer:
    # eps=1e-6: AdamW turns rounding noise of near-zero gradients into full steps otherwise.
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-6)


OPTIMIZERS = {"sgd": sgd, "adamw": adamw}


class DropoutLM(TinyLM):
    """``TinyLM`` with dropout, as every Hugging Face model has by default: on the
    embeddings and on each block's output (activations every tensor-parallel rank holds
    whole), drawn from the global torch generator."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.embed(x))
        for block in self.blocks:
            h = self.drop(block(h))
        return self.head(self.norm(h))


def make_dropout_model() -> nn.Module:
    return DropoutLM()
