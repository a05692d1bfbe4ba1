"""Published model configurations, GPUs and interconnects.

Model dimensions come from the published configs (GPT-2 ``config.json``; Llama 2/3
``params.json`` / Hugging Face configs); ``published_params`` is the parameter count those
releases report, so a test can check that the dimensions reproduce it.

GPU memory is the total the driver reports (nvidia-smi MiB); ``peak_flops`` is dense
bf16 tensor-core peak and ``peak_flops_fp32`` plain fp32 (no TF32), from NVIDIA data
sheets (SXM parts). Links carry an achievable bus bandwidth (nccl-tests busbw, with its
source) beside the nominal peak; α is an order-of-magnitude start-up cost. Measure your
own with nccl-tests or ``workbench calibrate``.
"""

from __future__ import annotations

from typing import Any

from workbench.errors import choices_error
from workbench.planner.specs import HardwareSpec, LinkSpec, ModelSpec

__all__ = [
    "GPUS",
    "LINKS",
    "MODELS",
    "hardware_preset",
    "link_preset",
    "model_preset",
]

_MIB = 2**20
_GIB = 2**30

MODELS: dict[str, ModelSpec] = {
    "gpt2-small": ModelSpec(
        name="gpt2-small", layers=12, hidden=768, heads=12, vocab=50257, seq=1024,
        tied_embeddings=True, bias=True, learned_positions=True,
        published_params=124_439_808,
    ),
    "gpt2-xl": ModelSpec(
        name="gpt2-xl", layers=48, hidden=1600, heads=25, vocab=50257, seq=1024,
        tied_embeddings=True, bias=True, learned_positions=True,
        published_params=1_557_611_200,
    ),
    "llama2-7b": ModelSpec(
        name="llama2-7b", layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000,
        seq=4096, gated_mlp=True, norm="rmsnorm", published_params=6_740_000_000,
    ),
    "llama2-13b": ModelSpec(
        name="llama2-13b", layers=40, hidden=5120, heads=40, ffn=13824, vocab=32000,
        seq=4096, gated_mlp=True, norm="rmsnorm", published_params=13_000_000_000,
    ),
    "llama2-70b": ModelSpec(
        name="llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672,
        vocab=32000, seq=4096, gated_mlp=True, norm="rmsnorm",
        published_params=69_000_000_000,
    ),
    "llama3-8b": ModelSpec(
        name="llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
        vocab=128256, seq=8192, gated_mlp=True, norm="rmsnorm",
        published_params=8_030_000_000,
    ),
    "llama3-70b": ModelSpec(
        name="llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672,
        vocab=128256, seq=8192, gated_mlp=True, norm="rmsnorm",
        published_params=70_600_000_000,
    ),
    "llama3-405b": ModelSpec(
        name="llama3-405b", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248,
        vocab=128256, seq=8192, gated_mlp=True, norm="rmsnorm",
        published_params=405_000_000_000,
    ),
}  # fmt: skip

# ``bandwidth`` is the achievable bus bandwidth per GPU for large messages (what
# nccl-tests print as busbw), ``peak`` the nominal per-direction rate beside it. The
# achievable figures are typical published nccl-tests results, rounded down; measure your
# own cluster (nccl-tests, or ``workbench calibrate`` for CPU ranks) and pass a LinkSpec.
_NCCL = "nccl-tests all_reduce_perf busbw, large messages"
LINKS: dict[str, LinkSpec] = {
    "pcie4": LinkSpec(name="pcie4", bandwidth=22e9, latency=5e-6, peak=32e9,
                      source="PCIe 4.0 x16 through the host: ~70% of 32 GB/s in p2p tests"),
    "pcie5": LinkSpec(name="pcie5", bandwidth=45e9, latency=5e-6, peak=64e9,
                      source="PCIe 5.0 x16: ~70% of 64 GB/s"),
    "nvlink3": LinkSpec(name="nvlink3", bandwidth=200e9, latency=2e-6, peak=300e9,
                        source=f"{_NCCL}, 8x A100 SXM (NVLink 3, NVSwitch): ~200-230 GB/s"),
    "nvlink4": LinkSpec(name="nvlink4", bandwidth=360e9, latency=2e-6, peak=450e9,
                        source=f"{_NCCL}, 8x H100 SXM (NVLink 4, no NVLS): ~360-370 GB/s"),
    "ib-hdr": LinkSpec(name="ib-hdr", bandwidth=23e9, latency=5e-6, peak=25e9,
                       source=f"{_NCCL}, one 200 Gb/s HDR NIC per GPU: ~92% of line rate"),
    "ib-ndr": LinkSpec(name="ib-ndr", bandwidth=46e9, latency=5e-6, peak=50e9,
                       source=f"{_NCCL}, one 400 Gb/s NDR NIC per GPU: ~92% of line rate"),
    "25gbe": LinkSpec(name="25gbe", bandwidth=2.8e9, latency=20e-6, peak=3.125e9,
                      source="TCP over 25 GbE: ~90% of line rate"),
    "100gbe": LinkSpec(name="100gbe", bandwidth=11e9, latency=10e-6, peak=12.5e9,
                       source="RoCE/TCP over 100 GbE: ~90% of line rate"),
}  # fmt: skip

# name -> (memory, bf16 peak, fp32 peak, GPUs per node, intra link, inter link, memory
# bandwidth in bytes/s: the data sheets' GDDR6X / HBM figure, SXM parts)
_GPU_TABLE: dict[str, tuple[int, float, float, int, str, str, float]] = {
    "rtx4090": (24564 * _MIB, 165.2e12, 82.6e12, 4, "pcie4", "25gbe", 1008e9),
    "a100-40gb": (40960 * _MIB, 312e12, 19.5e12, 8, "nvlink3", "ib-hdr", 1555e9),
    "a100-80gb": (81920 * _MIB, 312e12, 19.5e12, 8, "nvlink3", "ib-hdr", 2039e9),
    "h100-80gb": (81559 * _MIB, 989e12, 67e12, 8, "nvlink4", "ib-ndr", 3350e9),
    "h200-141gb": (143771 * _MIB, 989e12, 67e12, 8, "nvlink4", "ib-ndr", 4800e9),
}

GPUS: tuple[str, ...] = tuple(_GPU_TABLE)
# Dense FP8 tensor-core peak: NVIDIA H100 SXM and H200 SXM data sheets list FP8 Tensor Core
# 3,958 TFLOPS "with sparsity"; dense is half (as their bf16 1,979 -> 989). A100 has no FP8
# tensor cores; the RTX 4090 is left out (no data-sheet figure checked here).
_FP8_PEAK: dict[str, float] = {"h100-80gb": 1979e12, "h200-141gb": 1979e12}
# GPU <-> host copies for offload: the host link's achievable rate (the pcie4 / pcie5
# presets: ~70% of x16 line rate; A100 and RTX 4090 are PCIe 4.0, H100 / H200 SXM 5.0).
_HOST_LINK: dict[str, str] = {
    "rtx4090": "pcie4",
    "a100-40gb": "pcie4",
    "a100-80gb": "pcie4",
    "h100-80gb": "pcie5",
    "h200-141gb": "pcie5",
}

# The share of bf16 peak large matmuls reach in the per-operation step-time model, where
# it differs from the A100-calibrated default (planner.efficiency.GEMM_EFFICIENCY).
# Hopper's: fitted on the Llama 3 paper's Table 4 8,192-GPU row (BF16 MFU 43%) with the
# A100-fitted traffic factor, by the same procedure (tests/planner/test_efficiency.py);
# the 16,384-GPU row is held out. H200 has the H100's compute die.
HOPPER_GEMM_EFFICIENCY = 0.537
_GEMM_EFFICIENCY: dict[str, float] = {
    "h100-80gb": HOPPER_GEMM_EFFICIENCY,
    "h200-141gb": HOPPER_GEMM_EFFICIENCY,
}


def model_preset(name: str, **changes: Any) -> ModelSpec:
    """The published configuration ``name`` (see ``MODELS``), optionally changed."""
    spec = MODELS.get(name)
    if spec is None:
        raise choices_error("model", name, MODELS)
    return spec.with_(**changes) if changes else spec


def link_preset(name: str) -> LinkSpec:
    link = LINKS.get(name)
    if link is None:
        raise choices_error("link", name, LINKS)
    return link


def hardware_preset(
    name: str,
    *,
    intra: str | LinkSpec | None = None,
    inter: str | LinkSpec | None = None,
    gpus_per_node: int | None = None,
    reserved: int = _GIB,
) -> HardwareSpec:
    """GPU preset ``name`` with its usual node (links and GPUs per node), overridable.

    ``reserved`` (default 1 GiB) is memory the CUDA context and allocator keep.
    """
    row = _GPU_TABLE.get(name)
    if row is None:
        raise choices_error("gpu", name, GPUS)
    memory, bf16, fp32, per_node, intra_name, inter_name, bandwidth = row
    return HardwareSpec(
        name=name,
        memory=memory,
        peak_flops=bf16,
        peak_flops_fp32=fp32,
        gpus_per_node=gpus_per_node or per_node,
        intra=_link(intra if intra is not None else intra_name),
        inter=_link(inter if inter is not None else inter_name),
        reserved=reserved,
        memory_bandwidth=bandwidth,
        gemm_efficiency=_GEMM_EFFICIENCY.get(name),
        peak_flops_fp8=_FP8_PEAK.get(name),
        host_bandwidth=LINKS[_HOST_LINK[name]].bandwidth,
    )


def _link(link: str | LinkSpec) -> LinkSpec:
    return link if isinstance(link, LinkSpec) else link_preset(link)
