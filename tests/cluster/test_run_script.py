"""``Cluster.run_script`` / ``%wb run``: torchrun scripts run unchanged on the engines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.errors import CollectiveTimeout

pytestmark = pytest.mark.engines

SCRIPTS = Path(__file__).resolve().parent / "scripts"
MIGRATION = SCRIPTS / "migration_ddp.py"
# What an engine holds that a script may change; printed by a cell before and after.
SNAPSHOT = (
    "import json, os, signal, sys\n"
    "from torch.distributed.distributed_c10d import _world\n"
    "print(json.dumps({'argv': sys.argv, 'path': sys.path, 'cwd': os.getcwd(),"
    " 'env': dict(os.environ), 'usr1': repr(signal.getsignal(signal.SIGUSR1)),"
    " 'int': repr(signal.getsignal(signal.SIGINT)), 'groups': len(_world.pg_names),"
    " 'threads': torch.get_num_threads()}))"
)


def _snapshot(cluster: Cluster) -> list[dict[str, Any]]:
    return [json.loads(r.stdout) for r in cluster.execute(SNAPSHOT)]


def _one_process_losses(tmp_path: Path) -> list[float]:
    """The same script, unchanged, in one process of its own (world size 1, the same
    global batch): the reference the 2-rank DDP run must equal."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "one_process.json"
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    env.update(MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    subprocess.run(
        [sys.executable, str(MIGRATION), "--batch", "8", "--out", str(out)],
        env=env,
        check=True,
        timeout=120,
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    return _one_process_losses(tmp_path_factory.mktemp("one_process"))


def test_the_migration_example_runs_unchanged_and_equals_one_process(
    cluster: Cluster, one_process: list[float], tmp_path: Path
) -> None:
    out = tmp_path / "ddp.json"
    results = cluster.run_script(MIGRATION, ["--batch", "8", "--out", str(out)])
    assert [r.ok for r in results] == [True, True], [r.traceback for r in results]
    assert results[0].stdout.startswith("16 steps, last loss")
    ddp = json.loads(out.read_text())
    assert len(ddp) == len(one_process) == 16  # 64 samples, global batch 8, 2 epochs
    assert ddp[-1] < ddp[0]  # it trained
    assert ddp == pytest.approx(one_process, rel=1e-5, abs=1e-7)
    # the script ended with destroy_process_group(): the cluster's group is still there
    cell = cluster.execute("t = torch.ones(1) * (rank + 1); dist.all_reduce(t); print(t.item())")
    assert [r.stdout for r in cell] == ["3.0\n", "3.0\n"]


def test_the_environment_argv_and_handlers_are_restored(cluster: Cluster, tmp_path: Path) -> None:
    cluster.execute("os = __import__('os'); os.environ['WB_SET_BEFORE_THE_SCRIPT'] = 'kept'")
    before = _snapshot(cluster)
    script = SCRIPTS / "state_probe.py"
    results = cluster.run_script(script, ["a", "--b", 3])
    assert [r.ok for r in results] == [True, True], [r.traceback for r in results]
    seen = [json.loads(r.stdout.splitlines()[0]) for r in results]
    for rank, (result, saw) in enumerate(zip(results, seen, strict=True)):
        assert saw["argv"] == [str(script), "a", "--b", "3"]
        assert saw["name"] == "__main__"
        assert saw["path0"] == str(SCRIPTS)
        assert saw["cwd"] == os.getcwd()
        env = saw["env"]
        assert env["RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["LOCAL_RANK"] == str(rank) and env["GROUP_RANK"] == "0"
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_WORLD_SIZE"] == "1" and env["ROLE_NAME"] == "default"
        assert env["MASTER_ADDR"] == cluster.ranks[rank].master_addr
        assert env["MASTER_PORT"] == str(cluster.ranks[rank].master_port)
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert env["TORCHELASTIC_RESTART_COUNT"] == env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        # atexit handlers ran at the script's end, last registered first
        assert result.stdout.splitlines()[1:] == [
            "atexit: registered last, runs first",
            "atexit: registered earlier, runs last",
        ]
    assert seen[0]["env"]["TORCHELASTIC_RUN_ID"] == seen[1]["env"]["TORCHELASTIC_RUN_ID"]
    after = _snapshot(cluster)
    assert after == before  # env, argv, sys.path, cwd, signals, threads, process groups
    assert after[0]["env"]["WB_SET_BEFORE_THE_SCRIPT"] == "kept"
    assert "TORCHELASTIC_RUN_ID" not in after[0]["env"]


def test_a_script_asking_for_another_group_fails_naming_both(cluster: Cluster) -> None:
    script = SCRIPTS / "asks_for_another_group.py"
    results = cluster.run_script(script, ["gloo", "4"])
    assert [r.ename for r in results] == ["ConfigError", "ConfigError"]
    message = results[1].evalue or ""
    assert "init_process_group(backend='gloo', world_size=4, rank=1)" in message
    assert "backend='gloo', world_size=2" in message and "different: world_size" in message
    assert "never here" not in results[1].stdout
    results = cluster.run_script(script, ["nccl", "2"], ranks=[0])
    assert "backend='nccl'" in (results[0].evalue or "")
    assert "different: backend" in (results[0].evalue or "")


def test_exit_codes_other_than_zero_fail_their_rank(cluster: Cluster) -> None:
    script = SCRIPTS / "exit_code.py"
    results = cluster.run_script(script, ["--codes", "0,3"])
    assert results[0].ok and results[0].stdout == "exiting with 0\n"
    assert results[1].ename == "ScriptExit"
    assert results[1].evalue == "exit_code.py exited with code 3 on rank 1"
    results = cluster.run_script(script, ["--codes", "none,none"])
    assert [r.ok for r in results] == [True, True]


def test_a_timeout_interrupts_the_script_and_still_restores(
    cluster: Cluster, tmp_path: Path
) -> None:
    before = _snapshot(cluster)
    script = tmp_path / "sleeps.py"
    script.write_text("import os, time\nos.environ['WB_SLEEPER'] = '1'\ntime.sleep(120)\n")
    # long enough for both ranks to be inside the script (SIGINT between cells is ignored)
    with pytest.raises(CollectiveTimeout, match="were interrupted and are free"):
        cluster.run_script(script, timeout=8)
    assert _snapshot(cluster) == before


def test_an_interrupt_inside_the_script_still_restores(cluster: Cluster, tmp_path: Path) -> None:
    before = _snapshot(cluster)
    script = tmp_path / "interrupted.py"
    script.write_text(
        "import os, signal, sys\n"
        "os.environ['WB_INTERRUPTED'] = '1'\nsys.path.append('/nowhere')\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
    )
    results = cluster.run_script(script)
    assert [r.ename for r in results] == ["KeyboardInterrupt", "KeyboardInterrupt"]
    assert "interrupted.py" in (results[0].traceback or "")
    assert _snapshot(cluster) == before


def test_an_edited_helper_module_is_read_again(cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "uses_helper.py"
    script.write_text("import wb_script_helper\nprint(wb_script_helper.VALUE)\n")
    helper = tmp_path / "wb_script_helper.py"
    helper.write_text("VALUE = 'first'\n")
    assert [r.stdout for r in cluster.run_script(script)] == ["first\n", "first\n"]
    helper.write_text("VALUE = 'edited'\n")
    assert [r.stdout for r in cluster.run_script(script)] == ["edited\n", "edited\n"]


def test_a_cell_adopts_the_group_and_keeps_it(cluster: Cluster) -> None:
    code = (
        "dist.init_process_group('gloo')\n"
        "dist.destroy_process_group()\n"
        "t = torch.ones(1); dist.all_reduce(t); print(t.item())"
    )
    assert [r.stdout for r in cluster.execute(code)] == ["2.0\n", "2.0\n"]
    results = cluster.execute("dist.init_process_group('gloo', world_size=3, rank=rank)")
    assert [r.ename for r in results] == ["ConfigError", "ConfigError"]
    assert "world_size=3" in (results[0].evalue or "")


# -- %wb run --------------------------------------------------------------------------------
@pytest.fixture
def shell(ipython_shell: Any, cluster: Cluster) -> Any:
    """The shell whose current cluster is the shared session cluster."""
    assert ipython_shell._workbench_magics.cluster is cluster
    return ipython_shell


def test_wb_run_runs_the_migration_example_unchanged(
    shell: Any, one_process: list[float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ddp.json"
    shell.run_line_magic("wb", f"run --timeout 300 {MIGRATION} --batch 8 --out {out}")
    assert capsys.readouterr().out.startswith("[rank 0]\n16 steps, last loss")
    assert json.loads(out.read_text()) == pytest.approx(one_process, rel=1e-5, abs=1e-7)


def test_wb_run_fails_the_ranks_whose_script_failed(shell: Any) -> None:
    from workbench.errors import RankError

    result = shell.run_cell(f"%wb run {SCRIPTS / 'exit_code.py'} --codes 0,3")
    error = result.error_in_exec
    assert isinstance(error, RankError) and set(error.failures) == {1}
    assert "exit_code.py exited with code 3 on rank 1" in str(error)


def test_wb_run_checks_ranks_against_the_cluster(shell: Any) -> None:
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="rank 2 is outside this cluster"):
        shell.run_line_magic("wb", f"run --ranks 2 {MIGRATION}")
