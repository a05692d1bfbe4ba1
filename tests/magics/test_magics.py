"""``%wb`` and ``%%wb`` through a real IPython shell."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from unittest import mock

import psutil
import pytest
from IPython.core.error import UsageError

from workbench.cluster import Cluster
from workbench.errors import RankError
from workbench.magics.render import as_this_cell


def _magics(shell: Any) -> Any:
    return shell._workbench_magics


@pytest.fixture
def attached(ipython_shell: Any, cluster: Cluster) -> Iterator[Any]:
    """The shell, whose current cluster is the shared session cluster (started from Python:
    Cluster.latest() is one answer for the magics and the library)."""
    assert _magics(ipython_shell).cluster is cluster
    yield ipython_shell


def test_cell_runs_on_every_rank_in_rank_order(attached: Any, capsys: Any) -> None:
    attached.run_cell_magic(
        "wb", "", "t = torch.ones(3) * (rank + 1)\ndist.all_reduce(t)\nprint(t.tolist())"
    )
    out = capsys.readouterr().out
    assert out == "[rank 0]\n[3.0, 3.0, 3.0]\n[rank 1]\n[3.0, 3.0, 3.0]\n"


def test_wb_and_torch_are_predefined_in_cells(attached: Any, capsys: Any) -> None:
    # The README's traced loop calls wb.traced in a cell without importing anything.
    attached.run_cell_magic(
        "wb", "--ranks 0 --no-labels", "print(wb.__name__, torch.__name__, callable(wb.traced))"
    )
    assert capsys.readouterr().out == "workbench torch True\n"


def test_a_comment_after_a_magic_is_ignored_as_in_a_shell(attached: Any, capsys: Any) -> None:
    # As the README writes them: `%%wb --ranks 0 --timeout 30    # a subset of ranks ...`
    attached.run_cell_magic("wb", "--ranks 0 --no-labels   # only rank 0", "print('#', rank)")
    assert capsys.readouterr().out == "# 0\n"


def test_cell_on_a_subset(attached: Any, capsys: Any) -> None:
    attached.run_cell_magic("wb", "--ranks 1", "print('only', rank)")
    assert capsys.readouterr().out == "[rank 1]\nonly 1\n"
    attached.run_cell_magic("wb", "--ranks 0 --no-labels", "print('plain')")
    assert capsys.readouterr().out == "plain\n"


def test_cell_via_the_controller(attached: Any, capsys: Any) -> None:
    with mock.patch.object(Cluster, "execute", wraps=Cluster.latest().execute) as execute:
        attached.run_cell_magic("wb", "--ranks 0 --no-labels --via-controller", "print(rank)")
        attached.run_cell_magic("wb", "--ranks 0 --no-labels", "print(rank)")
    assert [c.kwargs["direct"] for c in execute.call_args_list] == [False, True]
    assert capsys.readouterr().out == "0\n0\n"


def test_errors_fail_the_cell_grouped_by_rank(attached: Any) -> None:
    result = attached.run_cell("%%wb\nraise ValueError('same everywhere')")
    assert isinstance(result.error_in_exec, RankError)
    rendered = result.error_in_exec._render_traceback_()
    assert rendered[0] == "[ranks 0, 1]"
    # the cell's frame is labelled with the notebook's count, not the engine's (issue 49)
    attached.execution_count += 100  # a notebook far ahead of its engines' %%wb cells
    count = attached.execution_count  # the In[count] this cell is shown as
    code = "%%wb\nif rank == 1: raise KeyError('one')\nprint('fine')"
    result = attached.run_cell(code, store_history=True)
    assert isinstance(result.error_in_exec, RankError)
    assert set(result.error_in_exec.failures) == {1}
    plain = re.sub(r"\x1b\[[0-9;]*m", "", result.error_in_exec.failures[1])
    assert re.search(rf"Cell\s*In\[{count}\], line 1", plain), plain


def test_a_rank_s_traceback_names_the_notebook_cell() -> None:
    engine = "Traceback\nCell In[4], line 2\n----> 2 f()\nCell In[2], line 1, in f()\n"
    assert as_this_cell(engine, 10) == engine.replace("In[4]", "In[10]")
    colour = "\x1b[0;32mCell\x1b[0m\x1b[0;32m In[4]\x1b[0m, line 2"
    assert as_this_cell(colour, 10) == colour.replace("In[4]", "In[10]")
    assert as_this_cell(engine, None) == engine and as_this_cell(None, 3) is None


def test_status_table(attached: Any, capsys: Any) -> None:
    attached.run_line_magic("wb", "status")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["rank", "engine", "host", "pid", "device", "backend", "state"]
    assert [line.split()[0] for line in lines[1:]] == ["0", "1"]
    rows = attached.run_line_magic("wb", "status --json")
    assert [r["rank"] for r in rows] == [0, 1]


@pytest.mark.parametrize(
    ("line", "cell", "message"),
    [
        ("", "--ranks 7", "outside this cluster; valid ranks are 0..1"),
        ("", "--ranks x", "use 'all'"),
        (
            "",
            "--timeout -1",
            r"--timeout -1.0 is not valid: out of range; use a number of seconds > 0",
        ),
        ("", "--timeout nan", "--timeout nan is not valid: not a finite number"),
        (
            "",
            "--ranks 0-50000000",
            r"rank 50000000 is outside this cluster; valid ranks are 0\.\.1",
        ),
        ("", "--bogus", r"unknown option '--bogus'.*valid options: "),
        # ASCII digits only: int() reads an Arabic-Indic one as rank 1 and 1_0 as 10
        ("", "--ranks \u0661", "'\u0661' is not a rank or a range"),
        ("", "--ranks 1_0", "'1_0' is not a rank or a range"),
    ],
)
def test_bad_cell_arguments(attached: Any, line: str, cell: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        attached.run_cell_magic("wb", cell, "print(1)")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("start -n 0", "-n 0 is not valid: out of range; use a number of engines >= 1"),
        ("start --threads 1.5", "--threads '1.5' is not valid: not a whole number"),
        ("start --timeout inf", "--timeout inf is not valid: not a finite number"),
        ("start --hosts node-a", "--launcher local does not place engines on named hosts"),
        ("start --launcher ssh", "--launcher ssh needs --hosts"),
        ("start --spare-hosts node-c", "launcher='local' cannot start a lost host's ranks"),
        (
            "start --launcher ssh --hosts a,b --spare-hosts b",
            r"spare_hosts=\('b',\) is not valid: 'b' is also in hosts",
        ),
        # with no cluster, or with the local one an earlier test of this shell left running
        ("grow 1 --hosts node-b", "no cluster|start one first|does not place engines on named"),
        ("start -n 5000", "-n 5000 is not valid: out of range; .* <= 1024"),
        (
            "start --profile x",
            "--profile 'x' is not valid: no ipyparallel controller to connect to "
            r"\(looked for .*profile_x/security/ipcontroller-client.json",
        ),
        ("dashboard --interval nan", "--interval nan is not valid: not a finite number"),
        ("start -n two", "not a whole number"),
        ("start -n ١", "-n '١' is not valid: not a whole number"),  # int() reads it as 1
        ("start -n 1_0", "-n '1_0' is not valid: not a whole number"),
        ("start --backend mpi", "invalid choice: 'mpi'.*gloo"),
        ("start --launcher k8s", "invalid choice: 'k8s'.*slurm"),
        ("frobnicate", "unknown command 'frobnicate'; valid commands: start"),
    ],
)
def test_bad_line_arguments(ipython_shell: Any, line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ipython_shell.run_line_magic("wb", line)


def test_cell_before_start_is_a_usage_error(ipython_shell: Any) -> None:
    # no cluster started anywhere (the shared one, if running, is hidden from the registry)
    with mock.patch("workbench.cluster.cluster._current", []):
        with pytest.raises(UsageError, match="start one first with `%wb start"):
            ipython_shell.run_cell_magic("wb", "", "print(1)")
        with pytest.raises(UsageError, match="start one first"):
            ipython_shell.run_line_magic("wb", "status")


def test_help_everywhere(ipython_shell: Any, capsys: Any) -> None:
    ipython_shell.run_line_magic("wb", "--help")
    assert "commands:" in capsys.readouterr().out
    ipython_shell.run_line_magic("wb", "start --help")
    assert "--backend" in capsys.readouterr().out
    ipython_shell.run_cell_magic("wb", "--help", "print(1)")
    assert "--ranks" in capsys.readouterr().out


@pytest.mark.engines
def test_start_and_stop_through_magics(ipython_shell: Any, capsys: Any) -> None:
    magics = _magics(ipython_shell)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    ipython_shell.run_line_magic("wb", "start -n 2 --backend gloo --profile-startup")
    try:
        out = capsys.readouterr().out
        assert "2 ranks on 1 host(s), backend gloo" in out
        # --profile-startup: the stages in order, then one row per engine with every milestone
        assert "start-up profile" in out
        stages = [
            s
            for s in ("controller started", "all engines registered", "process group formed")
            if s in out
        ]
        assert stages == sorted(stages, key=out.index) and len(stages) == 3
        rows = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()]
        assert len(rows) == 2 and all(len(r) == 7 and "-" not in r for r in rows), out
        started = [p.pid for p in me.children(recursive=True) if p.pid not in before]
        with pytest.raises(UsageError, match="already running"):
            ipython_shell.run_line_magic("wb", "start -n 2")
        ipython_shell.run_cell_magic("wb", "--ranks 1", "print(world_size, device)")
        assert capsys.readouterr().out == "[rank 1]\n2 cpu\n"
    finally:
        ipython_shell.run_line_magic("wb", "stop")
    assert magics.running_started_here() is None
    _gone, alive = psutil.wait_procs(
        [psutil.Process(p) for p in started if psutil.pid_exists(p)], timeout=5
    )
    assert [p.pid for p in alive] == []
