"""Shared by the tests that kill a rank mid-run and compare the loss curve afterwards."""

from __future__ import annotations

from typing import Any

from workbench.trace import Metric


def die_in_forward() -> None:
    """Arm this engine to SIGKILL itself when the next forward phase starts (run on it)."""
    import os
    import signal

    from workbench.engine.state import engine_state

    def forward(index: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    engine_state().run._forward = forward


def rank0_losses(run: Any) -> list[float]:
    """Rank 0's loss of every step so far, from a session's or a stepper's events."""
    return [
        e.value for e in run.events if isinstance(e, Metric) and e.rank == 0 and e.name == "loss"
    ]
