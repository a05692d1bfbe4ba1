"""The autopsy's pieces without processes: verdicts, stacks, the ledger, dumps, bad input."""

from __future__ import annotations

import os
import pickle
import stat
import sys
from pathlib import Path

import pytest

from workbench.cluster import Cluster
from workbench.cluster.dispatch.autopsy import (
    Autopsy,
    RankAutopsy,
    RankState,
    _keep_dump,
    explain_death,
    judge,
)
from workbench.engine.autopsy import format_stack, stacks
from workbench.engine.hang import Ledger, ledger_path, read_ledger
from workbench.errors import ClusterError, CollectiveTimeout


def _waiting(rank: int, op: str, nth: int, position: int, nbytes: int = 16) -> RankAutopsy:
    collective = {"op": op, "nth": nth, "position": position, "bytes": nbytes}
    return RankAutopsy(
        rank=rank, state=RankState.WAITING, where="cell line 2, in <module>", collective=collective
    )


def test_verdicts() -> None:
    busy = RankAutopsy(rank=1, state=RankState.BUSY, where="cell line 4, in load_batch")
    assert judge({0: _waiting(0, "all_reduce", 1, 1), 1: busy}) == (
        "rank 1 never reached all_reduce #1: it is in load_batch (cell line 4)",
        [1],
    )
    assert judge({0: _waiting(0, "all_reduce", 1, 1), 1: _waiting(1, "broadcast", 1, 1)}) == (
        "mismatch at collective #1: rank 0 all_reduce, rank 1 broadcast",
        [1],
    )
    done = RankAutopsy(rank=1, state=RankState.FINISHED, issued={"all_reduce": 9})
    assert judge({0: _waiting(0, "all_reduce", 10, 10), 1: done}) == (
        "rank 1 issued 9 all_reduce, rank 0 waits in its 10th",
        [1],
    )
    sizes = {0: _waiting(0, "all_reduce", 1, 1, 16), 1: _waiting(1, "all_reduce", 1, 1, 32)}
    assert judge(sizes) == ("sizes differ at all_reduce #1: 16 B on rank 0, 32 B on rank 1", [1])
    nobody = {r: RankAutopsy(rank=r, state=RankState.BUSY, where="x.py:3 in f") for r in (0, 1)}
    assert judge(nobody)[0].startswith("no rank is in a collective: busy in Python code")


def test_the_autopsy_shows_one_line_per_rank_and_a_table() -> None:
    ranks = {0: _waiting(0, "all_reduce", 1, 1), 1: RankAutopsy(rank=1, state=RankState.BUSY)}
    autopsy = Autopsy(verdict="v<1>", culprits=[1], ranks=ranks)
    hang = "not finished\n  rank 0: waits\n  rank 1: busy\nRecover with `%wb restart`"
    lines = autopsy.message(hang).splitlines()
    assert lines[:2] == ["not finished", "autopsy: v<1>"]
    assert lines[2].startswith("  rank 0: waits | all_reduce #1 (16 B)")
    error = CollectiveTimeout("m", autopsy=autopsy)
    assert error.verdict == "v<1>" and error.culprits == [1]
    assert "<table>" in error._repr_html_() and "v&lt;1&gt;" in error._repr_html_()


def test_stacks_name_cell_lines_and_fold_other_threads() -> None:
    frame = sys._getframe()
    here = frame.f_code.co_filename
    # this file as a "cell" that had 2 leading blank lines (IPython drops them)
    (lines, where), line = format_stack(frame, {here: 2}), frame.f_lineno
    assert where == f"cell line {line + 2}, in {frame.f_code.co_name}"
    assert lines[0].startswith(f"cell line {line + 2}, in ")
    out = stacks()
    assert out["main"] and out["where"] != "?"
    assert all(line.startswith("thread ") for line in out["threads"])


def test_ledger_records_per_cell_and_survives_in_its_file(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path, 1)
    ledger.new_cell()
    for _ in range(3):
        ledger.begin("all_reduce", 16, 2)
        ledger.end()
    ledger.begin("broadcast", 8, 2)
    assert ledger.record()["counts"] == {"all_reduce": 3, "broadcast": 1}
    record = read_ledger(tmp_path, 1)
    assert record["state"] == "in" and record["issued"] == 4
    assert record["last"] == {
        "op": "broadcast",
        "bytes": 8,
        "group_size": 2,
        "issued": 4,
        "in_cell": 4,
        "nth": 1,
    }
    assert stat.S_IMODE(os.stat(ledger_path(tmp_path, 1)).st_mode) == 0o600
    ledger.new_cell()
    assert ledger.record()["counts"] == {} and read_ledger(tmp_path, 1)["cell"] == 2
    ledger.begin("all_reduce", 16, 2)
    ledger.end()  # in memory: one write per collective
    assert ledger.record()["state"] == "done" and read_ledger(tmp_path, 1)["state"] == "in"
    ledger.close()


def test_a_death_on_differing_sizes_is_explained(tmp_path: Path) -> None:
    for rank, nbytes in ((0, 16), (1, 32)):
        ledger = Ledger(tmp_path, rank)
        ledger.new_cell()
        ledger.begin("all_reduce", nbytes, 2)
        ledger.close()
    assert explain_death(str(tmp_path), 2, [0]) == (
        "sizes differ at all_reduce #1: 16 B on rank 0, 32 B on rank 1"
    )
    assert explain_death(None, 2, [0]) is None


def test_flight_recorder_dump_names_its_groups(tmp_path: Path) -> None:
    entry = {"process_group": ["0", "default_pg"], "collective_seq_id": 1}
    fr = {"entries": [entry], "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}}
    _keep_dump(tmp_path / "fr", 0, fr, 2)
    path = tmp_path / "fr" / "rank_0"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    dump = pickle.loads(path.read_bytes())  # our own file, written just above
    assert dump["pg_config"]["0"] == {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}


def test_stacks_of_a_stopped_cluster_is_one_clear_error() -> None:
    with pytest.raises(ClusterError, match="not running; start it"):
        Cluster(n=2).stacks()


def test_a_session_keeps_the_autopsy_when_it_adds_where_the_run_was() -> None:
    from workbench.session.rank_failures import error_fields

    autopsy = Autopsy(verdict="v", culprits=[1], ranks={})
    again = CollectiveTimeout("more", **error_fields(CollectiveTimeout("m", autopsy=autopsy)))
    assert again.autopsy is autopsy and again.verdict == "v"


def test_a_rank_that_does_not_answer_is_read_from_its_files() -> None:
    from workbench.cluster.dispatch.autopsy import _collective

    began = {"state": "untracked", "last": {"op": "all_reduce", "nth": 3, "in_cell": 5}}
    status = {"in_flight": [{"op": "all_reduce", "bytes": 16, "step": 0, "phase": ""}]}
    collective = _collective(began, None, status)
    assert collective is not None
    assert (collective["nth"], collective["position"], collective["bytes"]) == (3, 5, 16)
    assert _collective(began, None, {"in_flight": []}) is None  # began, but not waiting now
