"""The autopsy of a hung cell and stacks on demand (issue 43), on 2 gloo ranks.

One cluster for the module: each fault leaves ranks blocked (or an engine dead), and the
``healthy`` fixture recovers it before the next test (a recovery is ~1 s; a start ~3-7 s).
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.cluster.dispatch.autopsy import Autopsy, RankState
from workbench.errors import CollectiveTimeout, EngineDied

pytestmark = pytest.mark.engines

TIMEOUT = 2.0

SLOW_DATA = """import time
def load_batch():
    if rank == 1:
        time.sleep(600)
    return torch.ones(4)
t = load_batch()
dist.all_reduce(t)
"""
MISMATCH = """if rank == 0:
    dist.all_reduce(torch.ones(4))
else:
    dist.broadcast(torch.ones(4), 0)
"""
COUNT = """for _ in range(10 if rank == 0 else 9):
    dist.all_reduce(torch.ones(4))
"""
SIZES = "dist.all_reduce(torch.ones(4 if rank == 0 else 8))\n"
BUSY = """import time
started = time.time()
while time.time() - started < 4:
    spin = 1
'finished'
"""
TOGETHER = "t = torch.ones(2)\ndist.all_reduce(t)\nfloat(t[0])"


@pytest.fixture
def healthy(own_cluster: Cluster) -> Cluster:
    """The module's cluster (tests/cluster/conftest.py), made healthy again if a previous
    test left it blocked or degraded."""
    return own_cluster


def _together(cluster: Cluster) -> list[str]:
    return [r.execute_result["data"]["text/plain"] for r in cluster.execute(TOGETHER, timeout=60)]


def _timeout(cluster: Cluster, code: str) -> CollectiveTimeout:
    with pytest.raises(CollectiveTimeout) as info:
        cluster.execute(code, timeout=TIMEOUT)
    assert isinstance(info.value.autopsy, Autopsy)
    return info.value


def test_slow_data_names_the_rank_and_its_line(healthy: Cluster) -> None:
    error = _timeout(healthy, SLOW_DATA)
    autopsy = error.autopsy
    assert error.verdict == "rank 1 never reached all_reduce #1: it is in load_batch (cell line 4)"
    assert error.culprits == [1]
    assert autopsy.ranks[1].state is RankState.BUSY
    assert autopsy.ranks[1].where == "cell line 4, in load_batch"
    assert "cell line 4, in load_batch: time.sleep(600)" in autopsy.ranks[1].stack
    assert autopsy.ranks[0].state is RankState.WAITING
    assert autopsy.ranks[0].collective["op"] == "all_reduce"
    assert autopsy.ranks[0].collective["bytes"] == 16
    assert autopsy.ranks[0].collective["seq"] is not None  # from torch's flight recorder
    assert autopsy.ranks[0].where == "cell line 7, in <module>"
    # The message: the verdict, then one line per rank saying where it is.
    text = str(error)
    assert error.verdict in text.splitlines()[1]
    rank_lines = [line for line in text.splitlines() if line.startswith("  rank ")]
    assert len(rank_lines) == 2 and "cell line 4, in load_batch" in rank_lines[1]
    assert "<table>" in error._repr_html_() and "load_batch" in error._repr_html_()
    # Each rank's flight-recorder dump is kept in the run directory, private.
    dumps = Path(autopsy.fr_dir)
    assert sorted(p.name for p in dumps.iterdir()) == ["rank_0", "rank_1"]
    assert stat.S_IMODE(os.stat(dumps / "rank_0").st_mode) == 0o600


def test_mismatched_collectives_are_called_a_mismatch(healthy: Cluster) -> None:
    error = _timeout(healthy, MISMATCH)
    assert error.verdict == "mismatch at collective #1: rank 0 all_reduce, rank 1 broadcast"
    assert error.culprits == [1]
    assert "ranks [0, 1] wait for ranks []" not in str(error)  # the old, wrong sentence


def test_a_missing_collective_is_counted(healthy: Cluster) -> None:
    error = _timeout(healthy, COUNT)
    assert error.verdict == "rank 1 issued 9 all_reduce, rank 0 waits in its 10th"
    assert error.culprits == [1]
    assert error.autopsy.ranks[1].issued == {"all_reduce": 9}


def test_differing_sizes_are_named_and_the_cluster_recovers(healthy: Cluster) -> None:
    with pytest.raises(EngineDied) as info:  # gloo aborts the rank that reads too much
        healthy.execute(SIZES, timeout=30)
    assert str(info.value).startswith(
        "sizes differ at all_reduce #1: 16 B on rank 0, 32 B on rank 1"
    )
    healthy.recover_sync()
    assert _together(healthy) == ["2.0", "2.0"]


def test_stacks_show_a_busy_loop_while_the_cell_goes_on(healthy: Cluster) -> None:
    results: dict[str, Any] = {}
    cell = threading.Thread(target=lambda: results.update(out=healthy.execute(BUSY, timeout=60)))
    cell.start()
    try:
        deadline = time.monotonic() + 30
        while True:  # until both ranks are in the loop (the cell has to arrive first)
            stacks = healthy.stacks()
            if all("cell line 3" in s or "cell line 4" in s for s in stacks.values()):
                break
            assert time.monotonic() < deadline, stacks
            time.sleep(0.1)
    finally:
        cell.join(60)
    assert sorted(stacks) == [0, 1]
    assert stacks[0].startswith("main thread")
    assert "while time.time() - started < 4" in stacks[0] or "spin = 1" in stacks[0]
    assert "other threads" in stacks[0]  # folded, one line each
    assert [r.execute_result["data"]["text/plain"] for r in results["out"]] == ["'finished'"] * 2
    assert list(healthy.stacks(ranks=[1])) == [1]


def test_wb_stacks_magic(healthy: Cluster, ipython_shell: Any, capsys: Any) -> None:
    if Cluster.latest() is not healthy:
        pytest.skip("another cluster is the current one")
    ipython_shell.run_line_magic("wb", "stacks --ranks 1")
    out = capsys.readouterr().out
    assert out.startswith("[rank 1]\nmain thread") and "[rank 0]" not in out


SCRIPT = """import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
def load_batch():
    if int(os.environ["RANK"]) == 1:
        time.sleep(600)
    return torch.ones(4)
dist.all_reduce(load_batch())
"""


def test_a_script_run_with_a_timeout_gets_the_autopsy(healthy: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with pytest.raises(CollectiveTimeout) as info:  # what `%wb run --timeout 2 train.py` runs
        healthy.run_script(script, timeout=TIMEOUT)
    assert info.value.verdict == (
        f"rank 1 never reached all_reduce #1: it is in {script}:6 in load_batch"
    )


TRACED = """import time
def load_batch():
    if rank == 1:
        time.sleep(600)
    return torch.ones(4)
with wb.traced():
    t = load_batch()
    dist.all_reduce(t)
"""


def test_a_traced_run_gets_the_autopsy(healthy: Cluster) -> None:
    """What a stepper's timeout sees: a run's own tracer records (the cell's is paused),
    so the collective comes from the status file and is numbered by the flight recorder."""
    error = _timeout(healthy, TRACED)
    assert error.culprits == [1]
    assert re.fullmatch(
        r"rank 1 never reached all_reduce #\d+: it is in load_batch \(cell line 4\)",
        error.verdict,
    )
    assert error.autopsy.ranks[0].collective["seq"] is not None
