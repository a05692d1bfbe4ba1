"""The notebook side of a multi-node test: run as the bed's user on the login node.

    python tests/multinode/driver.py '{"scenario": "full", "launcher": "ssh", ...}' OUT.json

Does what a user does in a notebook (``wb.Cluster(...)``, a training session, a killed
engine, recovery, an interrupt, stop) and writes what it saw to OUT.json; the pytest side
asserts on it. Kept in one process per scenario: a cluster start is the expensive part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

STEPS = 6
SPEC = {"model": "mlp-tiny", "strategy": "dp", "batch_size": 8}


# ----------------------------------------------------------------- run on the engines
# (shipped by value: each imports what it uses)
def _env() -> dict[str, str]:
    import os
    import socket
    import sys

    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")
    out = {k: os.environ.get(k, "") for k in keys}
    out["hostname"] = socket.gethostname()
    out["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "")
    out["python"] = ".".join(map(str, sys.version_info[:3]))
    out["executable"] = sys.executable
    return out


def _all_reduce() -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return float(t.item())


def _spin() -> None:
    """Busy in Python code until interrupted (60 s at most)."""
    import time

    end = time.monotonic() + 60
    while time.monotonic() < end:
        time.sleep(0.01)


def _die_in_forward() -> None:
    """Arm this engine to SIGKILL itself when the next forward phase starts."""
    import os
    import signal

    from workbench.engine.state import engine_state

    def forward(index: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    engine_state().run._forward = forward


# ----------------------------------------------------------------- kernel side
def _losses(session: Any) -> list[float]:
    from workbench.trace import Metric

    return [
        e.value
        for e in session.events
        if isinstance(e, Metric) and e.rank == 0 and e.name == "loss"
    ]


def _mine() -> list[str]:
    """This user's processes on every node (the root PID namespace sees them all)."""
    me, uid = os.getpid(), os.getuid()
    out = []
    for proc in psutil.process_iter(["uids", "status", "cmdline"]):
        info = proc.info
        if proc.pid == me or info["uids"] is None or info["uids"].real != uid:
            continue
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        out.append(f"{proc.pid} {' '.join(info['cmdline'] or [])[:160]}")
    return out


def _ranks(cluster: Any) -> list[dict[str, Any]]:
    from workbench.engine.hosts import local_pid_space

    return [
        {
            "rank": r.rank,
            "engine": r.engine_id,
            "host": r.host,
            "local_rank": r.local_rank,
            "local_world_size": r.local_world_size,
            "node_rank": r.node_rank,
            "master_addr": r.master_addr,
            "local_pid": r.pid_space == local_pid_space(),
        }
        for r in cluster.ranks
    ]


def _interrupt(cluster: Any, rank: int, out: dict[str, Any]) -> None:
    r = cluster.ranks[rank]
    future = cluster.client[r.engine_id].apply_async(_spin)
    time.sleep(1.0)
    started = time.perf_counter()
    cluster.interrupt([rank])
    try:
        future.get(timeout=20)
        out["interrupt"] = {"ename": None}
    except Exception as exc:
        out["interrupt"] = {
            "ename": getattr(exc, "ename", type(exc).__name__),
            "seconds": time.perf_counter() - started,
        }


class _Typed:
    """Answers a rank's pdb prompts from a list (``debug_inbox.Prompter``), keeping what
    was asked and shown."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.seen: list[str] = []

    def why_not(self) -> str | None:
        return None

    def ask(self, rank: int, output: str, prompt: str) -> str:
        self.seen += [output, prompt]
        return self.lines.pop(0)

    def show(self, rank: int, output: str) -> None:
        self.seen.append(output)


def _debug_remote(cluster: Any, out: dict[str, Any]) -> None:
    """pdb on the last rank (another host): a breakpoint, then post-mortem (issue 45)."""
    rank = cluster.world_size - 1
    typed = _Typed(["p y", "c"])
    [cell] = cluster.execute("y = 41\nbreakpoint()\ny += 1\nprint(y)", ranks=rank, on_prompt=typed)
    failed = cluster.execute("def f(k):\n    local = k * 3\n    raise ValueError(local)\nf(5)")
    mortem = _Typed(["p local", "q"])
    left = cluster.debug(rank, on_prompt=mortem)
    out["debug"] = {
        "rank": rank,
        "host": cluster.ranks[rank].host,
        "breakpoint": typed.seen,
        "stdout": cell.stdout,
        "failed": [r.ename for r in failed],
        "post_mortem": mortem.seen,
        "left": left,
    }


def _training(cluster: Any, out: dict[str, Any], home: Path) -> None:
    from workbench.errors import EngineDied
    from workbench.parallel import RunSpec, reference_losses_and_params
    from workbench.session.training import TrainingSession

    spec = RunSpec(**SPEC)
    out["single_device"] = [float(x) for x in reference_losses_and_params(spec, STEPS)[0]]
    session = TrainingSession(cluster, spec, timeout=120)
    session.run(STEPS)
    out["ddp"] = _losses(session)
    session.close()
    if out["scenario"] != "full":
        return
    # kill one remote engine mid-step; recover; the loss curve must not notice
    victim = cluster.world_size - 1
    before = _ranks(cluster)
    session = TrainingSession(
        cluster, spec, timeout=120, checkpoint_dir=home / f"ckpt-{os.getpid()}", checkpoint_every=3
    )
    session.run(3)
    cluster.run(_die_in_forward, ranks=[victim])
    fault: dict[str, Any] = {"victim": victim, "victim_host": cluster.ranks[victim].host}
    started = time.perf_counter()
    try:
        session.step()
        fault["error"] = None
    except EngineDied as exc:
        fault.update(error=str(exc), ranks=exc.ranks, detect_s=time.perf_counter() - started)
    fault["stuck"] = cluster.stuck_ranks  # survivors left blocked in the collective
    started = time.perf_counter()
    fault["report"] = str(session.recover())
    fault["recover_s"] = time.perf_counter() - started
    session.run(STEPS - 3)
    fault["losses"] = _losses(session)
    fault["ranks_before"], fault["ranks_after"] = before, _ranks(cluster)
    fault["env_after"] = cluster.run(_env)
    if cluster.config.launcher == "slurm":  # the engines' jobs: id, state, node
        argv = ["squeue", "-h", "-u", os.environ["USER"], "-o", "%i %t %N"]
        fault["jobs_after"] = subprocess.run(argv, capture_output=True, text=True).stdout
    session.close()
    out["fault"] = fault


def _failed_load(cluster: Any, out: dict[str, Any], home: Path) -> None:
    """An engine dies, and the checkpoint recovery would roll back to fails to load (a
    file of it changed): recovery fails with that error; stop must still end everything."""
    from workbench.errors import EngineDied
    from workbench.parallel import RunSpec
    from workbench.session.training import TrainingSession

    root = home / f"ckpt-{os.getpid()}"
    session = TrainingSession(
        cluster, RunSpec(**SPEC), timeout=120, checkpoint_dir=root, checkpoint_every=3
    )
    session.run(3)
    cluster.run(_die_in_forward, ranks=[cluster.world_size - 1])
    try:
        session.step()
        out["died"] = False
    except EngineDied:
        out["died"] = True
    newest = Path(session.checkpoints()[-1]["path"])
    (newest / "rng" / "rank-00000.pt").write_bytes(b"changed after the save")
    try:
        session.recover()
        out["recover_error"] = None
    except Exception as exc:
        out["recover_error"] = f"{type(exc).__name__}: {exc}"


def _attach_kept(cfg: dict[str, Any], out_path: str) -> None:
    """Scenario "attach": a new "kernel" takes up the kept cluster that a "keep" driver
    started before it was SIGKILLed (tests/multinode/test_keep.py), then stops it."""
    from workbench.cluster import Cluster

    out: dict[str, Any] = {"scenario": cfg["scenario"]}
    stopping = time.perf_counter()
    try:
        cluster = Cluster.attach(cfg["name"])
        out["attach_s"] = time.perf_counter() - stopping
        out["ranks"] = _ranks(cluster)
        out["kept"] = [r.stdout for r in cluster.execute("print(z)")]
        out["all_reduce"] = cluster.run(_all_reduce)
        stopping = time.perf_counter()
        cluster.stop_sync()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    while (left := _mine()) and time.perf_counter() - stopping < 20:
        time.sleep(0.25)
    out["left"] = left
    out["gone_s"] = time.perf_counter() - stopping
    Path(out_path).write_text(json.dumps(out, indent=1))


def _one_rank_dies(cluster: Any, out: dict[str, Any]) -> None:
    """The last rank's engine is SIGKILLed while the others wait in a collective: what
    the waiting call and then a recovery say (under mpi: mpiexec ends the whole job)."""
    last = cluster.world_size - 1
    cell = (
        "import os, signal, torch\nimport torch.distributed as dist\n"
        f"if rank == {last}:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "t = torch.ones(1)\ndist.all_reduce(t)"
    )
    for key, call in (
        ("cell_error", lambda: cluster.execute(cell, timeout=120)),
        ("recover_error", cluster.recover_sync),
    ):
        try:
            call()
            out[key] = None
        except Exception as exc:
            out[key] = f"{type(exc).__name__}: {exc}"


def main(cfg: dict[str, Any], out_path: str) -> None:
    from workbench.cluster import Cluster

    if cfg["scenario"] == "attach":
        _attach_kept(cfg, out_path)
        return
    out: dict[str, Any] = {"scenario": cfg["scenario"]}
    home = Path(os.environ["HOME"])
    cluster = Cluster(
        n=cfg["n"],
        launcher=cfg["launcher"],
        hosts=cfg.get("hosts", ()),
        backend="gloo",
        launcher_options=cfg.get("options"),
        start_timeout=cfg.get("start_timeout", 120),
        init_timeout=60,
        spare_hosts=cfg.get("spare_hosts", ()),
        keep=cfg["scenario"] == "keep",  # outlives this driver's SIGKILL (test_keep.py)
        lease=cfg.get("lease", 3600.0),
        name=cfg.get("name"),
    )
    started = time.perf_counter()
    try:
        cluster.start_sync()
        out["start_s"] = time.perf_counter() - started
        out["timings"] = dict(cluster.timings)
        out["ranks"] = _ranks(cluster)
        out["env"] = cluster.run(_env)
        out["kernel_env"] = _env()
        out["all_reduce"] = cluster.run(_all_reduce)
        if cfg["scenario"] in ("full", "train"):
            _interrupt(cluster, cluster.world_size - 2, out)
            _debug_remote(cluster, out)
            _training(cluster, out, home)
        if cfg["scenario"] == "failed_load":
            _failed_load(cluster, out, home)
        if cfg["scenario"] in ("host_loss", "spare"):  # a sibling: the script's directory
            import host_loss_scenario as lose

            run = lose.lose_host_and_go_on if cfg["scenario"] == "host_loss" else None
            (run or lose.lose_host_onto_spare)(cluster, out, home)
        if cfg["scenario"] == "partition":  # a sibling too
            import partition_scenario

            partition_scenario.cut_off_and_go_on(cluster, out, home)
        if cfg["scenario"] == "keep":  # kept: what the next "kernel" must find again
            cluster.execute("z = rank * 10 + 7")
        if cfg["scenario"] == "mpi_rank_death":
            _one_rank_dies(cluster, out)
        if cfg["scenario"] in ("orphan", "keep"):  # the test SIGKILLs this process (the "kernel")
            out["pid"] = os.getpid()
            tmp = Path(f"{out_path}.tmp")
            tmp.write_text(json.dumps(out, indent=1))
            tmp.replace(out_path)
            time.sleep(600)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["error_s"] = time.perf_counter() - started
        out["traceback"] = traceback.format_exc()
    finally:
        stopping = time.perf_counter()
        try:  # the report is written whatever the stop does (a lost host's, say)
            cluster.stop_sync()
        except Exception as exc:
            out["stop_error"] = f"{type(exc).__name__}: {exc}"
        out["stop_s"] = time.perf_counter() - stopping
        # Nothing of the cluster may be left anywhere 20 s after stop. Under mpiexec the
        # engines' nannies (own sessions, so orted does not end them) outlive their engine by
        # their unregistration's 3 s linger (the controller is gone): 7-8 s after a training
        # run on a 2-core machine, past 10 s when it is loaded.
        while (left := _mine()) and time.perf_counter() - stopping < 20:
            time.sleep(0.25)
        out["left"] = left
        out["gone_s"] = time.perf_counter() - stopping
        Path(out_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
