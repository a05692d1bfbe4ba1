"""The workbench kernel: IPython's kernel, with a local cluster's processes started first.

``python -m workbench.kernel_launcher -f {connection_file}`` is the "Python 3 (workbench)"
kernel spec (``workbench kernel install``). Before the kernel imports anything it starts
the process that imports torch once and forks a local cluster's engines, and the
controller's (``workbench.cluster.launch.warm_start``), so their imports run while the kernel
starts and the notebook is read, and ``%wb start`` only sends them their command lines.
Otherwise it is the plain Python kernel: ``%load_ext workbench`` is still what loads the
magics, and a notebook runs the same in either kernel. Set ``WORKBENCH_WARM_START=0`` in
the kernel's environment to start nothing ahead.
"""

from __future__ import annotations

import os
import sys

__all__ = ["WARM_ENV", "main"]

WARM_ENV = "WORKBENCH_WARM_START"


def main() -> None:
    # As ipykernel_launcher: the working directory is not a place to import modules from.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    if os.environ.get(WARM_ENV, "1") != "0":
        from workbench.cluster.launch import warm_start

        for role in warm_start.ROLES:
            warm_start.spawn(role)
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
