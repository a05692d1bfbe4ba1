"""Kept clusters (issue 44): ``%wb start --keep`` outlives its kernel, ``%wb attach`` takes it
up from a new kernel with the engines' variables, the lease ends what no kernel holds, and
only the user who started it can read its connection file.

The kernel tests drive a real IPython kernel through jupyter_client (its restart is
jupyter's own: a shutdown request, atexit, a new process; its kill is a SIGKILL to the
kernel's whole process group). The kernel without ``--keep`` is tests/cluster/
test_faults_orphans.py's: nothing left after a SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from IPython.core.error import UsageError

from benchmarks.kernel_session import Kernel
from tests.processes import alive
from workbench.cluster import Cluster
from workbench.cluster.keep import KeptClusters, keep_settings
from workbench.errors import ClusterError, ConfigError

# ----------------------------------------------------------------- bad input, no process


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"keep": True, "lease": 0}, "lease=0"),
        ({"keep": True, "lease": -5}, "lease=-5"),
        ({"keep": True, "lease": "soon"}, "lease='soon'"),
        ({"keep": True, "lease": float("nan")}, "lease=nan"),
        ({"keep": True, "name": "a/b"}, "name='a/b'"),
        ({"keep": False, "name": "mine"}, "name='mine'"),
        ({"keep": "yes"}, "keep='yes'"),
        ({"keep": True, "cluster_id": "someone-elses"}, "cluster_id='someone-elses'"),
    ],
)
def test_bad_keep_settings_are_one_clear_error(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        Cluster(n=2, **kwargs)
    assert named in str(info.value)
    assert "valid" in str(info.value)


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("start --keep --lease abc", "--lease 'abc'"),
        ("start --keep --lease 0", "--lease 0"),
        ("start --keep --lease -1", "--lease -1"),
        ("start --lease 30", "--lease is for a kept cluster"),
        ("start --name x", "--name is for a kept cluster"),
        ("start --keep --name ../x", "--name '../x'"),
        ("start --keep --cluster-id foreign", "--cluster-id foreign"),
        ("attach no-such-cluster", "no kept cluster has that name"),
        ("attach ../etc", "name='../etc'"),
    ],
)
def test_bad_magic_input_is_a_usage_error(ipython_shell: Any, line: str, named: str) -> None:
    with pytest.raises(UsageError) as info:
        ipython_shell.run_line_magic("wb", line)
    assert named in str(info.value)


def test_without_keep_there_is_nothing_to_keep() -> None:
    assert keep_settings(False, 3600, None, foreign=None) is None
    assert Cluster(n=2).kept is None


def _fake_record(files: KeptClusters, name: str, watchdog_pid: int, run_dir: str) -> Path:
    started = psutil.Process(watchdog_pid).create_time() if psutil.pid_exists(watchdog_pid) else 0
    return files.write(
        name,
        {
            "created": time.time(),
            "lease_s": 60.0,
            "run_dir": run_dir,
            "watchdog": {"pid": watchdog_pid, "started": started},
            "controller": None,
            "config": {"launcher": "local"},
            "ranks": [],
            "connection": {"key": "secret"},
        },
    ).path


def test_files_are_private_and_stale_ones_are_cleaned(tmp_path: Path) -> None:
    files = KeptClusters(tmp_path)
    stale = _fake_record(files, "stale", os.getpid(), str(tmp_path))
    data = json.loads(stale.read_text())  # its watchdog's pid, now another process's
    data["watchdog"]["started"] -= 60
    stale.write_text(json.dumps(data))
    live = _fake_record(files, "live", os.getpid(), str(tmp_path))  # "its watchdog": us
    assert stat.S_IMODE(files.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(live.stat().st_mode) == 0o600
    scan = files.scan()
    assert [k.name for k in scan.live] == ["live"]
    assert scan.removed == ["stale"] and not stale.exists()
    assert "stale" in scan.notice()
    with pytest.raises(ConfigError, match=r"no kept cluster has that name.*'live'"):
        files.find("stale")
    live.chmod(0o644)  # readable by others: refused, not used
    with pytest.raises(ClusterError, match="chmod 600"):
        files.scan()


@pytest.mark.engines  # it forks (the second user)
def test_a_second_user_cannot_attach(tmp_path: Path) -> None:
    """Another uid can neither read the directory nor use a file it does not own."""
    if os.getuid() != 0:
        pytest.skip("needs root to act as a second user")
    files = KeptClusters(tmp_path)
    tmp_path.chmod(0o755)  # even where the state dir's parent is open, clusters/ is not
    _fake_record(files, "mine", os.getpid(), str(tmp_path))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child becomes user 'nobody' and tries
        os.close(read)
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                KeptClusters(tmp_path).find("mine")
                text = "attached"
            except ClusterError as exc:
                text = str(exc)
            os.write(write, text.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert "only the user who started a kept cluster can attach" in said
    # a file someone else owns, in a directory this user reads: refused as well
    (files.root / "theirs.json").write_text("{}")
    os.chown(files.root / "theirs.json", 65534, 65534)
    with pytest.raises(ClusterError, match="belongs to another user"):
        files.scan()


# ----------------------------------------------------------------- a real kernel


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    yield k
    k.close()


def _cluster_pids(kernel: Kernel) -> tuple[list[int], list[int]]:
    """Of the kernel's current cluster: the processes that must outlive the kernel (the
    controller, engines, watchdog), and every process of it (the controller's schedulers
    too, and the forker's spare, which ends with the kernel): what a failed test kills."""
    line = kernel.run(
        "import json, workbench as wb\n"
        "c = wb.Cluster.current()\n"
        "vital = c.pids() + [c.engines.watchdog.pid]\n"
        "tree = [p.pid for p in c.engines.process_tree(c.ranks)]\n"
        "print(json.dumps([vital, vital + tree]))"
    )
    vital, everything = json.loads(line.strip().splitlines()[-1])
    return list(vital), sorted(set(everything))


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


@pytest.mark.engines
def test_kept_cluster_survives_a_restart_and_is_attached(kernel: Kernel) -> None:
    kernel.run("%load_ext workbench")
    kernel.run("%wb start -n 2 --keep --name t44")
    kernel.run("%%wb\nz = rank*10+7")
    report = "print(len(s.events), s.session.step_index, s.spec.batch_size)"
    before = kernel.run(
        "import workbench as wb\n"
        "s = wb.Stepper(model='gpt-tiny', strategy='dp', batch_size=8)\n"
        f"s.step()\n{report}"
    )
    vital, pids = _cluster_pids(kernel)
    record = KeptClusters().path_of("t44")
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert "key" in json.loads(record.read_text())["connection"]
    try:
        kernel.restart()
        assert alive(vital) == vital  # engines, controller and watchdog outlived the kernel
        kernel.run("%load_ext workbench")
        listed = kernel.run("%wb list")
        assert re.search(r"t44\s+2\s+\S+\s+local\s+.*\bno\s*$", listed, re.M), listed
        said = kernel.run("%wb attach t44")
        seconds = float(re.search(r"attached to kept cluster 't44' in ([0-9.]+) s", said)[1])
        print(f"attach took {seconds:.3f} s")
        assert kernel.run("%%wb\nprint(z)") == "[rank 0]\n7\n[rank 1]\n17\n"
        # the stepper's run, taken up from the engines: its step index and the events the
        # engines still hold (those of its last call: the old kernel had acknowledged and
        # so let go of the earlier ones, which bounds an engine's memory on a long run)
        after = kernel.run(f"import workbench as wb\ns = wb.Stepper.attach()\n{report}")
        assert after.split()[1:] == before.split()[1:] == ["1", "8"]
        assert 0 < int(after.split()[0]) <= int(before.split()[0])
        assert kernel.run("s.step()\nprint(s.session.step_index)").strip() == "2"
        assert "this kernel" in kernel.run("%wb list")
        # this test process is a second kernel of the same user: refused, named
        with pytest.raises(ClusterError, match=r"attached to another kernel \(pid \d+\)"):
            Cluster.attach("t44")
        kernel.run("%wb stop")
        assert _gone_within(pids, 10) == []
        assert not record.exists()
    finally:
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.engines
def test_lease_ends_a_kept_cluster_after_its_kernel_is_killed(kernel: Kernel) -> None:
    """The issue's 20 s lease, scaled down to keep the suite short: alive at half the lease
    after the kernel's SIGKILL, nothing left within the lease plus 10 s."""
    lease = 4.0
    kernel.run("%load_ext workbench")
    kernel.run(f"%wb start -n 2 --keep --lease {lease} --name lease44")
    vital, pids = _cluster_pids(kernel)
    try:
        kernel.kill()  # SIGKILL to the kernel's whole process group
        killed = time.monotonic()
        time.sleep(lease / 2)
        assert alive(vital) == vital
        assert _gone_within(pids, lease + 10 - (time.monotonic() - killed)) == []
        print(f"ended {time.monotonic() - killed:.1f} s after the kill (lease {lease} s)")
        assert not KeptClusters().path_of("lease44").exists()
    finally:
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.engines
def test_detach_attach_in_python_and_a_lost_controller() -> None:
    """From Python: detach lets go (the lease runs), attach without a name takes the only
    free one with its variables; an attached cluster cannot replace engines; a kept
    cluster whose controller died meanwhile is ended when attach finds it."""
    cluster = Cluster(n=2, keep=True, lease=60).start_sync()
    name = cluster.kept
    vital = [*cluster.pids(), cluster.engines.watchdog.pid]  # type: ignore[union-attr]
    tree = [p.pid for p in cluster.engines.process_tree(cluster.ranks)]
    pids = sorted({*vital, *tree})  # what a failure kills: the schedulers too
    try:
        cluster.execute("z = rank * 10 + 7")
        cluster.detach_sync()
        assert cluster.state == "stopped" and alive(vital) == vital
        row = next(k.row() for k in KeptClusters().scan().live if k.name == name)
        assert row["attached"] == "no"
        deadline = time.monotonic() + 5  # the watchdog notices the detach within a poll
        while KeptClusters().find(name)[0].lease_left() >= 60 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert KeptClusters().find(name)[0].lease_left() < 60
        again = Cluster.attach()
        assert again is not cluster and again.kept == name and again.world_size == 2
        assert [r.stdout for r in again.execute("print(z)")] == ["7\n", "17\n"]
        assert KeptClusters().find(name)[0].lease_left() == 60  # whole while held
        with pytest.raises(ClusterError, match="restart --full"):
            again.recover_sync()
        controller = again.engines.controller_process()
        assert controller is not None
        controller.kill()
        psutil.wait_procs([controller], timeout=10)  # dead (a loaded machine is slow to)
        again.detach_sync()
        with pytest.raises(ClusterError, match="lost its ipyparallel controller"):
            Cluster.attach(name)
        assert _gone_within(pids, 10) == []
        assert not KeptClusters().path_of(str(name)).exists()
    finally:
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)
