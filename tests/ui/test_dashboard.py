from __future__ import annotations

from workbench.cluster import Cluster
from workbench.ui.dashboard import Dashboard


def test_dashboard_shows_every_rank_and_memory(cluster: Cluster) -> None:
    board = Dashboard(cluster)
    assert [r["rank"] for r in board.rows] == [0, 1]
    assert "<th>host</th>" in board.table.value
    assert board.table.value.count("<tr>") == 3
    assert len(board.memory) == 2 and all(m["rss"] > 10 * 2**20 for m in board.memory)
    bars = [t for t in board.figure.data if t.name == "process RSS"]
    assert len(bars) == 1 and list(bars[0].x) == [0, 1]
    board.refresh_button.click()
    assert board.message.value == ""
    board.close()


def test_dashboard_magic(ipython_shell, cluster: Cluster) -> None:  # type: ignore[no-untyped-def]
    import pytest
    from IPython.core.error import UsageError

    # a cluster started from Python is the magics' current cluster too (Cluster.latest)
    assert ipython_shell._workbench_magics.cluster is cluster
    board = ipython_shell.run_line_magic("wb", "dashboard")
    assert isinstance(board, Dashboard) and len(board.rows) == 2
    board.close()
    with pytest.raises(UsageError, match="--interval 0.0 is not valid"):
        ipython_shell.run_line_magic("wb", "dashboard --interval 0")
