"""Mixture of experts and expert parallelism.

``MoE`` replaces a block's feed-forward: a router (a linear layer, no bias) scores every
token against ``n_experts`` experts; each token goes to its ``top_k`` highest (softmax
probabilities, renormalised over the chosen k; ``torch.topk`` on the probabilities, ties
to the lower expert index, so routing is deterministic); the output is the weighted sum of
the chosen experts' outputs.

Capacity: dropless. Every token reaches every expert it chose, however many tokens chose
that expert (capacity factor = infinity, as MegaBlocks / dropless MoE): no token is ever
dropped or padded, so the result does not depend on how the batch is split over ranks,
and expert parallel equals one device exactly. The price is uneven expert loads (and
all-to-all sizes), visible in the trace.

Expert parallelism (``apply_ep``): rank r of ``ep`` keeps experts
``[r·E/ep, (r+1)·E/ep)`` (the others are deleted; the kept ones keep their names) and the
rest of the model whole. Tokens travel to their experts' ranks and back in two
all-to-alls per MoE layer (dispatch and combine; their gradients travel the same way back
in backward), after a small all-to-all of the per-expert token counts. The batch is split
over the ranks as data parallel does: the shared parameters' gradients are averaged over
them in the sync phase; an expert's gradient already sums every rank's tokens, so it is
divided by ``ep`` (each rank's loss is the mean over its own share of the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workbench.parallel.collectives import keep_for_backward
from workbench.parallel.dp import average_gradients
from workbench.trace.comm_source import labelled

__all__ = ["ExpertParallel", "ExpertShard", "MoE", "apply_ep"]


@dataclass(frozen=True)
class ExpertShard:
    """This rank's share of the experts."""

    group: dist.ProcessGroup
    rank: int
    size: int
    n_experts: int

    @property
    def per_rank(self) -> int:
        return self.n_experts // self.size

    def owned(self) -> range:
        return range(self.rank * self.per_rank, (self.rank + 1) * self.per_rank)


class MoE(nn.Module):
    """Router + experts (``FeedForward`` modules keyed "0".."E-1"), dropless top-k."""

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int, expert: Any) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): expert(dim, hidden) for e in range(n_experts)})
        self.shard: ExpertShard | None = None
        self.sent_bytes: list[int] = []  # expert parallel: bytes sent to each expert, last

    def keep_experts(self, owned: range) -> None:
        """Keep only the experts ``owned`` (their names unchanged): a rank's share under
        expert parallel, or the planner's picture of one."""
        for name in list(self.experts.keys()):
            if int(name) not in owned:
                del self.experts[name]

    def use_shard(self, shard: ExpertShard) -> None:
        """Run expert parallel over ``shard``: keep its experts, dispatch to the others'."""
        self.keep_experts(shard.owned())
        self.shard = shard

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, chosen experts) of every token: ``[tokens, top_k]`` each."""
        probs = self.router(tokens).softmax(dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        return weights / weights.sum(dim=-1, keepdim=True), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        weights, chosen = self.route(tokens)
        flat = chosen.flatten()
        order = torch.argsort(flat, stable=True)  # assignments grouped by expert
        rows = order // self.top_k
        sent = tokens[rows]
        counts = torch.bincount(flat, minlength=len(self.router.weight))
        if self.shard is None:
            done = self._run_experts(sent, counts)
        else:
            done = self._dispatch_and_combine(sent, counts, self.shard)
        out = torch.zeros_like(tokens)
        out = out.index_add(0, rows, done * weights.flatten()[order, None])
        return out.view(shape)

    def _run_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Each expert on its consecutive run of ``rows`` (``counts`` per expert, in
        ``self.experts`` order)."""
        parts = torch.split(rows, counts.tolist())
        outs = [expert(part) for expert, part in zip(self.experts.values(), parts, strict=True)]
        return torch.cat(outs) if outs else rows[:0]

    def _dispatch_and_combine(
        self, sent: torch.Tensor, counts: torch.Tensor, shard: ExpertShard
    ) -> torch.Tensor:
        """Rows to their experts' ranks, through the local experts, and back."""
        e_local = shard.per_rank
        got = torch.empty_like(counts)  # [source rank x local expert] counts
        with labelled("ep-counts"):
            dist.all_to_all_single(got, counts, group=shard.group)
        send_split = counts.view(shard.size, e_local).sum(dim=1).tolist()
        by_source = got.view(shard.size, e_local)
        recv_split = by_source.sum(dim=1).tolist()
        # Recorded with the bytes this rank sends each expert (the timeline's hover).
        row = sent.shape[-1] * sent.element_size()
        sizes = " ".join(f"e{e}:{int(n) * row}B" for e, n in enumerate(counts.tolist()))
        self.sent_bytes = [int(n) * row for n in counts.tolist()]
        with labelled(f"ep-dispatch {sizes}"):
            received = all_to_all_single(sent, recv_split, send_split, shard.group)
        # received: by source rank, then by expert; the experts want their rows together
        labels = torch.arange(e_local).repeat(shard.size).repeat_interleave(by_source.flatten())
        regroup = torch.argsort(labels, stable=True)
        done = self._run_experts(received[regroup], by_source.sum(dim=0))
        back = torch.empty_like(done).index_copy(0, regroup, done)
        with labelled("ep-combine"):
            return all_to_all_single(back, send_split, recv_split, shard.group)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with its gradient: the same exchange with the splits swapped
    (torch's ``distributed.nn`` one is deprecated in 2.13)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, recv: list[int], send: list[int], group: dist.ProcessGroup
    ) -> torch.Tensor:
        keep_for_backward(ctx, splits=(recv, send), group=group)
        out = x.new_empty(sum(recv), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        recv, send = ctx.splits
        out = grad.new_empty(sum(send), *grad.shape[1:])
        # Named, not "workbench": the planner counts that source as data-parallel traffic.
        with labelled("ep-backward"):
            dist.all_to_all_single(out, grad.contiguous(), send, recv, group=ctx.group)
        return out, None, None, None


def all_to_all_single(
    x: torch.Tensor, recv: list[int], send: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    return _AllToAll.apply(x, recv, send, group)  # type: ignore[no-any-return]


class ExpertParallel(nn.Module):
    """The model with its experts spread over ``shard``'s ranks; ``sync()`` after backward.

    ``dp_group``: every rank that holds other samples (default: ``shard``'s group);
    ``replicas``: the ranks holding the same experts as this one (dp × ep with ep < dp)."""

    def __init__(
        self,
        module: nn.Module,
        shard: ExpertShard,
        *,
        dp_group: dist.ProcessGroup | None = None,
        replicas: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.shard = shard
        self.dp_group = dp_group if dp_group is not None else shard.group
        self.replicas = replicas
        for m in module.modules():
            if isinstance(m, MoE):
                m.use_shard(shard)

    def forward(self, *args: Any) -> Any:
        return self.module(*args)

    def expert_parameters(self) -> list[nn.Parameter]:
        return [
            p for m in self.module.modules() if isinstance(m, MoE) for p in m.experts.parameters()
        ]

    def expert_bytes(self) -> list[int]:
        """Bytes this rank dispatched to each expert in the last forward, all layers."""
        layers = [m.sent_bytes for m in self.module.modules() if isinstance(m, MoE)]
        return [sum(col) for col in zip(*layers, strict=True)] if layers else []

    def sync(self) -> None:
        """Shared parameters: averaged over the dp ranks. Experts: their gradient already
        sums the tokens of every rank of the ep group; summed over the expert's replicas
        too, it sums every rank's, so it is divided by dp (each rank's loss is the mean
        over its own share of the batch)."""
        experts = self.expert_parameters()
        ids = {id(p) for p in experts}
        average_gradients([p for p in self.module.parameters() if id(p) not in ids], self.dp_group)
        if self.replicas is not None:
            average_gradients(experts, self.replicas)  # the mean; x replicas below
        scale = dist.get_world_size(self.dp_group)
        if self.replicas is not None:
            scale //= dist.get_world_size(self.replicas)
        for p in experts:
            if p.grad is not None:
                p.grad.div_(scale)


def apply_ep(model: nn.Module, dims: Any, n_experts: int) -> ExpertParallel:
    """Spread ``model``'s experts over ``dims.ep`` ranks of the dp dimension: the dp ranks
    themselves when ep == dp, else groups of ep consecutive ranks, each group's experts
    replicated over the groups (``n_experts`` divisible by ep)."""
    dp_group = dims.submesh("dp").get_group()
    replicas = None
    group = dp_group
    if dims.ep < dims.dp:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(
            dims.device_type, (dims.dp // dims.ep, dims.ep), mesh_dim_names=("ep_rep", "ep")
        )
        group, replicas = mesh["ep"].get_group(), mesh["ep_rep"].get_group()
    shard = ExpertShard(group, dist.get_rank(group), dist.get_world_size(group), n_experts)
    return ExpertParallel(model, shard, dp_group=dp_group, replicas=replicas)
