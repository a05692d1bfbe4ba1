"""The collectives of a training step, by parallelism, and how much of each is hidden.

dp/ZeRO   = over the dp·cp ranks that share parameters: ZeRO-0 all-reduce, ZeRO-1
            reduce-scatter + all-gather, once per step and hidden behind the last
            micro-batch's backward; ZeRO-2 reduce-scatters every micro-batch (DeepSpeed) or
            once per step (``grad_sync='per_step'``); ZeRO-3 gathers the weights for every
            forward and backward and hides each pass's traffic behind that pass only, the
            first unit's gather never (it is needed before any compute starts); with
            ``zero3_prefetch='module'``, DeepSpeed's first ZeRO-3 (``zero3_modules``).
tp        = 4 all-reduces of s·b·h activations per layer per micro-batch (+2 under full
            recompute); sequence parallel swaps each for reduce-scatter + all-gather.
cp        = ring attention: K and V gathered forward, their gradients reduce-scattered
            backward, per layer per micro-batch (not hidden: an upper bound).
pp        = a send of activations forward and of gradients backward per micro-batch.
ep        = all-to-alls of each token's top-k rows per MoE layer per micro-batch: dispatch
            and combine forward, their gradients backward (not hidden).

Each collective's cost is ``comm``'s ring formula on the link its group spans; what it
hides behind is ``compute_time``'s busiest-stage compute.
"""

from __future__ import annotations

from workbench.planner.comm import (
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    group_link,
    p2p_time,
)
from workbench.planner.compute_time import Compute
from workbench.planner.params import largest_unit, stage_params
from workbench.planner.specs import StepInputs
from workbench.planner.zero3_modules import module_dp_time

__all__ = ["cp_time", "dp_time", "ep_exchange_bytes", "ep_time", "pp_time", "tp_time"]


def dp_time(step: StepInputs, work: Compute, overlap: float) -> tuple[float, float]:
    """Data-parallel / ZeRO traffic over the dp·cp ranks that share parameters (spaced
    tp): (seconds of communication, seconds of it not hidden behind compute)."""
    model, training, parallel, m = step.model, step.training, step.parallel, step.m
    group, tp = parallel.grad_group, parallel.tp
    if group == 1:
        return 0.0, 0.0
    d = training.dtype_bytes
    dp_link = group_link(step.hardware, group, tp)
    n_rank = max(stage_params(model, tp, work.layout, vocab_parallel=parallel.vocab_parallel))
    trainable = n_rank * training.trainable
    grad_bytes = trainable * training.grad_comm_bytes
    z = parallel.zero
    once = training.grad_sync == "per_step" or m == 1
    bwd_micro = work.bwd_micro
    if z == 0:
        dp_comm = all_reduce_time(grad_bytes, group, dp_link)
        return dp_comm, max(0.0, dp_comm - overlap * bwd_micro)  # after the last backward
    rs = all_gather_time(grad_bytes, group, dp_link)
    if z <= 2:
        ag = all_gather_time(trainable * d, group, dp_link)  # updated weights
        syncs = 1 if z == 1 or once else m
        # Every reduce-scatter hides behind its micro-batch's backward; the last one and
        # the weight all-gather behind the last backward.
        exposed = (syncs - 1) * max(0.0, rs - overlap * bwd_micro) + max(
            0.0, rs + ag - overlap * bwd_micro
        )
        return syncs * rs + ag, exposed
    if training.zero3_prefetch == "module":
        return module_dp_time(step, work, dp_link)
    # ZeRO-3: every pass gathers the weights and hides that behind its own compute only;
    # the first unit's gather is never hidden.
    ag = all_gather_time(n_rank * d, group, dp_link)
    unit = all_gather_time(largest_unit(model, tp) * d, group, dp_link)
    fwd = max(unit, ag - overlap * work.fwd_micro)
    bwd_rs = max(unit, ag + rs - overlap * bwd_micro)
    bwd = max(unit, ag - overlap * bwd_micro)
    if once:  # gradients accumulate unsharded; one reduce-scatter after the last
        return m * 2 * ag + rs, m * fwd + (m - 1) * bwd + bwd_rs
    return m * (2 * ag + rs), m * (fwd + bwd_rs)


def _activation_bytes(step: StepInputs) -> float:
    """One micro-batch's activations at a layer boundary, on one context-parallel rank."""
    s_local = step.seq / step.parallel.cp
    return step.training.micro_batch * s_local * step.model.hidden * step.training.dtype_bytes


def tp_time(step: StepInputs, layers: int) -> float:
    """Tensor-parallel activation all-reduces over contiguous ranks: 4 per layer per
    micro-batch (6 under full recompute) on the busiest stage."""
    tp = step.parallel.tp
    if tp == 1:
        return 0.0
    act = _activation_bytes(step)
    per_layer = 6 if step.training.recompute == "full" else 4
    link = group_link(step.hardware, tp, 1)
    return layers * step.m * per_layer * all_reduce_time(act, tp, link)


def cp_time(step: StepInputs, layers: int) -> float:
    """Context parallel: K and V (kv_hidden wide, split over TP) gathered forward (and
    again under full recompute), their gradients reduce-scattered backward."""
    cp, tp, training = step.parallel.cp, step.parallel.tp, step.training
    if cp == 1:
        return 0.0
    kv = 2 * training.micro_batch * step.seq * step.model.kv_hidden * training.dtype_bytes / tp
    passes = 3 if training.recompute == "full" else 2
    link = group_link(step.hardware, cp, tp)
    return layers * step.m * passes * all_gather_time(kv, cp, link)


def ep_exchange_bytes(step: StepInputs) -> float:
    """Bytes one rank hands to one all-to-all of expert parallel, per layer and
    micro-batch: its tokens' top-k rows (``parallel/ep.py`` dispatches every row, also
    those for its own experts; the combine and the backward's exchanges return as many on
    average over the ranks, their split following the routing)."""
    model, training = step.model, step.training
    if step.parallel.ep == 1 or not model.experts:
        return 0.0
    tokens = training.micro_batch * step.seq / step.parallel.cp
    return tokens * model.top_k * model.hidden * training.dtype_bytes


def ep_time(step: StepInputs, layers: int) -> float:
    """Expert parallel: per MoE layer and micro-batch, rows to their experts' ranks and
    back (dispatch, combine), and their gradients the other way in backward (again in the
    recomputed forward under full recompute); all-to-alls over the ep ranks, spaced tp
    apart (ep borrows dp ranks)."""
    size = ep_exchange_bytes(step)
    if not size:
        return 0.0
    ep, training = step.parallel.ep, step.training
    passes = 6 if training.recompute == "full" else 4
    link = group_link(step.hardware, ep, step.parallel.tp)
    return layers * step.m * passes * all_to_all_time(size, ep, link)


def pp_time(step: StepInputs) -> float:
    """Pipeline point-to-point between neighbouring stages, ranks spaced tp·cp·dp apart:
    activations forward and their gradients backward, per micro-batch."""
    p = step.parallel
    if p.pp == 1:
        return 0.0
    act = _activation_bytes(step)
    sent = act / p.tp if p.sequence_parallel else act
    return 2 * step.m * p2p_time(sent, group_link(step.hardware, p.pp, p.tp * p.cp * p.dp))
