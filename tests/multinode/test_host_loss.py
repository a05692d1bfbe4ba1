"""A host lost whole mid-run, on the 2-node bed: ``wb.Cluster(n=4, launcher="ssh",
hosts=["wbmn1", "wbmn2"])``, a data-parallel run with ``elastic=True``, and wbmn2 taken
down during a step as a powered-off host goes (its link cut, then every process in its
namespaces killed, sshd included: no reset reaches the survivors). The step raises
``HostLost`` naming wbmn2 and its ranks within the issue's 15 s; the run shrinks to the 2
ranks on wbmn1, then grows back onto wbmn2 once it is up again, and its losses and samples
equal the uninterrupted 4-rank run's (computed first in the same driver run). Nothing is
left on any node after stop.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import (
    HOSTS,
    nothing_left,
    ok,
    other_host,
    same_curve_and_samples,
    told_host_lost,
)

pytestmark = [pytest.mark.engines, pytest.mark.slow]

# The behaviour: a lost host is told, not waited out. The process group's timeout (the
# driver's init_timeout=60) is what the survivors' collective would otherwise wait for;
# how fast it is told (~9 s on the bed; the goal is 15 s) is printed, not asserted.
DETECT_S = 60.0
CUT_AFTER_S = 1.5  # into the step (its forward phase waits 4 s): the host goes mid-cell


def _wait_for(proc: subprocess.Popen[str], path: Path, out: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            report = out.read_text() if out.exists() else "(no report)"
            log = out.with_suffix(".log").read_text()
            raise AssertionError(f"the driver exited ({proc.returncode}):\n{report}\n{log}")
        assert time.monotonic() < deadline, f"no {path.name} within {timeout} s"
        time.sleep(0.05)


def _report(proc: subprocess.Popen[str], out: Path, **extra: Any) -> dict[str, Any]:
    """The driver's report, once it ended, with what the test side saw."""
    proc.wait(600)
    assert out.exists(), f"the driver wrote no report:\n{out.with_suffix('.log').read_text()}"
    report: dict[str, Any] = json.loads(out.read_text())
    report.update(extra)
    return report


def _clean_up(bed: Bed, proc: subprocess.Popen[str], out: Path, meetings: list[str]) -> None:
    """The driver ended, every node up and linked (the next tests need them), the meeting
    files (``<name>.ready`` / ``.done``), the report and the log removed."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)
    for node in bed.nodes:
        bed.bring_up(node.name)
    for name in meetings:
        for end in (".ready", ".done"):
            (bed.home / f"{name}{end}").unlink(missing_ok=True)
    for path in (out, out.with_suffix(".log")):
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def run(bed: Bed) -> Iterator[dict[str, Any]]:
    proc, out = bed.spawn_driver(
        {"scenario": "host_loss", "launcher": "ssh", "hosts": HOSTS, "n": 4}
    )
    home = bed.home
    try:
        _wait_for(proc, home / "take_down.ready", out, 900)
        victim = (home / "take_down.ready").read_text()  # the last rank's host
        (home / "take_down.done").write_text("")
        time.sleep(CUT_AFTER_S)
        cut = bed.take_down(victim)
        _wait_for(proc, home / "bring_up.ready", out, 600)
        gone = bed.node(victim).unshare_pid == 0
        bed.bring_up(victim)
        (home / "bring_up.done").write_text("")
        yield _report(proc, out, cut_at=cut, was_down=gone)
    finally:
        _clean_up(bed, proc, out, ["take_down", "bring_up"])


def test_a_host_down_whole_is_host_lost_before_the_group_timeout(run: dict[str, Any]) -> None:
    told_host_lost(run, DETECT_S, "went down")


def test_the_run_shrinks_to_the_host_left_and_grows_back_with_the_same_curve(
    run: dict[str, Any],
) -> None:
    ok(run)
    print(f"shrink to 2 ranks and roll back: {run['shrink_s']:.1f} s")
    assert "shrunk from 4 to 2 ranks" in run["shrink_report"], run["shrink_report"]
    assert "global batch 8 kept" in run["shrink_report"]
    assert "checkpoint of step 3" in run["shrink_report"]
    assert run["hosts_shrunk"] == [other_host(run)] * 2 and run["spec_shrunk"] == [8, 2]
    assert run["was_down"]  # the host came back as a rebooted one: a new sshd, no engine
    assert "grown from 2 to 4 ranks" in run["grow_report"], run["grow_report"]
    assert "checkpoint of step 6" in run["grow_report"]
    assert run["hosts_grown"] == [other_host(run)] * 2 + [run["victim"]] * 2
    assert run["spec_grown"] == [8, 1]
    same_curve_and_samples(run)


def test_nothing_is_left_on_any_node_after_stop(bed: Bed, run: dict[str, Any]) -> None:
    nothing_left(bed, ok(run))
