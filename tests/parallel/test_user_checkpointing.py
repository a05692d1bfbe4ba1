"""``checkpointing=`` and ``precision="bf16-mixed"`` for the user's own model: the blocks
found as FSDP finds them or given by name / class, recomputed in backward without changing
the numbers (one device, DDP and FSDP against the plain single-device run) while fewer
activation bytes stay saved; bad values refused before anything runs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from tests.harness import run_ranks
from tests.parallel import _user_models as um
from workbench.errors import ConfigError
from workbench.parallel.parallelize import Layout
from workbench.parallel.user_checkpointing import apply_user_checkpointing, checkpoint_blocks
from workbench.parallel.user_model import UserRun, build_user_train_step, user_reference

TOL, STEPS = 1e-5, 5
BASE: dict[str, Any] = {"model": um.make_model, "data": um.make_data, "loss": um.lm_loss}


def test_blocks_are_found_as_fsdp_wraps_them_or_given() -> None:
    model = um.make_model()
    blocks = [f"blocks.{i}" for i in range(um.BLOCKS)]
    assert checkpoint_blocks(model, True) == blocks
    assert checkpoint_blocks(model, "blocks.*") == blocks
    assert checkpoint_blocks(model, type(model.blocks[0])) == blocks
    assert checkpoint_blocks(model, ("blocks.1", "blocks.*")) == ["blocks.1", "blocks.0"]
    assert checkpoint_blocks(model, False) == []
    with pytest.raises(ConfigError, match=r"'block\.\*' matches no module.*blocks\.\*"):
        checkpoint_blocks(model, "block.*")
    with pytest.raises(ConfigError, match="no repeated blocks"):
        checkpoint_blocks(torch.nn.Linear(2, 2), True)
    # Module paths (state-dict keys, TP plans) do not change.
    keys = list(model.state_dict())
    assert apply_user_checkpointing(model, True) == blocks
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize("value", [3, "", [], ["blocks.*", 2], [int], None])
def test_bad_checkpointing_values_are_named(value: object) -> None:
    with pytest.raises(ConfigError, match=r"checkpointing=.*module name pattern"):
        UserRun(**BASE, checkpointing=value)


def test_bf16_mixed_is_the_planners_name_for_bf16() -> None:
    assert UserRun(**BASE, precision="bf16-mixed").precision == "bf16"
    with pytest.raises(ConfigError, match=r"precision='fp16'.*'bf16-mixed'"):
        UserRun(**BASE, precision="fp16")


def _peak_activations(step: Any) -> int:
    return max(s.activations for s in step.recorder.events if s.kind == "memory")


def test_checkpointing_one_device_same_numbers_fewer_saved_bytes() -> None:
    runs = {}
    for checkpointing in (False, True):
        step = build_user_train_step(
            UserRun(**BASE, optimizer=um.adamw, checkpointing=checkpointing), world_size=1
        )
        losses = [step.run_step() for _ in range(STEPS)]
        step.memory_tracer.stop()
        params = {n: p.detach().clone() for n, p in step.model.named_parameters()}
        runs[checkpointing] = (losses, params, _peak_activations(step))
    (plain_losses, plain, plain_peak), (ck_losses, ck, ck_peak) = runs[False], runs[True]
    assert ck_losses == plain_losses  # recomputation repeats the same arithmetic
    assert all(torch.equal(ck[n], plain[n]) for n in plain)
    print(f"saved activations: plain {plain_peak} B, checkpointed {ck_peak} B")
    assert 0 < ck_peak < plain_peak


def test_bf16_saves_fewer_activation_bytes_and_still_learns() -> None:
    peaks, losses = {}, {}
    for precision in ("fp32", "bf16-mixed"):
        step = build_user_train_step(
            UserRun(**BASE, optimizer=um.adamw, precision=precision), world_size=1
        )
        losses[precision] = [step.run_step() for _ in range(STEPS)]
        step.memory_tracer.stop()
        peaks[precision] = _peak_activations(step)
    assert peaks["bf16-mixed"] < peaks["fp32"]
    assert losses["bf16-mixed"][-1] < losses["bf16-mixed"][0]
    # bf16 rounds: close to fp32, not equal.
    assert max(abs(a - b) for a, b in zip(*losses.values(), strict=True)) < 0.05


def _checkpointed(rank: int, world: int) -> dict[str, float]:
    from workbench.parallel.build import full_state_dict

    ref_losses, ref_params = user_reference(UserRun(**BASE, optimizer=um.adamw), STEPS)
    out = {}
    for name, zero in (("ddp", 0), ("fsdp", 3)):
        run = UserRun(
            **BASE, optimizer=um.adamw, layout=Layout(zero=zero), checkpointing=True, trace=False
        )
        step = build_user_train_step(run)
        losses = [step.run_step() for _ in range(STEPS)]
        params = full_state_dict(step)
        if rank == 0:
            assert params is not None
            out[name] = max(
                max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
                max(float((params[n] - ref_params[n]).abs().max()) for n in params),
            )
        # bf16-mixed with checkpointing: FSDP through MixedPrecisionPolicy, DDP autocast.
        bf16 = build_user_train_step(replace(run, precision="bf16-mixed"))
        bf16_losses = [bf16.run_step() for _ in range(STEPS)]
        out[f"{name} bf16"] = max(abs(a - b) for a, b in zip(bf16_losses, ref_losses, strict=True))
    return out


@pytest.mark.engines
def test_checkpointed_blocks_under_ddp_and_fsdp_match_one_device() -> None:
    results = run_ranks(_checkpointed, timeout=300)[0]
    assert sorted(results) == ["ddp", "ddp bf16", "fsdp", "fsdp bf16"]
    for name in ("ddp", "fsdp"):
        assert results[name] <= TOL, f"{name}: {results[name]:.3e}"
        bf16 = results[f"{name} bf16"]
        assert 0 < bf16 <= 2e-2, f"{name} bf16 vs fp32: {bf16}"  # bf16 ran, and close
