"""End the processes that carry ``WB_CI_RUN_TOKEN=<token>`` in their environment.

Every process one CI run starts (however deep: pytest, ipyparallel controllers and engines,
JupyterLab, kernels, Chromium) inherits the token, so this ends what that run left and
nothing else. Matching is by pid and environment, never by process name. Standard library
only: it runs before and after the virtual environment exists.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def tagged(token: str) -> list[int]:
    needle = f"WB_CI_RUN_TOKEN={token}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                variables = f.read().split(b"\0")
        except OSError:  # gone, a kernel thread, or not ours to read
            continue
        if needle in variables:
            found.append(int(entry))
    return found


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue


def main(token: str, grace_s: float = 5.0) -> int:
    pids = tagged(token)
    if not pids:
        return 0
    print(f"ci: ending {len(pids)} processes this run left: {pids}", file=sys.stderr)
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
        pids = tagged(token)
        if not pids:
            return 0
    signal_all(pids, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1]:
        sys.exit("usage: python3 .ci/sweep.py TOKEN")
    sys.exit(main(sys.argv[1]))
