"""A Jupyter kernel driven as a notebook front end drives it (jupyter_client, synchronous):
run a cell and read its text, restart the kernel as Jupyter's "Restart kernel" does, and
kill its whole process group as a crashed kernel dies. Used by the kept-cluster benchmark
and tests (issue 44)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

__all__ = ["Kernel"]


class Kernel:
    """One IPython kernel (``kernel_name``, by default the Python one of this interpreter)."""

    def __init__(self, kernel_name: str = "python3") -> None:
        from jupyter_client.manager import KernelManager

        self.manager = KernelManager(kernel_name=kernel_name)
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(120)

    def run(self, code: str, timeout: float = 180) -> str:
        """The cell's text output; an error in the cell raises ``RuntimeError``."""
        out: list[str] = []
        errors: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
            elif msg["msg_type"] == "error":
                errors.append(f"{content['ename']}: {content['evalue']}")

        self.client.execute_interactive(code, output_hook=hook, timeout=timeout)
        if errors:
            raise RuntimeError(f"cell {code.splitlines()[0]!r} failed: {errors[0]}")
        return "".join(out)

    def timed(self, code: str, timeout: float = 180) -> tuple[float, str]:
        """(seconds from request to reply, the cell's text output)."""
        started = time.perf_counter()
        text = self.run(code, timeout)
        return time.perf_counter() - started, text

    def restart(self) -> None:
        """Jupyter's "Restart kernel": a shutdown request (the kernel's atexit runs), then a
        new kernel process."""
        self.manager.restart_kernel(now=False)
        self.client.wait_for_ready(120)

    def kill(self) -> None:
        """SIGKILL to the kernel's whole process group (no atexit, nothing of it left)."""
        pid = self.manager.provisioner.pid  # type: ignore[union-attr]
        os.killpg(os.getpgid(pid), signal.SIGKILL)

    def close(self) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)
