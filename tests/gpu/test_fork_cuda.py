"""The forker (engine/zygote.py) imports torch and forks the engines: it must never have
initialised CUDA, or every engine fails at its first CUDA call. Checked as the zygote does
it, in a fresh process, with the failing case beside it (so the check can fail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORK_THEN_CUDA = """
import os, sys
from workbench.engine import zygote
zygote._preload()  # what the forker imports before it forks
import torch
if {init_first}:
    torch.cuda.init()  # the mistake: CUDA touched before the fork
print("parent initialised:", torch.cuda.is_initialized(), flush=True)
pid = os.fork()
if pid == 0:
    try:
        ok = torch.ones(4, device="cuda").sum().item() == 4.0
        os._exit(0 if ok else 3)
    except Exception as e:
        print("child:", type(e).__name__, e, flush=True)
        os._exit(4)
_, status = os.waitpid(pid, 0)
print("child exit:", os.waitstatus_to_exitcode(status), flush=True)
"""


def _fork(init_first: bool) -> str:
    done = subprocess.run(
        [sys.executable, "-c", FORK_THEN_CUDA.format(init_first=init_first)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return done.stdout


def test_a_child_of_the_forker_uses_cuda(numbers: dict[str, Any]) -> None:
    out = _fork(init_first=False)
    numbers["output"] = out.strip().replace("\n", " / ")
    assert "parent initialised: False" in out
    assert "child exit: 0" in out


def test_cuda_initialised_before_the_fork_breaks_the_child(numbers: dict[str, Any]) -> None:
    out = _fork(init_first=True)
    numbers["output"] = out.strip().replace("\n", " / ")
    assert "parent initialised: True" in out
    if "child exit: 0" in out:
        pytest.fail(f"a child used CUDA after its parent initialised it: {out}")
    assert "Cannot re-initialize CUDA in forked subprocess" in out
