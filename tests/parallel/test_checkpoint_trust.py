"""Loading a checkpoint never runs code from it: a crafted ``.metadata`` (or shard value)
is refused by the signed manifest and, behind it, by the restricted unpicklers."""

from __future__ import annotations

import io
import json
import os
import pickle
import stat
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

from workbench.errors import CheckpointError
from workbench.parallel import RunSpec, build_train_step
from workbench.parallel.checkpoint import load_checkpoint, save_checkpoint
from workbench.parallel.checkpoint.reader import WeightsOnlyPlanner, load_metadata
from workbench.parallel.checkpoint.trust import (
    MANIFEST,
    checkpoint_key,
    file_digest,
    write_manifest,
)
from workbench.parallel.step import TrainStep

KEY = b"k" * 32


class _Payload:
    """Unpickling this creates ``marker``: the proof that loading ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def _saved(root: Path) -> tuple[TrainStep, Path]:
    ts = build_train_step(RunSpec(model="mlp-tiny", strategy="single", trace=False))
    ts.run_step()
    return ts, save_checkpoint(ts, root, key=KEY)


def _forge_manifest(directory: Path, key: bytes) -> None:
    """What an attacker without the key can do: recompute every sum, sign with a guess."""
    (directory / MANIFEST).unlink()
    write_manifest(directory, key)


def test_crafted_metadata_is_refused_and_never_unpickled(tmp_path: Path) -> None:
    ts, path = _saved(tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata .*does not match the SHA-256"):
        load_checkpoint(ts, tmp_path / "ckpt", key=KEY)
    assert not marker.exists()

    _forge_manifest(path, b"guessed-key-of-the-attacker")
    with pytest.raises(CheckpointError, match="not signed with your checkpoint key"):
        load_checkpoint(ts, tmp_path / "ckpt", key=KEY)
    assert not marker.exists()

    (path / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="has no manifest.json"):
        load_checkpoint(ts, tmp_path / "ckpt", key=KEY)
    assert not marker.exists()

    # Defence in depth: even signed with the right key (a leaked key, a bug in the
    # manifest), .metadata is unpickled only into DCP's metadata classes.
    write_manifest(path, KEY)
    with pytest.raises(CheckpointError, match=r"\.open, which is not part of DCP"):
        load_checkpoint(ts, tmp_path / "ckpt", key=KEY)
    assert not marker.exists()


def test_genuine_metadata_passes_the_restricted_unpickler(tmp_path: Path) -> None:
    _, path = _saved(tmp_path)
    metadata = load_metadata((path / ".metadata").read_bytes())
    keys = set(metadata.state_dict_metadata)
    assert any(k.startswith("model.") for k in keys) and any(k.startswith("optim.") for k in keys)
    with pytest.raises(CheckpointError, match="not DCP's Metadata"):
        load_metadata(pickle.dumps({"a": 1}))


def test_non_tensor_values_are_loaded_weights_only(tmp_path: Path) -> None:
    """DCP's default planner loads non-tensor values with weights_only=False."""
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save(_Payload(marker), buffer)
    buffer.seek(0)
    planner = WeightsOnlyPlanner(flatten_state_dict=False)
    planner.state_dict = {}
    index = MetadataIndex("optim.param_groups.0.lr")
    item = ReadItem(
        type=LoadItemType.BYTE_IO,
        dest_index=index,
        dest_offsets=torch.Size([0]),
        storage_index=index,
        storage_offsets=torch.Size([0]),
        lengths=torch.Size([0]),
    )
    with pytest.raises(pickle.UnpicklingError):
        planner.load_bytes(item, buffer)
    assert not marker.exists()


def test_tampered_shard_and_rng_files_are_refused(tmp_path: Path) -> None:
    ts, path = _saved(tmp_path)
    shard = next(path.glob("*.distcp"))
    original = shard.read_bytes()
    shard.write_bytes(original[: len(original) // 2])
    with pytest.raises(CheckpointError, match=rf"{shard.name} .*does not match the SHA-256"):
        load_checkpoint(ts, tmp_path, key=KEY)
    shard.write_bytes(original)
    rng = path / "rng" / "rank-00000.pt"
    torch.save({"cpu": torch.zeros(3, dtype=torch.uint8)}, rng)
    with pytest.raises(CheckpointError, match=r"rng/rank-00000\.pt .*does not match"):
        load_checkpoint(ts, tmp_path, key=KEY)


def test_key_file_is_private_and_created_once(tmp_path: Path) -> None:
    path = tmp_path / "state" / "checkpoint.key"
    key = checkpoint_key(path)
    assert len(key) == 32 and checkpoint_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    os.chmod(path, 0o644)
    with pytest.raises(CheckpointError, match="readable or writable by others"):
        checkpoint_key(path)
    os.chmod(path, 0o600)
    path.write_text("abc\n")
    with pytest.raises(CheckpointError, match="not a hex key"):
        checkpoint_key(path)


def test_default_key_comes_from_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path / "state"))
    ts = build_train_step(RunSpec(model="mlp-tiny", strategy="single", trace=False))
    ts.run_step()
    path = save_checkpoint(ts, tmp_path / "ckpt")
    assert (tmp_path / "state" / "checkpoint.key").is_file()
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["files"][".metadata"] == file_digest(path / ".metadata")
    assert load_checkpoint(ts, tmp_path / "ckpt")["step"] == 1
    # Someone else's key (another user, another machine) does not vouch for it.
    with pytest.raises(CheckpointError, match="not signed with your checkpoint key"):
        load_checkpoint(ts, tmp_path / "ckpt", key=b"x" * 32)


def test_a_huge_meta_json_is_neither_listed_nor_read_whole(tmp_path: Path) -> None:
    """A 256 MiB sparse ``meta.json`` in place of a real one: the listing skips it and the
    load refuses it, each reading at most ``SMALL_FILE_BYTES`` of it. 256 MiB is twice the
    growth the test allows (8 x 16 MiB), so reading it whole would fail the test; the
    manifest's signing hashes it, which took 25 s at 2 GiB."""
    import resource

    from workbench.parallel.checkpoint.layout import list_checkpoints
    from workbench.parallel.checkpoint.trust import SMALL_FILE_BYTES

    ts, path = _saved(tmp_path / "ckpt")
    assert [m["step"] for m in list_checkpoints(tmp_path / "ckpt")] == [1]
    meta = path / "meta.json"
    with open(meta, "r+b") as f:
        f.truncate(16 * SMALL_FILE_BYTES)  # sparse: costs no disk
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert list_checkpoints(tmp_path / "ckpt") == []
    write_manifest(path, KEY)  # even signed (so its size is no tampering sign), it is capped
    with pytest.raises(CheckpointError, match=r"meta\.json .*larger than 16 MiB"):
        load_checkpoint(ts, tmp_path / "ckpt", key=KEY)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 8 * SMALL_FILE_BYTES, f"reading the listing grew the process by {grown} B"
