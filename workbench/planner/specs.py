"""Planner inputs: model, training, parallel layout and hardware, as validated dataclasses.

Every spec is keyword-only, slotted and frozen so a plan can be hashed, cached and swept.
Validation happens in ``__post_init__`` and raises ``ConfigError`` naming the bad value and
the valid range or choices (never ``assert``).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from workbench.errors import ConfigError, ParallelError, choices_error

__all__ = [
    "GPU_KINDS",
    "GRAD_DTYPES",
    "GRAD_SYNC",
    "NORMS",
    "OPTIMIZERS",
    "PRECISIONS",
    "RECOMPUTE",
    "SCHEDULES",
    "HardwareSpec",
    "LinkSpec",
    "ModelSpec",
    "ParallelSpec",
    "TrainingSpec",
    "assumed_shape",
]

PRECISIONS = ("fp32", "bf16-mixed")
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum")
RECOMPUTE = ("none", "selective", "full")
NORMS = ("layernorm", "rmsnorm")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
GPU_KINDS = ("gpu", "cpu")
# Gradient storage: "auto" is the precision's own (fp32 -> fp32; bf16-mixed -> bf16, or
# bf16 + an fp32 copy with fp32_grads=True); "fp32" alone is Megatron's main_grad and
# DeepSpeed ZeRO-3's accounting (2 + 4 + 12 = 18 bytes/param with Adam).
GRAD_DTYPES = ("auto", "bf16", "fp32", "bf16+fp32")
# When ZeRO-2/3 (FSDP) reduce-scatters gradients: after every micro-batch (DeepSpeed) or
# once per step after accumulating unsharded gradients (FSDP without gradient sync).
GRAD_SYNC = ("per_microbatch", "per_step")


def _int(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}={value!r} is not valid; it must be an integer >= {minimum}")
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ConfigError(f"{name}={value!r} is not valid; it must be >= {minimum}{upper}")


def _opt_int(name: str, value: object, *, minimum: int = 1) -> None:
    if value is not None:
        _int(name, value, minimum=minimum)


def _float(
    name: str, value: object, *, low: float, high: float | None = None, low_open: bool = True
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name}={value!r} is not valid; it must be a finite number")
    bad_low = value <= low if low_open else value < low
    if bad_low or (high is not None and value > high):
        lo = f"> {low}" if low_open else f">= {low}"
        hi = f" and <= {high}" if high is not None else ""
        raise ConfigError(f"{name}={value!r} is not valid; it must be {lo}{hi}")


def assumed_shape(n_params: float) -> tuple[int, int, int]:
    """(layers, hidden, heads) for a model known only by its size.

    GPT-3-family models keep hidden/layers close to 128 (6.7B: 4096/32, 13B: 5120/40,
    175B: 12288/96) and 12·L·h² parameters in the blocks, so L ≈ (N / (12·128²))^(1/3).
    Hidden is rounded to a multiple of 128 and heads use a head size of 128.
    """
    layers = max(1, round((n_params / (12 * 128 * 128)) ** (1 / 3)))
    hidden = max(128, round(math.sqrt(n_params / (12 * layers)) / 128) * 128)
    return layers, hidden, hidden // 128


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelSpec:
    """A decoder-only transformer, by its dimensions, its parameter count, or both.

    ``params`` (when given) is the exact parameter count used for model state; the
    dimensions drive activations, TP/PP sharding and per-layer communication. A model given
    only by ``params`` gets an assumed GPT-3-like shape (``shape_assumed`` is True).
    """

    name: str = "custom"
    params: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None  # grouped-query attention; None means heads
    ffn: int | None = None  # MLP inner size; None means 4·hidden
    vocab: int | None = None
    seq: int | None = None  # default training sequence length (and learned positions)
    gated_mlp: bool = False  # SwiGLU: gate, up and down projections
    tied_embeddings: bool = False
    bias: bool = False
    norm: str = "layernorm"
    learned_positions: bool = False
    published_params: int | None = None
    shape_assumed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.params is not None:
            if isinstance(self.params, float) and self.params.is_integer():
                object.__setattr__(self, "params", int(self.params))
            _int("params", self.params)
        dims = ("layers", "hidden", "heads")
        for name in (*dims, "kv_heads", "ffn", "vocab", "seq", "published_params"):
            _opt_int(name, getattr(self, name))
        if self.norm not in NORMS:
            raise choices_error("norm", self.norm, NORMS)
        missing = [d for d in dims if getattr(self, d) is None]
        if missing and len(missing) < len(dims):
            raise ConfigError(
                f"model dimensions {', '.join(missing)} are missing; give all of "
                "layers, hidden and heads, or none of them and params=<count>"
            )
        if missing:
            if self.params is None:
                raise ConfigError(
                    "a model needs params=<count> or layers, hidden and heads (and vocab)"
                )
            layers, hidden, heads = assumed_shape(self.params)
            object.__setattr__(self, "layers", layers)
            object.__setattr__(self, "hidden", hidden)
            object.__setattr__(self, "heads", heads)
            object.__setattr__(self, "shape_assumed", True)
        if self.hidden % self.heads:
            raise ConfigError(
                f"hidden={self.hidden} is not divisible by heads={self.heads}; "
                f"valid head counts divide {self.hidden}"
            )
        kv = self.kv_heads
        if kv is not None and (kv > self.heads or self.heads % kv):
            raise ConfigError(
                f"kv_heads={kv} is not valid; it must divide heads={self.heads} "
                f"(valid: {[d for d in range(1, self.heads + 1) if self.heads % d == 0]})"
            )
        if self.params is None and self.vocab is None:
            raise ConfigError("a model given by its dimensions needs vocab=<size>")

    # -- derived sizes -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V): kv_heads · head_dim."""
        return (self.kv_heads or self.heads) * self.head_dim

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def vocab_size(self) -> int:
        return self.vocab if self.vocab is not None else 50257

    @property
    def n_params(self) -> int:
        """The parameter count: ``params`` when given, else derived from the dimensions."""
        if self.params is not None:
            return self.params
        from workbench.planner.params import count_params

        return count_params(self).total

    def with_(self, **changes: Any) -> ModelSpec:
        if self.shape_assumed and not {"layers", "hidden", "heads"} & set(changes):
            # Re-derive the assumed shape from the (possibly new) parameter count.
            changes = {"layers": None, "hidden": None, "heads": None, **changes}
        return _replace(self, **changes)


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainingSpec:
    """One training step: batch, sequence, precision, optimizer, recompute and efficiency.

    ``mfu`` is the compute efficiency: the fraction of peak FLOP/s the executed work
    (matmuls and attention, recompute included) reaches while computing; the plan reports
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
    mfu: float = 0.5
    overlap: float = 1.0
    bucket_bytes: int = 25 * 2**20  # DDP bucket; two in flight when dp > 1
    flash_attention: bool = False  # no s x s scores stored (an fp32 logsumexp instead)
    fused_swiglu: bool = False  # SwiGLU saves gate, up and the product (3 tensors, not 4)
    grads: str = "auto"  # see GRAD_DTYPES
    grad_sync: str = "per_microbatch"  # see GRAD_SYNC
    selective_overhead: float = 0.05  # selective recompute: extra share of layer compute

    def __post_init__(self) -> None:
        _int("micro_batch", self.micro_batch)
        _opt_int("global_batch", self.global_batch)
        _opt_int("grad_accum", self.grad_accum)
        _opt_int("seq", self.seq)
        _int("bucket_bytes", self.bucket_bytes, minimum=0)
        if self.precision not in PRECISIONS:
            raise choices_error("precision", self.precision, PRECISIONS)
        if self.optimizer not in OPTIMIZERS:
            raise choices_error("optimizer", self.optimizer, OPTIMIZERS)
        if self.recompute not in RECOMPUTE:
            raise choices_error("recompute", self.recompute, RECOMPUTE)
        _float("trainable", self.trainable, low=0.0, high=1.0)
        _float("mfu", self.mfu, low=0.0, high=1.0)
        _float("overlap", self.overlap, low=0.0, high=1.0, low_open=False)
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
        _float("selective_overhead", self.selective_overhead, low=0.0, high=1.0, low_open=False)

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
        return _replace(self, **changes)


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
    first_stage_layers: int | None = None  # uneven pipeline: fewer layers on stage 0
    last_stage_layers: int | None = None  # ... and on the last stage (Llama 3: one less)

    def __post_init__(self) -> None:
        _int("dp", self.dp)
        _int("tp", self.tp)
        _int("pp", self.pp)
        _int("cp", self.cp)
        _opt_int("first_stage_layers", self.first_stage_layers)
        _opt_int("last_stage_layers", self.last_stage_layers)
        if self.pp == 1 and (self.first_stage_layers or self.last_stage_layers):
            raise ConfigError("first_stage_layers / last_stage_layers need pp > 1")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise choices_error("zero", self.zero, (0, 1, 2, 3))
        _opt_int("micro_batches", self.micro_batches)
        if self.schedule not in SCHEDULES:
            raise choices_error("schedule", self.schedule, SCHEDULES)
        _int("virtual_stages", self.virtual_stages)
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ConfigError("virtual_stages > 1 needs schedule='interleaved'")
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
        return _replace(self, **changes)


@dataclass(kw_only=True, slots=True, frozen=True)
class LinkSpec:
    """One interconnect as the collective cost model sees it.

    ``bandwidth`` is the achievable bus bandwidth in bytes/s per GPU (the B of S/B: what
    nccl-tests report as busbw for large messages); ``peak`` the nominal per-direction
    rate, for reference; ``source`` where the achievable figure comes from.
    ``latency`` is the per-step start-up cost α in seconds.
    """

    name: str = "custom"
    bandwidth: float
    latency: float
    peak: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        _float("bandwidth", self.bandwidth, low=0.0)
        _float("latency", self.latency, low=0.0, low_open=False)
        if self.peak is not None:
            _float("peak", self.peak, low=0.0)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LinkSpec:
        known = {f.name for f in fields(cls)}
        extra = set(data) - known
        if extra:
            raise ConfigError(f"unknown link fields {sorted(extra)}; valid: {sorted(known)}")
        missing = {"bandwidth", "latency"} - set(data)
        if missing:
            raise ConfigError(f"link fields {sorted(missing)} are missing")
        return cls(**data)


@dataclass(kw_only=True, slots=True, frozen=True)
class HardwareSpec:
    """A GPU (or CPU process) type, its nodes and its links.

    ``memory`` is the device memory in bytes, ``reserved`` what the runtime keeps (CUDA
    context, allocator slack) and is not available to tensors. ``peak_flops`` is dense
    bf16 matmul peak, ``peak_flops_fp32`` the fp32 one. ``kind='cpu'`` changes one fact:
    CPU dropout saves its mask in the activation dtype, CUDA as 1-byte bools.
    ``max_overlap`` caps how much communication can hide behind compute (a CPU rank's
    gloo all-reduce runs on the cores that compute: ~0); ``step_overhead`` is per-step time
    that does not shrink with the batch (optimizer, dispatch), from ``cpu_profile``.
    ``cores`` (CPU ranks only) is how many cores a node's ranks run on, ``background`` how
    many other busy processes compete for them; ``core_share`` turns both into the share
    of a core each rank gets (None: every rank has its own device).
    """

    name: str = "custom"
    memory: int
    peak_flops: float
    peak_flops_fp32: float | None = None
    gpus_per_node: int = 8
    intra: LinkSpec
    inter: LinkSpec
    reserved: int = 0
    kind: str = "gpu"
    max_overlap: float = 1.0  # cap on comm/compute overlap (CPU gloo: the same cores)
    step_overhead: float = 0.0  # seconds per step per rank outside forward/backward
    cores: float | None = None  # CPU cores a node's ranks share (None: a device per rank)
    background: float = 0.0  # other busy processes on those cores, in whole-core demands

    def __post_init__(self) -> None:
        _float("max_overlap", self.max_overlap, low=0.0, high=1.0, low_open=False)
        _float("step_overhead", self.step_overhead, low=0.0, high=1e6, low_open=False)
        if self.cores is not None:
            _float("cores", self.cores, low=0.0, high=1e6)
        _float("background", self.background, low=0.0, high=1e6, low_open=False)
        _int("memory", self.memory)
        _int("gpus_per_node", self.gpus_per_node)
        _int("reserved", self.reserved, minimum=0)
        if self.reserved >= self.memory:
            raise ConfigError(f"reserved={self.reserved} must be < memory={self.memory}")
        _float("peak_flops", self.peak_flops, low=0.0)
        if self.peak_flops_fp32 is not None:
            _float("peak_flops_fp32", self.peak_flops_fp32, low=0.0)
        if self.kind not in GPU_KINDS:
            raise choices_error("kind", self.kind, GPU_KINDS)
        for name in ("intra", "inter"):
            if not isinstance(getattr(self, name), LinkSpec):
                raise ConfigError(f"{name} must be a LinkSpec, got {getattr(self, name)!r}")

    def flops(self, precision: str) -> float:
        if precision == "fp32":
            return self.peak_flops_fp32 or self.peak_flops
        return self.peak_flops

    @property
    def usable(self) -> int:
        return self.memory - self.reserved

    def core_share(self, ranks: int) -> float:
        """The share of one core each of ``ranks`` busy ranks on a node gets.

        Processor sharing (the fair scheduler's steady state): ``ranks + background``
        runnable processes on ``cores`` cores each run min(1, cores / (ranks +
        background)) of the time. 1.0 when ``cores`` is None (a device per rank).
        """
        if self.cores is None:
            return 1.0
        return min(1.0, self.cores / (ranks + self.background))

    def with_(self, **changes: Any) -> HardwareSpec:
        return _replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["intra"] = {f.name: getattr(self.intra, f.name) for f in fields(LinkSpec)}
        data["inter"] = {f.name: getattr(self.inter, f.name) for f in fields(LinkSpec)}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareSpec:
        """Rebuild from ``to_dict`` output; any malformed field is a ``ConfigError``."""
        if not isinstance(data, dict):
            raise ConfigError(f"hardware must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        extra = set(data) - known
        if extra:
            raise ConfigError(f"unknown hardware fields {sorted(extra)}; valid: {sorted(known)}")
        required = {f.name for f in fields(cls) if f.default is MISSING}
        missing = required - set(data)
        if missing:
            raise ConfigError(f"hardware fields {sorted(missing)} are missing")
        values = dict(data)
        for name in ("intra", "inter"):
            link = values.get(name)
            if not isinstance(link, dict):
                raise ConfigError(
                    f"hardware {name}={link!r} is not valid; it must be an object with "
                    "bandwidth and latency"
                )
            values[name] = LinkSpec.from_dict(link)
        return cls(**values)


def _replace(spec: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` that skips init=False fields and re-validates."""
    values = {f.name: getattr(spec, f.name) for f in fields(spec) if f.init}
    unknown = set(changes) - set(values)
    if unknown:
        raise ConfigError(f"unknown fields {sorted(unknown)}; valid: {sorted(values)}")
    values.update(changes)
    return type(spec)(**values)
