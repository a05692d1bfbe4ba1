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

# Set before anything imports IPython/ipyparallel: they read these at import/start time.
if "IPYTHONDIR" not in os.environ:
    _state = Path(tempfile.mkdtemp(prefix="wb-test-state-"))
    os.environ["IPYTHONDIR"] = str(_state / "ipython")
    os.environ["JUPYTER_CONFIG_DIR"] = str(_state / "jupyter" / "config")
    os.environ["JUPYTER_DATA_DIR"] = str(_state / "jupyter" / "data")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(_state / "jupyter" / "runtime")
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
    """One 2-rank gloo cluster shared by every test that needs engines; always stopped."""
    from workbench.cluster import Cluster

    c = Cluster(n=2, backend="gloo", init_timeout=60)
    c.start_sync()
    try:
        yield c
    finally:
        c.stop_sync()


@pytest.fixture(scope="session")
def ipython_shell():  # type: ignore[no-untyped-def]
    """A real IPython shell with the workbench extension loaded."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "workbench")
    return shell
