"""The processes the workbench kernel starts ahead (cluster/launch/warm_start.py,
launch/warm.py, kernel_launcher.py), the engines' forker and the controller: taken by the
first local cluster when its environment matches, given up (and stopped) when it does not,
and never left running — not when the kernel exits, not when it is killed."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.processes import BOUND_S, alive
from workbench.cluster import Cluster
from workbench.cluster.launch import standby, warm_start
from workbench.engine import zygote
from workbench.engine.warm_request import request_line

# Starting a torch-importing process and a kernel: generous, on a busy 2-core machine.
KERNEL_BOUND_S = 120.0


def test_env_changes_lists_what_to_set_and_what_to_remove() -> None:
    started = {"A": "1", "B": "2", "GONE": "x"}
    wanted = {"A": "1", "B": "3", "NEW": "y"}
    assert warm_start.env_changes(started, wanted) == {"B": "3", "NEW": "y", "GONE": None}


def test_only_variables_nothing_imported_has_read_may_differ() -> None:
    assert warm_start.compatible({"IPP_CLUSTER_ID": "c1", "MPLBACKEND": "inline", "TERM": None})
    for key in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "TORCH_LOGS"):
        assert not warm_start.compatible({"IPP_CLUSTER_ID": "c1", key: "1"}), key


def test_the_request_line_is_one_line_of_json() -> None:
    line = request_line(["2", "--a=1"], {"X": None}, "/w", "/w/out.log")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {
        "args": ["2", "--a=1"],
        "env": {"X": None},
        "cwd": "/w",
        "output": "/w/out.log",
    }


@pytest.fixture
def nothing_warm() -> Iterator[None]:
    assert all(warm_start.warm(role) is None for role in warm_start.ROLES)
    try:
        yield
    finally:
        warm_start.stop()


def _wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + BOUND_S
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def _standby_pid(directory: str) -> int:
    deadline = time.monotonic() + BOUND_S
    while (pid := standby.waiting_pid(directory)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pid is not None, "no standby waits"
    return pid


@pytest.mark.engines
def test_a_local_cluster_takes_the_warm_forker_and_controller(nothing_warm: None) -> None:
    forker = warm_start.spawn("engines").process
    controller = warm_start.spawn("controller").process
    assert warm_start.spawn("engines").process is forker  # one per kernel
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        assert warm_start.warm("controller") is None  # taken
        # the forker too, which forked a standby for a replacement engine (standby.py)
        assert warm_start.warm("engines") is None
        assert cluster.engines.standby is not None
        ahead = _standby_pid(cluster.engines.standby.directory)
        assert psutil.Process(ahead).ppid() == forker.pid
        parents = {psutil.Process(r.pid).ppid() for r in cluster.ranks}
        assert parents == {forker.pid}
        ipp = cluster.engines.ipp
        assert ipp is not None and ipp.controller is not None
        assert ipp.controller.process.pid == controller.pid
        assert {forker.pid, controller.pid} <= set(cluster.pids())  # watched and stopped
        table = cluster.startup.table()
        assert "engines started with the workbench kernel: taken (" in table
        assert "controller started with the workbench kernel: taken (" in table
        for eid in (r.engine_id for r in cluster.ranks):
            row = cluster.startup.engines[eid]
            assert row["process_started"] <= row["forked"] <= row["registered"]
        out = cluster.execute("import torch.distributed as dist\nprint(dist.get_world_size())")
        assert [r.stdout.strip() for r in out] == ["2", "2"]
        (launcher,) = ipp.engines.values()
        assert Path(launcher.output_file).is_file()  # the engines' output goes there
        assert Path(ipp.controller.output_file).is_file()
    finally:
        pids = cluster.pids()
        cluster.stop_sync()
    assert _wait_gone([*pids, forker.pid, controller.pid, ahead]) == []  # the standby too
    assert warm_start.warm("engines") is None


@pytest.mark.engines
@pytest.mark.parametrize("role", sorted(warm_start.ROLES))
def test_a_changed_environment_gives_up_the_warm_process(
    nothing_warm: None, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    process = warm_start.spawn(role).process
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # numpy's BLAS reads it at import
    assert warm_start.take(role, dict(os.environ)) is None
    assert process.poll() is not None  # stopped, not left behind
    assert warm_start.warm(role) is None


@pytest.mark.engines
def test_a_cluster_started_after_the_environment_changed_starts_fresh_processes(
    nothing_warm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    warm = [warm_start.spawn(role).process for role in warm_start.ROLES]
    monkeypatch.setenv("WB_TEST_SETTING", "changed")
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        assert all(p.poll() is not None for p in warm)
        assert not {p.pid for p in warm} & set(cluster.pids())
        table = cluster.startup.table()
        assert "engines started with the workbench kernel: not taken: WB_TEST_SETTING" in table
        assert "controller started with the workbench kernel: not taken: WB_TEST_SETTING" in table
        out = cluster.execute("import os\nprint(os.environ['WB_TEST_SETTING'])")
        assert [r.stdout.strip() for r in out] == ["changed", "changed"]
    finally:
        pids = cluster.pids()
        cluster.stop_sync()
    assert _wait_gone(pids) == []


@pytest.mark.engines
def test_a_warm_process_that_died_is_not_taken(nothing_warm: None) -> None:
    process = warm_start.spawn("engines").process
    process.kill()  # our own child, by its pid
    process.wait()
    assert warm_start.take("engines", dict(os.environ)) is None
    assert warm_start.warm("engines") is None


class _Launcher:
    """What start_warm reads of an ipyparallel launcher that has not started yet."""

    state = "before"
    work_dir = "."

    def __init__(self, output_file: str) -> None:
        self.output_file = output_file

    def get_env(self) -> dict[str, str]:
        return {}


@pytest.mark.engines
def test_a_process_that_dies_before_its_request_is_sent_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workbench.cluster.launch import warm

    dead = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
    dead.wait(BOUND_S)  # its pipe has no reader now: the request cannot be written
    monkeypatch.setattr(warm_start, "take", lambda role, env: (dead, {}))
    launcher = _Launcher(str(tmp_path / "out.log"))
    assert warm.start_warm(launcher, "engines", ["2"]) is False
    assert launcher.state == "before"  # the launcher starts its own process instead


@pytest.mark.engines
@pytest.mark.parametrize("role", sorted(warm_start.ROLES))
def test_a_warm_process_ends_when_its_pipe_closes(nothing_warm: None, role: str) -> None:
    process = warm_start.spawn(role).process
    assert process.stdin is not None
    process.stdin.close()  # as when the kernel that started it is gone
    assert process.wait(KERNEL_BOUND_S) == 0
    warm_start.stop()
    assert warm_start.warm(role) is None


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="'nanny'"):
        warm_start.spawn("nanny")


@pytest.fixture
def workbench_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    from workbench.cli.kernel import install

    install(name="wb-test", prefix=str(tmp_path))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    return "wb-test"


def _run(client: object, code: str) -> str:
    out: list[str] = []

    def hook(msg: dict) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(content["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(content["traceback"]))
        elif msg["msg_type"] == "execute_result":
            out.append(content["data"]["text/plain"])

    client.execute_interactive(code, output_hook=hook, timeout=KERNEL_BOUND_S)  # type: ignore[attr-defined]
    return "".join(out)


def _warm_pids(client: object) -> dict[str, int]:
    code = (
        "from workbench.cluster.launch import warm_start\n"
        "print({r: warm_start.warm(r).process.pid for r in warm_start.ROLES})"
    )
    return ast.literal_eval(_run(client, code).strip())


@pytest.mark.engines
def test_the_workbench_kernel_starts_the_forker_that_wb_start_forks_from(
    workbench_kernel: str,
) -> None:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=workbench_kernel, startup_timeout=KERNEL_BOUND_S)
    try:
        pids = _warm_pids(kc)
        forker = pids["engines"]
        assert zygote.__file__ in psutil.Process(forker).cmdline()
        _run(kc, "%load_ext workbench")
        assert "2 ranks" in _run(kc, "%wb start -n 2")
        text = _run(kc, "%%wb\nimport os\nprint('parent', os.getppid())")
        assert text.count(f"parent {forker}") == 2, text
        code = "print(__import__('workbench').Cluster.latest().engines.ipp.controller.process.pid)"
        assert _run(kc, code).strip() == str(pids["controller"])
        assert "stopped" in _run(kc, "%wb stop")
        assert _wait_gone(list(pids.values())) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


@pytest.mark.engines
@pytest.mark.parametrize("how", ["shutdown", "killed"])
def test_a_workbench_kernel_that_never_started_a_cluster_leaves_nothing(
    workbench_kernel: str, how: str
) -> None:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=workbench_kernel, startup_timeout=KERNEL_BOUND_S)
    try:
        pids = list(_warm_pids(kc).values())
        assert len(alive(pids)) == len(warm_start.ROLES)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=how == "killed")
    deadline = time.monotonic() + KERNEL_BOUND_S
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive(pids) == []


@pytest.mark.engines
def test_the_workbench_kernel_can_be_told_to_start_nothing_ahead(workbench_kernel: str) -> None:
    from jupyter_client.manager import start_new_kernel

    from workbench.kernel_launcher import WARM_ENV

    env = {**os.environ, WARM_ENV: "0"}
    km, kc = start_new_kernel(kernel_name=workbench_kernel, startup_timeout=KERNEL_BOUND_S, env=env)
    try:
        code = (
            "from workbench.cluster.launch import warm_start\n"
            "print([warm_start.warm(r) for r in warm_start.ROLES])"
        )
        assert _run(kc, code).strip() == "[None, None]"
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


def test_the_kernel_spec_runs_this_interpreter_with_the_workbench_launcher(tmp_path: Path) -> None:
    from workbench.cli import main

    assert main(["kernel", "install", "--prefix", str(tmp_path), "--name", "wbk"]) == 0
    spec = json.loads((tmp_path / "share/jupyter/kernels/wbk/kernel.json").read_text())
    assert spec["argv"] == [
        sys.executable,
        "-m",
        "workbench.kernel_launcher",
        "-f",
        "{connection_file}",
    ]
    assert spec["language"] == "python"
    # the launcher's icon: the file names jupyter_server's kernelspec API looks for
    found = {p.name for p in (tmp_path / "share/jupyter/kernels/wbk").iterdir()}
    assert found == {"kernel.json", "logo-svg.svg", "logo-32x32.png", "logo-64x64.png"}, found
    png = (tmp_path / "share/jupyter/kernels/wbk/logo-64x64.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png[16:24] == bytes([0, 0, 0, 64] * 2)
    svg = (tmp_path / "share/jupyter/kernels/wbk/logo-svg.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<rect") == 5


def test_a_bad_kernel_name_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.cli import main

    assert main(["kernel", "install", "--prefix", str(tmp_path), "--name", "a b"]) == 2
    assert "'a b'" in capsys.readouterr().err
    assert not (tmp_path / "share").exists()
