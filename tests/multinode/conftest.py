"""The 2-node bed for the multi-node tests: built once per session, always torn down.

Skipped with the reason when it cannot be built here (not root, no namespaces, missing
Debian packages). The teardown checks that nothing of the bed is left: no process of its
user, no namespace, no bridge, no user, no directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator

import pytest

from tests.multinode.bed import BRIDGE, STATE_FILE, Bed, ensure_venv, unavailable_reason


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start making the bed's venv (minutes, once per checkout and pins) while the tests
    before the bed's run; ``Bed.up`` waits for it (a file lock), so no test times out on it.

    Only for a run that will use the bed: one of its ``engines`` tests selected, outside the
    unit tier. In the unit tier the process guard (tests/conftest.py) refuses every process
    start, so the pip runs of this thread failed whichever test happened to be running."""
    if bed_wanted(session.items) and unavailable_reason() is None:
        threading.Thread(target=_make_venv_quietly, name="bed-venv", daemon=True).start()


def bed_wanted(items: list[pytest.Item]) -> bool:
    if os.environ.get("WB_TEST_TIER") == "unit":
        return False
    return any(
        "tests/multinode/" in item.nodeid and item.get_closest_marker("engines") is not None
        for item in items
    )


def _make_venv_quietly() -> None:
    with contextlib.suppress(Exception):  # Bed.up tries again and reports the error
        ensure_venv()


@pytest.fixture(scope="session")
def bed() -> Iterator[Bed]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    # slurm (munged, slurmctld, slurmd) when Debian's slurm-wlm and munge are installed
    slurm = all(shutil.which(c) for c in ("munged", "slurmctld", "slurmd", "sbatch"))
    built = Bed(slurm=slurm).up()
    names = [n.name for n in built.nodes]
    try:
        yield built
    finally:
        built.down()
        left = []
        if built.root.exists():
            left.append(str(built.root))
        if STATE_FILE.exists():
            left.append(str(STATE_FILE))
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        left += [f"netns {n}" for n in names if n in netns.split()]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        if BRIDGE in links:
            left.append(f"bridge {BRIDGE}")
        users = subprocess.run(["getent", "passwd", built.user], capture_output=True).returncode
        if users == 0:
            left.append(f"user {built.user}")
        assert not left, f"the bed left {left} behind"
