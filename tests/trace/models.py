"""Small models and independent ground truths shared by the trace tests."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["TiedLM", "make_mlp", "saved_ground_truth"]


def make_mlp(d_in: int = 16, hidden: int = 32, d_out: int = 8, layers: int = 3) -> nn.Sequential:
    mods: list[nn.Module] = [nn.Linear(d_in, hidden), nn.GELU()]
    for _ in range(layers - 2):
        mods += [nn.Linear(hidden, hidden), nn.GELU()]
    mods.append(nn.Linear(hidden, d_out))
    return nn.Sequential(*mods)


class TiedLM(nn.Module):
    """Embedding and output projection share one weight (counted once)."""

    def __init__(self, vocab: int = 50, dim: int = 12) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.proj(self.embed(tokens))))


def saved_ground_truth(model: nn.Module, run: Callable[[], torch.Tensor]) -> int:
    """Bytes autograd saves for backward in ``run()``: every saved tensor is kept, then the
    distinct storages not belonging to a parameter are summed afterwards."""
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t.detach()  # t itself would tie an op's saved output to its own graph

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    sizes = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in kept
        if t.untyped_storage().data_ptr() not in param_ptrs
    }
    del out
    return sum(sizes.values())
