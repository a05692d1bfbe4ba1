"""The peers benchmark's fault rows (issue 31): each tool from a fresh kernel, 2 ranks.

In every sample, after the tool's own start (``peers_bench``'s set-up cells):

1. **a rank exits mid-cell**: rank 0 waits in a barrier while rank 1 writes the time and
   SIGKILLs itself 0.5 s into the cell; measured from that time to the cell's reply (error
   or not: nbdistributed's cell returns after its 30 s message timeout, with a message);
2. **recovery after it**: the tool's own way back, up to a working all-reduce (its output);
3. **a hung collective**: rank 0 enters a barrier that rank 1 never joins, with a 5 s
   timeout where the tool has one — ``%%wb --timeout 5``; jupyter-distributed and raw
   ipyparallel: the gloo group's own timeout (``init_process_group(timeout=5 s)``);
   nbdistributed has neither and answers after its fixed 30 s message timeout — request to
   reply;
4. **recovery after the hang**, the same way as 2.

The ways back, each the tool's documented one: the workbench ``%wb restart``;
jupyter-distributed the notebook's Restart (its group refuses cells after a rank failure
until then) and its init cell again; nbdistributed ``%unload_ext`` (its graceful stop:
``%dist_shutdown`` and ``%dist_reset`` run ``pkill -f`` on patterns that match other
people's processes on a shared machine), ``%load_ext``, ``%dist_init`` and the readiness
wait (``nbd_ready``); raw ipyparallel ``cluster.stop_cluster_sync()`` and its set-up again.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, Row, Target, median
from benchmarks.notebook_driver import KernelSpec, NotebookRun

__all__ = ["FAULT_KEYS", "HANG_TIMEOUT_S", "fault_rows", "fault_sampler", "fault_setup"]

HANG_TIMEOUT_S = 5
DEAD_TARGET = Target("<=", 0.1, "<= 0.1 s")
HANG_TARGET = Target("<=", HANG_TIMEOUT_S + 0.5, f"<= {HANG_TIMEOUT_S + 0.5:g} s (timeout + 0.5)")
RECOVER_TARGET = Target("<=", 1.0, "<= 1 (vs the fastest peer)")
# details key -> what the table row says
FAULT_KEYS = {
    "dead": "a rank exits mid-cell: seconds until the cell returns, {n} ranks",
    "recover": "recovery after it, to a working all-reduce, {n} ranks",
    "hang": f"hung collective, {HANG_TIMEOUT_S} s timeout: seconds to the message, {{n}} ranks",
    "recover_hang": "recovery after the hang, to a working all-reduce, {n} ranks",
}
_GROUP_TIMEOUT = f"timeout=__import__('datetime').timedelta(seconds={HANG_TIMEOUT_S})"
HANG = "import torch.distributed as dist\nif rank == 0:\n    dist.barrier()\nprint('returned')"


def _dead(path: str) -> str:
    return (
        "import os, signal, time\nimport torch.distributed as dist\nif rank == 1:\n"
        f"    time.sleep(0.5)\n    open({path!r}, 'w').write(repr(time.time()))\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()"
    )


def fault_setup(tool: Any, n: int) -> list[str]:
    """The tool's start cells, its gloo group given the hang timeout where the user
    creates the group (jupyter-distributed, raw ipyparallel)."""
    cells = tool.setup(n)
    if tool.name in ("jupyter-distributed", "raw ipyparallel"):
        cells = [c.replace('"gloo"', f'"gloo", {_GROUP_TIMEOUT}') for c in cells]
    return cells


def _hang_cell(tool: Any) -> str:
    if tool.name.startswith("workbench"):
        return f"%%wb --timeout {HANG_TIMEOUT_S}\n" + HANG
    return tool.cell(HANG)


async def _recover(run: NotebookRun, tool: Any, n: int, body: str, marker: str) -> float:
    """The tool's way back, timed up to its all-reduce's output."""
    start = time.perf_counter()
    if tool.name.startswith("workbench"):
        cells = ["%wb restart", tool.cell(body)]
    elif tool.name == "jupyter-distributed":
        await run.restart()
        cells = fault_setup(tool, n)
    elif tool.name == "nbdistributed":
        cells = ["%unload_ext nbdistributed", *fault_setup(tool, n)]
    else:
        cells = ["rc.close()\ncluster.stop_cluster_sync()", *fault_setup(tool, n)]
    text = ""
    for source in cells:
        _, text, failed = await run.timed(source)
        if failed:
            raise RuntimeError(f"{tool.name}: recovery cell failed: {source!r}: {text[:400]}")
    seconds = time.perf_counter() - start
    expected = f"{marker}{n * (n + 1) / 2}"
    if text.count(expected) < n:
        raise RuntimeError(f"{tool.name}: no all-reduce after recovery: {text[:400]}")
    return seconds


async def _one(tool: Any, n: int, kernels: str, body: str, marker: str) -> dict[str, Any]:
    env = {"OMP_NUM_THREADS": "1", **(tool.env or {})}
    run = NotebookRun(KernelSpec(tool.kernel.format(n=n), []), Path(kernels), env=env)
    fd, stamp = tempfile.mkstemp(prefix="wb-bench-kill-")
    os.close(fd)
    try:
        await run.start(fault_setup(tool, n), marker)
        _, _, dead_error = await run.timed(tool.cell(_dead(stamp)))
        returned = time.time()
        killed = float(Path(stamp).read_text() or "nan")
        out: dict[str, Any] = {"dead": returned - killed, "dead_error": dead_error}
        out["recover"] = await _recover(run, tool, n, body, marker)
        out["hang"], text, out["hang_error"] = await run.timed(_hang_cell(tool))
        out["hang_text"] = text[-300:]
        out["recover_hang"] = await _recover(run, tool, n, body, marker)
        return out
    finally:
        os.unlink(stamp)
        await run.close()


def fault_sampler(
    tool: Any, n: int, kernels: str, details: dict, body: str, marker: str
) -> Callable[[], float]:
    """One fault sample of ``tool``: stores every figure under ``details`` (``dead:n`` ...
    as the table reads them, flags under ``faults:n``); returns the dead-rank seconds."""

    def sample() -> float:
        out = asyncio.run(_one(tool, n, kernels, body, marker))
        for key in FAULT_KEYS:
            details.setdefault(f"{key}:{n}", {}).setdefault(tool.name, []).append(out[key])
        flags = {k: out[k] for k in ("dead_error", "hang_error", "hang_text")}
        details.setdefault(f"faults:{n}", {}).setdefault(tool.name, []).append(flags)
        return float(out["dead"])

    return sample


def fault_rows(result: BenchResult, details: dict, n: int) -> None:
    """Rows against the issue's targets: dead rank <= 0.1 s, hang <= timeout + 0.5 s,
    recovery <= the fastest peer; each shown beside the fastest peer."""
    wb = "workbench"
    for key, target in (
        ("dead", DEAD_TARGET),
        ("recover", RECOVER_TARGET),
        ("hang", HANG_TARGET),
        ("recover_hang", RECOVER_TARGET),
    ):
        medians = {t: median(v) for t, v in details.get(f"{key}:{n}", {}).items() if v}
        if wb not in medians:
            continue
        peers = {t: v for t, v in medians.items() if not t.startswith("workbench")}
        peer = min(peers, key=peers.__getitem__) if peers else None
        value = medians[wb]
        ratio = value / peers[peer] if peer and peers[peer] else None
        absolute = target is not RECOVER_TARGET
        result.rows.append(
            Row(
                metric=FAULT_KEYS[key].format(n=n) + (f", vs {peer} (fastest)" if peer else ""),
                unit="s",
                workbench=value,
                raw=peers.get(peer) if peer else None,
                raw_label=peer or "",
                ratio=ratio,
                target=target.describe(),
                met=target.check(value) if absolute else target.check(ratio),
                samples=len(details[f"{key}:{n}"][wb]),
            )
        )
