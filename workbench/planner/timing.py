"""Step time: compute at a set efficiency, plus what compute cannot hide.

FLOPs per token (Narayanan et al. 2021, eq. 3; PaLM appendix B): a training step runs
6·N matmul FLOPs per token (N: the matmul parameters, head included, embedding lookup
not) plus 12·L·s·h for attention (QKᵀ and AV; forward 4·L·s·h). That is the MFU numerator
papers use. HFU counts what is executed: a second forward under full recompute, the
attention core again under selective recompute.

compute   = per micro-batch, the busiest pipeline stage's executed FLOPs at the matmul
            efficiency × peak plus its memory-bound traffic at the memory bandwidth
            (``planner.efficiency``; a flat ``mfu`` when one is given), times the
            micro-batches; the pipeline adds
bubble    = (p−1)/v of one busiest-stage micro-batch per micro-batch slot.
dp/ZeRO   = over the dp·cp ranks that share parameters: ZeRO-0 all-reduce, ZeRO-1
            reduce-scatter + all-gather, once per step and hidden behind the last
            micro-batch's backward; ZeRO-2 reduce-scatters every micro-batch (DeepSpeed) or
            once per step (``grad_sync='per_step'``); ZeRO-3 gathers the weights for every
            forward and backward and hides each pass's traffic behind that pass only, the
            first unit's gather never (it is needed before any compute starts).
tp        = 4 all-reduces of s·b·h activations per layer per micro-batch (+2 under full
            recompute); sequence parallel swaps each for reduce-scatter + all-gather.
cp        = ring attention: K and V gathered forward, their gradients reduce-scattered
            backward, per layer per micro-batch (not hidden: an upper bound).
pp        = a send of activations forward and of gradients backward per micro-batch.
overhead  = the hardware's per-step time outside forward and backward (CPU profile).
fp8       = matmul FLOPs at the FP8 peak, attention-core FLOPs at the bf16 peak.
offload   = optimizer offload (ZeRO-Offload): the rank's bf16 gradient shard to the host
            and its bf16 weights back, once per step at the host bandwidth, not hidden (the
            CPU optimizer step itself is not modelled); activation offload: every
            micro-batch's saved activations out in forward and back in backward, hidden
            behind that micro-batch's compute up to the overlap.
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
from workbench.planner.comm import (
    all_gather_time,
    all_reduce_time,
    group_link,
    p2p_time,
    spans_nodes,
)
from workbench.planner.efficiency import GEMM_EFFICIENCY, TRAFFIC_FACTOR
from workbench.planner.memory import model_layer_bytes
from workbench.planner.params import (
    count_params,
    largest_unit,
    matmul_params,
    stage_params,
)
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, TrainingSpec

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

    @property
    def total(self) -> float:
        return (
            self.compute
            + self.bubble
            + self.dp_exposed
            + self.tp_comm
            + self.pp_comm
            + self.cp_comm
            + self.overhead
            + self.offload
        )

    @property
    def comm_exposed(self) -> float:
        return self.dp_exposed + self.tp_comm + self.pp_comm + self.cp_comm

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


def training_flops(n_params: int, tokens: int, training: TrainingSpec) -> float:
    """Executed matmul FLOPs of one step counted as 2·N per token per pass, attention left
    out: forward 2N, backward 2N (inputs) + 2N·trainable (weights), and a second forward
    under full recompute. (A parameter-count rule of thumb; ``step_time`` uses the
    per-layer count with attention, ``executed_flops_per_token``.)"""
    per_token = (4 + 2 * training.trainable) * n_params
    if training.recompute == "full":
        per_token += 2 * n_params
    return per_token * tokens


def _attention_fwd(model: ModelSpec, seq: int) -> float:
    """Forward attention-core FLOPs per token per layer (QKᵀ and AV: 2·s·h each)."""
    return 4.0 * seq * model.hidden


def model_flops_per_token(model: ModelSpec, seq: int) -> float:
    """The papers' MFU numerator per token: 6·N_matmul + 12·L·s·h."""
    return 6.0 * matmul_params(model) + 3.0 * model.layers * _attention_fwd(model, seq)


def _passes(training: TrainingSpec) -> tuple[float, float]:
    """(matmul passes, attention-core passes) per token in units of one forward:
    forward 1, backward 1 + trainable (inputs and weights) for matmuls, 2 for attention;
    +1 forward of everything under full recompute, of the attention core under selective
    recompute without FlashAttention."""
    matmul = 2.0 + training.trainable
    attention = 3.0
    if training.recompute == "full":
        matmul += 1.0
        attention += 1.0
    elif training.recompute == "selective" and not training.flash_attention:
        attention += 1.0
    return matmul, attention


def executed_flops_per_token(model: ModelSpec, training: TrainingSpec, seq: int) -> float:
    """Executed FLOPs per token of the whole model (the HFU numerator per token)."""
    matmul, attention = _passes(training)
    return 2.0 * matmul_params(model) * matmul + (
        model.layers * _attention_fwd(model, seq) * attention
    )


def _layer_head_flops(model: ModelSpec, training: TrainingSpec, seq: int) -> tuple[float, float]:
    """Executed FLOPs per token of one transformer layer, and of the output head."""
    c = count_params(model)
    total_mm = matmul_params(model)
    head_mm = c.embedding if c.head == 0 else c.head
    layer_mm = (total_mm - head_mm) / model.layers
    matmul, attention = _passes(training)
    layer = 2.0 * layer_mm * matmul + _attention_fwd(model, seq) * attention
    return layer, 2.0 * head_mm * matmul


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


def _traffic_per_layer(
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
    passes = 2.0 if training.recompute == "full" else 1.0
    return factor * act * passes / hardware.memory_bandwidth


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
    traffic = _traffic_per_layer(model, training, parallel, hardware, seq, factor)
    rate = eff * _compute_peak(model, training, hardware, seq) * share
    work = _compute(model, training, parallel, seq, m, rate=rate, traffic=traffic)
    overlap = min(training.overlap, hardware.max_overlap)
    dp_comm, dp_exposed = _dp_time(model, training, parallel, hardware, work, m, overlap)
    if hardware.comm_cpu is not None:  # CPU ranks: the collective's work takes the cores
        dp_exposed = hardware.comm_cpu * dp_comm / share
    layers = max(work.layout)
    return StepTime(
        compute=work.compute,
        bubble=work.bubble,
        dp_comm=dp_comm,
        dp_exposed=dp_exposed,
        tp_comm=_tp_time(model, training, parallel, hardware, seq, m, layers),
        pp_comm=_pp_time(model, training, parallel, hardware, seq, m),
        tokens=tokens,
        world=world,
        model_flops=model_flops_per_token(model, seq) * tokens,
        peak_flops=peak,
        dp_inter=spans_nodes(parallel.grad_group, tp, hardware.gpus_per_node),
        tp_inter=spans_nodes(tp, 1, hardware.gpus_per_node),
        pp_inter=spans_nodes(pp, tp * cp * dp, hardware.gpus_per_node),
        hardware_flops=executed_flops_per_token(model, training, seq) * tokens,
        cp_comm=_cp_time(model, training, parallel, hardware, seq, m, layers),
        overhead=hardware.step_overhead / share,
        offload=_offload_time(model, training, parallel, hardware, seq, work, overlap),
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


def _compute_peak(
    model: ModelSpec, training: TrainingSpec, hardware: HardwareSpec, seq: int
) -> float:
    """The peak the executed FLOPs run at: the precision's, or under FP8 the matmuls at
    the FP8 peak and the attention core at bf16 (one rate with the same total time)."""
    peak = hardware.flops(training.precision)
    if not training.fp8 or hardware.peak_flops_fp8 is None:
        return peak
    matmul, _ = _passes(training)
    mm = 2.0 * matmul_params(model) * matmul
    total = executed_flops_per_token(model, training, seq)
    return total / (mm / hardware.peak_flops_fp8 + (total - mm) / peak)


def _offload_time(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    seq: int,
    work: _Compute,
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


@dataclass(frozen=True, slots=True)
class _Compute:
    """The busiest pipeline stage's compute: one micro-batch (and its forward and backward
    parts, which data-parallel traffic hides behind), the whole step, and the bubble."""

    layout: tuple[int, ...]  # transformer layers per pipeline stage
    per_micro: float
    fwd_micro: float
    bwd_micro: float
    compute: float
    bubble: float


def _compute(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    seq: int,
    m: int,
    *,
    rate: float,
    traffic: float = 0.0,
) -> _Compute:
    """Compute at ``rate`` FLOP/s per rank plus ``traffic`` seconds of memory-bound work
    per layer: the busiest stage, one micro-batch (b·s tokens over its tp·cp ranks), m of
    them per step, and the pipeline bubble."""
    pp = parallel.pp
    layer_f, head_f = _layer_head_flops(model, training, seq)
    layout = parallel.stage_layers(model.layers)
    stage = [n * layer_f + (head_f if i == pp - 1 else 0.0) for i, n in enumerate(layout)]
    busiest = max(range(pp), key=lambda i: stage[i])
    scale = training.micro_batch * seq / (parallel.tp * parallel.cp * rate)
    per_micro = stage[busiest] * scale + layout[busiest] * traffic
    if training.recompute == "selective" and not training.flash_attention:
        # Recomputing softmax and dropout is memory-bound: Korthikanti et al. measured it
        # as a share of each layer's time, not as FLOPs.
        per_micro += training.selective_overhead * layout[busiest] * layer_f * scale
    fwd_share = 1.0 / _passes(training)[0]  # the forward is one of the matmul passes
    return _Compute(
        layout=layout,
        per_micro=per_micro,
        fwd_micro=per_micro * fwd_share,
        bwd_micro=per_micro * (1.0 - fwd_share),
        compute=m * per_micro,
        bubble=per_micro * (pp - 1) / parallel.virtual_stages if pp > 1 else 0.0,
    )


def _dp_time(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    work: _Compute,
    m: int,
    overlap: float,
) -> tuple[float, float]:
    """Data-parallel / ZeRO traffic over the dp·cp ranks that share parameters (spaced
    tp): (seconds of communication, seconds of it not hidden behind compute)."""
    group, tp = parallel.grad_group, parallel.tp
    if group == 1:
        return 0.0, 0.0
    d = training.dtype_bytes
    dp_link = group_link(hardware, group, tp)
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


def _activation_bytes(model: ModelSpec, training: TrainingSpec, cp: int, seq: int) -> float:
    """One micro-batch's activations at a layer boundary, on one context-parallel rank."""
    s_local = seq / cp
    return training.micro_batch * s_local * model.hidden * training.dtype_bytes


def _tp_time(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    seq: int,
    m: int,
    layers: int,
) -> float:
    """Tensor-parallel activation all-reduces over contiguous ranks: 4 per layer per
    micro-batch (6 under full recompute) on the busiest stage."""
    tp = parallel.tp
    if tp == 1:
        return 0.0
    act = _activation_bytes(model, training, parallel.cp, seq)
    per_layer = 6 if training.recompute == "full" else 4
    return layers * m * per_layer * all_reduce_time(act, tp, group_link(hardware, tp, 1))


def _cp_time(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    seq: int,
    m: int,
    layers: int,
) -> float:
    """Context parallel: K and V (kv_hidden wide, split over TP) gathered forward (and
    again under full recompute), their gradients reduce-scattered backward."""
    cp, tp = parallel.cp, parallel.tp
    if cp == 1:
        return 0.0
    kv = 2 * training.micro_batch * seq * model.kv_hidden * training.dtype_bytes / tp
    passes = 3 if training.recompute == "full" else 2
    return layers * m * passes * all_gather_time(kv, cp, group_link(hardware, cp, tp))


def _pp_time(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    seq: int,
    m: int,
) -> float:
    """Pipeline point-to-point between neighbouring stages, ranks spaced tp·cp·dp apart:
    activations forward and their gradients backward, per micro-batch."""
    p = parallel
    if p.pp == 1:
        return 0.0
    act = _activation_bytes(model, training, p.cp, seq)
    sent = act / p.tp if p.sequence_parallel else act
    return 2 * m * p2p_time(sent, group_link(hardware, p.pp, p.tp * p.cp * p.dp))
