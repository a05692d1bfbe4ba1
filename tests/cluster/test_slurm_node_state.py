"""``slurm_nodes.node_state`` / ``free_nodes`` run the real commands: here stand-in
``scontrol`` / ``sinfo`` scripts on ``PATH`` that print what the bed's Slurm printed
(``slurm_bed_capture.txt``), one that hangs, and none at all. Slurm's answer is an extra
signal: whenever it cannot be had in time, it is None (the sshd probe decides alone)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from tests.cluster.test_slurm_spares import _captured
from workbench.cluster.hosts import slurm_nodes

pytestmark = pytest.mark.engines  # it starts the stand-in scripts


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/bin:/usr/bin")


@pytest.mark.parametrize(
    ("label", "state"),
    [
        ("idle", {"IDLE"}),
        ("down_not_responding", {"DOWN", "NOT_RESPONDING"}),
        ("idle_drain", {"IDLE", "DRAIN"}),
        ("not_found", None),  # exit 1: a name Slurm does not know
    ],
)
def test_node_state_reads_scontrol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: str, state: set[str] | None
) -> None:
    rc, text = _captured()[label]
    _stand_in(tmp_path, monkeypatch, "scontrol", f"echo {shlex.quote(text)}\nexit {rc}")
    assert slurm_nodes.node_state("wbmn1") == state


def test_no_scontrol_on_path_is_no_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    assert slurm_nodes.node_state("wbmn1") is None
    assert slurm_nodes.free_nodes("wb", ()) is None


def test_a_stuck_slurmctld_is_no_signal_after_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in(tmp_path, monkeypatch, "scontrol", "exec sleep 60")
    started = time.monotonic()
    assert slurm_nodes.node_state("wbmn1", timeout=0.5) is None
    assert time.monotonic() - started < 30  # bounded by the timeout, not by the command


def test_free_nodes_reads_sinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _captured()["sinfo"][1].replace(";", "\\n")
    _stand_in(tmp_path, monkeypatch, "sinfo", f'printf "{text}\\n"')
    assert slurm_nodes.free_nodes("wb", {"wbmn1"}) == ["wbmn3"]
