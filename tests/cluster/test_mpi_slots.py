"""launcher="mpi" without hosts or a hostfile, more engines than this machine's cores:
one message naming ``hosts=`` / ``hostfile=`` before mpiexec starts anything."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psutil
import pytest

import workbench as wb
from workbench.errors import ConfigError

pytestmark = pytest.mark.engines


def _fake_openmpi(tmp_path: Path) -> tuple[str, Path]:
    """An ``mpiexec`` that answers ``--version`` as openmpi's does and logs every call."""
    log = tmp_path / "calls"
    script = tmp_path / "mpiexec"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'if [ "$1" = "--version" ]; then echo "mpiexec (OpenRTE) 4.1.4"; exit 0; fi\n'
        "exit 1\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), log


def test_more_engines_than_cores_without_hosts_is_refused_before_mpiexec_runs(
    tmp_path: Path,
) -> None:
    mpiexec, log = _fake_openmpi(tmp_path)
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    cluster = wb.Cluster(
        n=cores + 1,
        launcher="mpi",
        launcher_options={"mpiexec": mpiexec, "mpi_args": ["--allow-run-as-root"]},
    )
    with pytest.raises(ConfigError) as info:
        cluster.start_sync()
    message = str(info.value)
    assert f"n={cores + 1}" in message and f"{cores} slot(s)" in message
    assert "hosts=" in message and "'hostfile'" in message and "--oversubscribe" in message
    calls = log.read_text().split("\n") if log.exists() else []
    assert all(c in ("--version", "") for c in calls), calls  # nothing was launched
    assert cluster.state != "running"


def test_oversubscribe_or_a_placement_option_is_the_users_choice(tmp_path: Path) -> None:
    from workbench.cluster.launch import launchers, mpi

    mpiexec, _ = _fake_openmpi(tmp_path)
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    for extra in (["--oversubscribe"], ["--map-by", ":OVERSUBSCRIBE"], ["--host", "a:8"]):
        options = launchers.parse_options("mpi", {"mpiexec": mpiexec, "mpi_args": extra})
        mpi.check_mpi_slots(cores + 1, [], options)  # no error: mpiexec decides
    options = launchers.parse_options("mpi", {"mpiexec": mpiexec})
    mpi.check_mpi_slots(cores, [], options)  # fits on this machine
    mpi.check_mpi_slots(cores + 1, ["node1", "node2"], options)  # hosts named
    with pytest.raises(ConfigError, match="neither hosts nor a hostfile"):
        mpi.check_mpi_slots(cores + 1, [], options)
