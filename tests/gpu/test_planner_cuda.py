"""The planner's step time for a small GPT in bf16 on the ``h200-141gb`` preset, against
the step measured on this GPU: the ratio, and the compute efficiency it implies."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from tests.gpu._gpt import PLANNED, gpt_step
from workbench.parallel.data import make_dataset
from workbench.parallel.models import GPTConfig, build_model, loss_fn_for
from workbench.parallel.planning.plan_from import plan_from
from workbench.planner.plan import Plan

MICRO_BATCH = 8
WARMUP, TIMED = 3, 10


def _planned(config: GPTConfig) -> Plan:
    return plan_from(
        lambda: build_model(config),
        data=make_dataset(config, 4),
        loss=loss_fn_for(config),
        batch_size=2,
        gpus=1,
        gpu="h200-141gb",
        seq_len=config.seq_len,
        micro_batch=MICRO_BATCH,
        precision="bf16-mixed",
    ).plan


def _measured_step_s(config: GPTConfig, device: str = "cuda:0") -> float:
    """The median untraced bf16 step; each timed step ends with float(loss), so its
    kernels have finished."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    step = gpt_step(config, device, precision="bf16", batch_size=MICRO_BATCH)
    step.memory_tracer.stop()  # the planner predicts an untraced step
    step.memory_tracer = None
    for _ in range(WARMUP):
        step.run_step()
    times = []
    for _ in range(TIMED):
        sync()
        t0 = time.perf_counter()
        step.run_step()
        times.append(time.perf_counter() - t0)
    step.close()
    return statistics.median(times)


def test_planned_step_time_against_the_measured_one(numbers: dict[str, Any]) -> None:
    planned = _planned(PLANNED)
    predicted = planned.time.total
    measured = _measured_step_s(PLANNED)
    implied_mfu = planned.time.model_flops / (measured * planned.time.peak_flops)
    numbers.update(
        params=planned.model.params,
        tokens_per_step=planned.time.tokens,
        predicted_step_s=predicted,
        measured_step_s=measured,
        measured_over_predicted=measured / predicted,
        predicted_mfu=planned.time.model_flops / (predicted * planned.time.peak_flops),
        implied_mfu=implied_mfu,
    )
    assert planned.time.tokens == MICRO_BATCH * PLANNED.seq_len
    # A planner more than 20x off on one GPU is wrong, not uncalibrated.
    assert 0.05 < measured / predicted < 20
