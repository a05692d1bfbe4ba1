"""On the engines: this rank's facts, the rendezvous store, joining and leaving the group.

The client ships these by reference (module name + function name), so engines import
``workbench.engine.process_group`` from the installed package instead of unpickling code
that was defined in a notebook cell.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

from workbench.engine import autopsy, cell_fds, group_guard, group_sockets, host_loss
from workbench.engine.state import engine_state, user_namespace

__all__ = [
    "engine_info",
    "open_store",
    "setup_rank",
    "teardown_rank",
]

# The rank's own state (its assignment, clock, run, stores) is in ``engine_state()``.
LOOPBACK = "127.0.0.1"


def _host_address(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


def engine_info() -> dict[str, Any]:
    """Facts the client needs to assign a rank; also the engine's clock for offsets."""
    import torch

    host = socket.gethostname()
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return {
        "host": host,
        "pid": os.getpid(),
        "address": _host_address(host),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "cpus": cpus,
        "time_ns": time.time_ns(),
    }


def _loopback_interface() -> str:
    """The name of this host's loopback interface ("lo" on Linux, "lo0" on macOS)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addrs):
            return name
    return "lo"


def open_store(bind: str, world_size: int, timeout_s: float) -> int:
    """On rank 0: the rendezvous store, listening on ``bind`` only; returns its port.

    The listening socket is created here, bound to exactly one address (loopback for a
    local cluster, ``MASTER_ADDR`` for several hosts), and handed to the store, so nothing
    listens on other interfaces and no other process can take the port between choosing
    it and listening on it. The store is kept until ``setup_rank`` joins the group with it.
    """
    from datetime import timedelta

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((bind, 0))
        sock.listen(max(16, world_size))
        port = int(sock.getsockname()[1])
        store = dist.TCPStore(
            bind,
            port,
            world_size,
            is_master=True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,  # the other ranks connect later, in setup_rank
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now and closes it with the group
    engine_state().keep_pending_store(store)
    return port


def _join_store(assignment: dict[str, Any], timeout_s: float) -> Any:
    """Rank 0 takes the store ``open_store`` made; the others connect to it as clients."""
    from datetime import timedelta

    import torch.distributed as dist

    store = engine_state().take_pending_store()
    if int(assignment["rank"]) == 0:
        if store is None:
            raise RuntimeError("rank 0 has no rendezvous store; open_store must run first")
        return store
    return dist.TCPStore(
        assignment["master_addr"],
        int(assignment["master_port"]),
        int(assignment["world_size"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
    )


def _export_rank_environment(assignment: dict[str, Any]) -> None:
    """The torchrun-style variables a user's code (and torch) reads on this rank."""
    os.environ.update(
        {
            "RANK": str(assignment["rank"]),
            "WORLD_SIZE": str(assignment["world_size"]),
            "LOCAL_RANK": str(assignment["local_rank"]),
            "LOCAL_WORLD_SIZE": str(assignment["local_world_size"]),
            "GROUP_RANK": str(assignment["node_rank"]),
            "MASTER_ADDR": assignment["master_addr"],
            "MASTER_PORT": str(assignment["master_port"]),
        }
    )
    if str(assignment["device"]).startswith("cpu"):
        # Accelerate finds no GPU otherwise and runs every gloo rank alone, as process 0
        # of 1 -- in a %%wb cell as in a script run through %wb run.
        os.environ["ACCELERATE_USE_CPU"] = "true"
    if assignment["master_addr"] == LOOPBACK:
        # One host: gloo's and NCCL's own connections listen on loopback too (by default
        # they bind the address the host name resolves to, which may face the network).
        loopback = _loopback_interface()
        os.environ["GLOO_SOCKET_IFNAME"] = loopback
        os.environ["NCCL_SOCKET_IFNAME"] = loopback


def setup_rank(
    assignment: dict[str, Any],
    timeout_s: float,
    clock_offset_ns: int = 0,
    run_dir: str | None = None,
) -> dict:
    """Join the process group and predefine ``rank, world_size, local_rank, device, dist,
    torch`` and ``wb`` (the ``workbench`` package: ``wb.traced`` in a cell, as the README
    writes it).

    Every engine calls this concurrently; ``timeout_s`` bounds the rendezvous so a peer
    that never arrives is an error, not a hang. With ``run_dir`` the engine's status thread
    (out-of-band in-flight record, see ``hang.py``) writes there.
    """
    import torch
    import torch.distributed as dist

    from workbench.trace import Clock

    teardown_rank()  # a re-init (restart, new port) starts from a clean slate
    pending = engine_state().pending_store
    # what this engine had before its first group (the controller) is never cut by recovery
    group_sockets.remember_engine_connections(set() if pending is None else {pending.port})
    _export_rank_environment(assignment)
    autopsy.enable_flight_recorder()  # torch records this group's collectives (hang autopsy)
    torch.set_num_threads(int(assignment["threads"]))
    device = torch.device(assignment["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    started = time.perf_counter()
    dist.init_process_group(
        backend=assignment["backend"],
        store=_join_store(assignment, timeout_s),
        rank=int(assignment["rank"]),
        world_size=int(assignment["world_size"]),
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    group_guard.install()  # the user's init_process_group adopts this group from now on
    host_loss.install()  # a lost host's survivors can be freed while blocked
    autopsy.install()  # stacks and the flight recorder, read from the control thread
    cell_fds.install()  # C-level output of a cell joins its stdout/stderr (both paths)
    engine_state().join_group(assignment, Clock(offset_ns=clock_offset_ns))
    if run_dir is not None:
        from workbench.engine import hang

        hang.start_monitor(run_dir, int(assignment["rank"]))
    user_namespace().update(
        rank=int(assignment["rank"]),
        world_size=int(assignment["world_size"]),
        local_rank=int(assignment["local_rank"]),
        device=device,
        dist=dist,
        torch=torch,
        wb=sys.modules["workbench"],  # this package, loaded before its modules
    )
    return {"rank": assignment["rank"], "init_s": time.perf_counter() - started}


def teardown_rank(sever: bool = False) -> int:
    """Close the training run and leave the process group (if any) so a new one can be
    created. Dropping every reference to the old groups closes their sockets, which is
    also what frees a peer blocked in a collective with this rank (it fails at once).

    But a group still held elsewhere keeps its sockets open (on torch 2.13 a DDP model
    holds its group in C++ after it is gone, and ``shutdown()`` does not close gloo's
    connections): with ``sever`` (recovery) they are cut at the socket as well
    (``group_sockets``); returns how many were cut."""
    import gc

    import torch.distributed as dist

    from workbench.engine.run_slot import drop_run

    # A fresh engine (the first setup_rank) has nothing to drop: skip the full collection,
    # which costs 0.1-0.3 s with torch loaded.
    held = dist.is_available() and dist.is_initialized()
    held = held or engine_state().run is not None
    drop_run()  # a run broken by the failure being recovered from is dropped anyway
    if dist.is_available() and dist.is_initialized():
        # shutdown() ends what a group still runs (NCCL aborts its communicators) even
        # while a mesh, DDP or a user variable still holds the group object (destroy alone
        # only forgets it)
        for group in list(dist.distributed_c10d._world.pg_map):
            try:
                group.shutdown()
            except Exception:  # already broken by the failure being recovered from
                continue
        dist.destroy_process_group()
    if held:
        gc.collect()
    return group_sockets.sever_group_connections() if sever else 0
