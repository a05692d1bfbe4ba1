"""Shared fixtures. Every test run uses private IPython/Jupyter state directories.

Tiers: ``make test-fast`` runs the unit tier (``WB_TEST_TIER=unit``, ``-m "not engines and
not browser"``): no engines, no forked ranks, no subprocesses. A test that starts processes
must carry the ``engines`` marker (tests using the ``cluster`` fixture get it automatically);
in the unit tier, starting a process fails the test with a message saying so, so the tier
cannot quietly grow slow.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

# Set before anything imports IPython/ipyparallel: they read these at import/start time.
if "IPYTHONDIR" not in os.environ:
    _state = Path(tempfile.mkdtemp(prefix="wb-test-state-"))
    os.environ["IPYTHONDIR"] = str(_state / "ipython")
    os.environ["JUPYTER_CONFIG_DIR"] = str(_state / "jupyter" / "config")
    os.environ["JUPYTER_DATA_DIR"] = str(_state / "jupyter" / "data")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(_state / "jupyter" / "runtime")
if _worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker (make test-venv runs two) has an IPython directory of its own:
    # ipyparallel keeps every cluster's connection files and logs in the profile, and a test
    # that checks its cluster left none behind must not see the other worker's clusters.
    os.environ["IPYTHONDIR"] = f"{os.environ['IPYTHONDIR'].rstrip('/')}-{_worker}"
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The checkpoint key (checkpoint.trust) of the test run, not the user's own.
os.environ.setdefault("WORKBENCH_STATE_DIR", tempfile.mkdtemp(prefix="wb-test-key-"))


import pytest

UNIT_TIER = os.environ.get("WB_TEST_TIER") == "unit"
ENGINE_FIXTURES = {"cluster"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engines)


def _refuse_processes(*args: object, **kwargs: object) -> None:
    pytest.fail(
        "this test starts processes (engines, ranks or a subprocess): mark it "
        "`@pytest.mark.engines` (module: `pytestmark = pytest.mark.engines`) so the unit tier "
        "(make test-fast) leaves it to make test",
        pytrace=False,
    )


@pytest.fixture(autouse=UNIT_TIER)
def _unit_tier_starts_no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing.process
    import subprocess

    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse_processes)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse_processes)
    monkeypatch.setattr(os, "fork", _refuse_processes)


@pytest.fixture(scope="session")
def cluster():  # type: ignore[no-untyped-def]
    """One 2-rank gloo cluster shared by every test that needs engines; always stopped.
    Each test gets it healthy (``_shared_cluster_healthy``): a test that broke it is
    followed by a recovery, or a fresh start of the same object, not by failures."""
    from workbench.cluster import Cluster

    c = Cluster(n=2, backend="gloo", init_timeout=60)
    c.start_sync()
    try:
        yield c
    finally:
        c.stop_sync()


def _healthy(c: Any) -> bool:
    """Running, no rank stuck or closed out of its group, and every rank answers in it."""
    import torch.distributed as dist

    if c.state != "running" or c.stuck_ranks or c.group_closed:
        return False
    try:
        return bool(c.run(dist.get_world_size, timeout=30) == [c.world_size] * c.world_size)
    except Exception:
        return False


def restore_health(c: Any) -> None:
    """Make a shared cluster healthy again after a test that broke it (a fault test):
    recover it (a fresh group, dead engines replaced); if that fails, stop and start the
    same object, so module fixtures holding it stay valid."""
    if _healthy(c):
        return
    if c.state in ("running", "degraded"):
        try:
            c.recover_sync()
            if _healthy(c):
                return
        except Exception:
            pass
    c.stop_sync()
    c.start_sync()


@pytest.fixture(autouse=True)
def _shared_cluster_healthy(request: pytest.FixtureRequest) -> None:
    if "cluster" in request.fixturenames:
        restore_health(request.getfixturevalue("cluster"))


@pytest.fixture(scope="session")
def ipython_shell():  # type: ignore[no-untyped-def]
    """A real IPython shell with the workbench extension loaded."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "workbench")
    return shell
