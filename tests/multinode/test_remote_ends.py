"""Slurm's one-job-per-engine launcher and the watchdog's remote commands, without a bed:
fake ``sbatch`` / ``scancel`` on PATH, local processes standing in for a host's engines."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from workbench.cluster import watchdog
from workbench.cluster.launch import launchers
from workbench.cluster.launch.slurm import SlurmJobsEngineSetLauncher, job_ids
from workbench.cluster.launch.ssh import FastSSHEngineLauncher
from workbench.cluster.lifecycle.remote_ends import end_cluster_line, remote_ends

pytestmark = pytest.mark.engines

# A fake Slurm client: records its arguments (and the job script) and answers like Slurm.
_FAKE = """#!/bin/sh
echo "$(basename "$0") $*" >> {log}
case "$(basename "$0")" in
  sbatch) for a; do :; done; cat "$a" >> {log}; echo "Submitted batch job $$" ;;
esac
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, log = tmp_path / "bin", tmp_path / "slurm.log"
    bin_dir.mkdir()
    for name in ("sbatch", "scancel"):
        (bin_dir / name).write_text(_FAKE.format(log=log))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def _engine_set(
    tmp_path: Path, hosts: list[str], n: int, **kw: object
) -> SlurmJobsEngineSetLauncher:
    options = launchers.parse_options("slurm", {"partition": "gpu", "sbatch_args": ["--qos=x"]})
    settings = launchers.ipp_settings("slurm", n, hosts, options, None, run_dir=str(tmp_path))
    assert settings["engines"] is SlurmJobsEngineSetLauncher
    (tmp_path / "profile").mkdir(exist_ok=True)
    return SlurmJobsEngineSetLauncher(
        config=settings["config"],
        profile_dir=str(tmp_path / "profile"),
        cluster_id="c1",
        engine_set_id="s1",
        **kw,
    )


def _sbatch_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("sbatch ")]


def test_slurm_starts_one_pinned_job_per_engine_and_replaces_on_a_node(
    tmp_path: Path, fake_slurm: Path
) -> None:
    engines = _engine_set(tmp_path, ["a", "b"], 4)
    ids = asyncio.run(engines.start(4))
    assert len(ids) == 4 and job_ids(engines) == ids
    calls = _sbatch_lines(fake_slurm)
    assert len(calls) == 4  # one job per engine
    assert sorted(c.split()[1] for c in calls) == ["--nodelist=a"] * 2 + ["--nodelist=b"] * 2
    for call in calls:
        words = call.split()
        assert {"--nodes=1", "--ntasks=1", "--partition=gpu", "--qos=x"} <= set(words)
        assert words[-1].startswith(str(tmp_path))  # the script is in the run directory
    script = fake_slurm.read_text()
    assert 'WB_LAUNCH_HOST="$SLURMD_NODENAME"' in script  # where a replacement goes
    assert "exec " in script and "srun" not in script  # the engine is the job

    # a replacement: one 1-engine job on the dead rank's node
    fake_slurm.write_text("")
    again = _engine_set(tmp_path, ["a", "b"], 4, engines={"b": 1})
    assert len(asyncio.run(again.start(1))) == 1
    assert [c.split()[1] for c in _sbatch_lines(fake_slurm)] == ["--nodelist=b"]

    # stop: one scancel for all of a set's jobs; the watchdog gets the same command
    ends = remote_ends(SimpleNamespace(cluster_id="c1", engines={"s1": engines}), None)
    assert ends["phases"] == [[["scancel", *ids]]]
    fake_slurm.write_text("")
    asyncio.run(engines.stop())
    assert fake_slurm.read_text().splitlines() == [f"scancel {' '.join(ids)}"]


def test_slurm_without_hosts_lets_slurm_place_the_jobs(tmp_path: Path, fake_slurm: Path) -> None:
    asyncio.run(_engine_set(tmp_path, [], 2).start(2))
    calls = _sbatch_lines(fake_slurm)
    assert len(calls) == 2 and not any("--nodelist" in c for c in calls)


def test_the_end_line_ends_only_this_clusters_processes_on_its_host() -> None:
    """Run here as it runs on an engine's host: the cluster's processes are found by their
    environment (IPP_CLUSTER_ID), never by name or a pid known elsewhere."""
    cid = f"wb-test-{os.getpid()}-{time.monotonic_ns()}"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen(sleeper, env={**os.environ, "IPP_CLUSTER_ID": cid})
    other = subprocess.Popen(sleeper, env={**os.environ, "IPP_CLUSTER_ID": f"{cid}-other"})
    try:
        subprocess.run(["sh", "-c", end_cluster_line(cid)], check=True, timeout=60)
        assert ours.wait(10) is not None
        assert other.poll() is None
    finally:
        for proc in (ours, other):
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def test_ssh_engines_are_ended_through_their_host_then_the_connections_closed() -> None:
    el = FastSSHEngineLauncher(hostname="node-a", ssh_args=["-o", "BatchMode=yes"])
    ends = remote_ends(
        SimpleNamespace(cluster_id="c9", engines={"s": SimpleNamespace(launchers={"k": el})}),
        "/tmp/wb-ssh-x",
    )
    (first,), (second,) = ends["phases"]
    assert first[:-1] == ["ssh", "-o", "BatchMode=yes", "node-a"]
    assert "IPP_CLUSTER_ID=c9" in first[-1] and "kill -TERM" in first[-1]
    assert second == ["ssh", "-o", "BatchMode=yes", "-O", "exit", "node-a"]
    assert ends["dirs"] == ["/tmp/wb-ssh-x"]


def test_watchdog_runs_the_remote_phases_in_order_when_the_kernel_dies(tmp_path: Path) -> None:
    run_dir, marks, ssh_dir = tmp_path / "run", tmp_path / "marks", tmp_path / "ssh"
    for d in (run_dir, marks, ssh_dir):
        d.mkdir()
    first = f"import time, pathlib; time.sleep(0.5); pathlib.Path({str(marks / 'a')!r}).touch()"
    # the second phase sees the first one's work done
    second = (
        f"import pathlib; p = pathlib.Path({str(marks)!r}); "
        "(p / 'b').write_text(str((p / 'a').exists()))"
    )
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    watchdog.write_pidfile(
        str(run_dir),
        [],
        {
            "phases": [[[sys.executable, "-c", first]], [[sys.executable, "-c", second]]],
            "dirs": [str(ssh_dir)],
        },
    )
    assert json.loads((run_dir / "pids.json").read_text())["pids"] == []
    dog = subprocess.Popen(
        [
            sys.executable,
            "-P",
            watchdog.__file__,
            "--parent",
            str(kernel.pid),
            "--run-dir",
            str(run_dir),
        ]
    )
    try:
        kernel.wait(30)
        assert dog.wait(60) == 0
        assert (marks / "b").read_text() == "True"
        assert not ssh_dir.exists() and not run_dir.exists()
    finally:
        for proc in (kernel, dog):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_a_spare_any_job_goes_where_slurm_has_room_and_is_never_requeued(
    tmp_path: Path, fake_slurm: Path
) -> None:
    """``spare_hosts="any"``: the lost ranks' jobs name no node but exclude every node the
    cluster ran on or lost (``spare_hosts.start_args``); no engine job is ever requeued (Slurm
    requeues a node-failed batch job by default: an engine nobody asked for, seen on the
    bed)."""
    from workbench.cluster.hosts.spare_hosts import start_args
    from workbench.config import ANY_SPARE

    cluster = SimpleNamespace(
        launch_hosts={0: ANY_SPARE, 1: ANY_SPARE, 2: "b", 3: "b"},
        lost_hosts={"a"},
        launcher_options=launchers.parse_options("slurm", {"partition": "gpu"}),
    )
    replacement = _engine_set(tmp_path, ["a", "b"], 4, **start_args(cluster, ANY_SPARE, 2))
    asyncio.run(replacement.start(2))
    calls = [c.split() for c in _sbatch_lines(fake_slurm)]
    assert len(calls) == 2 and not any(w.startswith("--nodelist") for c in calls for w in c)
    assert all({"--exclude=a,b", "--partition=gpu"} <= set(c) for c in calls), calls
    assert "#SBATCH --no-requeue" in fake_slurm.read_text()
