"""Published figures the planner is held against (docs/planner-validation.md).

Every ``published`` value below is typed from the cited source; every ``planner`` value
is computed by the planner at test time. Step-time rows all use the planner's default
per-operation efficiency model (workbench/planner/efficiency.py): its constants are
fitted on the rows marked ``calibration`` (Narayanan et al. Table 1 1.7B and 1008B for
A100; Llama 3 Table 4 8,192 GPUs for Hopper's matmul efficiency) and nothing is fitted
per row; every other step-time row is held out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.planner import (
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    all_gather_time,
    all_reduce_time,
    count_params,
    evaluate,
    hardware_preset,
    layer_activation_bytes,
    model_preset,
    plan,
)
from workbench.planner.params import largest_unit
from workbench.planner.specs import LinkSpec

__all__ = ["CASES", "Case"]

GB = 1e9


@dataclass(frozen=True)
class Case:
    id: str
    source: str  # paper, table, row
    published: float
    planner: Callable[[], float]
    tolerance: float  # relative; 0 means exact
    unit: str
    xfail: str | None = None  # why the planner does not reproduce it (strict xfail)
    # Step-time rows: the planner figure with TrainingSpec overrides (mfu=, memory_traffic=),
    # which test_efficiency uses to re-derive the per-operation model's constants.
    with_training: Callable[..., float] | None = None
    calibration: bool = False  # used to fit the constants (not a validation of them)


CASES: list[Case] = []


def _case(*args, **kwargs) -> None:
    CASES.append(Case(*args, **kwargs))


# -- Hugging Face parameter counts (model cards / safetensors metadata) ----------------
for name, count, repo in (
    ("gpt2-small", 124_439_808, "openai-community/gpt2"),
    ("gpt2-xl", 1_557_611_200, "openai-community/gpt2-xl"),
    ("llama2-7b", 6_738_415_616, "meta-llama/Llama-2-7b-hf"),
    ("llama2-13b", 13_015_864_320, "meta-llama/Llama-2-13b-hf"),
    ("llama2-70b", 68_976_648_192, "meta-llama/Llama-2-70b-hf"),
    ("llama3-8b", 8_030_261_248, "meta-llama/Meta-Llama-3-8B"),
    ("llama3-70b", 70_553_706_496, "meta-llama/Meta-Llama-3-70B"),
    ("llama3-405b", 405_853_388_800, "meta-llama/Llama-3.1-405B"),
):
    _case(
        f"params-{name}",
        f"Hugging Face {repo}, parameter count",
        count,
        lambda name=name: count_params(model_preset(name)).total,
        0.0,
        "params",
    )

# -- ZeRO (Rajbhandari et al. 2020), Figure 1: 7.5B model, N_d = 64, K = 12 --------------
_PSI = 7_500_000_000
_MIXED_ADAM = TrainingSpec(precision="bf16-mixed", optimizer="adam")


def _zero_state(zero: int, psi: int = _PSI, dp: int = 64) -> float:
    p = evaluate(
        ModelSpec(params=psi, vocab=32000, seq=2048),
        _MIXED_ADAM,
        ParallelSpec(dp=dp, zero=zero),
        hardware_preset("a100-80gb"),
    )
    return p.memory.model_state / GB


for zero, gb, label in ((0, 120.0, "baseline"), (1, 31.4, "P_os"), (2, 16.6, "P_os+g"),
                        (3, 1.9, "P_os+g+p")):  # fmt: skip
    _case(
        f"zero-fig1-{label}",
        f"ZeRO paper, Figure 1, 7.5B model on 64 GPUs, {label}",
        gb,
        lambda zero=zero: _zero_state(zero),
        0.03,  # the paper rounds to 0.1 GB (1.875 -> 1.9 is 1.3%)
        "GB",
    )
_case(
    "zero-table1-1T-1024",
    "ZeRO paper, Table 1, 1T parameters, N_d = 1024, P_os+g+p",
    15.6,
    lambda: _zero_state(3, psi=10**12, dp=1024),
    0.01,
    "GB",
)

# -- DeepSpeed memory estimators (docs: 'Memory Requirements', API functions) -----------
_L7 = model_preset("llama2-7b")
_N7 = count_params(_L7).total
_FP32_GRADS = TrainingSpec(precision="bf16-mixed", optimizer="adamw", grads="fp32")


def _ds_plan(zero: int) -> float:
    p = evaluate(_L7, _FP32_GRADS, ParallelSpec(dp=8, zero=zero), hardware_preset("a100-80gb"))
    extra = p.memory.temporary if zero == 3 else 0
    return (p.memory.model_state + extra) / GB


_case(
    "deepspeed-zero2-llama2-7b-8gpu",
    "DeepSpeed estimate_zero2_model_states_mem_needs: 2Ψ + 16Ψ/N (Llama 2 7B, N = 8)",
    (2 * _N7 + 16 * _N7 / 8) / GB,
    lambda: _ds_plan(2),
    1e-9,
    "GB",
)
_case(
    "deepspeed-zero3-llama2-7b-8gpu",
    "DeepSpeed estimate_zero3_model_states_mem_needs: 4·largest layer + 18Ψ/N (N = 8)",
    (4 * largest_unit(_L7) + 18 * _N7 / 8) / GB,
    lambda: _ds_plan(3),
    1e-9,
    "GB",
)

# -- DeepSpeed offload estimators (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py, --
# commit 38327e07): estimate_zero2_model_states_mem_needs(cpu_offload=True) gives
# gpu = 2Ψ, cpu = Ψ·max(4·N, 16)·additional_buffer_factor (here 4 GPUs, factor 1: 16Ψ);
# estimate_zero3_model_states_mem_needs(cpu_offload=True, cpu_offload_params=False,
# zero_init=True) gives gpu = 4·largest layer + 2Ψ/N, cpu = 16Ψ/nodes·factor.
_ADAM_OFFLOAD = TrainingSpec(precision="bf16-mixed", optimizer="adamw", offload_optimizer=True)


def _offload(zero: int, gpus: int, part: str) -> float:
    p = evaluate(_L7, _ADAM_OFFLOAD, ParallelSpec(dp=gpus, zero=zero), hardware_preset("a100-80gb"))
    if part == "host":  # host memory of the node: every GPU's rank's offloaded shard
        return p.memory.host * gpus / GB
    extra = p.memory.temporary if zero == 3 else 0
    return (p.memory.model_state + extra) / GB


for zero, gpus, part, published, formula in (
    (2, 4, "gpu", 2 * _N7, "2Ψ"),
    (2, 4, "host", 16 * _N7, "Ψ·max(4N, 16), N = 4, buffer factor 1"),
    (3, 8, "gpu", 4 * largest_unit(_L7) + 2 * _N7 / 8, "4·largest layer + 2Ψ/N, N = 8"),
    (3, 8, "host", 16 * _N7, "16Ψ per node, zero_init, buffer factor 1"),
):
    fn = "estimate_zero2" if zero == 2 else "estimate_zero3"
    _case(
        f"deepspeed-zero{zero}-offload-{part}-llama2-7b",
        f"DeepSpeed {fn}_model_states_mem_needs, cpu_offload=True, {part}: {formula} (Llama 2 7B)",
        published / GB,
        lambda zero=zero, gpus=gpus, part=part: _offload(zero, gpus, part),
        1e-9,
        "GB",
    )

# ZeRO-Offload (Ren et al. 2021), abstract: "It can train models with over 13 billion
# parameters on a single GPU, a 10x increase in size compared to popular framework such
# as PyTorch". Their GPU is a 32 GB V100; the model here is Llama 2 13B's shape (the
# paper's own 13B shape is not used), full recompute, micro-batch 1, sequence 1024.
_V100 = hardware_preset("a100-40gb").with_(name="v100-32gb", memory=32 * 2**30)


def _v100_13b(offload: bool) -> float:
    p = plan("llama2-13b", _V100, gpus=1, seq=1024, recompute="full", offload_optimizer=offload)
    return p.memory.total / GB


_case(
    "zero-offload-13b-one-gpu",
    "ZeRO-Offload paper (Ren et al. 2021), abstract: over 13B parameters on one GPU (32 GB V100)",
    _V100.usable / GB,
    lambda: _v100_13b(True),
    0.0,
    "GB (<= usable)",
)

# -- Korthikanti et al. 2022, Table 2 (activations per layer), GPT-3 175B shape ----------
_S, _B, _H, _A, _T = 2048, 1, 12288, 96, 8
_SBH = _S * _B * _H
for label, published, kwargs in (
    ("no parallelism", _SBH * (34 + 5 * _A * _S / _H), {"tp": 1}),
    ("tensor parallel", _SBH * (10 + 24 / _T + 5 * _A * _S / (_H * _T)), {"tp": _T}),
    ("tensor + sequence parallel", _SBH * (34 / _T + 5 * _A * _S / (_H * _T)),
     {"tp": _T, "sequence_parallel": True}),
    ("TP + SP + selective recompute", _SBH * 34 / _T,
     {"tp": _T, "sequence_parallel": True, "recompute": "selective"}),
    ("full recompute", 2 * _SBH, {"tp": _T, "recompute": "full"}),
):  # fmt: skip
    _case(
        f"korthikanti-table2-{label.replace(' ', '-').replace('+', 'and')}",
        f"Korthikanti et al. 2022, Table 2, {label} (s=2048, h=12288, a=96, t=8)",
        published / GB,
        lambda kwargs=kwargs: layer_activation_bytes(s=_S, b=_B, h=_H, a=_A, **kwargs) / GB,
        1e-12,
        "GB/layer",
    )

# -- Korthikanti et al. 2022, Table 5: iteration time, selective recompute + SP ------------
_A100 = hardware_preset("a100-80gb")


def _gpt(h: int, a: int, layers: int) -> ModelSpec:
    return ModelSpec(name=f"gpt-h{h}", layers=layers, hidden=h, heads=a, vocab=51200, seq=2048)


for name, a, h, layers, tp, pp, gpus, batch, seconds, xfail in (
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 1.10, None),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 13.75, None),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 37.83, None),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 71.49, None),
):

    def _step(a=a, h=h, layers=layers, tp=tp, pp=pp, gpus=gpus, batch=batch, **over) -> float:
        layout = ParallelSpec(dp=gpus // (tp * pp), tp=tp, pp=pp, sequence_parallel=True)
        training = TrainingSpec(micro_batch=1, global_batch=batch, recompute="selective", **over)
        return evaluate(_gpt(h, a, layers), training, layout, _A100).time.total

    _case(
        f"korthikanti-table5-{name}",
        f"Korthikanti et al. 2022, Table 5, {name}, 'present work' iteration time",
        seconds,
        _step,
        0.15,
        "s",
        xfail,
        with_training=_step,
    )

# -- Narayanan et al. 2021, Table 1: achieved TFLOP/s per A100 (full recompute) ------------
for billions, a, h, layers, tp, pp, gpus, batch, tflops, xfail in (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, None),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, None),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, None),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, None),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, None),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, None),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, None),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, None),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, None),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, None),
):

    def _tflops(a=a, h=h, layers=layers, tp=tp, pp=pp, gpus=gpus, batch=batch, **over) -> float:
        layout = ParallelSpec(dp=gpus // (tp * pp), tp=tp, pp=pp)
        training = TrainingSpec(micro_batch=1, global_batch=batch, recompute="full", **over)
        t = evaluate(_gpt(h, a, layers), training, layout, _A100).time
        return t.hardware_flops / (t.world * t.total) / 1e12  # executed, as the paper counts

    _case(
        f"narayanan-table1-{billions:g}B",
        f"Narayanan et al. 2021, Table 1, {billions:g}B row ({gpus} GPUs)",
        tflops,
        _tflops,
        0.15,
        "TFLOP/s/GPU",
        xfail,
        with_training=_tflops,
        calibration=billions in (1.7, 1008.0),
    )

# -- Narayanan et al. 2021, Table 2: ZeRO-3 without model parallelism, 174.6B GPT ----------
# (h 12288, 96 heads, 96 layers, batch 1536; the micro-batch shrinks as GPUs grow, one
# micro-batch per step). The "0.31 of per-GPU throughput kept" is this table:
# 44 / 144 TFLOP/s from 384 to 1536 GPUs. Full recompute, counted as in Table 1. The paper
# "integrated ZeRO into our codebase using the DeepSpeed Python library" (section 5.2;
# arXiv April 2021, DeepSpeed v0.3.13 then): zero3_prefetch="module" is that ZeRO-3 with
# its default settings (workbench/planner/zero3_modules.py); nothing is fitted to the rows.
_ZERO3_175B = _gpt(12288, 96, 96)


def _zero3_tflops(gpus: int, micro_batch: int) -> float:
    training = TrainingSpec(
        micro_batch=micro_batch, global_batch=1536, recompute="full", zero3_prefetch="module"
    )
    t = evaluate(_ZERO3_175B, training, ParallelSpec(dp=gpus, zero=3), _A100).time
    return t.hardware_flops / (t.world * t.total) / 1e12


_case(
    "narayanan-table2-zero3-scaling-384-1536",
    "Narayanan et al. 2021, Table 2, ZeRO-3 174.6B: TFLOP/s per GPU at 1536 GPUs (44) "
    "over 384 GPUs (144)",
    44 / 144,
    lambda: _zero3_tflops(1536, 1) / _zero3_tflops(384, 4),
    0.15,
    "x kept",
)
for gpus, mb, tflops in ((384, 4, 144), (768, 2, 88), (1536, 1, 44)):
    _case(
        f"narayanan-table2-zero3-{gpus}",
        f"Narayanan et al. 2021, Table 2, ZeRO-3 174.6B, {gpus} GPUs, micro-batch {mb}",
        tflops,
        lambda gpus=gpus, mb=mb: _zero3_tflops(gpus, mb),
        0.15,
        "TFLOP/s/GPU",
    )

# -- nccl-tests (PERFORMANCE.md): busbw = algbw x factor ---------------------------------
_LINK = LinkSpec(bandwidth=100e9, latency=0.0)
_case(
    "nccl-tests-allreduce-factor-n8",
    "nccl-tests PERFORMANCE.md, all_reduce busbw factor 2(n-1)/n, n = 8",
    2 * 7 / 8,
    lambda: _LINK.bandwidth * all_reduce_time(1e9, 8, _LINK) / 1e9,
    1e-12,
    "x",
)
_case(
    "nccl-tests-allgather-factor-n8",
    "nccl-tests PERFORMANCE.md, all_gather / reduce_scatter busbw factor (n-1)/n, n = 8",
    7 / 8,
    lambda: _LINK.bandwidth * all_gather_time(1e9, 8, _LINK) / 1e9,
    1e-12,
    "x",
)

# -- Llama 3 (Dubey et al. 2024), section 3.3: 405B on H100 --------------------------------
_H100 = hardware_preset("h100-80gb")
_LLAMA3 = {
    "tp": 8,
    "pp": 16,
    "zero": 1,
    "sequence_parallel": True,
    "seq": 8192,
    "flash_attention": True,
    "fused_swiglu": True,
    "first_stage_layers": 7,  # "we reduce one Transformer layer each from the first
    "last_stage_layers": 7,  # and the last stages"
}


def _llama3(dp: int, micro_batches: int, **extra: object):
    return plan("llama3-405b", _H100, dp=dp, micro_batches=micro_batches, **_LLAMA3, **extra)


_case(
    "llama3-405b-memory-fits",
    "Llama 3 paper §3.3.2: 405B trained at TP8 CP1 PP16, 8K sequence, on 80 GB H100s",
    _H100.usable / GB,  # it fits: at most the usable memory
    lambda: _llama3(64, 32).memory.total / GB,
    0.0,
    "GB (<= usable)",
)
for gpus, dp, mb, mfu in ((8192, 64, 32, 0.43), (16384, 128, 16, 0.41)):

    def _mfu(dp=dp, mb=mb, **over) -> float:
        return _llama3(dp, mb, schedule="interleaved", virtual_stages=7, **over).time.mfu

    _case(
        f"llama3-405b-mfu-{gpus}",
        f"Llama 3 paper, Table 4, {gpus} GPUs, TP8 CP1 PP16 DP{dp}, seq 8192: BF16 MFU",
        mfu,
        _mfu,
        0.15,
        "MFU",
        with_training=_mfu,
        calibration=gpus == 8192,
    )
