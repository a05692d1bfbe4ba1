"""Step time: compute at a set efficiency, plus what compute cannot hide.

The step adds up parts that each have their own module:

- the FLOPs a step counts (MFU) and executes (HFU): ``flops``;
- compute, the pipeline bubble and offload copies, one rank's own time: ``compute_time``;
- the data-, tensor-, context- and pipeline-parallel collectives and how much of each
  compute hides: ``comm_time``;
- overhead = the hardware's per-step time outside forward and backward (CPU profile).

cores     = CPU ranks time-share a node's cores: with r = min(world, ranks per node) busy
            ranks and ``background`` other busy processes on c cores, each rank runs
            share = min(1, c / (r + background)) of the time, so compute (and the bubble)
            and the overhead stretch by 1/share; the collectives keep their calibrated
            cost (the fit was measured with the ranks sharing the cores), except the
            data-parallel one on CPU ranks with ``comm_cpu``: gloo's work there competes
            with compute for the same cores, so comm_cpu x its time is added to the step
            (never hidden) and stretched by 1/share too.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import ConfigError
from workbench.planner.comm import spans_nodes
from workbench.planner.comm_time import cp_time, dp_time, ep_time, pp_time, tp_time
from workbench.planner.compute_time import (
    compute_efficiency,
    compute_peak,
    offload_time,
    stage_compute,
    traffic_per_layer,
)
from workbench.planner.flops import (
    executed_flops_per_token,
    model_flops_per_token,
    training_flops,
)
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, StepInputs, TrainingSpec

# compute_efficiency and the FLOP counts live in compute_time and flops; they stay
# importable from here, where they were first.
__all__ = [
    "StepTime",
    "compute_efficiency",
    "executed_flops_per_token",
    "model_flops_per_token",
    "step_time",
    "training_flops",
]


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
    model_flops: float  # papers' MFU numerator: (6·N + 12·L·s·h)·tokens
    peak_flops: float
    dp_inter: bool = False
    tp_inter: bool = False
    pp_inter: bool = False
    hardware_flops: float = 0.0  # executed FLOPs (recompute included): the HFU numerator
    cp_comm: float = 0.0
    overhead: float = 0.0
    offload: float = 0.0  # GPU <-> host copies not hidden behind compute
    ep_comm: float = 0.0  # expert parallel's all-to-alls

    @property
    def total(self) -> float:
        return (
            self.compute
            + self.bubble
            + self.dp_exposed
            + self.tp_comm
            + self.pp_comm
            + self.cp_comm
            + self.ep_comm
            + self.overhead
            + self.offload
        )

    @property
    def comm_exposed(self) -> float:
        return self.dp_exposed + self.tp_comm + self.pp_comm + self.cp_comm + self.ep_comm

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total

    @property
    def efficiency(self) -> float:
        """Fraction of the step spent on useful compute (1.0: perfect linear scaling)."""
        return self.compute / self.total

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation as papers define it (attention FLOPs included)."""
        return self.model_flops / (self.world * self.peak_flops * self.total)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: executed FLOPs (recompute included) per peak."""
        return self.hardware_flops / (self.world * self.peak_flops * self.total)

    @property
    def tflops_per_gpu(self) -> float:
        """Achieved model TFLOP/s per GPU (the MFU numerator per second per GPU)."""
        return self.model_flops / (self.world * self.total) / 1e12

    def as_dict(self) -> dict[str, float]:
        return {
            "compute_s": self.compute,
            "bubble_s": self.bubble,
            "dp_comm_s": self.dp_comm,
            "dp_exposed_s": self.dp_exposed,
            "tp_comm_s": self.tp_comm,
            "cp_comm_s": self.cp_comm,
            "pp_comm_s": self.pp_comm,
            "overhead_s": self.overhead,
            "offload_s": self.offload,
            "step_s": self.total,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s,
            "efficiency": self.efficiency,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tflops_per_gpu": self.tflops_per_gpu,
        }


def step_time(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    seq: int,
    micro_batches: int,
) -> StepTime:
    dp, tp, pp, cp, m = parallel.dp, parallel.tp, parallel.pp, parallel.cp, micro_batches
    world = parallel.world
    tokens = training.micro_batch * m * dp * seq
    peak = hardware.flops(training.precision)
    _check_options(training, hardware)
    share = hardware.core_share(min(world, hardware.gpus_per_node))
    eff, factor = compute_efficiency(training, hardware)
    traffic = traffic_per_layer(model, training, parallel, hardware, seq, factor)
    rate = eff * compute_peak(model, training, hardware, seq) * share
    work = stage_compute(model, training, parallel, seq, m, rate=rate, traffic=traffic)
    overlap = min(training.overlap, hardware.max_overlap)
    sized = StepInputs(model, training, parallel, hardware, seq, m)
    dp_comm, dp_exposed = dp_time(sized, work, overlap)
    if hardware.comm_cpu is not None:  # CPU ranks: the collective's work takes the cores
        dp_exposed = hardware.comm_cpu * dp_comm / share
    layers = max(work.layout)
    return StepTime(
        compute=work.compute,
        bubble=work.bubble,
        dp_comm=dp_comm,
        dp_exposed=dp_exposed,
        tp_comm=tp_time(sized, layers),
        pp_comm=pp_time(sized),
        tokens=tokens,
        world=world,
        model_flops=model_flops_per_token(model, seq) * tokens,
        peak_flops=peak,
        dp_inter=spans_nodes(parallel.grad_group, tp, hardware.gpus_per_node),
        tp_inter=spans_nodes(tp, 1, hardware.gpus_per_node),
        pp_inter=spans_nodes(pp, tp * cp * dp, hardware.gpus_per_node),
        hardware_flops=executed_flops_per_token(model, training, seq) * tokens,
        cp_comm=cp_time(sized, layers),
        ep_comm=ep_time(sized, layers),
        overhead=hardware.step_overhead / share,
        offload=offload_time(model, training, parallel, hardware, seq, work, overlap),
    )


def _check_options(training: TrainingSpec, hardware: HardwareSpec) -> None:
    """FP8 and offload need the hardware's FP8 peak and host bandwidth."""
    if training.fp8 and hardware.peak_flops_fp8 is None:
        raise ConfigError(
            f"fp8=True but hardware {hardware.name!r} has no FP8 peak; give "
            "HardwareSpec(peak_flops_fp8=...) or a GPU with FP8 tensor cores (h100-80gb, "
            "h200-141gb)"
        )
    if (training.offload_optimizer or training.offload_activations) and not (
        hardware.host_bandwidth
    ):
        raise ConfigError(
            f"offload needs the GPU <-> host bandwidth, which hardware {hardware.name!r} "
            "does not give; set HardwareSpec(host_bandwidth=<bytes/s>)"
        )
