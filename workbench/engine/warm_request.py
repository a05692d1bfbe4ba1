"""The one request a process started ahead reads before it becomes what was asked for.

The workbench kernel starts a local cluster's processes before ``%wb start`` (the engines'
forker, engine/zygote.py, and the controller, cluster/launch/warm_controller.py) so their imports
run early; each then waits here for its command line, environment, working directory and
output file, one JSON line on stdin written by the launcher that takes it over
(``workbench.cluster.launch.warm_start``). Standard library only: it runs before, and next to,
the heavy imports.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

__all__ = ["apply_request", "await_request", "request_line"]


def request_line(args: list[str], env: dict[str, str | None], cwd: str, output: str) -> bytes:
    """The request: ``env`` maps a variable to its new value, or None to remove it."""
    request = {"args": args, "env": env, "cwd": cwd, "output": output}
    return (json.dumps(request) + "\n").encode()


def await_request() -> list[str]:
    """Read the request and apply it to this process; return its arguments. Exits quietly
    at end of input: nobody will take this process (its kernel ended or gave it up)."""
    line = sys.stdin.readline()
    if not line.strip():
        sys.exit(0)
    return apply_request(line)


def apply_request(line: str) -> list[str]:
    """Apply one request line (``request_line``) to this process; return its arguments."""
    request: dict[str, Any] = json.loads(line)
    for key, value in request["env"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.chdir(request["cwd"])
    # stdin /dev/null and output to the launcher's file, as for a process ipyparallel
    # starts itself (children inherit both).
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    return [str(a) for a in request["args"]]
