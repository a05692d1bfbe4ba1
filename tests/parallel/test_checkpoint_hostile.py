"""A checkpoint folder others can write into: special files, absurd JSON, an unsigned
newest step, the user's own folders beside the checkpoints. Listing and loading never
hang or crash, rollback still finds the newest good checkpoint, and a save deletes and
replaces only what the workbench wrote (single process: no ranks)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workbench.errors import CheckpointError
from workbench.parallel import RunSpec, build_train_step
from workbench.parallel.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from workbench.parallel.checkpoint.trust import MANIFEST
from workbench.parallel.step import TrainStep

KEY = b"h" * 32
SPEC = RunSpec(model="mlp-tiny", strategy="single", batch_size=8, trace=False)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints of steps 1 and 2, signed with KEY (copied by each test that edits)."""
    root = tmp_path_factory.mktemp("saved")
    step = build_train_step(SPEC)
    for _ in range(2):
        step.run_step()
        save_checkpoint(step, root, key=KEY)
    step.close()
    return root


def _copy(saved: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(saved, root)
    return root


def _ends(call: Callable[[], Any], fifo: Path) -> Any:
    """``call()`` in a thread; a call blocked on ``fifo`` is freed (its writer opens and
    closes it) and the test fails instead of hanging."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(20)
        pytest.fail(f"blocked on the FIFO {fifo}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.mark.parametrize("name", ["meta.json", MANIFEST])
def test_a_fifo_swapped_in_after_the_check_is_refused_not_waited_on(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    root = _copy(saved, tmp_path)
    fifo = root / "step-00000002" / name
    fifo.unlink()
    os.mkfifo(fifo)
    # The swap lands between the is_file() check and the open(): the check says "file".
    monkeypatch.setattr(Path, "is_file", lambda self: True)
    listed = _ends(lambda: list_checkpoints(root), fifo)
    assert [m["step"] for m in listed] == ([1] if name == "meta.json" else [1, 2])
    fresh = build_train_step(SPEC)
    with pytest.raises(CheckpointError, match="not a regular file"):
        _ends(lambda: load_checkpoint(fresh, root, step=2, key=KEY), fifo)
    fresh.close()


def test_a_deeply_nested_meta_json_is_skipped_by_the_listing(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    (root / "step-00000002" / "meta.json").write_text("[" * 200_000 + "]" * 200_000)
    assert [m["step"] for m in list_checkpoints(root)] == [1]


@pytest.mark.parametrize(
    ("forge", "why"), [("unsigned", "no manifest.json"), ("edited", "SHA-256")]
)
def test_rollback_skips_an_unsigned_newest_checkpoint_and_says_so(
    saved: Path, tmp_path: Path, forge: str, why: str
) -> None:
    root = _copy(saved, tmp_path)
    forged = root / "step-00000009"
    shutil.copytree(root / "step-00000002", forged)
    meta = json.loads((forged / "meta.json").read_text())
    (forged / "meta.json").write_text(json.dumps({**meta, "step": 9}))  # the sums no longer hold
    if forge == "unsigned":
        (forged / MANIFEST).unlink()
    fresh = build_train_step(SPEC)
    with pytest.warns(UserWarning, match=r"loading step-00000002; .* skipped: step-00000009"):
        loaded = load_checkpoint(fresh, root, key=KEY)
    assert loaded["step"] == 2 and fresh.step == 2
    with pytest.raises(CheckpointError, match=why):  # asked for by step: refused
        load_checkpoint(fresh, root, step=9, key=KEY)
    fresh.close()


def _stepped(steps: int) -> TrainStep:
    step = build_train_step(SPEC)
    for _ in range(steps):
        step.run_step()
    return step


def test_a_save_leaves_the_users_own_temporary_folders_alone(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    mine = root / ".tmp-my-notes"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    step = _stepped(1)
    save_checkpoint(step, root, key=KEY)
    step.close()
    assert (mine / "notes.txt").read_text() == "keep me"
    assert [m["step"] for m in list_checkpoints(root)] == [1]


def test_a_save_refuses_to_replace_a_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    theirs = root / "step-00000001"
    theirs.mkdir(parents=True)
    (theirs / "data.csv").write_text("1,2,3\n")
    step = _stepped(1)
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        save_checkpoint(step, root, key=KEY)
    step.close()
    assert (theirs / "data.csv").read_text() == "1,2,3\n"
    assert sorted(p.name for p in root.iterdir()) == ["step-00000001"]  # nothing left behind
