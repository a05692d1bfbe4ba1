"""A load that fails leaves the run exactly as it was: weights, optimizer state, RNG, step
and data position; training then continues as if the load had never been tried.

Each corruption is tried twice where it makes sense: as is (the signed manifest refuses
it) and re-signed with the key (as a save bug or a user with the key could produce), so
the checks behind the manifest, and the load into copies, are exercised too.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.harness import run_ranks
from workbench.errors import CheckpointError
from workbench.parallel import RunSpec, build_train_step
from workbench.parallel.checkpoint import load_checkpoint, save_checkpoint
from workbench.parallel.checkpoint.trust import MANIFEST, write_manifest
from workbench.parallel.step import TrainStep

KEY = b"all-or-nothing-test-key-32-bytes"
SPEC = RunSpec(model="mlp-tiny", strategy="single", batch_size=8, trace=False)


def _snapshot(ts: TrainStep) -> dict[str, Any]:
    return {
        "model": {k: v.detach().clone() for k, v in ts.model.state_dict().items()},
        "optim": {
            p: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for p, s in ts.optimizer.state_dict()["state"].items()
        },
        "groups": json.dumps(ts.optimizer.state_dict()["param_groups"]),
        "step": ts.step,
        "data_position": ts.data_position,
        "last_loss": ts.last_loss,
        "torch_rng": torch.get_rng_state(),
        "py_rng": random.getstate(),
    }


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["optim"].keys() == b["optim"].keys() and a["optim"]
    for p in a["optim"]:
        for k, v in a["optim"][p].items():
            w = b["optim"][p][k]
            assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w
    for field in ("groups", "step", "data_position", "last_loss", "py_rng"):
        assert a[field] == b[field], field
    assert torch.equal(a["torch_rng"], b["torch_rng"])


def _resign(path: Path) -> None:
    (path / MANIFEST).unlink()
    write_manifest(path, KEY)


def _truncate_shard(path: Path) -> None:
    shard = next(path.glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) * 2 // 3])


def _bad_rng(path: Path) -> None:
    torch.save({"cpu": torch.zeros(3, dtype=torch.uint8)}, path / "rng" / "rank-00000.pt")


def _edit_meta(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        meta = json.loads((path / "meta.json").read_text())
        change(meta)
        (path / "meta.json").write_text(json.dumps(meta))

    return edit


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated shard": (_truncate_shard, r"__0_0\.distcp"),
    "bad rng file": (_bad_rng, r"rng/rank-00000\.pt"),
    "no data_position": (
        _edit_meta(lambda m: m.pop("data_position")),
        r"meta\.json.*'data_position' is missing",
    ),
    "negative data_position": (
        _edit_meta(lambda m: m.update(data_position=-3)),
        r"meta\.json.*'data_position' is -3; it must be an integer >= 0",
    ),
    "no step": (_edit_meta(lambda m: m.pop("step")), r"meta\.json.*'step' is missing"),
    "step as text": (_edit_meta(lambda m: m.update(step="2")), r"'step' is '2'"),
}


@pytest.mark.parametrize("resign", [False, True], ids=["as-is", "re-signed"])
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_failed_load_leaves_the_run_unchanged(
    tmp_path: Path, corruption: str, resign: bool
) -> None:
    corrupt, names = CORRUPTIONS[corruption]
    ts = build_train_step(SPEC)
    twin = build_train_step(SPEC)  # the same run that never tries the load
    for run in (ts, twin):
        run.run_step()
        run.run_step()
    path = save_checkpoint(ts, tmp_path, key=KEY)
    for run in (ts, twin):
        run.run_step()  # progress the failed load must not roll back
    corrupt(path)
    expected = names if resign else r"does not match the SHA-256"
    if resign:
        _resign(path)
    elif corruption != "truncated shard" and corruption != "bad rng file":
        expected = r"meta\.json .*does not match the SHA-256"
    torch.manual_seed(7)
    random.seed(7)
    before = _snapshot(ts)
    with pytest.raises(CheckpointError, match=expected) as info:
        load_checkpoint(ts, tmp_path, key=KEY)
    assert "the run is unchanged" in str(info.value)
    _assert_same(before, _snapshot(ts))
    torch.manual_seed(7)
    random.seed(7)
    assert ts.run_step() == twin.run_step()
    _assert_same(_snapshot(twin), _snapshot(ts))


def test_failed_load_into_a_fresh_run_leaves_its_optimizer_empty(tmp_path: Path) -> None:
    """DCP's get_state_dict initialises an empty optimizer; a failed load undoes that."""
    ts = build_train_step(SPEC)
    ts.run_step()
    path = save_checkpoint(ts, tmp_path, key=KEY)
    _edit_meta(lambda m: m.pop("step"))(path)
    _resign(path)
    fresh = build_train_step(SPEC)
    with pytest.raises(CheckpointError, match="'step' is missing"):
        load_checkpoint(fresh, tmp_path, key=KEY)
    assert not fresh.optimizer.state


def _load_corrupt_meta(rank: int, world: int, root: str) -> dict[str, Any]:
    import torch.distributed as dist

    spec = RunSpec(model="gpt-tiny", strategy="fsdp", batch_size=8, trace=False)
    ts = build_train_step(spec)
    ts.run_step()
    path = save_checkpoint(ts, root, key=KEY)
    ts.run_step()
    if rank == 0:
        _edit_meta(lambda m: m.update(data_position=-1))(path)
        _resign(path)
    dist.barrier()
    local = {k: v.to_local().clone() for k, v in ts.model.state_dict().items()}
    try:
        load_checkpoint(ts, root, key=KEY)
        error = None
    except CheckpointError as exc:
        error = str(exc)
    same = all(torch.equal(local[k], v.to_local()) for k, v in ts.model.state_dict().items())
    loss = ts.run_step()  # the group is intact and the ranks still train together
    return {"error": error, "same": same, "step": ts.step, "loss": loss}


@pytest.mark.engines
def test_every_rank_refuses_and_keeps_its_shard(tmp_path: Path) -> None:
    results = run_ranks(_load_corrupt_meta, str(tmp_path))
    for r in results:
        assert r["error"] is not None and "'data_position' is -1" in r["error"]
        assert r["same"] and r["step"] == 3
    assert results[0]["loss"] == results[1]["loss"]
