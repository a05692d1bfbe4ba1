"""The step machine: phase order, spans, loss metric, where gradients get synchronised,
pipeline micro-batch spans, and the Megatron f/g view (two all-reduces per block)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import run_ranks
from workbench.parallel import PHASES, RunSpec, build_train_step
from workbench.trace import Metric, PhaseSpan, Recorder


def _spans(recorder: Recorder) -> list[tuple[int, str]]:
    return [(e.step, e.phase) for e in recorder.events if isinstance(e, PhaseSpan)]


def test_single_phase_by_phase() -> None:
    recorder = Recorder()
    step = build_train_step(RunSpec(strategy="single", trace=False), recorder=recorder)
    assert (step.step, step.phase) == (0, "data")
    ran = [step.run_phase() for _ in PHASES]
    assert ran == list(PHASES)
    assert (step.step, step.phase) == (1, "data")
    step.run_phase()  # data of step 1, then finish the step from the middle
    loss = step.run_step()
    assert step.last_loss == loss and step.step == 2
    assert _spans(recorder) == [(s, p) for s in range(2) for p in PHASES]
    metrics = [e for e in recorder.events if isinstance(e, Metric)]
    assert [(m.step, m.name) for m in metrics] == [(0, "loss"), (1, "loss")]
    assert metrics[1].value == loss


def test_grad_accum_phase_names() -> None:
    step = build_train_step(RunSpec(strategy="single", grad_accum=2, trace=False))
    assert step.phases == [
        "data",
        "forward[mb=0]",
        "backward[mb=0]",
        "forward[mb=1]",
        "backward[mb=1]",
        "sync",
        "optimizer",
    ]
    assert [step.run_phase() for _ in step.phases] == step.phases


def _grad_max(model: Any) -> list[float]:
    return [float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None]


def _distributed_checks(rank: int, world_size: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {}

    def gathered(values: list[float]) -> list[list[float]]:
        parts: list[Any] = [None] * world_size
        dist.all_gather_object(parts, values)
        return parts

    # DP without overlap: gradients differ after backward, agree after sync.
    for overlap in (False, True):
        step = build_train_step(RunSpec(strategy="dp", overlap=overlap, trace=False))
        for _ in range(3):  # data, forward, backward
            step.run_phase()
        after_backward = gathered(_grad_max(step.model))
        step.run_phase()  # sync
        after_sync = gathered(_grad_max(step.model))
        step.run_phase()  # optimizer
        out[f"overlap={overlap}"] = {
            "backward_equal": after_backward[0] == after_backward[1],
            "sync_equal": after_sync[0] == after_sync[1],
            "spans": _spans(step.recorder),
        }

    # Pipeline: micro-batch spans nest inside the forward phase; the loss reaches every rank.
    recorder = Recorder(rank)
    step = build_train_step(
        RunSpec(strategy="pp", microbatches=2, schedule="1f1b", trace=False), recorder=recorder
    )
    loss = step.run_step()
    out["pp"] = {"spans": _spans(recorder), "loss": loss}

    # bf16: FSDP through MixedPrecisionPolicy, the others through autocast.
    out["bf16"] = {}
    for strategy in ("fsdp", "tp", "pp"):
        step = build_train_step(RunSpec(strategy=strategy, precision="bf16", trace=False))
        out["bf16"][strategy] = [step.run_step() for _ in range(3)]

    # Megatron f/g: one all-reduce forward (g) and one backward (f) per feed-forward block.
    from workbench.parallel import collectives
    from workbench.parallel.megatron import apply_megatron
    from workbench.parallel.models import FeedForward

    torch.manual_seed(0)
    block = FeedForward(8, 16)
    ref = FeedForward(8, 16)
    ref.load_state_dict(block.state_dict())
    apply_megatron(block, dist.group.WORLD)
    calls: list[str] = []
    real = collectives.all_reduce

    def counting(tensor: Any, group: Any = None, **kw: Any) -> Any:
        calls.append("all_reduce")
        return real(tensor, group, **kw)

    collectives.all_reduce = counting  # type: ignore[assignment]
    try:
        x = torch.randn(4, 8, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        y = block(x)
        forward_calls = len(calls)
        y.sum().backward()
    finally:
        collectives.all_reduce = real  # type: ignore[assignment]
    y_ref = ref(x_ref)
    y_ref.sum().backward()
    out["megatron"] = {
        "forward_calls": forward_calls,
        "backward_calls": len(calls) - forward_calls,
        "out_diff": float((y - y_ref).abs().max()),
        "input_grad_diff": float((x.grad - x_ref.grad).abs().max()),
        "fc1_shape": tuple(block.fc1.weight.shape),
        "fc2_shape": tuple(block.fc2.weight.shape),
    }
    return out


@pytest.mark.engines
def test_distributed_step_machine() -> None:
    results = run_ranks(_distributed_checks, timeout=120)
    for r in results:
        deferred, overlapped = r["overlap=False"], r["overlap=True"]
        assert not deferred["backward_equal"] and deferred["sync_equal"]  # sync did the work
        assert overlapped["backward_equal"]  # DDP synchronised during backward
        assert deferred["spans"] == [(0, p) for p in PHASES]
        assert overlapped["spans"] == [(0, p) for p in PHASES]  # empty sync span still there
        spans = r["pp"]["spans"]
        micro = [p for _, p in spans if "[mb=" in p]
        assert sorted(micro) == [
            "backward[mb=0]",
            "backward[mb=1]",
            "forward[mb=0]",
            "forward[mb=1]",
        ]
        # nested spans close first, so the outer phase follows its micro-batches
        assert [p for _, p in spans if "[mb=" not in p] == list(PHASES)
        meg = r["megatron"]
        assert (meg["forward_calls"], meg["backward_calls"]) == (1, 1)
        assert meg["out_diff"] <= 1e-6 and meg["input_grad_diff"] <= 1e-6
        assert meg["fc1_shape"] == (8, 8) and meg["fc2_shape"] == (8, 8)  # halves of 16
    assert results[0]["pp"]["loss"] == results[1]["pp"]["loss"]
    fp32 = build_train_step(RunSpec(strategy="single", trace=False))
    reference = [fp32.run_step() for _ in range(3)]
    for strategy, losses in results[0]["bf16"].items():
        diff = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
        assert 0 < diff <= 2e-2, f"{strategy} bf16 vs fp32: {diff}"  # bf16 ran, and close


def _traced(rank: int, world_size: int, strategies: list[tuple[str, bool]]) -> dict[str, Any]:
    from workbench.trace import CommEvent, MemorySample

    out: dict[str, Any] = {}
    for strategy, overlap in strategies:
        recorder = Recorder(rank)
        spec = RunSpec(strategy=strategy, overlap=overlap, trace=True)
        with build_train_step(spec, recorder=recorder) as step:
            step.run_step()
        events = recorder.events
        out[f"{strategy},{overlap}"] = {
            # boundary samples only: a "peak" sample marks a high point inside a phase
            "memory_phases": [
                e.phase for e in events if isinstance(e, MemorySample) and e.label != "peak"
            ],
            "peak_phases": [
                e.phase for e in events if isinstance(e, MemorySample) and e.label == "peak"
            ],
            "comm": sorted({(e.phase, e.source) for e in events if isinstance(e, CommEvent)}),
        }
    return out


@pytest.mark.engines
def test_traced_step_emits_memory_and_comm_events() -> None:
    strategies = [("dp", False), ("dp", True), ("zero1", True), ("pp", False), ("megatron", False)]
    result = run_ranks(_traced, strategies, timeout=120)[0]
    for r in result.values():
        assert r["memory_phases"] == list(PHASES)  # one sample at the end of every phase
    deferred = result["dp,False"]["comm"]
    assert ("sync", "workbench") in deferred  # the explicit gradient all-reduce
    assert not any(phase == "backward" for phase, _ in deferred)
    assert ("backward", "ddp-bucket") in result["dp,True"]["comm"]  # overlapped buckets
    assert ("optimizer", "zero") in result["zero1,True"]["comm"]  # ZeRO-1 broadcasts
    assert ("forward", "pipeline") in result["pp,False"]["comm"]  # activations sent
    # the schedule frees its activations inside "forward": the peak is a sample of its own
    assert result["pp,False"]["peak_phases"] == ["forward"]
    meg = result["megatron,False"]["comm"]
    assert ("forward", "workbench") in meg and ("backward", "workbench") in meg  # g and f


@pytest.mark.engines
def test_traced_step_with_dtensor_parameters() -> None:
    result = run_ranks(_traced, [("fsdp", False), ("tp", False)], timeout=120)[0]
    for r in result.values():
        assert r["memory_phases"] == list(PHASES)
    assert any(phase == "forward" for phase, _ in result["fsdp,False"]["comm"])  # all-gathers
