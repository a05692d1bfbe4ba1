"""Bad input to the command line: one line naming the value and what is valid, exit 2,
never a traceback, a hang or a MemoryError (unit tier: in this process)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from workbench.cli import main


def _one_line(argv: list[str], capsys: pytest.CaptureFixture[str], fifo: Path | None = None) -> str:
    """``main(argv)`` in a thread (a read blocked on ``fifo`` fails the test); its exit code
    must be 2 and its error one line, returned."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main(argv)), daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        assert fifo is not None
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
        pytest.fail(f"{argv} blocked")
    err = capsys.readouterr().err.strip()
    assert codes == [2], err
    assert len(err.splitlines()) == 1, err
    return err


def test_a_fifo_as_the_hardware_profile_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "hw.json"
    os.mkfifo(fifo)
    err = _one_line(["plan", "--model", "gpt2-small", "--hardware-json", str(fifo)], capsys, fifo)
    assert str(fifo) in err and "not a regular file" in err


def test_an_endless_device_as_the_hardware_profile_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _one_line(["plan", "--model", "gpt2-small", "--hardware-json", "/dev/zero"], capsys)
    assert "/dev/zero" in err and "not a regular file" in err


def test_more_virtual_stages_than_layers_names_the_valid_range(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--model", "gpt2-small", "--pp", "1024", "--virtual-stages", "24"]
    err = _one_line([*argv, "--schedule", "interleaved"], capsys)
    assert "1..0" not in err
    assert "virtual_stages=24" in err and "valid virtual_stages: 1..12" in err


def test_a_kernel_prefix_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    err = _one_line(["kernel", "install", "--prefix", str(a_file / "env")], capsys)
    assert str(a_file / "env") in err
