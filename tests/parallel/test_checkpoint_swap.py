"""A shard swapped between its hash check and DCP's read is never loaded.

A second process keeps replacing the genuine ``__0_0.distcp`` by a same-size shard of
another save (hard link + rename, as anyone with write access to the folder can) and
putting the genuine one back, while this process loads the checkpoint over and over.
Each load must either refuse or load the genuine weights: what is read is what was hashed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from workbench.errors import CheckpointError
from workbench.parallel import RunSpec, build_train_step
from workbench.parallel.checkpoint import load_checkpoint, save_checkpoint
from workbench.parallel.step import TrainStep

KEY = b"s" * 32
LOADS = 150

_SWAPPER = textwrap.dedent(
    """
    import os, sys
    target, genuine, forged, stop = sys.argv[1:]
    tmp = target + ".swap"
    while not os.path.exists(stop):
        for source in (forged, genuine):
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            os.link(source, tmp)
            os.rename(tmp, target)
    """
)


def _weights(ts: TrainStep) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in ts.model.state_dict().items()}


def _run(shift: float) -> TrainStep:
    ts = build_train_step(RunSpec(model="mlp-tiny", strategy="single", trace=False))
    ts.run_step()
    with torch.no_grad():  # weights of their own, whatever the run's seed
        for p in ts.model.parameters():
            p.add_(shift)
    return ts


@pytest.mark.engines
def test_a_shard_swapped_during_loads_is_never_loaded(tmp_path: Path) -> None:
    genuine_run, forged_run = _run(0.0), _run(1.0)
    genuine_dir = save_checkpoint(genuine_run, tmp_path / "genuine", key=KEY)
    forged_dir = save_checkpoint(forged_run, tmp_path / "forged", key=KEY)
    shard = "__0_0.distcp"
    assert (genuine_dir / shard).stat().st_size == (forged_dir / shard).stat().st_size
    # Keep both shards' inodes alive under private names for the swapper to link from.
    (tmp_path / "genuine.keep").hardlink_to(genuine_dir / shard)
    (tmp_path / "forged.keep").hardlink_to(forged_dir / shard)
    genuine, forged = _weights(genuine_run), _weights(forged_run)
    assert any(not torch.equal(genuine[k], forged[k]) for k in genuine)

    stop = tmp_path / "stop"
    swapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SWAPPER,
            str(genuine_dir / shard),
            str(tmp_path / "genuine.keep"),
            str(tmp_path / "forged.keep"),
            str(stop),
        ]
    )
    outcomes = {"refused": 0, "genuine": 0, "forged": 0}
    try:
        target = _run(2.0)
        for _ in range(LOADS):
            try:
                load_checkpoint(target, tmp_path / "genuine", key=KEY)
            except CheckpointError:
                outcomes["refused"] += 1
                continue
            loaded = _weights(target)
            if all(torch.equal(loaded[k], genuine[k]) for k in genuine):
                outcomes["genuine"] += 1
            else:
                outcomes["forged"] += 1
    finally:
        stop.touch()
        swapper.wait(timeout=60)
    assert swapper.returncode == 0
    assert outcomes["forged"] == 0, outcomes
    assert outcomes["refused"] > 0, f"the swapper never raced a load: {outcomes}"
