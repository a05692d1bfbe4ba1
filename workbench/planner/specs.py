"""Planner inputs: model, training, parallel layout and hardware, as validated dataclasses.

Every spec is keyword-only, slotted and frozen so a plan can be hashed, cached and swept.
Validation happens in ``__post_init__`` and raises ``ConfigError`` naming the bad value and
the valid range or choices (never ``assert``).

This module holds how a step is run (``TrainingSpec``, ``ParallelSpec`` and their
vocabulary; ``StepInputs``, the four specs and the shapes one step's time is sized by); what
is trained lives in ``model_spec``, what it runs on in ``hardware_spec`` and the shared
field checks in ``spec_checks``. Every spec and choice list is importable
from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.errors import ConfigError, ParallelError, choices_error
from workbench.planner.hardware_spec import GPU_KINDS, HardwareSpec, LinkSpec
from workbench.planner.model_spec import NORMS, ModelSpec, assumed_shape
from workbench.planner.spec_checks import check_float, check_int, check_opt_int, replace_spec
from workbench.vocab import OPTIMIZERS, PRECISIONS, RECOMPUTE, SCHEDULES

__all__ = [
    "GPU_KINDS",
    "GRAD_DTYPES",
    "GRAD_SYNC",
    "NORMS",
    "OPTIMIZERS",
    "PRECISIONS",
    "RECOMPUTE",
    "SCHEDULES",
    "ZERO3_PREFETCH",
    "HardwareSpec",
    "LinkSpec",
    "ModelSpec",
    "ParallelSpec",
    "StepInputs",
    "TrainingSpec",
    "assumed_shape",
]

# Gradient storage: "auto" is the precision's own (fp32 -> fp32; bf16-mixed -> bf16, or
# bf16 + an fp32 copy with fp32_grads=True); "fp32" alone is Megatron's main_grad and
# DeepSpeed ZeRO-3's accounting (2 + 4 + 12 = 18 bytes/param with Adam).
GRAD_DTYPES = ("auto", "bf16", "fp32", "bf16+fp32")
# When ZeRO-2/3 (FSDP) reduce-scatters gradients: after every micro-batch (DeepSpeed) or
# once per step after accumulating unsharded gradients (FSDP without gradient sync).
GRAD_SYNC = ("per_microbatch", "per_step")
# How ZeRO-3 gathers weights: a layer at a time, each pass's gathers hidden behind that
# pass (FSDP), or one sub-module (weight matrix) ahead with the device synchronized before
# every gather (DeepSpeed's ZeRO-3 as first released, v0.3.13, 2021): ``zero3_modules``.
ZERO3_PREFETCH = ("layer", "module")


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainingSpec:
    """One training step: batch, sequence, precision, optimizer, recompute and efficiency.

    ``mfu`` is the compute efficiency: the fraction of peak FLOP/s the executed matmul
    and attention FLOPs (recompute included) reach. None (the default) is the
    per-operation model of ``planner.efficiency``: matmuls at ``GEMM_EFFICIENCY`` of peak
    plus the memory-bound ops' traffic (``memory_traffic`` x activation bytes, default
    ``TRAFFIC_FACTOR``) at the hardware's memory bandwidth. A number alone is one flat
    efficiency for all the work (``memory_traffic`` then defaults to 0); the plan reports
    the achieved MFU (papers' definition) and HFU separately. ``overlap`` is the fraction of
    the eligible compute (backward; the matching pass under ZeRO-3) behind which data
    parallel traffic can hide. ``trainable`` < 1 models LoRA-style fine-tuning: only that
    fraction of parameters has gradients and optimizer state.
    """

    micro_batch: int = 1
    global_batch: int | None = None
    grad_accum: int | None = None
    seq: int | None = None
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    recompute: str = "none"
    dropout: bool = True
    fp32_grads: bool = False  # keep an fp32 gradient copy (Megatron main_grad, DeepSpeed 2+18)
    trainable: float = 1.0
    mfu: float | None = None  # None: the per-operation model (planner.efficiency)
    memory_traffic: float | None = None  # memory-bound bytes per activation byte
    overlap: float = 1.0
    bucket_bytes: int = 25 * 2**20  # DDP bucket; two in flight when dp > 1
    flash_attention: bool = False  # no s x s scores stored (an fp32 logsumexp instead)
    fused_swiglu: bool = False  # SwiGLU saves gate, up and the product (3 tensors, not 4)
    grads: str = "auto"  # see GRAD_DTYPES
    grad_sync: str = "per_microbatch"  # see GRAD_SYNC
    zero3_prefetch: str = "layer"  # see ZERO3_PREFETCH
    selective_overhead: float = 0.05  # selective recompute: extra share of layer compute
    # FP8 matmuls (Transformer Engine style): matmuls at the GPU's FP8 peak, an FP8 copy of
    # the weights (1 byte/param) beside the bf16 ones, linear-layer inputs saved in 1 byte.
    fp8: bool = False
    # ZeRO-Offload: fp32 gradients, fp32 master weights and optimizer state in host memory
    # (the optimizer step runs on the CPU; its time is not modelled); per step the bf16
    # gradients go down and the bf16 weights come back over PCIe.
    offload_optimizer: bool = False
    # Activation offload: each layer's saved activations go to host memory after its
    # forward and come back for its backward; the GPU keeps two layers' worth.
    offload_activations: bool = False

    def __post_init__(self) -> None:
        check_int("micro_batch", self.micro_batch)
        check_opt_int("global_batch", self.global_batch)
        check_opt_int("grad_accum", self.grad_accum)
        check_opt_int("seq", self.seq)
        check_int("bucket_bytes", self.bucket_bytes, minimum=0)
        if self.precision not in PRECISIONS:
            raise choices_error("precision", self.precision, PRECISIONS)
        if self.optimizer not in OPTIMIZERS:
            raise choices_error("optimizer", self.optimizer, OPTIMIZERS)
        if self.recompute not in RECOMPUTE:
            raise choices_error("recompute", self.recompute, RECOMPUTE)
        check_float("trainable", self.trainable, low=0.0, high=1.0)
        if self.mfu is not None:
            check_float("mfu", self.mfu, low=0.0, high=1.0)
        if self.memory_traffic is not None:
            check_float("memory_traffic", self.memory_traffic, low=0.0, high=1e3, low_open=False)
        check_float("overlap", self.overlap, low=0.0, high=1.0, low_open=False)
        if self.fp32_grads and self.precision == "fp32":
            raise ConfigError("fp32_grads=True only applies to precision='bf16-mixed'")
        if self.grads not in GRAD_DTYPES:
            raise choices_error("grads", self.grads, GRAD_DTYPES)
        if self.fp32_grads and self.grads not in ("auto", "bf16+fp32"):
            raise ConfigError(
                f"fp32_grads=True means grads='bf16+fp32', but grads={self.grads!r} was given"
            )
        if self.precision == "fp32" and self.grads not in ("auto", "fp32"):
            raise ConfigError(f"grads={self.grads!r} needs precision='bf16-mixed'")
        if self.grad_sync not in GRAD_SYNC:
            raise choices_error("grad_sync", self.grad_sync, GRAD_SYNC)
        if self.zero3_prefetch not in ZERO3_PREFETCH:
            raise choices_error("zero3_prefetch", self.zero3_prefetch, ZERO3_PREFETCH)
        check_float(
            "selective_overhead", self.selective_overhead, low=0.0, high=1.0, low_open=False
        )
        for name in ("fp8", "offload_optimizer", "offload_activations"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} is not valid; use True/False")
        if self.fp8 and self.precision != "bf16-mixed":
            raise ConfigError(f"fp8=True needs precision='bf16-mixed', not {self.precision!r}")

    @property
    def grad_dtype(self) -> str:
        """The resolved gradient storage: 'fp32', 'bf16' or 'bf16+fp32'."""
        if self.grads != "auto":
            return self.grads
        if self.precision == "fp32":
            return "fp32"
        return "bf16+fp32" if self.fp32_grads else "bf16"

    @property
    def grad_comm_bytes(self) -> int:
        """Bytes per gradient element that data-parallel collectives move (the fp32 copy
        when one is kept, else the stored dtype)."""
        return 2 if self.grad_dtype == "bf16" else 4

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one activation / compute-weight element."""
        return 4 if self.precision == "fp32" else 2

    def with_(self, **changes: Any) -> TrainingSpec:
        return replace_spec(self, **changes)


@dataclass(kw_only=True, slots=True, frozen=True)
class ParallelSpec:
    """How the job is split: data × tensor × pipeline parallel, ZeRO stage, sequence parallel.

    Ranks are laid out TP innermost, then DP, then PP (Megatron's order), so a TP group is
    contiguous and stays inside a node when tp <= GPUs per node. ``micro_batches`` is the
    number of micro-batches per step per data-parallel replica (the pipeline's m); it is
    the same thing as gradient accumulation and may be given in either place.
    ``vocab_parallel`` (Megatron's default) splits the embedding and head by vocabulary
    across TP ranks; False keeps them whole on every TP rank, as a TP plan that shards only
    the blocks does.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    micro_batches: int | None = None
    schedule: str = "1f1b"
    virtual_stages: int = 1
    vocab_parallel: bool = True
    cp: int = 1  # context parallel: the sequence split over cp ranks (ring attention)
    # expert parallel: a mixture-of-experts model's experts split over ep of the dp ranks,
    # tokens sent to their experts' ranks and back (all-to-all)
    ep: int = 1
    first_stage_layers: int | None = None  # uneven pipeline: fewer layers on stage 0
    last_stage_layers: int | None = None  # ... and on the last stage (Llama 3: one less)

    def __post_init__(self) -> None:
        check_int("dp", self.dp)
        check_int("tp", self.tp)
        check_int("pp", self.pp)
        check_int("cp", self.cp)
        check_int("ep", self.ep)
        if self.dp % self.ep:
            valid = [e for e in range(1, self.dp + 1) if self.dp % e == 0]
            raise ConfigError(
                f"ep={self.ep} is not valid with dp={self.dp}: expert parallel splits the "
                f"experts over ep of the data-parallel ranks; choose ep from {valid}"
            )
        check_opt_int("first_stage_layers", self.first_stage_layers)
        check_opt_int("last_stage_layers", self.last_stage_layers)
        if self.pp == 1 and (self.first_stage_layers or self.last_stage_layers):
            raise ConfigError("first_stage_layers / last_stage_layers need pp > 1")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise choices_error("zero", self.zero, (0, 1, 2, 3))
        check_opt_int("micro_batches", self.micro_batches)
        if self.schedule not in SCHEDULES:
            raise choices_error("schedule", self.schedule, SCHEDULES)
        check_int("virtual_stages", self.virtual_stages)
        if self.virtual_stages > 1 and self.schedule in ("1f1b", "gpipe"):
            raise ConfigError(
                f"virtual_stages > 1 needs a multi-stage schedule, not {self.schedule!r}: "
                "'interleaved', 'zero_bubble', 'zbv' or 'dualpipe_v'"
            )
        if self.sequence_parallel and self.tp == 1:
            raise ParallelError("sequence_parallel=True needs tp > 1 (it shards along TP)")

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def grad_group(self) -> int:
        """Ranks that hold the same parameters and sync (or shard) their gradients:
        data parallel x context parallel."""
        return self.dp * self.cp

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        """Transformer layers on each pipeline stage. Balanced by default (the first
        stages take the remainder); with first/last_stage_layers the middle stages share
        what is left evenly."""
        p = self.pp
        if p == 1:
            return (layers,)
        first, last = self.first_stage_layers, self.last_stage_layers
        if first is None and last is None:
            base, extra = divmod(layers, p)
            return tuple(base + (1 if i < extra else 0) for i in range(p))
        rest = layers - (first or 0) - (last or 0)
        middle = p - (first is not None) - (last is not None)
        if rest < middle or (middle and rest % middle) or (not middle and rest):
            raise ParallelError(
                f"first_stage_layers={first}, last_stage_layers={last} leave {rest} of "
                f"{layers} layers for {middle} middle stage(s); they must split evenly "
                "(at least one layer each)"
            )
        each = rest // middle if middle else 0
        return tuple(
            first if i == 0 and first is not None
            else last if i == p - 1 and last is not None
            else each
            for i in range(p)
        )  # fmt: skip

    def with_(self, **changes: Any) -> ParallelSpec:
        return replace_spec(self, **changes)


@dataclass(frozen=True, slots=True)
class StepInputs:
    """What every collective of a step is sized by: the run as planned, its sequence
    length and its micro-batches per step (m)."""

    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelSpec
    hardware: HardwareSpec
    seq: int
    m: int
