"""One sample of the multi-node benchmark, run as the bed's user on its login node:

    python -m benchmarks.multinode_sample '{"kind": "workbench", "launcher": "ssh", ...}'

Prints ``{"start_s": ..., "stop_s": ...}``: seconds from nothing to a ready n-rank gloo
group, and from there to everything stopped. ``kind="raw"`` is what a user writes by hand
with ipyparallel and the same launcher: the launcher's own settings (remote python, the
engines per host, a hostfile and openmpi's ``-x``, the sbatch node list), start, connect,
``wait_for_engines``, then ``init_process_group`` on every engine with rank 0's address.
Both use the workbench's controller heartbeat (500 ms), so the ratio is the workbench's
own cost, not a setting.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import socket
import sys
import tempfile
import time
from typing import Any

HEARTBEAT = ["--HeartMonitor.period=500"]


def _address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (what a user looks up by hand)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))
        return str(s.getsockname()[0])


def _engine_address() -> str:
    import socket

    return socket.gethostbyname(socket.gethostname())


def _join(rank: int, world: int, master: str, port: int) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{master}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    return dist.get_rank()


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def workbench(launcher: str, hosts: list[str], n: int) -> dict[str, float]:
    from workbench.cluster import Cluster

    cluster = Cluster(n=n, launcher=launcher, hosts=hosts, backend="gloo", start_timeout=300)
    started = time.perf_counter()
    try:
        cluster.start_sync()
        start_s = time.perf_counter() - started
        ranks = sorted(cluster.run(_engine_rank))
        if ranks != list(range(n)):
            raise RuntimeError(f"ranks {ranks}, expected 0..{n - 1}")
    finally:
        stopping = time.perf_counter()
        cluster.stop_sync()
    return {"start_s": start_s, "stop_s": time.perf_counter() - stopping}


def _engine_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def _raw_cluster(launcher: str, hosts: list[str], n: int, work: str) -> Any:
    import ipyparallel as ipp
    from traitlets.config import Config

    cfg = Config()
    kwargs: dict[str, Any] = {
        "n": n,
        "log_level": logging.ERROR,
        "controller_args": list(HEARTBEAT),
        "config": cfg,
    }
    per_host = {h: n // len(hosts) for h in hosts} if hosts else {}
    if launcher == "local":
        return ipp.Cluster(engines="local", **kwargs)
    kwargs["controller_ip"] = _address_towards(hosts[0])
    if launcher == "ssh":
        cfg.SSHLauncher.remote_python = sys.executable
        cfg.SSHEngineSetLauncher.engines = per_host
        return ipp.Cluster(engines="ssh", **kwargs)
    if launcher == "mpi":
        hostfile = os.path.join(work, "hostfile")
        with open(hostfile, "w") as f:
            f.writelines(f"{h} slots={k}\n" for h, k in per_host.items())
        env = ["-x", "IPP_CONNECTION_INFO", "-x", "IPP_CLUSTER_ID", "-x", "IPP_PROFILE_DIR"]
        cfg.MPIEngineSetLauncher.mpi_args = ["--hostfile", hostfile, *env]
        return ipp.Cluster(engines="mpi", **kwargs)
    cfg.SlurmEngineSetLauncher.submit_command = [
        "sbatch",
        f"--nodelist={','.join(hosts)}",
        f"--nodes={len(hosts)}",
        f"--ntasks-per-node={n // len(hosts)}",
    ]
    cfg.SlurmEngineSetLauncher.batch_file_name = os.path.join(work, "engines.sbatch")
    return ipp.Cluster(engines="slurm", **kwargs)


def raw(launcher: str, hosts: list[str], n: int) -> dict[str, float]:
    work = tempfile.mkdtemp(prefix="wb-bench-", dir=os.environ["HOME"])
    started = time.perf_counter()
    cluster = _raw_cluster(launcher, hosts, n, work)
    client = None
    try:
        cluster.start_cluster_sync()
        client = cluster.connect_client_sync()
        client.wait_for_engines(n, timeout=300, interactive=False)
        ids = sorted(client.ids)[:n]
        master = client[ids[0]].apply_sync(_engine_address)
        port = random.randint(20000, 40000)
        futures = [
            client[eid].apply_async(_join, rank, n, master, port) for rank, eid in enumerate(ids)
        ]
        ranks = [f.get(timeout=300) for f in futures]
        start_s = time.perf_counter() - started
        if ranks != list(range(n)):
            raise RuntimeError(f"raw rendezvous ranks {ranks}, expected 0..{n - 1}")
    finally:
        stopping = time.perf_counter()
        if client is not None:
            with contextlib.suppress(Exception):  # a failed start: stop what there is
                client[:].apply_sync(_leave)
            client.close()
        cluster.stop_cluster_sync()
        shutil.rmtree(work, ignore_errors=True)
    return {"start_s": start_s, "stop_s": time.perf_counter() - stopping}


def main(cfg: dict[str, Any]) -> None:
    run = workbench if cfg["kind"] == "workbench" else raw
    print(json.dumps(run(cfg["launcher"], list(cfg.get("hosts", [])), int(cfg["n"]))))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
