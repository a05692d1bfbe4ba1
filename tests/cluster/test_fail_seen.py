"""Which survivors of a death a cell stops waiting for (``fail_wait.Seen``), no engines:
a rank whose status shows it in a collective, or a collective of it failed since the cell
was sent; not a rank busy elsewhere, nor one whose failure is older than the cell."""

from __future__ import annotations

from typing import Any

from workbench.cluster.dispatch.fail_wait import Seen

BARRIER = {"op": "barrier", "bytes": 0, "group_size": 2, "source": "user"}


def _status(in_flight: list[dict[str, Any]], failed_at: float = 0.0) -> dict[str, Any]:
    return {
        "rank": 0,
        "pid": 1,
        "step": 0,
        "phase": "",
        "in_flight": in_flight,
        "failed_at": failed_at,
    }


def test_a_rank_in_a_collective_or_failed_out_of_one_since_the_cell_is_seen() -> None:
    seen = Seen(sent=1000.0)
    seen.look(0, _status([BARRIER]))
    seen.look(1, _status([], failed_at=1000.5))
    assert seen.ranks == {0, 1}


def test_a_rank_busy_elsewhere_or_failed_before_the_cell_is_not() -> None:
    seen = Seen(sent=1000.0)
    seen.look(0, _status([]))
    seen.look(1, _status([], failed_at=999.0))  # a failure in an earlier cell
    seen.look(2, None)  # no status file (another host)
    seen.look(3, {"in_flight": [], "failed_at": "soon"})  # a damaged value: not a time
    assert seen.ranks == set()


def test_a_status_without_failed_at_from_an_older_engine_still_counts_its_flights() -> None:
    seen = Seen(sent=1000.0)
    seen.look(0, {"rank": 0, "in_flight": [BARRIER]})
    seen.look(1, {"rank": 1, "in_flight": []})
    assert seen.ranks == {0}
