"""What one rank spends on its own in a step: compute, the pipeline bubble, offload copies.

compute   = per micro-batch, the busiest pipeline stage's executed FLOPs (``flops``) at
            the matmul efficiency × peak plus its memory-bound traffic at the memory
            bandwidth (``planner.efficiency``; a flat ``mfu`` when one is given), times the
            micro-batches; the pipeline adds
bubble    = (p−1)/v of one busiest-stage micro-batch per micro-batch slot.
fp8       = matmul FLOPs at the FP8 peak, attention-core FLOPs at the bf16 peak.
offload   = optimizer offload (ZeRO-Offload): the rank's bf16 gradient shard to the host
            and its bf16 weights back, once per step at the host bandwidth, not hidden (the
            CPU optimizer step itself is not modelled); activation offload: every
            micro-batch's saved activations out in forward and back in backward, hidden
            behind that micro-batch's compute up to the overlap.

The collectives are ``comm_time``'s; ``timing.step_time`` adds the parts up.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.planner.efficiency import GEMM_EFFICIENCY, TRAFFIC_FACTOR
from workbench.planner.flops import executed_flops_per_token, layer_head_flops, passes
from workbench.planner.memory import model_layer_bytes
from workbench.planner.params import matmul_params, stage_params
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, TrainingSpec

__all__ = [
    "Compute",
    "compute_efficiency",
    "compute_peak",
    "offload_time",
    "stage_compute",
    "traffic_per_layer",
]


def compute_efficiency(training: TrainingSpec, hardware: HardwareSpec) -> tuple[float, float]:
    """(matmul efficiency, memory traffic per activation byte) a plan computes with: the
    per-operation model's constants (the hardware's own matmul efficiency when it has
    one) unless ``training.mfu`` fixes a flat efficiency (then
    no traffic term unless ``memory_traffic`` is given); no traffic term on hardware
    without a memory bandwidth (CPU profiles, whose rate is measured)."""
    if training.mfu is None:
        eff = hardware.gemm_efficiency or GEMM_EFFICIENCY
        traffic = TRAFFIC_FACTOR if training.memory_traffic is None else training.memory_traffic
    else:
        eff, traffic = training.mfu, training.memory_traffic or 0.0
    return eff, (traffic if hardware.memory_bandwidth else 0.0)


def traffic_per_layer(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    seq: int,
    factor: float,
) -> float:
    """Seconds one rank's memory-bound ops take per layer per micro-batch: ``factor`` x
    the layer's activation bytes without recompute (forward again under full recompute)
    at the memory bandwidth."""
    if factor == 0.0 or not hardware.memory_bandwidth:
        return 0.0
    act = model_layer_bytes(model, training, parallel, hardware, seq, recompute="none")
    forwards = 2.0 if training.recompute == "full" else 1.0
    return factor * act * forwards / hardware.memory_bandwidth


def compute_peak(
    model: ModelSpec, training: TrainingSpec, hardware: HardwareSpec, seq: int
) -> float:
    """The peak the executed FLOPs run at: the precision's, or under FP8 the matmuls at
    the FP8 peak and the attention core at bf16 (one rate with the same total time)."""
    peak = hardware.flops(training.precision)
    if not training.fp8 or hardware.peak_flops_fp8 is None:
        return peak
    matmul, _ = passes(training)
    mm = 2.0 * matmul_params(model) * matmul
    total = executed_flops_per_token(model, training, seq)
    return total / (mm / hardware.peak_flops_fp8 + (total - mm) / peak)


@dataclass(frozen=True, slots=True)
class Compute:
    """The busiest pipeline stage's compute: one micro-batch (and its forward and backward
    parts, which data-parallel traffic hides behind), the whole step, and the bubble."""

    layout: tuple[int, ...]  # transformer layers per pipeline stage
    per_micro: float
    fwd_micro: float
    bwd_micro: float
    compute: float
    bubble: float
    head_micro: float = 0.0  # of per_micro, the output head's share (busiest stage)


def stage_compute(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    seq: int,
    m: int,
    *,
    rate: float,
    traffic: float = 0.0,
) -> Compute:
    """Compute at ``rate`` FLOP/s per rank plus ``traffic`` seconds of memory-bound work
    per layer: the busiest stage, one micro-batch (b·s tokens over its tp·cp ranks), m of
    them per step, and the pipeline bubble."""
    pp = parallel.pp
    layer_f, head_f = layer_head_flops(model, training, seq)
    layout = parallel.stage_layers(model.layers)
    stage = [n * layer_f + (head_f if i == pp - 1 else 0.0) for i, n in enumerate(layout)]
    busiest = max(range(pp), key=lambda i: stage[i])
    scale = training.micro_batch * seq / (parallel.tp * parallel.cp * rate)
    per_micro = stage[busiest] * scale + layout[busiest] * traffic
    head_micro = head_f * scale if busiest == pp - 1 else 0.0
    if training.recompute == "selective" and not training.flash_attention:
        # Recomputing softmax and dropout is memory-bound: Korthikanti et al. measured it
        # as a share of each layer's time, not as FLOPs.
        per_micro += training.selective_overhead * layout[busiest] * layer_f * scale
    fwd_share = 1.0 / passes(training)[0]  # the forward is one of the matmul passes
    return Compute(
        layout=layout,
        per_micro=per_micro,
        fwd_micro=per_micro * fwd_share,
        bwd_micro=per_micro * (1.0 - fwd_share),
        compute=m * per_micro,
        bubble=per_micro * (pp - 1) / parallel.virtual_stages * _BUBBLE_SHARE[parallel.schedule]
        if pp > 1
        else 0.0,
        head_micro=head_micro,
    )


# What is left of the 1F1B bubble when backward is split into B and W (equal F, B, W
# costs): ZB-H1 fills two thirds of it with W; ZB-V and DualPipeV fill all of it.
_BUBBLE_SHARE: dict[str, float] = {
    **{"gpipe": 1.0, "1f1b": 1.0, "interleaved": 1.0},
    **{"zero_bubble": 1 / 3, "zbv": 0.0, "dualpipe_v": 0.0},
}


def offload_time(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    seq: int,
    work: Compute,
    overlap: float,
) -> float:
    """Seconds of GPU <-> host copies the step waits for (see the module docstring)."""
    bw = hardware.host_bandwidth
    if not bw:
        return 0.0
    seconds = 0.0
    if training.offload_optimizer:
        n = max(
            stage_params(model, parallel.tp, work.layout, vocab_parallel=parallel.vocab_parallel)
        )
        shard = n * training.trainable / (parallel.grad_group if parallel.zero >= 1 else 1)
        seconds += 2 * training.dtype_bytes * shard / bw  # gradients down, weights up
    if training.offload_activations:
        layers = max(work.layout)
        act = layers * model_layer_bytes(model, training, parallel, hardware, seq)
        per_micro = 2 * act / bw  # out during forward, back during backward
        seconds += work.compute / work.per_micro * max(0.0, per_micro - overlap * work.per_micro)
    return seconds
