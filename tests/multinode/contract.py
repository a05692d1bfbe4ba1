"""What every launcher must do on the 2-node bed, written once.

Each launcher's test module subclasses ``LauncherContract`` (as ``TestSSH`` etc.) and
provides a module fixture ``run``: the report of one driver run that trained DDP on 2x2
engines. The launcher's own checks (recovery, failures surfacing with the launcher's own
words) stay in its module.
"""

from __future__ import annotations

import subprocess
from typing import Any

from tests.multinode.bed import NODE_PYTHON, Bed
from tests.multinode.checks import nothing_left, ok, trained_like_single_device, two_by_two


class LauncherContract:
    def test_ranks_local_ranks_and_master_addr(self, bed: Bed, run: dict[str, Any]) -> None:
        two_by_two(bed, run)

    def test_interrupt_reaches_a_remote_rank(self, run: dict[str, Any]) -> None:
        assert ok(run)["interrupt"]["ename"] == "KeyboardInterrupt"

    def test_ddp_across_nodes_equals_single_device(self, run: dict[str, Any]) -> None:
        trained_like_single_device(run)

    def test_notebook_and_engines_run_the_nodes_own_python(
        self, bed: Bed, run: dict[str, Any]
    ) -> None:
        """As on a user's cluster: a venv in the shared home made from the nodes' Python."""
        node = subprocess.run(
            [NODE_PYTHON, "-c", "import sys; print(*sys.version_info[:3], sep='.')"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        seen = [ok(run)["kernel_env"], *run["env"]]
        assert {e["python"] for e in seen} == {node}
        assert {e["executable"] for e in seen} == {str(bed.python)}

    def test_stop_leaves_nothing_on_any_node(self, bed: Bed, run: dict[str, Any]) -> None:
        nothing_left(bed, run)
