"""The machine a plan runs on: a device type, its nodes, and the links between ranks."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any

from workbench.errors import ConfigError, choices_error
from workbench.planner.spec_checks import check_float, check_int, replace_spec

__all__ = ["GPU_KINDS", "HardwareSpec", "LinkSpec"]

GPU_KINDS = ("gpu", "cpu")


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
        check_float("bandwidth", self.bandwidth, low=0.0)
        check_float("latency", self.latency, low=0.0, low_open=False)
        if self.peak is not None:
            check_float("peak", self.peak, low=0.0)

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
    ``memory_bandwidth`` is the device memory's bandwidth in bytes/s (data sheet), the
    rate of the memory-bound ops in the per-operation step-time model (None: not
    modelled, as for CPU profiles, whose compute rate is measured); ``gemm_efficiency``
    the share of peak its large matmuls reach in that model (None: the A100-calibrated
    ``planner.efficiency.GEMM_EFFICIENCY``). ``cores`` (CPU ranks only) is how many
    cores a node's ranks run on, ``background`` how many other busy processes compete
    for them; ``core_share`` turns both into the share
    of a core each rank gets (None: every rank has its own device). ``comm_cpu`` (CPU
    ranks) is the CPU time a rank spends per second of modelled data-parallel collective
    time: gloo's copies and reductions run on the cores that compute, so that work is
    added to the step, not hidden, and stretches by 1/share like compute (None: the
    collective is a device's, hidden up to the overlap; ``cpu_profile`` calibrates it).
    ``peak_flops_fp8`` is the dense FP8 matmul peak (data sheet; needed by
    ``TrainingSpec.fp8``), ``host_bandwidth`` the achievable GPU <-> host copy rate per GPU
    (needed by the offload options).
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
    memory_bandwidth: float | None = None  # device memory bytes/s (None: not modelled)
    gemm_efficiency: float | None = None  # share of peak large matmuls reach (None: default)
    comm_cpu: float | None = None  # CPU s per s of DP collective (CPU ranks; None: a device's)
    peak_flops_fp8: float | None = None  # dense FP8 matmul peak (None: no FP8 tensor cores)
    host_bandwidth: float | None = None  # GPU <-> host bytes/s per GPU (offload; None: unknown)

    def __post_init__(self) -> None:
        check_float("max_overlap", self.max_overlap, low=0.0, high=1.0, low_open=False)
        check_float("step_overhead", self.step_overhead, low=0.0, high=1e6, low_open=False)
        if self.cores is not None:
            check_float("cores", self.cores, low=0.0, high=1e6)
        check_float("background", self.background, low=0.0, high=1e6, low_open=False)
        if self.memory_bandwidth is not None:
            check_float("memory_bandwidth", self.memory_bandwidth, low=0.0, high=1e16)
        if self.gemm_efficiency is not None:
            check_float("gemm_efficiency", self.gemm_efficiency, low=0.0, high=1.0)
        if self.peak_flops_fp8 is not None:
            check_float("peak_flops_fp8", self.peak_flops_fp8, low=0.0, high=1e18)
        if self.host_bandwidth is not None:
            check_float("host_bandwidth", self.host_bandwidth, low=0.0, high=1e15)
        if self.comm_cpu is not None:
            check_float("comm_cpu", self.comm_cpu, low=0.0, high=1e3, low_open=False)
        check_int("memory", self.memory)
        check_int("gpus_per_node", self.gpus_per_node)
        check_int("reserved", self.reserved, minimum=0)
        if self.reserved >= self.memory:
            raise ConfigError(f"reserved={self.reserved} must be < memory={self.memory}")
        check_float("peak_flops", self.peak_flops, low=0.0)
        if self.peak_flops_fp32 is not None:
            check_float("peak_flops_fp32", self.peak_flops_fp32, low=0.0)
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
        return replace_spec(self, **changes)

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
