"""Checkpoints of the user's own model: a run saved after SAVE_AT steps and loaded into a
fresh run continues exactly as the uninterrupted run (DDP and FSDP on 2 ranks, a Dataset
and a data callable); a different model is refused with the names that differ, and the
layouts that DCP cannot hold (pipeline stages, ZeRO-1) are refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.harness import run_ranks
from tests.parallel import _user_models as um
from workbench.errors import CheckpointError
from workbench.parallel.build import full_state_dict
from workbench.parallel.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from workbench.parallel.parallelize import Layout
from workbench.parallel.user_model import UserRun, build_user_train_step

pytestmark = pytest.mark.engines

STEPS, SAVE_AT = 5, 3


def _batches(dp_rank: int, dp_size: int) -> Any:
    """A data callable (not a Dataset): seeded, so every call gives the same batches."""
    g = torch.Generator().manual_seed(100 + dp_rank)
    for _ in range(50):
        x = torch.randint(0, um.VOCAB, (8 // dp_size, um.SEQ), generator=g)
        yield x, (x + 1) % um.VOCAB


def _run(layout: dict[str, Any], data: Any = um.make_data, model: Any = um.make_model) -> UserRun:
    return UserRun(
        model=model,
        data=data,
        loss=um.lm_loss,
        optimizer=um.adamw,
        layout=Layout(**layout),
        trace=False,
    )


def _resume(rank: int, world: int, root: str, save: dict, load: dict, data: str) -> dict:
    source = um.make_data if data == "dataset" else _batches
    full = build_user_train_step(_run(save, source))
    full_losses = [full.run_step() for _ in range(STEPS)]
    full_params = full_state_dict(full)

    first = build_user_train_step(_run(save, source))
    losses = [first.run_step() for _ in range(SAVE_AT)]
    save_checkpoint(first, root)
    first.run_step()  # progress after the save, which the load must not see
    resumed = build_user_train_step(_run(load, source))
    meta = load_checkpoint(resumed, root)
    losses += [resumed.run_step() for _ in range(STEPS - SAVE_AT)]
    params = full_state_dict(resumed)
    diff = None
    if params is not None and full_params is not None:
        assert params.keys() == full_params.keys()
        diff = max(float((params[k] - full_params[k]).abs().max()) for k in params)
    return {"full": full_losses, "resumed": losses, "param_diff": diff, "meta": meta}


@pytest.mark.parametrize(
    ("save", "load", "data"),
    [
        ({"zero": 0}, {"zero": 0}, "dataset"),
        ({"zero": 3}, {"zero": 3}, "dataset"),
        ({"zero": 3}, {"zero": 0}, "callable"),  # resharded: saved under FSDP, loaded as DDP
    ],
    ids=["ddp", "fsdp", "fsdp-to-ddp-callable-data"],
)
def test_user_model_resume_equals_uninterrupted(
    tmp_path: Path, save: dict, load: dict, data: str
) -> None:
    results = run_ranks(_resume, str(tmp_path), save, load, data, timeout=300)
    for r in results:
        print(r["full"], r["resumed"])
        assert len(r["resumed"]) == STEPS
        assert max(abs(a - b) for a, b in zip(r["resumed"], r["full"], strict=True)) <= 1e-6
        assert r["meta"]["step"] == SAVE_AT
    assert results[0]["param_diff"] <= 1e-6
    # The losses moved after the load: the comparison is not of a frozen run.
    assert abs(results[0]["full"][-1] - results[0]["full"][SAVE_AT]) > 1e-3
    (meta,) = list_checkpoints(tmp_path)
    assert meta["strategy"].startswith("user:") and meta["world_size"] == 2
    assert meta["spec"]["model"] == "make_model" and meta["spec"]["optimizer"] == "adamw"
    assert meta["params"]["head.weight"] == [um.VOCAB, um.DIM]  # full shape, even sharded


class _Wider(um.TinyLM):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(um.DIM, um.VOCAB + 1, bias=False)


def _wider() -> torch.nn.Module:
    return _Wider()


def _deeper() -> torch.nn.Module:
    return um.TinyLM(blocks=3)


def _mismatch(rank: int, world: int, root: str) -> dict[str, Any]:
    saved = build_user_train_step(_run({"zero": 3}))
    saved.run_step()
    save_checkpoint(saved, root)
    out: dict[str, Any] = {}
    for name, factory in (("wider", _wider), ("deeper", _deeper)):
        other = build_user_train_step(_run({"zero": 3}, model=factory))
        before = {k: v.detach().clone() for k, v in other.model.state_dict().items()}
        try:
            load_checkpoint(other, root)
        except CheckpointError as exc:
            out[name] = str(exc)
        after = other.model.state_dict()
        out[f"{name}_unchanged"] = all(torch.equal(before[k], after[k]) for k in before)
        out[f"{name}_step"] = other.step
    return out


def test_a_different_model_is_refused_naming_what_differs(tmp_path: Path) -> None:
    for r in run_ranks(_mismatch, str(tmp_path), timeout=300):
        assert "holds a different model than this run" in r["wider"]
        assert "head.weight (checkpoint [32, 16], this run [33, 16])" in r["wider"]
        assert "not in the checkpoint: ['blocks.2." in r["deeper"]
        assert r["wider_unchanged"] and r["deeper_unchanged"]
        assert r["wider_step"] == r["deeper_step"] == 0


def _refused(rank: int, world: int, root: str) -> dict[str, str]:
    out = {}
    for name, layout in (
        ("pp", {"dp": 1, "pp": 2, "pp_split": ["blocks.1"]}),
        ("zero1", {"zero": 1}),
    ):
        step = build_user_train_step(_run(layout))
        step.run_step()
        try:
            save_checkpoint(step, root)
        except CheckpointError as exc:
            out[name] = str(exc)
    return out


def test_pipeline_and_zero1_user_runs_are_refused(tmp_path: Path) -> None:
    for r in run_ranks(_refused, str(tmp_path), timeout=300):
        assert "pipeline stages (pp > 1)" in r["pp"] and "DDP (zero=0), FSDP" in r["pp"]
        assert "ZeRO-1" in r["zero1"]
    assert list_checkpoints(tmp_path) == []
