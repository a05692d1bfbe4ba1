"""PID 1 of one bed node: set up the node's own view of the machine, start sshd, reap orphans.

Run by ``bed.py`` inside the node's fresh network, PID, mount and UTS namespaces, so the
node has its own hostname, ``/etc/hosts``, ``/tmp`` and process ids, as a real machine does.
Leaving this process ends every process of the node (the kernel kills the rest of a PID
namespace with its init). Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time


def sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True)


def _blocking_ancestor(path: str) -> str | None:
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts)):
        ancestor = "/" + "/".join(parts[:depth])
        if os.stat(ancestor).st_mode & 0o001 == 0:
            return ancestor
    return None


def expose(paths: list[str], stage: str) -> None:
    """Make ``paths`` (the interpreter's install, the checkout with its venv) reachable for
    a plain user in this mount namespace only: where an ancestor is private (``/root`` with
    mode 700, e.g. a pyenv or a CI checkout under root), lay a world-readable tmpfs over
    that ancestor holding just those paths. On a real cluster they are simply installed
    where every user can read them."""
    blocked: dict[str, list[str]] = {}
    for path in paths:
        ancestor = _blocking_ancestor(path)
        if ancestor is not None:
            blocked.setdefault(ancestor, []).append(path)
    for i, (ancestor, inside) in enumerate(blocked.items()):
        staged = []
        for j, path in enumerate(inside):
            place = f"{stage}/{i}-{j}"
            os.makedirs(place, exist_ok=True)
            sh("mount", "--bind", path, place)
            staged.append((path, place))
        sh("mount", "-t", "tmpfs", "-o", "mode=755", "wbmn-view", ancestor)
        for path, place in staged:
            os.makedirs(path, exist_ok=True)
            sh("mount", "--bind", place, path)


def login(cfg: dict, argv: list[str]) -> None:
    """The login node's view for the bed user: the bed's /etc/hosts, then run ``argv``."""
    sh("mount", "--bind", cfg["hosts"], "/etc/hosts")
    expose(cfg["expose"], cfg["stage"])
    os.setgroups([])
    os.setgid(cfg["gid"])
    os.setuid(cfg["uid"])
    os.execvp(argv[0], argv)


def main() -> None:
    if sys.argv[1] == "login":
        login(json.loads(sys.argv[2]), sys.argv[3:])
        return
    cfg = json.loads(sys.argv[1])
    sh("hostname", cfg["name"])
    if os.getpid() == 1:
        # Node pids start far from the login node's, so a remote pid used as a local one
        # points at nothing (or at something unrelated), never at the engine by luck.
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(cfg["pid_base"]))
    sh("mount", "--bind", cfg["hosts"], "/etc/hosts")
    # A private /tmp: what an engine writes there is invisible to the login node and to
    # the other node (the workbench must not rely on a node-local directory being shared).
    sh("mount", "-t", "tmpfs", "-o", "mode=1777,size=1g", "wbmn-" + cfg["name"], "/tmp")
    expose(cfg["expose"], cfg["stage"])
    children = [subprocess.Popen(cmd, start_new_session=True) for cmd in cfg["daemons"]]

    def stop(*_: object) -> None:
        for child in children:
            with contextlib.suppress(OSError):
                child.terminate()
        sys.exit(0)  # leaving PID 1 ends every other process of the node

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("node-ready", flush=True)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)


if __name__ == "__main__":
    main()
