"""Step time: compute at a set MFU, plus the communication that compute cannot hide.

compute   = F / (world · mfu · peak), F = (4 + 2·trainable)·N·tokens (6·N·tokens for full
            training; +2·N·tokens with full recompute, which reruns the forward)
bubble    = compute · (p−1)/(v·m)                      (pipeline fill and drain)
dp/ZeRO   = all-reduce of gradients (ZeRO-0); reduce-scatter of gradients + all-gather
            of weights (ZeRO-1/2, ZeRO-2 reduce-scatters every micro-batch); two weight
            all-gathers and a gradient reduce-scatter every micro-batch (ZeRO-3). Hidden
            behind ``overlap`` × backward compute (× all compute for ZeRO-3).
tp        = 4 all-reduces of s·b·h activations per layer per micro-batch (2 forward,
            2 backward; +2 with full recompute); sequence parallel swaps each for a
            reduce-scatter + all-gather of the same cost. Not hidden.
pp        = a send of activations forward and of gradients backward per micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.planner.comm import (
    all_gather_time,
    all_reduce_time,
    group_link,
    p2p_time,
    spans_nodes,
)
from workbench.planner.params import params_per_rank
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, TrainingSpec

__all__ = ["StepTime", "step_time", "training_flops"]


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds per training step by part, and what they add up to."""

    compute: float
    bubble: float
    dp_comm: float
    dp_exposed: float
    tp_comm: float
    pp_comm: float
    tokens: int
    world: int
    model_flops: float  # 6·N·tokens (the MFU numerator)
    peak_flops: float
    dp_inter: bool = False
    tp_inter: bool = False
    pp_inter: bool = False

    @property
    def total(self) -> float:
        return self.compute + self.bubble + self.dp_exposed + self.tp_comm + self.pp_comm

    @property
    def comm_exposed(self) -> float:
        return self.dp_exposed + self.tp_comm + self.pp_comm

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total

    @property
    def efficiency(self) -> float:
        """Fraction of the step spent on useful compute (1.0: perfect linear scaling)."""
        return self.compute / self.total

    @property
    def mfu(self) -> float:
        """Achieved model FLOPs utilisation: 6·N·tokens / (world · peak · step time)."""
        return self.model_flops / (self.world * self.peak_flops * self.total)

    def as_dict(self) -> dict[str, float]:
        return {
            "compute_s": self.compute,
            "bubble_s": self.bubble,
            "dp_comm_s": self.dp_comm,
            "dp_exposed_s": self.dp_exposed,
            "tp_comm_s": self.tp_comm,
            "pp_comm_s": self.pp_comm,
            "step_s": self.total,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s,
            "efficiency": self.efficiency,
            "mfu": self.mfu,
        }


def training_flops(n_params: int, tokens: int, training: TrainingSpec) -> float:
    """Executed FLOPs of one step: forward 2N, backward 2N (inputs) + 2N·trainable
    (weights), and a second forward under full recompute."""
    per_token = (4 + 2 * training.trainable) * n_params
    if training.recompute == "full":
        per_token += 2 * n_params
    return per_token * tokens


def step_time(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    seq: int,
    micro_batches: int,
) -> StepTime:
    dp, tp, pp, m = parallel.dp, parallel.tp, parallel.pp, micro_batches
    world = parallel.world
    n = model.n_params
    tokens = training.micro_batch * m * dp * seq
    peak = hardware.flops(training.precision)
    compute = training_flops(n, tokens, training) / (world * training.mfu * peak)
    bubble = compute * (pp - 1) / (parallel.virtual_stages * m) if pp > 1 else 0.0

    # Data-parallel / ZeRO traffic over dp ranks spaced tp apart.
    d = training.dtype_bytes
    dp_link = group_link(hardware, dp, tp)
    n_rank = params_per_rank(model, tp, pp, vocab_parallel=parallel.vocab_parallel)
    trainable = n_rank * training.trainable
    grad_bytes = trainable * (4 if training.fp32_grads else d)
    z = parallel.zero
    if dp == 1:
        dp_comm = 0.0
    elif z == 0:
        dp_comm = all_reduce_time(grad_bytes, dp, dp_link)
    elif z == 1:
        dp_comm = all_gather_time(grad_bytes, dp, dp_link) + all_gather_time(
            trainable * d, dp, dp_link
        )
    elif z == 2:
        dp_comm = m * all_gather_time(grad_bytes, dp, dp_link) + all_gather_time(
            trainable * d, dp, dp_link
        )
    else:
        dp_comm = m * (
            2 * all_gather_time(n_rank * d, dp, dp_link) + all_gather_time(grad_bytes, dp, dp_link)
        )
    # Backward share of the executed FLOPs: (recompute forward + 2N + 2N·trainable) out of
    # (forward 2N + all of that).
    rec = 2.0 if training.recompute == "full" else 0.0
    back = rec + 2.0 + 2.0 * training.trainable
    backward = compute * back / (2.0 + back)
    if z >= 3:
        hideable = compute
    elif z == 2:
        hideable = backward
    else:
        hideable = backward / m  # one sync after the last micro-batch's backward
    dp_exposed = max(0.0, dp_comm - training.overlap * hideable)

    # Tensor-parallel activations all-reduces, contiguous ranks.
    layers = math.ceil(model.layers / pp)
    tp_comm = 0.0
    if tp > 1:
        per_layer = 6 if training.recompute == "full" else 4
        act = training.micro_batch * seq * model.hidden * d
        tp_comm = layers * m * per_layer * all_reduce_time(act, tp, group_link(hardware, tp, 1))

    # Pipeline point-to-point between neighbouring stages, ranks spaced tp·dp apart.
    pp_comm = 0.0
    if pp > 1:
        act = training.micro_batch * seq * model.hidden * d
        if parallel.sequence_parallel:
            act /= tp
        pp_comm = 2 * m * p2p_time(act, group_link(hardware, pp, tp * dp))

    return StepTime(
        compute=compute,
        bubble=bubble,
        dp_comm=dp_comm,
        dp_exposed=dp_exposed,
        tp_comm=tp_comm,
        pp_comm=pp_comm,
        tokens=tokens,
        world=world,
        model_flops=6.0 * n * tokens,
        peak_flops=peak,
        dp_inter=spans_nodes(dp, tp, hardware.gpus_per_node),
        tp_inter=spans_nodes(tp, 1, hardware.gpus_per_node),
        pp_inter=spans_nodes(pp, tp * dp, hardware.gpus_per_node),
    )
