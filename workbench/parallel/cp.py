"""Context parallelism: the sequence split over ranks, attention computed around a ring.

Rank ``r`` of ``c`` holds tokens ``[r·s, (r+1)·s)`` of every sample (``s = seq_len / c``):
its embeddings, activations and loss are those of its share only, so activation memory
falls to 1/c. Attention is the one place a token needs the others: each rank keeps its
queries and passes its keys and values around the ring (``send`` to ``r+1``, ``recv`` from
``r-1``, c-1 times), computing the scores of its queries against each block as it arrives.
Blocks are combined exactly (the log-sum-exp of each block's scores, as FlashAttention
and Ring Attention do), so the output equals full attention; causal masking skips the
blocks that lie wholly in a query's future.

torch's own ``context_parallel`` (torch 2.13) does not run on CPU: on gloo it fails with
``aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
strategy registered`` (measured), hence this ring, written with autograd so backward
sends the keys' and values' gradients back around the ring the other way.

The parameters are replicated: their gradients are averaged over the cp ranks in the sync
phase, as data parallelism does (each rank's loss is the mean over an equal share of the
tokens, so the mean of the ranks' gradients is the whole sequence's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workbench.parallel.collectives import keep_for_backward

__all__ = ["ContextShard", "ring_attention", "shard_sequence"]


@dataclass(frozen=True)
class ContextShard:
    """This rank's place in the context-parallel group."""

    group: dist.ProcessGroup
    rank: int
    size: int

    @classmethod
    def of(cls, group: dist.ProcessGroup) -> ContextShard:
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    def offset(self, local_len: int) -> int:
        """The position of this rank's first token."""
        return self.rank * local_len


class _RingShift(torch.autograd.Function):
    """Send to the next rank of the ring, receive from the previous; backward the reverse."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, shard: ContextShard) -> torch.Tensor:
        keep_for_backward(ctx, shard=shard)
        return _shift(t.contiguous(), shard, +1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _shift(grad.contiguous(), ctx.shard, -1), None


def _shift(t: torch.Tensor, shard: ContextShard, direction: int) -> torch.Tensor:
    out = torch.empty_like(t)
    to = dist.get_global_rank(shard.group, (shard.rank + direction) % shard.size)
    source = dist.get_global_rank(shard.group, (shard.rank - direction) % shard.size)
    ops = [
        dist.P2POp(dist.isend, t, to, group=shard.group),
        dist.P2POp(dist.irecv, out, source, group=shard.group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return out


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shard: ContextShard
) -> torch.Tensor:
    """Causal attention of this rank's queries over every rank's keys and values.

    ``q, k, v``: ``[batch, heads, local_seq, head_dim]`` of this rank's tokens.
    """
    s = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    kv = torch.stack([k, v])
    maxes, sums, outs = [], [], []
    for i in range(shard.size):
        source = (shard.rank - i) % shard.size  # whose keys and values this block holds
        if source <= shard.rank:  # a block wholly in the future is masked out: skipped
            scores = (q @ kv[0].transpose(-2, -1)) * scale
            if source == shard.rank:
                mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
                scores = scores.masked_fill(mask, float("-inf"))
            top = scores.amax(dim=-1, keepdim=True).detach()
            weights = (scores - top).exp()
            maxes.append(top)
            sums.append(weights.sum(dim=-1, keepdim=True))
            outs.append(weights @ kv[1])
        if i < shard.size - 1:
            kv = _RingShift.apply(kv, shard)
    top = torch.stack(maxes).amax(dim=0)
    total = sum(w * (m - top).exp() for w, m in zip(sums, maxes, strict=True))
    out = sum(o * (m - top).exp() for o, m in zip(outs, maxes, strict=True))
    # Every rank's backward must pass through all its shifts, or a peer waits for a
    # gradient that never comes: a rank whose last blocks were skipped (the future) ties
    # the final shift into its output with weight 0.
    return out / total + 0.0 * kv.sum()  # type: ignore[operator]


def shard_sequence(batches: Any, shard: ContextShard) -> Any:
    """This rank's share of every batch's sequence (tokens and targets; extra fields, such
    as the samples' indices, pass unchanged)."""
    for batch in batches:
        x, y, *rest = batch
        s = x.shape[1] // shard.size
        part = slice(shard.rank * s, (shard.rank + 1) * s)
        yield (x[:, part], y[:, part], *rest)
