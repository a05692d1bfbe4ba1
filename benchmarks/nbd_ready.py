"""Wait until nbdistributed's workers can receive a cell (run in its kernel by
``%run -m benchmarks.nbd_ready``; a line magic, so nbdistributed runs it locally).

``%dist_init`` returns after a fixed 2 s sleep, while each worker still imports torch, joins
the process group and only then connects its ZMQ socket to the kernel's ROUTER socket; a
ROUTER drops messages for a peer that has not connected yet, so a cell sent earlier is lost
and times out after 30 s. The benchmark waits here for every worker's connection, which
credits nbdistributed with the readiness check it lacks (a user would wait longer).
"""

from __future__ import annotations

import time

import psutil
from IPython import get_ipython

__all__ = ["wait"]


def wait(timeout: float = 180.0) -> float:
    magics = get_ipython().magics_manager.registry["DistributedMagic"]
    manager = magics._process_manager
    port = manager.comm_port
    procs = [psutil.Process(p.pid) for p in manager.processes]
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        connected = 0
        for proc in procs:
            conns = proc.net_connections(kind="tcp")
            if any(c.raddr and c.raddr.port == port and c.status == "ESTABLISHED" for c in conns):
                connected += 1
        if connected == len(procs):
            return time.perf_counter() - start
        time.sleep(0.005)
    raise TimeoutError(f"nbdistributed workers not connected after {timeout} s")


if __name__ == "__main__":
    wait()
