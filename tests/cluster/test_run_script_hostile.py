"""``%wb run`` scripts that do what a process may do and an engine must survive: fork,
close fds 1 and 2, leave signals blocked or an alarm set. Each run ends as a process's
would have, and the engine goes on serving cells as before."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import pytest

from workbench.cluster import Cluster

pytestmark = pytest.mark.engines


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


FORKS = {
    # the child ends with sys.exit(0): a process would end there
    "exit": "if pid == 0:\n    sys.exit(0)\n",
    # the child returns from the script: a process would end at the script's end too
    "return": "if pid == 0:\n    pass\n",
    # the child fails
    "raise": "if pid == 0:\n    raise RuntimeError('child fails')\n",
}


@pytest.mark.parametrize("child", list(FORKS))
def test_a_forked_child_ends_with_the_script(cluster: Cluster, tmp_path: Path, child: str) -> None:
    pids = tmp_path / "child.pids"
    body = (
        "import os, sys\npid = os.fork()\n" + FORKS[child] + "if pid:\n"
        f"    open({str(pids)!r}, 'a').write(f'{{pid}}\\n')\n"
        "    _, status = os.waitpid(pid, 0)\n"
        "    print('child ended', os.waitstatus_to_exitcode(status))\n"
    )
    results = cluster.run_script(_script(tmp_path, "forks.py", body), timeout=60)
    codes = {"exit": 0, "return": 0, "raise": 1}[child]
    assert [r.stdout.strip() for r in results] == [f"child ended {codes}"] * 2
    for pid in map(int, pids.read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    assert [r.stdout for r in cluster.execute("print('still one engine')")] == [
        "still one engine\n"
    ] * 2


def test_a_script_that_closes_fds_1_and_2_leaves_them_captured(
    cluster: Cluster, tmp_path: Path
) -> None:
    engine_pids = [int(r.stdout) for r in cluster.execute("import os\nprint(os.getpid())")]
    script = _script(tmp_path, "closes.py", "import os, time\nos.close(1)\nos.close(2)\n")
    cluster.run_script(script, timeout=60)
    busy = [psutil.Process(pid) for pid in engine_pids]
    before = [p.cpu_times() for p in busy]
    opened = cluster.execute(
        "import os, time\ntime.sleep(2)\n"
        f"f = open({str(tmp_path / 'next.txt')!r}, 'w')\nprint(f.fileno())\nf.close()\n"
        "os.write(1, b'c-level\\n')"
    )
    used = [sum(p.cpu_times()[:2]) - sum(b[:2]) for p, b in zip(busy, before, strict=True)]
    assert all(int(r.stdout.split()[0]) > 2 for r in opened)  # not fd 1 or 2
    assert [r.stdout.split()[1] for r in opened] == ["c-level"] * 2  # fd 1 is captured again
    assert all(u < 1.0 for u in used), f"engines used {used} s of CPU in a 2 s sleep"


def test_a_scripts_signal_mask_alarm_and_timers_are_put_back(
    cluster: Cluster, tmp_path: Path
) -> None:
    body = (
        "import signal\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\n"
        "signal.alarm(120)\n"
        "signal.setitimer(signal.ITIMER_PROF, 300.0)\n"
        "signal.setitimer(signal.ITIMER_VIRTUAL, 300.0)\n"
    )
    cluster.run_script(_script(tmp_path, "signals.py", body), timeout=60)
    state = cluster.execute(
        "import json, signal\n"
        "print(json.dumps({'blocked': sorted(int(s) for s in signal.pthread_sigmask("
        "signal.SIG_BLOCK, [])), 'timers': [signal.getitimer(t)[0] for t in ("
        "signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)]}))"
    )
    for result in state:
        seen = json.loads(result.stdout)
        assert int(signal.SIGINT) not in seen["blocked"]
        assert int(signal.SIGTERM) not in seen["blocked"]
        assert seen["timers"] == [0.0, 0.0, 0.0]
