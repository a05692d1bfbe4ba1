"""Checkpoints: resume equals the uninterrupted run, resharding across layouts, atomic
saves, keep_last, data position across epochs, refused strategies and bad arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.harness import run_ranks
from workbench.errors import CheckpointError
from workbench.parallel import RunSpec, build_train_step, full_state_dict
from workbench.parallel.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from workbench.parallel.data import batches, make_loader

pytestmark = pytest.mark.engines

STEPS = 6
SAVE_AT = 3


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _resume_run(rank: int, world: int, root: str, strategies: tuple[str, str]) -> dict[str, Any]:
    """Uninterrupted run under strategies[0]; a second run saved at SAVE_AT under
    strategies[0], then a fresh run under strategies[1] loads it and finishes."""
    save_as, load_as = strategies
    spec = RunSpec(model="gpt-tiny", strategy=save_as, batch_size=8, trace=False)
    full = build_train_step(spec)
    full_losses = [full.run_step() for _ in range(STEPS)]
    full_params = full_state_dict(full)

    first = build_train_step(spec)
    losses = [first.run_step() for _ in range(SAVE_AT)]
    save_checkpoint(first, root, keep_last=2)
    first.run_step()  # progress after the save that the load must roll back
    del first
    resumed = build_train_step(RunSpec(model="gpt-tiny", strategy=load_as, batch_size=8))
    meta = load_checkpoint(resumed, root)
    losses += [resumed.run_step() for _ in range(STEPS - SAVE_AT)]
    params = full_state_dict(resumed)
    resumed.close()
    return {
        "full_losses": full_losses,
        "losses": losses,
        "param_diff": None if params is None else _max_diff(params, full_params),
        "meta_step": meta["step"],
        "steps_after": resumed.step,
    }


@pytest.mark.parametrize("strategies", [("dp", "dp"), ("tp", "tp"), ("fsdp", "dp")])
def test_resume_equals_uninterrupted(tmp_path: Path, strategies: tuple[str, str]) -> None:
    results = run_ranks(_resume_run, str(tmp_path), strategies)
    for r in results:
        assert r["meta_step"] == SAVE_AT and r["steps_after"] == STEPS
        assert len(r["losses"]) == STEPS
        assert max(abs(a - b) for a, b in zip(r["losses"], r["full_losses"], strict=True)) <= 1e-6
    assert results[0]["param_diff"] <= 1e-6
    metas = list_checkpoints(tmp_path)
    assert [m["step"] for m in metas] == [SAVE_AT]
    assert metas[0]["strategy"] == strategies[0] and metas[0]["world_size"] == 2


def test_single_device_keep_last_rng_and_atomicity(tmp_path: Path) -> None:
    spec = RunSpec(model="mlp-tiny", strategy="single", batch_size=8, trace=False)
    ts = build_train_step(spec)
    for _ in range(4):
        ts.run_step()
        save_checkpoint(ts, tmp_path, keep_last=2)
    assert [m["step"] for m in list_checkpoints(tmp_path)] == [3, 4]
    # A save that died before its commit: a .tmp directory with shards but no meta.json.
    (tmp_path / ".tmp-step-00000005").mkdir()
    (tmp_path / ".tmp-step-00000005" / "__0_0.distcp").write_bytes(b"partial")
    assert [m["step"] for m in list_checkpoints(tmp_path)] == [3, 4]
    # RNG state round-trips: draws after the load repeat the draws after the save.
    torch.manual_seed(123)
    save_checkpoint(ts, tmp_path)
    expected = torch.rand(3)
    fresh = build_train_step(spec)
    meta = load_checkpoint(fresh, tmp_path)
    assert torch.equal(torch.rand(3), expected)
    assert meta["step"] == 4 and fresh.step == 4 and fresh.data_position == 4
    assert not (tmp_path / ".tmp-step-00000005").exists()  # the next save cleaned it up
    # Older checkpoint by step; loads never unpickle: metadata is JSON.
    load_checkpoint(fresh, tmp_path, step=3)
    assert fresh.step == 3
    assert json.loads((tmp_path / "step-00000003" / "meta.json").read_text())["step"] == 3


def test_mid_step_unknown_step_and_wrong_model_are_refused(tmp_path: Path) -> None:
    ts = build_train_step(RunSpec(model="mlp-tiny", strategy="single", trace=False))
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        load_checkpoint(ts, tmp_path)
    ts.run_phase()
    with pytest.raises(CheckpointError, match="middle of step 0"):
        save_checkpoint(ts, tmp_path)
    ts.run_step()
    with pytest.raises(CheckpointError, match="keep_last=0"):
        save_checkpoint(ts, tmp_path, keep_last=0)
    save_checkpoint(ts, tmp_path)
    with pytest.raises(CheckpointError, match=r"step=7 .*available steps: \[1\]"):
        load_checkpoint(ts, tmp_path, step=7)
    other = build_train_step(RunSpec(model="gpt-tiny", strategy="single", trace=False))
    with pytest.raises(CheckpointError, match="model 'mlp-tiny'"):
        load_checkpoint(other, tmp_path)


def _refused(rank: int, world: int, root: str) -> list[str]:
    out = []
    for strategy in ("zero1", "megatron", "pp"):
        ts = build_train_step(RunSpec(model="gpt-tiny", strategy=strategy, trace=False))
        try:
            save_checkpoint(ts, root)
        except CheckpointError as exc:
            out.append(str(exc))
    return out


def test_unsupported_strategies_are_refused_with_the_choices(tmp_path: Path) -> None:
    messages = run_ranks(_refused, str(tmp_path))[0]
    assert len(messages) == 3
    assert all("cannot be checkpointed" in m and "fsdp" in m for m in messages)


def test_data_position_resumes_across_epochs() -> None:
    from workbench.parallel.data import make_dataset
    from workbench.parallel.models import get_config

    dataset = make_dataset(get_config("mlp-tiny"), 20)
    loader = make_loader(dataset, 4, seed=3)  # 5 batches per epoch
    stream = batches(loader)
    expected = [next(stream)[0] for _ in range(13)]
    for start in (0, 4, 5, 7, 12):
        resumed = batches(loader, start=start)
        got = [next(resumed)[0] for _ in range(13 - start)]
        assert all(torch.equal(a, b) for a, b in zip(got, expected[start:], strict=True))
